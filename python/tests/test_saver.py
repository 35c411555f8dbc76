"""The memory savers' decisions (vmmweights.saver) on the host backend, no
PyTorch: own tags only, foreign tags refused, the host backup released after
resume unless retained, the disk backup round trip, pause and resume on every
device, and the start-up routing decision."""

import ctypes
import os

import pytest

import vmmweights as vw
from vmmweights.saver import ROUTE_ENV, ForeignTagError, OwnTags, SaverCore, configure_subprocess, start_plan

MiB = 1 << 20


class Saver:
    """A SaverCore over host pools of two simulated devices; it records the
    ranges it allocates, as PyTorch's memory pools list them in the shim."""

    def __init__(self, env=None):
        self.pools = {d: vw.Pool(backend="host", device=d) for d in (0, 1)}
        self.blocks = {}  # (device, pool tag) -> [(ptr, size)]
        self.synced = []
        self.core = SaverCore(
            pool_of=self.pools.__getitem__,
            ranges=lambda d, t: self.blocks.get((d, t), []),
            synchronize=self.synced.append,
            env=env or {},
        )

    def alloc(self, tag, kind, size, fill, device=0):
        """Allocate in a region of `tag` as the shim does, filled with `fill`."""
        name = self.core.region_tag(device, tag, kind)
        ptr = self.pools[device].alloc(size, name)
        self.pools[device].write(ptr, fill * (size // len(fill)))
        self.blocks.setdefault((device, name), []).append((ptr, size))
        return ptr

    def asleep(self, device=0):
        return {t["tag"]: t["asleep"] for t in self.pools[device].report()["tags"]}

    def backup_bytes(self, device=0):
        return self.pools[device].report()["total"]["host_backup_bytes"]

    def close(self):
        for p in self.pools.values():
            p.close()


@pytest.fixture
def saver():
    s = Saver()
    yield s
    s.close()


def test_pause_and_resume_touch_only_the_savers_tags(saver):
    pool = saver.pools[0]
    theirs = pool.alloc(MiB, "weights")  # vt.use_pool("weights") elsewhere in the process
    pool.write(theirs, b"T" * MiB)
    mine = saver.alloc("weights", "cpu", MiB, b"M")
    assert saver.core.pause() == {0: ["tms:weights/cpu"]}
    assert saver.asleep() == {"weights": False, "tms:weights/cpu": True}
    assert pool.read(theirs, 4) == b"TTTT"  # still awake and intact

    pool.sleep(weights="offload")  # someone else's sleep
    assert saver.core.resume() == {0: ["tms:weights/cpu"]}
    assert saver.asleep() == {"weights": True, "tms:weights/cpu": False}, "resume() must not wake a foreign tag"
    assert pool.read(mine, 4) == b"MMMM"
    pool.wake("weights")
    assert pool.read(theirs, 4) == b"TTTT"


def test_a_tag_the_saver_never_created_is_refused_by_name(saver):
    pool = saver.pools[0]
    theirs = pool.alloc(MiB, "weights")
    pool.write(theirs, b"T" * MiB)
    saver.alloc("kv_cache", "none", MiB, b"K")
    for call in (saver.core.pause, saver.core.resume):
        with pytest.raises(ForeignTagError, match="'weights'") as e:
            call("weights")
        assert e.value.tag == "weights"
    assert saver.asleep() == {"weights": False, "tms:kv_cache/none": False}, "a refused call changes nothing"
    assert pool.read(theirs, 4) == b"TTTT"


def test_a_created_tag_with_nothing_on_a_device_is_no_error(saver):
    saver.alloc("weights", "cpu", MiB, b"W", device=1)
    saver.core.own.note(0, "weights", "cpu")  # a region on device 0 that allocated nothing
    assert saver.core.pause("weights") == {1: ["tms:weights/cpu"]}
    assert saver.core.resume("weights") == {1: ["tms:weights/cpu"]}
    assert saver.core.pause("weights") == {1: ["tms:weights/cpu"]}
    assert saver.core.pause("weights") == {}, "pausing a paused tag again does nothing"


def test_pause_and_resume_act_on_every_device(saver):
    a = saver.alloc("weights", "cpu", MiB, b"A", device=0)
    b = saver.alloc("weights", "cpu", MiB, b"B", device=1)
    saver.alloc("kv_cache", "none", MiB, b"K", device=1)
    assert saver.core.pause() == {0: ["tms:weights/cpu"], 1: ["tms:kv_cache/none", "tms:weights/cpu"]}
    assert all(saver.asleep(0).values()) and all(saver.asleep(1).values())
    assert sorted(saver.synced) == [0, 1], "queued work is waited for on each device before release"
    saver.core.resume()
    assert not any(saver.asleep(0).values()) and not any(saver.asleep(1).values())
    assert saver.pools[0].read(a, 2) == b"AA" and saver.pools[1].read(b, 2) == b"BB"


def test_one_tag_in_several_kinds_pauses_each_kind_its_own_way(saver):
    kept = saver.alloc("weights", "cpu", MiB, b"C")
    saver.alloc("weights", "none", MiB, b"N")
    saver.core.pause("weights")
    rep = {t["tag"]: t for t in saver.pools[0].report()["tags"]}
    assert rep["tms:weights/cpu"]["offloaded_bytes"] > 0
    assert rep["tms:weights/none"]["discarded_bytes"] > 0
    saver.core.resume("weights")
    assert saver.pools[0].read(kept, 2) == b"CC"


def test_backup_is_released_after_resume_and_kept_with_retain(saver):
    ptr = saver.alloc("weights", "cpu", 4 * MiB, b"W")
    saver.core.pause()
    assert saver.backup_bytes() >= 4 * MiB
    saver.core.resume()
    assert saver.backup_bytes() == 0, "upstream's default: no host backup left after resume"
    assert saver.pools[0].read(ptr, 2) == b"WW"
    # The pinned memory under it stays for the next pause (no pinning again).
    saver.core.pause()
    saver.core.resume()
    assert saver.backup_bytes() == 0
    assert saver.pools[0].release_backup() >= 4 * MiB, "a releasing resume keeps the pinned arena"

    saver.core.retain_cpu_backup = True
    saver.core.pause()
    saver.core.resume()
    kept = saver.backup_bytes()
    assert kept >= 4 * MiB, "retain_cpu_backup keeps the host backup after resume"
    saver.pools[0].write(ptr, b"V" * (4 * MiB))
    saver.core.pause()  # the retained backup is refreshed, not reused stale
    saver.core.resume()
    assert saver.pools[0].read(ptr, 2) == b"VV"
    assert saver.backup_bytes() == kept

    saver.core.retain_cpu_backup = False
    saver.core.pause()
    saver.core.resume()
    assert saver.backup_bytes() == 0


def test_a_paused_tensors_bytes_are_read_from_the_host_backup(saver):
    """What get_cpu_backup returns: the bytes of a paused CPU-backup range,
    out of the pool's backup, without waking it; refused by tag otherwise."""
    ptr = saver.alloc("weights", "cpu", 1 * MiB, b"ab")
    kv = saver.alloc("kv", "none", 1 * MiB, b"K")
    pool = saver.pools[0]
    with pytest.raises(vw.VmmwError, match="is awake"):
        pool.read_backup(ptr, 4)
    saver.core.pause()
    weights = saver.core.region_tag(0, "weights", "cpu")
    assert pool.read_backup(ptr + 2, 6) == (weights, b"ababab")
    assert pool.read_backup(ptr, 1 * MiB) == (weights, b"ab" * (MiB // 2))
    assert saver.asleep()[weights], "reading did not wake it"
    with pytest.raises(vw.VmmwError, match="discard policy") as e:
        pool.read_backup(kv, 4)
    assert saver.core.region_tag(0, "kv", "none") in str(e.value)
    with pytest.raises(vw.VmmwError):
        pool.read_backup(0x1000, 4)
    saver.core.resume()
    with pytest.raises(vw.VmmwError, match="is awake"):
        pool.read_backup(ptr, 4)


def test_a_backup_view_is_the_pinned_backup_in_place(saver):
    """What get_cpu_backup(zero_copy=True) wraps: the host address of a
    paused range's backup, the same across cycles, readable after a retained
    resume, gone after a resume that releases the backup."""
    ptr = saver.alloc("weights", "cpu", 1 * MiB, b"ab")
    pool = saver.pools[0]
    weights = saver.core.region_tag(0, "weights", "cpu")
    with pytest.raises(vw.VmmwError, match="no host backup"):
        pool.backup_view(ptr, 4)
    saver.core.pause()
    tag, host = pool.backup_view(ptr, 1 * MiB)
    assert tag == weights and host
    assert ctypes.string_at(host + 2, 6) == b"ababab"

    saver.core.retain_cpu_backup = True
    saver.core.resume()
    assert pool.backup_view(ptr, 1 * MiB) == (weights, host), "kept after a retained resume"
    saver.pools[0].write(ptr, b"Z" * (1 * MiB))
    saver.core.pause()
    assert pool.backup_view(ptr, 1 * MiB) == (weights, host), "the next pause rewrites it in place"
    assert ctypes.string_at(host, 4) == b"ZZZZ"

    saver.core.retain_cpu_backup = False
    saver.core.resume()
    with pytest.raises(vw.VmmwError, match="no host backup"):
        pool.backup_view(ptr, 4)
    with pytest.raises(vw.VmmwError, match="VMMW_INVALID_ARGUMENT"):
        pool.backup_view(ptr, 0)
    with pytest.raises(vw.VmmwError, match="VMMW_UNKNOWN_POINTER"):
        pool.backup_view(0x1000, 4)


def test_retain_from_the_environment():
    s = Saver(env={"TMS_RETAIN_CPU_BACKUP": "1"})
    try:
        assert s.core.retain_cpu_backup is True
    finally:
        s.close()


def test_disk_backup_round_trip(saver, tmp_path):
    saver.core.disk.set_directory(str(tmp_path / "spill"))
    pattern = bytes(range(256)) * (3 * MiB // 256)
    big = saver.alloc("weights", "disk", 3 * MiB, pattern)
    small = saver.alloc("weights", "disk", 7, b"s")
    lost = saver.alloc("kv_cache", "none", MiB, b"K")
    for _ in range(3):
        saver.core.pause()
        files = sorted(os.listdir(tmp_path / "spill"))
        assert len(files) == 2, files  # one per range
        sizes = sorted(os.path.getsize(tmp_path / "spill" / f) for f in files)
        assert sizes == [7, 3 * MiB]
        contents = {(tmp_path / "spill" / f).read_bytes()[:7] for f in files}
        assert pattern[:7] in contents and b"s" * 7 in contents
        assert saver.backup_bytes() == 0, "a disk-backed tag keeps no host backup"
        assert saver.asleep()["tms:weights/disk"]
        saver.core.resume()
        assert saver.pools[0].read(big, 3 * MiB) == pattern
        assert saver.pools[0].read(small, 7) == b"s" * 7
        assert os.listdir(tmp_path / "spill") == [], "the files go with the backup after resume"
    assert saver.pools[0].read(lost, 1) is not None


def test_disk_backup_kept_with_retain_and_a_missing_directory_changes_nothing(saver, tmp_path):
    saver.alloc("weights", "disk", MiB, b"D")
    with pytest.raises(ValueError, match="set_disk_backup_dir"):
        saver.core.pause()
    assert saver.asleep() == {"tms:weights/disk": False}
    saver.core.disk.set_directory(str(tmp_path))
    saver.core.retain_cpu_backup = True
    saver.core.pause()
    saver.core.resume()
    assert len(os.listdir(tmp_path)) == 1, "retained: the disk copy stays after resume"


def test_disk_backup_directory_from_the_environment(tmp_path):
    s = Saver(env={"TMS_DISK_BACKUP_DIR": str(tmp_path / "d")})
    try:
        ptr = s.alloc("w", "disk", MiB, b"E")
        s.core.pause()
        assert len(os.listdir(tmp_path / "d")) == 1
        s.core.resume()
        assert s.pools[0].read(ptr, 2) == b"EE"
    finally:
        s.close()


def test_own_tags_are_named_in_the_shims_namespace():
    own = OwnTags("CuMemAllocator", "cumem")
    assert own.note(0, "weights") == "cumem:weights"
    assert own.pool_tags(0) == {"cumem:weights": "weights"}
    assert own.pool_tags(1) == {}
    with pytest.raises(ForeignTagError, match="'kv_cache'.*'weights'"):
        own.check(["weights", "kv_cache"])
    with pytest.raises(ValueError, match="non-empty"):
        own.note(0, "")
    with pytest.raises(vw.VmmwError):
        own.note(0, "x" * 80)  # the pool tag would pass the registry's length limit


def test_unknown_backup_kind_is_refused(saver):
    with pytest.raises(ValueError, match="unknown backup kind"):
        saver.core.region_tag(0, "w", "tape")


@pytest.mark.parametrize(
    "env, route, tag, kind",
    [
        ({}, False, None, "none"),
        ({"TMS_INIT_ENABLE": "0"}, False, None, "none"),
        ({ROUTE_ENV: "1"}, True, None, "none"),
        ({"TMS_INIT_ENABLE": "1"}, True, "default", "none"),
        ({"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}, True, "default", "cpu"),
        ({"TMS_INIT_ENABLE": "true", "TMS_INIT_ENABLE_DISK_BACKUP": "1"}, True, "default", "disk"),
        ({"TMS_INIT_ENABLE_CPU_BACKUP": "1"}, False, None, "cpu"),
    ],
)
def test_start_plan_routes_from_the_first_allocation_when_asked(env, route, tag, kind):
    plan = start_plan(env)
    assert (plan.route_all, plan.init_tag, plan.init_kind) == (route, tag, kind)
    assert plan.hook_mode == ("preload" if route else "torch")
    assert ("preload hook mode" in plan.reason) == route


def test_start_plan_reads_backend_retain_and_disk_dir():
    plan = start_plan({"TMS_INIT_CPU_BACKUP_BACKEND": "MMAP", "TMS_RETAIN_CPU_BACKUP": "1", "TMS_DISK_BACKUP_DIR": "/x"})
    assert (plan.cpu_backup_backend, plan.retain_cpu_backup, plan.disk_dir) == ("mmap", True, "/x")
    assert start_plan({}).cpu_backup_backend == "pinned"


@pytest.mark.parametrize(
    "env, message",
    [
        ({"TMS_INIT_CPU_BACKUP_BACKEND": "cuda"}, "expected 'pinned' or 'mmap'"),
        ({"TMS_INIT_ENABLE_CPU_BACKUP": "1", "TMS_INIT_ENABLE_DISK_BACKUP": "1"}, "mutually exclusive"),
    ],
)
def test_start_plan_refuses_bad_settings(env, message):
    with pytest.raises(ValueError, match=message):
        start_plan(env)


def test_configure_subprocess_sets_the_route_for_children_and_restores(monkeypatch):
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    with configure_subprocess():
        assert start_plan().route_all
    assert ROUTE_ENV not in os.environ
    monkeypatch.setenv(ROUTE_ENV, "0")
    with configure_subprocess():
        assert os.environ[ROUTE_ENV] == "1"
    assert os.environ[ROUTE_ENV] == "0"


def test_the_package_ships_the_torch_memory_saver_alias():
    from pathlib import Path

    root = Path(vw.__file__).parent / "torch" / "alias" / "torch_memory_saver"
    names = {p.relative_to(root).as_posix() for p in root.rglob("*.py")}
    assert {"__init__.py", "entrypoint.py", "utils.py", "testing_utils.py", "hooks/__init__.py",
            "hooks/base.py", "hooks/mode_preload.py", "hooks/mode_torch.py"} <= names


def test_a_disk_backup_that_cannot_be_written_changes_nothing(saver, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    saver.core.disk.directory = str(blocker)  # as if set, then replaced by a file
    ptr = saver.alloc("weights", "disk", MiB, b"D")
    saver.alloc("kv", "cpu", MiB, b"C")
    with pytest.raises(OSError):
        saver.core.pause()
    assert not any(saver.asleep().values()), "nothing sleeps when the copy to disk fails"
    assert saver.pools[0].read(ptr, 2) == b"DD"
    assert blocker.read_bytes() == b""


def test_an_mmap_region_gives_its_host_memory_back_at_every_resume(saver):
    """torch_memory_saver's "mmap" backend: the host memory is reclaimed at
    a releasing resume (upstream's RSS test); "cpu" keeps the pinned arena."""
    m = saver.alloc("weights", "mmap", 4 * MiB, b"m")
    assert saver.core.region_tag(0, "weights", "mmap") == "tms:weights/mmap"
    for _ in range(2):
        saver.core.pause()
        assert saver.backup_bytes() >= 4 * MiB
        saver.core.resume()
        assert saver.pools[0].read(m, 2) == b"mm"
        assert saver.backup_bytes() == 0
        assert saver.pools[0].release_backup() == 0, "nothing left pinned after an mmap tag's resume"
    saver.core.retain_cpu_backup = True
    saver.core.pause()
    saver.core.resume()
    assert saver.backup_bytes() >= 4 * MiB, "retained: the backup stays, mmap or not"


def test_drop_backups_releases_only_the_named_awake_tags(saver):
    pool = saver.pools[0]
    a = saver.alloc("a", "cpu", 2 * MiB, b"a")
    saver.alloc("b", "cpu", 2 * MiB, b"b")
    saver.core.retain_cpu_backup = True
    saver.core.pause()
    saver.core.resume()
    per_tag = {t["tag"]: t["host_backup_bytes"] for t in pool.report()["tags"]}
    assert per_tag["tms:a/cpu"] >= 2 * MiB and per_tag["tms:b/cpu"] >= 2 * MiB
    assert pool.drop_backups("tms:a/cpu") == 0, "kept pinned: nothing unpinned"
    per_tag = {t["tag"]: t["host_backup_bytes"] for t in pool.report()["tags"]}
    assert per_tag.get("tms:a/cpu", 0) == 0 and per_tag["tms:b/cpu"] >= 2 * MiB
    saver.core.pause("b")
    assert pool.drop_backups("tms:b/cpu", unpin=True) >= 0
    per_tag = {t["tag"]: t["host_backup_bytes"] for t in pool.report()["tags"]}
    assert per_tag["tms:b/cpu"] >= 2 * MiB, "an asleep tag keeps its backup"
    saver.core.resume("b")
    assert pool.read(a, 2) == b"aa"
    with pytest.raises(vw.VmmwError, match="VMMW_INVALID_ARGUMENT|VMMW_UNKNOWN_TAG"):
        pool.drop_backups("x" * 80)
    assert pool.drop_backups() == 0


def test_region_settings_start_from_the_environment_and_nest_per_thread():
    """What upstream's C library reports per thread (its tests read it):
    the start from TMS_INIT_*, a region's settings inside it, restored after."""
    import threading

    from vmmweights.saver import RegionConfigs

    cfg = RegionConfigs(start_plan({"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}))
    c = cfg.current()
    assert (c.tag, c.interesting, c.cpu_backup, c.backend, c.disk_backup, c.kind) == (
        "default", True, True, "pinned", False, "cpu")
    with cfg.entered("grad", False, None, False) as inner:
        assert (inner.tag, inner.interesting, inner.cpu_backup, inner.backend, inner.kind) == (
            "grad", True, False, "pinned", "none")
        with cfg.entered("w", True, "mmap", False) as deeper:
            assert (deeper.backend, deeper.kind) == ("mmap", "mmap")
        assert cfg.current() == inner
        seen = []
        t = threading.Thread(target=lambda: seen.append(cfg.current()))
        t.start()
        t.join()
        assert seen == [c], "another thread keeps its own settings"
    assert cfg.current() == c

    plain = RegionConfigs(start_plan({"TMS_INIT_CPU_BACKUP_BACKEND": "mmap"}))
    assert (plain.current().interesting, plain.current().backend) == (False, "mmap")
    with plain.entered("w", True, None, False) as r:
        assert r.kind == "mmap", "a CPU backup takes the thread's backend when the region names none"
    with plain.entered("d", False, None, True) as r:
        assert r.kind == "disk"
    plain.set(interesting=True)
    assert plain.current().interesting
    assert start_plan({"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1",
                       "TMS_INIT_CPU_BACKUP_BACKEND": "mmap"}).init_kind == "mmap"


def test_the_preload_mode_puts_the_interposer_first_on_ld_preload_and_restores(monkeypatch):
    """torch_memory_saver's configure_subprocess: the interposer first on
    LD_PRELOAD, what was there kept after it, restored after the block;
    without an interposer the children route through our allocator."""
    from vmmweights.saver import preloaded_subprocess

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(ROUTE_ENV, raising=False)
    with preloaded_subprocess(lambda: "/x/libhook.so") as lib:
        assert lib == "/x/libhook.so" and os.environ["LD_PRELOAD"] == "/x/libhook.so"
    assert "LD_PRELOAD" not in os.environ
    monkeypatch.setenv("LD_PRELOAD", "/other.so")
    with preloaded_subprocess(lambda: "/x/libhook.so"):
        assert os.environ["LD_PRELOAD"].split(":") == ["/x/libhook.so", "/other.so"]
    assert os.environ["LD_PRELOAD"] == "/other.so"

    def none():
        raise RuntimeError("no interposer here")

    with preloaded_subprocess(none) as lib:
        assert lib is None and os.environ[ROUTE_ENV] == "1" and os.environ["LD_PRELOAD"] == "/other.so"
    assert ROUTE_ENV not in os.environ


def test_the_interposer_is_found_by_the_gpu_runtimes_name(tmp_path):
    from types import SimpleNamespace

    from vmmweights.saver import binary_in_package

    pkg = tmp_path / "torch_memory_saver"
    pkg.mkdir()
    cuda12 = SimpleNamespace(version=SimpleNamespace(cuda="12.9", hip=None))
    rocm = SimpleNamespace(version=SimpleNamespace(cuda=None, hip="7.2.0"))
    (tmp_path / "hook_cu12.abi3.so").touch()
    (tmp_path / "hook.abi3.so").touch()
    assert binary_in_package(str(pkg), "hook", cuda12) == str(tmp_path / "hook_cu12.abi3.so")
    assert binary_in_package(str(pkg), "hook", rocm) == str(tmp_path / "hook.abi3.so")
    (pkg / "hook_cu12.abi3.so").touch()
    assert binary_in_package(str(pkg), "hook", cuda12) == str(pkg / "hook_cu12.abi3.so"), "the package's own first"
    with pytest.raises(RuntimeError, match="_cu13"):
        binary_in_package(str(pkg), "hook", SimpleNamespace(version=SimpleNamespace(cuda="13.0", hip=None)))
    (pkg / "hook_cu12.x.so").touch()
    with pytest.raises(RuntimeError, match="exactly one"):
        binary_in_package(str(pkg), "hook", cuda12)
