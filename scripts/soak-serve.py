#!/usr/bin/env python3
"""Soak of `vmmw serve` on the host backend, loopback only, bounded in time.

Importers (separate processes) attach over the wire (SCM_RIGHTS), map the
memfds read-only, check the bytes against the checkpoint of the version the
owner announced, and detach, in a loop; slow importers attach and read no
notice; junk clients connect and stay silent, send garbage, or hang up
mid-handshake; the owner is sent SIGHUP after rewriting the checkpoint.
Every few seconds the server's descriptors, threads, RSS and CPU are sampled;
once a minute all clients pause and the server's CPU over the quiet window is
measured. Exit 1 on a wrong byte or a counter that keeps growing.

usage: soak-serve.py VMMW_BINARY [--seconds N] [--importers N] [--slow-hold S] [--out FILE]
"""
import argparse, json, mmap, multiprocessing as mp, os, random, signal, socket, struct
import subprocess, sys, tempfile, time

MAGIC = b"VMMWSHR1"
TENSORS = [("a", 1 << 18), ("b", 1 << 19), ("c", 3 << 17), ("d", 1 << 16)]  # F32 elements


def content(version):
    """The checkpoint's data bytes for `version` (each tensor a pattern of it)."""
    out = {}
    for i, (name, n) in enumerate(TENSORS):
        unit = struct.pack("<I", (version * 2654435761 + i * 40503) & 0xFFFFFFFF)
        out[name] = unit * n
    return out


def write_checkpoint(path, version):
    data = content(version)
    header, at = {}, 0
    for name, n in TENSORS:
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [at, at + 4 * n]}
        at += 4 * n
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, _ in TENSORS:
            f.write(data[name])
    os.rename(tmp, path)


def recv_exact(s, n, fds):
    buf = b""
    while len(buf) < n:
        msg, anc, _, _ = socket.recv_fds(s, n - len(buf), 64)
        fds.extend(anc)
        if not msg:
            raise EOFError("closed after %d of %d bytes" % (len(buf), n))
        buf += msg
    return buf


def attach(path, timeout=10.0):
    """(manifest, maps, sock, early notices) or raises."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    s.sendall(b"r")
    fds = []
    head = recv_exact(s, 16, fds)
    assert head[:8] == MAGIC, head
    (n,) = struct.unpack("<Q", head[8:])
    hello = json.loads(recv_exact(s, n, fds))
    if "refused" in hello:
        s.close()
        raise RuntimeError("refused: " + hello["refused"])
    m = hello["manifest"]
    while len(fds) < len(m["chunks"]):
        recv_exact(s, 1, fds)
    notices = []
    while True:
        b = recv_exact(s, 1, fds)
        if b == b"E":
            break
        if b == b"V":
            notices.append(("V", struct.unpack("<Q", recv_exact(s, 8, fds))[0]))
        else:
            notices.append((b.decode(), None))
    maps = []
    for fd, size in zip(fds, m["chunks"]):
        maps.append(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ))
        os.close(fd)
    return m, maps, s, notices


def read_tensors(m, maps):
    flat = b"".join(bytes(x) for x in maps)
    out = {}
    for t in m["tensors"]:
        n = 4
        for d in t["shape"]:
            n *= d
        out[t["name"]] = flat[t["offset"]:t["offset"] + n]
    return out


def poll_notices(s):
    s.setblocking(False)
    got = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                got += b"!"
                break
            got += b
    except BlockingIOError:
        pass
    s.setblocking(True)
    return got


def parse_notices(raw):
    """Raw notice bytes -> [(kind, version or None)]: `V` + u64, `R`, `X`, `!` (closed)."""
    out, i = [], 0
    while i < len(raw):
        k = raw[i:i + 1]
        if k == b"V":
            if i + 9 > len(raw):
                break
            out.append(("V", struct.unpack("<Q", raw[i + 1:i + 9])[0]))
            i += 9
        else:
            out.append((k.decode("latin-1"), None))
            i += 1
    return out


def last_version(raw):
    """The last `V` notice in raw notice bytes, as an early-notice list."""
    vs = [n for n in parse_notices(raw) if n[0] == "V"]
    return vs[-1:]


def kinds(raw):
    return {k for k, _ in parse_notices(raw)}


def importer(path, stop, pause, stats):
    rng = random.Random(os.getpid())
    while not stop.is_set():
        if pause.is_set():
            time.sleep(0.05)
            continue
        try:
            m, maps, s, early = attach(path)
        except Exception as e:  # refused while over the bound, or server reloading
            with stats.get_lock():
                stats[2] += 1
            time.sleep(0.05)
            continue
        ok = False
        # Reloads come every second and each rewrites the tensors in place
        # before its publish: a read that overlaps one is torn and followed
        # by a `V`; read again then. Wrong means: no publish follows within 5 s.
        for _ in range(50):
            version = m["version"]
            for kind, v in early:
                if kind == "V":
                    version = v
            data = read_tensors(m, maps)
            later = poll_notices(s)
            if kinds(later) & {"R", "X"}:
                ok = True  # revoked: allowed outcome
                with stats.get_lock():
                    stats[3] += 1
                break
            if "V" in kinds(later):
                early = last_version(later)
                continue  # a publish came while reading: read again
            if data == content(version):
                ok = True
                break
            # A reload may be in flight (bytes ahead of the version): its
            # publish must follow.
            deadline = time.time() + 5
            while time.time() < deadline and "V" not in kinds(later):
                time.sleep(0.05)
                later += poll_notices(s)
            if "V" not in kinds(later):
                break
            early = last_version(later)
        with stats.get_lock():
            stats[0] += 1
            if not ok:
                stats[1] += 1
                seen = {n: [v for v in range(max(1, version - 5), version + 6)
                            if content(v)[n] == b] for n, b in data.items()}
                print("WRONG BYTES at version %d: tensors match versions %s" % (version, seen),
                      file=sys.stderr, flush=True)
        for x in maps:
            x.close()
        s.close()
        time.sleep(rng.random() * 0.05)


def slow_importer(path, stop, pause, stats, hold, published):
    """Attach and read no notice for `hold` seconds. Past about a hundred
    publishes the owner must evict it (`X`); before that every publish must
    be in its queue: never a silent drop."""
    while not stop.is_set():
        p0 = published.value
        try:
            m, maps, s, _ = attach(path)
        except Exception:
            time.sleep(0.2)
            continue
        t0 = time.time()
        while time.time() - t0 < hold and not stop.is_set():
            time.sleep(0.2)
        got = b""
        while True:  # drain everything queued
            more = poll_notices(s)
            got += more
            if not more or more.endswith(b"!"):
                break
        time.sleep(0.5)  # a publish under way when the hold ended lands
        got += poll_notices(s)
        p1 = published.value
        seen = sum(1 for k, _ in parse_notices(got) if k == "V")
        with stats.get_lock():
            if "X" in kinds(got):
                stats[4] += 1
            elif not stop.is_set() and abs(seen - (p1 - p0)) > 1:
                stats[5] += 1  # neither evicted nor told of every publish
                print("SLOW IMPORTER: %d publishes, %d notices, no eviction" % (p1 - p0, seen),
                      file=sys.stderr, flush=True)
        for x in maps:
            x.close()
        s.close()


def junk(path, stop, pause):
    rng = random.Random(os.getpid())
    while not stop.is_set():
        if pause.is_set():
            time.sleep(0.05)
            continue
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            k = rng.randrange(4)
            if k == 1:
                s.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
            elif k == 2:
                s.sendall(b"r")
                s.recv(7)  # hang up mid-handshake
            elif k == 3:
                time.sleep(rng.random() * 2)  # silent
            s.close()
        except OSError:
            pass
        time.sleep(rng.random() * 0.1)


def sample(pid):
    fds = len(os.listdir("/proc/%d/fd" % pid))
    threads = len(os.listdir("/proc/%d/task" % pid))
    rss = 0
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    cpu = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return fds, threads, rss, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vmmw")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--importers", type=int, default=16)
    ap.add_argument("--out", default=None)
    ap.add_argument("--slow-hold", type=float, default=200, help="seconds a slow importer reads nothing")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="vmmw-soak-")
    ckpt, sock = os.path.join(d, "model.safetensors"), os.path.join(d, "serve.sock")
    version = 1
    write_checkpoint(ckpt, version)
    env = dict(os.environ, VMMW_BACKEND="host")
    log = open(os.path.join(d, "serve.log"), "w")
    srv = subprocess.Popen([a.vmmw, "serve", ckpt, "--socket", sock, "--policy", "revoke"],
                           stdout=subprocess.PIPE, stderr=log, env=env, text=True)
    line = srv.stdout.readline()
    assert line.startswith("serving"), line
    stop, pause = mp.Event(), mp.Event()
    # reads, wrong, failed attaches, revoked reads, slow importers evicted, slow ones not
    stats = mp.Array("q", 6)
    procs = [mp.Process(target=importer, args=(sock, stop, pause, stats)) for _ in range(a.importers)]
    published = mp.Value("q", 0)
    procs += [mp.Process(target=slow_importer, args=(sock, stop, pause, stats, a.slow_hold, published))
              for _ in range(2)]
    procs += [mp.Process(target=junk, args=(sock, stop, pause)) for _ in range(2)]
    for p in procs:
        p.start()
    t0 = time.time()
    samples, quiet = [], []
    next_reload, next_quiet = t0 + 2, t0 + 30
    while time.time() - t0 < a.seconds:
        now = time.time()
        if now >= next_reload:
            version += 1
            write_checkpoint(ckpt, version)
            srv.send_signal(signal.SIGHUP)
            line = srv.stdout.readline()
            assert line.startswith("reloaded"), line
            published.value += 1
            next_reload = now + 1.0
        if now >= next_quiet:
            pause.set()
            time.sleep(3)  # slow importers stay attached; the others finish
            c0 = sample(srv.pid)[3]
            time.sleep(5)
            quiet.append(sample(srv.pid)[3] - c0)
            pause.clear()
            next_quiet = time.time() + 60
        samples.append((time.time() - t0,) + sample(srv.pid))
        time.sleep(0.5)
    stop.set()
    for p in procs:
        p.join(30)
    time.sleep(2)
    end = sample(srv.pid)
    srv.send_signal(signal.SIGTERM)
    srv.wait(30)
    log.close()
    text = open(os.path.join(d, "serve.log")).read()
    # Growth: the last quarter's peak against the first quarter's peak.
    q = max(1, len(samples) // 4)
    first, last = samples[:q], samples[-q:]
    peak = lambda rows, i: max(r[i] for r in rows)
    res = {
        "seconds": round(time.time() - t0),
        "importers": a.importers, "slow_importers": 2, "junk_clients": 2,
        "reloads": version - 1,
        "importer_reads": stats[0], "wrong_bytes": stats[1],
        "failed_attaches": stats[2], "revoked_reads": stats[3],
        "slow_importers_evicted": stats[4], "slow_importers_dropped_silently": stats[5],
        "attach_lines": text.count(": attach "), "evicted_lines": text.count(": evicted "),
        "refused_lines": text.count(": refused "),
        "fds_first_quarter_peak": peak(first, 1), "fds_last_quarter_peak": peak(last, 1),
        "fds_after_clients_left": end[0],
        "threads_first_quarter_peak": peak(first, 2), "threads_last_quarter_peak": peak(last, 2),
        "threads_after_clients_left": end[1],
        "rss_kib_first_quarter_peak": peak(first, 3), "rss_kib_last_quarter_peak": peak(last, 3),
        "rss_kib_after_clients_left": end[2],
        "cpu_seconds_total": round(end[3], 2),
        "cpu_seconds_per_5s_quiet_window": [round(x, 2) for x in quiet],
        "serve_exit": srv.returncode,
    }
    out = json.dumps(res, indent=1)
    print(out)
    if a.out:
        open(a.out, "w").write(out + "\n")
    bad = (res["wrong_bytes"] > 0 or res["serve_exit"] != 0 or res["slow_importers_dropped_silently"] > 0
           or res["fds_last_quarter_peak"] > res["fds_first_quarter_peak"] + 8
           or res["threads_last_quarter_peak"] > res["threads_first_quarter_peak"] + 8
           or res["rss_kib_last_quarter_peak"] > res["rss_kib_first_quarter_peak"] * 1.5 + 4096
           or any(x > 0.1 for x in quiet))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
