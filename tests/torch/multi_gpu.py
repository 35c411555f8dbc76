"""Several GPUs of one host through the C API, checked in PyTorch.

  python3 tests/torch/multi_gpu.py load --dir DIR [--layers 36] [--devices 2]
      vmmw_loader_load_devices into the process-global pools of devices
      0..N-1, as replicas and as N tensor-parallel ranks (qwen3 preset); every
      destination on every device is compared with the full tensors read by
      safetensors and sliced in PyTorch (q/gate/up rows, o/down columns,
      vocabulary rows, kv heads replicated when ranks outnumber them); then
      the replicas slept on one host backup and woken on every device from
      it (vmmw_replicas_sleep / vmmw_replicas_wake), checked again.
  python3 tests/torch/multi_gpu.py allreduce [--devices 2]
      one process per GPU, tensors allocated in our pool (vmmweights.torch
      MemPool), all-reduced through torch.distributed's NCCL; checks the sum.

Prints one summary line per check; exits non-zero on any mismatch. Keep
NVLink multicast off (NCCL_NVLS_ENABLE=0; scripts/gpu-check.sh sets it).
"""

import argparse
import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch"))
sys.path.insert(0, os.path.dirname(__file__))
import vmmweights as vw  # noqa: E402
import vmmweights.torch as vt  # noqa: E402
from vmmweights import _native  # noqa: E402

HD = 128
VP = ctypes.c_void_p
ERR = ctypes.POINTER(ctypes.c_void_p)


class Destination(ctypes.Structure):
    _fields_ = [
        ("ptr", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("dtype", ctypes.c_char * 16),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_uint64 * 8),
    ]


class MultiResult(ctypes.Structure):
    _fields_ = [
        ("host_bytes", ctypes.c_uint64),
        ("peer_bytes", ctypes.c_uint64),
        ("delivered_bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("host_seconds", ctypes.c_double),
        ("peer_seconds", ctypes.c_double),
        ("gbps", ctypes.c_double),
        ("recovered_devices", ctypes.c_uint32),
    ]


def declare():
    lib = _native.lib()
    if getattr(lib, "vmmw_loader_load_devices", None) is None:
        sys.exit(f"{vw.library_path()} does not export vmmw_loader_load_devices; rebuild it")
    sigs = {
        "vmmw_loader_open": [ctypes.c_char_p, ctypes.POINTER(VP), ERR],
        "vmmw_loader_set_rules_preset": [VP, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ERR],
        "vmmw_loader_allocate": [VP, VP, ctypes.c_uint32, ERR],
        "vmmw_loader_destination_count": [VP, ctypes.POINTER(ctypes.c_size_t), ERR],
        "vmmw_loader_destination_name": [
            VP, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ERR],
        "vmmw_loader_destination": [VP, ctypes.c_char_p, ctypes.POINTER(Destination), ERR],
        "vmmw_loader_load_devices": [
            ctypes.POINTER(VP), ctypes.POINTER(VP), ctypes.c_size_t, ctypes.c_int32, ctypes.POINTER(MultiResult), ERR],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int32
        fn.argtypes = args
    lib.vmmw_loader_free.restype = None
    lib.vmmw_loader_free.argtypes = [VP]
    return lib


def _call(name, *args):
    """`name(*args, &error)` on the library; vmmweights.VmmwError on failure."""
    err = ctypes.c_void_p()
    status = getattr(_native.lib(), name)(*args, ctypes.byref(err))
    if status != 0:
        _native._raise(name, status, err)


class _Cai:
    """A device pointer as an int16 tensor (viewed as bf16 afterwards)."""

    def __init__(self, ptr, numel):
        self.__cuda_array_interface__ = {"shape": (numel,), "typestr": "<i2", "data": (ptr, False), "strides": None, "version": 3}


def destinations(loader, device):
    n = ctypes.c_size_t()
    _call("vmmw_loader_destination_count", loader, ctypes.byref(n))
    out = {}
    for i in range(n.value):
        buf = ctypes.create_string_buffer(512)
        _call("vmmw_loader_destination_name", loader, ctypes.c_size_t(i), buf, ctypes.c_size_t(512), None)
        d = Destination()
        _call("vmmw_loader_destination", loader, buf.value, ctypes.byref(d))
        dtype = d.dtype if isinstance(d.dtype, bytes) else d.dtype.value  # a ctypes char array reads as bytes
        assert dtype == b"BF16", dtype
        shape = [d.shape[k] for k in range(d.ndim)]
        with torch.cuda.device(device):
            t = torch.as_tensor(_Cai(d.ptr, d.bytes // 2), device=f"cuda:{device}")
        out[buf.value.decode()] = t.view(torch.bfloat16).view(shape)
    return out


def expected(f, name, rank, world, kv_heads):
    """What destination `name` holds on `rank` of `world`, from the full tensors in `f`."""
    get = f.get_tensor

    def split0(n):
        t = get(n)
        per = t.shape[0] // world
        return t[rank * per:(rank + 1) * per]

    def kv(n):
        if world <= kv_heads:
            return split0(n)
        head = rank // (world // kv_heads)
        return get(n)[head * HD:(head + 1) * HD]

    if world == 1:
        split0 = get  # noqa: F811
        kv = get  # noqa: F811
    if name.endswith(".self_attn.qkv_proj.weight"):
        p = name[: -len(".qkv_proj.weight")]
        return torch.cat([split0(f"{p}.q_proj.weight"), kv(f"{p}.k_proj.weight"), kv(f"{p}.v_proj.weight")])
    if name.endswith(".mlp.gate_up_proj.weight"):
        p = name[: -len(".gate_up_proj.weight")]
        return torch.cat([split0(f"{p}.gate_proj.weight"), split0(f"{p}.up_proj.weight")])
    if world > 1 and (name.endswith("o_proj.weight") or name.endswith("down_proj.weight")):
        t = get(name)
        per = t.shape[1] // world
        return t[:, rank * per:(rank + 1) * per]
    if world > 1 and name in ("model.embed_tokens.weight", "lm_head.weight"):
        return split0(name)
    return get(name)


class Checkpoint:
    """Tensors of a (sharded) checkpoint by name, read on one device."""

    def __init__(self, d, device):
        import json

        from safetensors import safe_open

        idx = os.path.join(d, "model.safetensors.index.json")
        files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
        self.handles = [safe_open(os.path.join(d, x), framework="pt", device=f"cuda:{device}") for x in files]
        self.where = {k: h for h in self.handles for k in h.keys()}

    def get_tensor(self, name):
        return self.where[name].get_tensor(name)


def check(d, loaders, mode, n, kv_heads):
    """Compare every destination on every device with the full tensors sliced
    in PyTorch: (mismatches, bytes checked)."""
    bad = 0
    checked = 0
    for k in range(n):
        ck = Checkpoint(d, k)
        for dname, got in destinations(loaders[k], k).items():
            want = expected(ck, dname, k if mode == 1 else 0, n if mode == 1 else 1, kv_heads)
            if got.shape != want.shape or not torch.equal(got, want.to(got.device)):
                bad += 1
                if bad <= 5:
                    print(f"MISMATCH device {k} {dname}: got {tuple(got.shape)}, want {tuple(want.shape)}")
            checked += got.numel() * 2
            del want
        del ck
        torch.cuda.synchronize(k)
    return bad, checked


def load(args):
    lib = declare()
    n = args.devices
    if torch.cuda.device_count() < n:
        print(f"SKIP: {torch.cuda.device_count()} GPUs visible, {n} needed")
        return 0
    if not os.path.exists(args.dir):
        import bench_load_reference as ref

        ref.generate(args.dir, args.layers)
    kv_heads = 8
    failures = 0
    for mode, name in ((0, "replicas"), (1, "ranks")):
        tag = vw.tag_id(f"multi-{name}")
        loaders = []
        for k in range(n):
            ld = VP()
            _call("vmmw_loader_open", args.dir.encode(), ctypes.byref(ld))
            world = n if mode == 1 else 0
            _call("vmmw_loader_set_rules_preset", ld, b"qwen3", ctypes.c_uint32(k if mode == 1 else 0),
                     ctypes.c_uint32(world), ctypes.c_uint32(HD))
            _call("vmmw_loader_allocate", ld, vw.Pool.default(k).handle, ctypes.c_uint32(tag))
            loaders.append(ld)
        ls = (VP * n)(*[x.value for x in loaders])
        ps = (VP * n)(*[vw.Pool.default(k).handle.value for k in range(n)])
        times = []
        for _ in range(args.repeat + 1):
            res = MultiResult()
            t = time.perf_counter()
            _call("vmmw_loader_load_devices", ls, ps, ctypes.c_size_t(n), ctypes.c_int32(mode), ctypes.byref(res))
            times.append(time.perf_counter() - t)
        best = sorted(times[1:])[len(times[1:]) // 2]
        bad, checked = check(args.dir, loaders, mode, n, kv_heads)
        status = "PASS" if bad == 0 else "FAIL"
        failures += bad
        print(f"{status} {name} on {n} GPUs: {checked / 1e9:.1f} GB checked against PyTorch slices, "
              f"{bad} mismatches; median {best:.3f} s, {res.delivered_bytes / best / 1e9:.1f} GB/s delivered "
              f"(host {res.host_bytes / 1e9:.1f} GB in {res.host_seconds:.3f} s, peer {res.peer_bytes / 1e9:.1f} GB "
              f"in {res.peer_seconds:.3f} s, repaired {res.recovered_devices})")
        if mode == 0:
            # The replicas asleep on one host backup (the first GPU's), woken on
            # every GPU from it (vmmw_replicas_sleep / vmmw_replicas_wake).
            group = [(vw.Pool.default(k), f"multi-{name}") for k in range(n)]
            sl = vw.sleep_replicas(group)
            free = [torch.cuda.mem_get_info(k)[0] for k in range(n)]
            w = vw.wake_replicas_from_backup(group)
            bad, checked = check(args.dir, loaders, mode, n, kv_heads)
            status = "PASS" if bad == 0 else "FAIL"
            failures += bad
            print(f"{status} replicas woken from one backup on {n} GPUs: {checked / 1e9:.1f} GB checked against "
                  f"PyTorch slices, {bad} mismatches; backup {sl['backup_bytes'] / 1e9:.1f} GB from GPU 0 "
                  f"(sleep {sl['seconds']:.3f} s; free while asleep {', '.join(f'{f / 1e9:.0f}' for f in free)} GB); "
                  f"wake {w['seconds']:.3f} s, {w['gbps']:.1f} GB/s delivered (host {w['host_bytes'] / 1e9:.1f} GB "
                  f"in {w['host_seconds']:.3f} s, peer {w['peer_bytes'] / 1e9:.1f} GB in {w['peer_seconds']:.3f} s, "
                  f"map {w['map_seconds']:.3f} s, {w['direct_pairs']} direct pairs)")
        for ld in loaders:
            lib.vmmw_loader_free(ld)
    return 1 if failures else 0


def _allreduce_rank(rank, world, port, numel, q):
    import torch.distributed as dist

    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        with vt.use_pool("allreduce", device=rank):
            x = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=f"cuda:{rank}")
        rep = vt.report(rank)
        ours = vt.tag_usage(rep, "allreduce")["live_bytes"] >= numel * 4
        dist.all_reduce(x)
        torch.cuda.synchronize()
        want = world * (world + 1) / 2
        ok = bool(torch.all(x == want).item())
        dist.destroy_process_group()
        q.put((rank, ok, ours, ""))
    except Exception as e:  # reported by the parent
        q.put((rank, False, False, repr(e)))


def allreduce(args):
    import torch.multiprocessing as mp

    n = args.devices
    if torch.cuda.device_count() < n:
        print(f"SKIP: {torch.cuda.device_count()} GPUs visible, {n} needed")
        return 0
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_allreduce_rank, args=(r, n, port, args.numel, q)) for r in range(n)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    ok = all(r[1] and r[2] for r in results)
    print(f"{'PASS' if ok else 'FAIL'} all-reduce over {n} GPUs of {args.numel} floats in our pool through NCCL: "
          + "; ".join(f"rank {r}: sum {'right' if s else 'WRONG'}, in our pool {o} {m}" for r, s, o, m in results))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["load", "allreduce"])
    ap.add_argument("--dir", default="/root/vmmw-ckpt-8b")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--numel", type=int, default=64 << 20)
    args = ap.parse_args()
    return load(args) if args.what == "load" else allreduce(args)


if __name__ == "__main__":
    sys.exit(main())
