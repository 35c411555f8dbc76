#!/usr/bin/env python3
"""The interposer's end-to-end check: a CUDA program (tests/preload/twin.c)
run under libvmmw_preload.so with `vmmw exec`, slept and woken through its
control socket, its bytes, addresses and memory checked at every step.

The same script runs in CI on the host backend, the program linked against
the stand-in runtime (scripts/test.d/32-preload.sh), and on a GPU against
the real libcudart (scripts/gpu.d/88-preload.sh). Prints one line per check:
`PASS name: detail`, `FAIL name: detail` or `SKIP name: reason`, and, on
cuda, `FIGURE name: ...` lines with the timings as ratios against the link
measured in the same run. Exits 1 when any check failed.

Usage: twin.py --vmmw PATH --twin PATH --lib PATH [--backend host|cuda]
               [--workdir DIR] [--bytes N] [--late PATH]
"""
import argparse
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

MIB = 1 << 20
GRANULE = 2 * MIB
failed = []


def report(kind, name, detail=""):
    detail = " ".join(str(detail).split())
    print(f"{kind} {name}: {detail[:400]}", flush=True)
    if kind == "FAIL":
        failed.append(name)


def check(name, ok, detail=""):
    report("PASS" if ok else "FAIL", name, detail)
    return ok


def round_up(n, to):
    return (n + to - 1) // to * to


class Twin:
    """The program under `vmmw exec`, spoken to one line at a time."""

    def __init__(self, args, socket_path, extra_env=None, scope=None, name="twin"):
        env = dict(os.environ)
        env.update(extra_env or {})
        cmd = [args.vmmw, "exec", "--socket", socket_path, "--backend", args.backend, "--lib", args.lib]
        if scope:
            cmd += ["--scope", scope]
        cmd += ["--", args.twin]
        self.stderr_path = os.path.join(args.workdir, f"{name}.stderr")
        self.stderr = open(self.stderr_path, "w")
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.stderr, env=env, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.socket = socket_path

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def cmd(self, line, timeout=600):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        try:
            got = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the program did not answer `{line}` within {timeout} s")
        if got is None:
            raise RuntimeError(f"the program ended while asked `{line}` (exit {self.p.wait()}); "
                               f"stderr: {open(self.stderr_path).read()[-2000:]}")
        return got

    def ok(self, line, timeout=600):
        got = self.cmd(line, timeout)
        if not got.startswith("ok"):
            raise RuntimeError(f"`{line}` answered `{got}`")
        return dict(kv.split("=", 1) for kv in got.split()[1:] if "=" in kv), got

    def stderr_text(self):
        self.stderr.flush()
        return open(self.stderr_path).read()


class Control:
    """A raw connection to the control socket (the protocol by hand)."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.f = self.s.makefile("rwb")

    def send(self, obj_or_text):
        text = obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text)
        self.f.write((text + "\n").encode())
        self.f.flush()
        line = self.f.readline()
        if not line:
            raise RuntimeError(f"the control socket closed without answering {text[:100]}")
        return json.loads(line)

    def close(self):
        self.s.close()


def ctl(args, sock, *words):
    """`vmmw ctl SOCKET words...`: (exit code, stdout, stderr)."""
    r = subprocess.run([args.vmmw, "ctl", sock, *words], capture_output=True, text=True, timeout=900)
    return r.returncode, r.stdout, r.stderr


def wait_for(path, secs):
    end = time.time() + secs
    while time.time() < end:
        if os.path.exists(path):
            return True
        time.sleep(0.02)
    return False


def meminfo(t, dev):
    kv, _ = t.ok(f"meminfo {dev}")
    return int(kv["free"]), int(kv["total"])


def count(t, what, dev=-1):
    kv, _ = t.ok(f"count {what} {dev}")
    return int(kv["n"])


def tags_of(status, device=None):
    return [x for x in status["tags"] if device is None or x["device"] == device]


def main_flow(args):
    host = args.backend == "host"
    sock = os.path.join(args.workdir, "control.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    t = Twin(args, sock)
    info, _ = t.ok("info")
    devices = int(info["devices"])
    check("the runtime is the stand-in on host, a real one on cuda",
          (info["standin"] == "1") == host, f"devices={devices} standin={info['standin']}")
    check("the control socket appears before any allocation", wait_for(sock, 10), sock)
    c = Control(sock)
    s = c.send({"op": "status"})
    check("status before the first cudaMalloc: no allocations yet",
          s["ok"] and s["state"] == "awake" and s.get("note") == "no allocations yet" and s["tags"] == [],
          f"state={s.get('state')} note={s.get('note')}")
    r = c.send({"op": "sleep", "policy": "offload"})
    check("a sleep before any allocation is refused",
          not r["ok"] and r["code"] == "VMMW_INVALID_STATE" and "no allocations yet" in r["error"], r.get("error", ""))
    # Hostile lines on the live process change nothing and keep the connection.
    r1 = c.send("this is not json")
    r2 = c.send({"op": "explode"})
    r3 = c.send({"op": "sleep", "policy": "reload"})
    r4 = c.send({"op": "status", "extra": 1})
    s = c.send({"op": "status"})
    check("bad requests are refused with the reason, the connection stays usable",
          all(not r["ok"] and r["code"] == "VMMW_INVALID_ARGUMENT" for r in (r1, r2, r3, r4)) and s["ok"],
          "; ".join(r["error"][:60] for r in (r1, r2)))

    free0, total0 = meminfo(t, 0)
    if host:
        limit = int(os.environ["VMMW_HOST_MEMORY"].rstrip("M")) * MIB
        check("cudaMemGetInfo is answered by the pool's driver, not the runtime",
              total0 == limit and count(t, "meminfo") == 0, f"total={total0} (VMMW_HOST_MEMORY={limit})")
    else:
        check("cudaMemGetInfo answers the device", 0 < free0 <= total0, f"free={free0} total={total0}")

    # Sizes: on cuda about llama-server's resident bytes, within a quarter of the card.
    budget = args.bytes or (64 * MIB if host else min(17 << 30, total0 // 4))
    big = round_up(budget // 2, GRANULE) + 12345
    mt_max = max(3 * MIB, budget // 8)
    t.ok(f"allocmt 4 7 {mt_max} 100", timeout=900)
    t.ok(f"alloc big 0 {big} 7", timeout=900)
    free1, _ = meminfo(t, 0)
    check("cudaMemGetInfo moves as the pool's memory does (allocation)",
          free0 - free1 >= big, f"free {free0} -> {free1} after {big} bytes and more")
    pdev = 1 if devices > 1 else 0
    kv, _ = t.ok(f"pitch pit {pdev} 1000 33 9")
    check("cudaMallocPitch is ours with a 512-byte row pitch", kv["pitch"] == "1024", f"pitch={kv['pitch']}")
    t.ok("foreign fgn 0 1048576")
    t.ok("managed mgd 1048576")
    t.ok("host hst 1048576")
    if host:
        check("managed, host and runtime-made allocations went to the runtime",
              count(t, "managed") == 1 and count(t, "host") >= 1 and count(t, "malloc") == 1,
              f"stand-in malloc={count(t, 'malloc')} managed={count(t, 'managed')}")
    kv, _ = t.ok("verify all", timeout=900)
    check("every buffer holds its pattern after allocation", int(kv["checked"]) == 30, f"{kv['checked']} buffers, {kv['bytes']} bytes")

    s = c.send({"op": "status"})
    used = sorted({x["device"] for x in s["tags"]})
    live = sum(x["live_bytes"] for x in s["tags"])
    check("status: every device used, the process's tag, its live bytes",
          used == list(range(min(devices, 4))) and {x["tag"] for x in s["tags"]} == {"process"} and live >= big,
          f"devices {used}, live {live}")
    syncs = [count(t, "sync", d) for d in used] if host else None

    # Three cycles: offload, offload-compressed, discard.
    link = None
    if not host:
        kv, _ = t.ok(f"link {1 << 30}", timeout=300)
        link = (float(kv["h2d_gbps"]), float(kv["d2h_gbps"]))
        print(f"FIGURE link: host->device {link[0]:.1f} GB/s, device->host {link[1]:.1f} GB/s (pinned, 1 GiB)")
    for cycle, policy in enumerate(["offload", "offload", "offload_compressed", "discard"]):
        ours = sum(x["tracked_bytes"] for x in c.send({"op": "status"})["tags"])
        r = c.send({"op": "sleep", "policy": policy})
        if not check(f"sleep {policy} (cycle {cycle + 1})", r["ok"] and r["bytes"] == ours and r["synced_devices"] == used,
                     r.get("error") or f"{r['bytes']} bytes in {r['seconds']:.3f} s, sync {r['sync_seconds']:.4f} s"):
            raise RuntimeError("sleep failed")
        if host:
            after = [count(t, "sync", d) for d in used]
            check(f"each device used was synchronized (cudaDeviceSynchronize) before the sleep ({policy})",
                  all(a > b for a, b in zip(after, syncs)), f"sync counts {syncs} -> {after}")
            syncs = after
        s = c.send({"op": "status"})
        check(f"status while asleep ({policy})", s["state"] == "asleep" and all(x["asleep"] for x in s["tags"]) and
              (policy == "discard" or s["host_backup_bytes"] > 0),
              f"state={s['state']}, backup {s['host_backup_bytes']} bytes")
        free2, _ = meminfo(t, 0)
        check(f"cudaMemGetInfo: the sleep gave the memory back ({policy})", free2 - free1 >= big,
              f"free {free1} -> {free2}")
        asleep_probe = t.cmd("probe big")
        w = c.send({"op": "wake"})
        check(f"wake ({policy})", w["ok"] and w["bytes"] == r["bytes"],
              w.get("error") or f"{w['bytes']} bytes in {w['seconds']:.3f} s")
        awake_probe = t.cmd("probe big")
        if "unknown" in asleep_probe:
            report("SKIP", f"memory is inaccessible while asleep ({policy})", "no way to probe on this runtime")
        elif host or awake_probe == "ok readable":
            check(f"memory is inaccessible while asleep ({policy})", asleep_probe.startswith("ok faulted"), asleep_probe)
            check(f"memory is accessible after the wake ({policy})", awake_probe == "ok readable", awake_probe)
        else:
            # The byte comparison below proves the memory is back; a driver
            # whose MAPPED attribute says no for it cannot tell the asleep case.
            report("SKIP", f"memory is inaccessible while asleep ({policy})",
                   f"cuPointerGetAttribute(MAPPED) does not tell: asleep `{asleep_probe}`, awake `{awake_probe}`")
        free3, _ = meminfo(t, 0)
        tolerance = 64 * MIB if host else 512 * MIB
        check(f"cudaMemGetInfo: the wake took the memory again ({policy})", abs(free3 - free1) <= tolerance,
              f"free {free2} -> {free3} (before the sleep {free1})")
        if policy == "discard":
            t.ok("fill all 500", timeout=900)
        kv, _ = t.ok("verify all", timeout=900)
        check(f"every byte at the same address after the wake ({policy})", int(kv["checked"]) == 30,
              f"{kv['bytes']} bytes checked")
        if link and policy != "discard":
            sleep_gbps = r["bytes"] / r["seconds"] / 1e9
            wake_gbps = w["bytes"] / w["seconds"] / 1e9
            print(f"FIGURE {policy} cycle {cycle + 1}: {r['bytes'] / 1e9:.2f} GB; sleep {r['seconds']:.3f} s "
                  f"({sleep_gbps:.1f} GB/s = {sleep_gbps / link[1]:.3f} of device->host; sync {r['sync_seconds']:.4f} s), "
                  f"wake {w['seconds']:.3f} s ({wake_gbps:.1f} GB/s = {wake_gbps / link[0]:.3f} of host->device)", flush=True)

    # The CLI: the same operations through `vmmw ctl`.
    rc, out, err = ctl(args, sock, "sleep", "--policy", "offload-compressed")
    check("vmmw ctl sleep --policy offload-compressed", rc == 0 and out.startswith("slept"), (out or err).strip()[:200])
    rc, out, err = ctl(args, sock, "status", "--json")
    doc = json.loads(out) if rc == 0 else {}
    check("vmmw ctl status --json: one document, asleep", doc.get("state") == "asleep", f"exit {rc}")
    rc, out, err = ctl(args, sock, "wake", "--json")
    doc = json.loads(out) if rc == 0 else {}
    check("vmmw ctl wake --json", rc == 0 and doc.get("op") == "wake", f"exit {rc}")
    rc, out, err = ctl(args, sock, "sleep", "--tag", "nope")
    check("vmmw ctl: an unknown tag is refused, exit 1, nothing changes",
          rc == 1 and "unknown tag `nope`" in err and c.send({"op": "status"})["state"] == "awake",
          err.strip()[:200])
    rc, out, err = ctl(args, sock, "sleep", "--policy", "reload")
    check("vmmw ctl: a bad policy is bad input, exit 2", rc == 2, err.strip()[:120])
    rc, out, err = ctl(args, sock + ".missing", "status")
    check("vmmw ctl: a missing socket is bad input, exit 2", rc == 2, err.strip()[:120])

    # In-process: the program sleeps and wakes itself.
    kv, _ = t.ok("psleep 0")
    s = c.send({"op": "status"})
    kv2, _ = t.ok("pwake 0")
    check("vmmw_preload_sleep / vmmw_preload_wake from inside the process",
          kv["rc"] == "0" and s["state"] == "asleep" and kv2["rc"] == "0", f"rc {kv['rc']}, {kv2['rc']}")
    kv, _ = t.ok("verify all", timeout=900)
    check("bytes intact after the in-process cycle", int(kv["checked"]) == 30, "")

    # A wake without room: another tag takes the memory while asleep.
    r = c.send({"op": "sleep", "policy": "offload"})
    need = sum(x["bytes"] for x in r["tags"] if x["device"] == 0)
    free4, _ = meminfo(t, 0)
    other = (free4 - need // 2) // GRANULE * GRANULE
    check("settag: a thread's allocations under another tag", t.ok("settag other")[0]["rc"] == "0", "")
    t.ok(f"alloc other 0 {other} 0", timeout=900)
    t.ok("settag -")
    s = c.send({"op": "status"})
    check("status: the new tag awake beside the asleep one",
          any(x["tag"] == "other" and not x["asleep"] for x in s["tags"]) and s["state"] == "asleep", "")
    w = c.send({"op": "wake"})
    s = c.send({"op": "status"})
    procs = [x for x in s["tags"] if x["tag"] == "process"]
    check("a wake without room is refused: out of memory, nothing mapped",
          not w["ok"] and w["code"] == "VMMW_OUT_OF_MEMORY" and "wake" in w["error"], w.get("error", "")[:300])
    check("...and the process stays asleep with every backup intact",
          s["state"] == "asleep" and all(x["asleep"] for x in procs) and s["host_backup_bytes"] >= need,
          f"backup {s['host_backup_bytes']} bytes")
    check("...and the refusal is the status's last answer", s["last"] and s["last"]["ok"] is False, "")
    t.ok("freelater other 400")
    w = c.send({"op": "wake", "wait_memory_ms": 20000})
    check("a wake that waits for memory succeeds once it is released", w["ok"] and w["wait_seconds"] >= 0.2,
          w.get("error") or f"waited {w['wait_seconds']:.3f} s")
    kv, _ = t.ok("verify all", timeout=900)
    check("every byte intact after the refused and the waiting wake", int(kv["checked"]) == 30, "")

    # Frees: ours synchronize and release exactly; others go to the runtime.
    if host:
        base_free = count(t, "free")
    kv, _ = t.ok("free fgn")
    kv2, _ = t.ok("free mgd")
    kv3, _ = t.ok("freehost hst")
    kv4, _ = t.ok("freenull")
    check("cudaFree of runtime-made, managed and NULL pointers, cudaFreeHost: the runtime's",
          (kv["rc"], kv2["rc"], kv3["rc"], kv4["rc"]) == ("0", "0", "0", "0") and
          (not host or count(t, "free") == base_free + 1 and count(t, "free_null") >= 1), "")
    before, _ = meminfo(t, 0)
    if host:
        syncs = count(t, "sync", 0)
    kv, _ = t.ok("free big")
    after, _ = meminfo(t, 0)
    exact = round_up(big, GRANULE)
    check("cudaFree of ours releases its memory at once",
          kv["rc"] == "0" and (after - before == exact if host else after - before >= exact * 0.99),
          f"free {before} -> {after} ({exact} expected)")
    if host:
        check("...after synchronizing its device, not through the runtime's cudaFree",
              count(t, "sync", 0) > syncs and count(t, "free") == base_free + 1, "")
    kv, _ = t.ok("freeagain big")
    check("a second cudaFree of the same pointer: invalid value, as the runtime says", kv["rc"] == "1", f"rc {kv['rc']}")

    t.ok("forkexit")
    s = c.send({"op": "status"})
    check("a forked child's exit leaves the parent's socket alone",
          os.path.exists(sock) and Control(sock).send({"op": "status"})["ok"], "")
    i = s.get("interposer", {})
    check("status: the interposer's counts", i.get("state") == "ready" and i.get("scope") == "all" and
          i.get("refused") == 0 and i.get("allocations") == 29, json.dumps(i)[:300])
    kv, line = t.ok(f"edges {pdev}")
    # A free inside a block goes to the runtime: the stand-in says invalid value, any runtime refuses it.
    mids = (kv["mid_small"], kv["mid_big"])
    mid_ok = mids == ("1", "1") if host else "0" not in mids
    check("cudaMalloc of 0 bytes: the runtime's (success, NULL); sizes no device holds and overflowing "
          "pitches: out of memory; cudaFree inside a block of ours: refused, the block kept",
          mid_ok and (kv["zero"], kv["null"], kv["huge"], kv["huge2"], kv["pitch_over"], kv["freed"]) ==
          ("0", "1", "2", "2", "2", "0"), line)
    c.close()
    t.ok("quit")
    rc = t.p.wait(timeout=60)
    check("vmmw exec ends as the program did, the socket removed", rc == 0 and not os.path.exists(sock),
          f"exit {rc}")
    err = t.stderr_text()
    stray = [l for l in err.splitlines() if l.startswith("vmmw preload:") and not l.startswith("vmmw preload: control socket")]
    check("nothing printed by the interposer but the served sleeps and wakes", not stray, "; ".join(stray))


def scope_flow(args):
    """Region scope, a failed init, and exit codes and signals through vmmw exec."""
    host = args.backend == "host"
    sock = os.path.join(args.workdir, "region.sock")
    t = Twin(args, sock, scope="region", name="region")
    wait_for(sock, 10)
    c = Control(sock)
    t.ok("alloc outside 0 1048576 3")
    s = c.send({"op": "status"})
    check("region scope: an allocation outside a region goes to the runtime",
          s["tags"] == [] and (not host or count(t, "malloc") == 1), f"tags {s['tags']}")
    rc = t.cmd("region 1")
    t.ok("alloc inside 0 1048576 4")
    s = c.send({"op": "status"})
    check("region scope: inside a region it is ours", rc.startswith("ok") and len(s["tags"]) == 1,
          f"{rc}; tags {[x['tag'] for x in s['tags']]}")
    r = c.send({"op": "sleep"})
    w = c.send({"op": "wake"})
    kv, _ = t.ok("verify all")
    check("region scope: sleep and wake keep both buffers' bytes", r["ok"] and w["ok"] and kv["checked"] == "2", "")
    t.ok("free outside")
    t.ok("free inside")
    c.close()
    t.ok("quit")
    t.p.wait(timeout=60)

    if host:
        sock = os.path.join(args.workdir, "bad.sock")
        t = Twin(args, sock, extra_env={"VMMW_PRELOAD_SCOPE": "bogus"}, name="bad")
        wait_for(sock, 10)
        t.ok("alloc a 0 4096 1")
        c = Control(sock)
        s = c.send({"op": "status"})
        r = c.send({"op": "sleep"})
        t.ok("free a")
        c.close()
        t.ok("quit")
        t.p.wait(timeout=60)
        err = t.stderr_text()
        check("a failed init passes everything to the runtime and says why once",
              err.count("goes to the CUDA runtime unchanged") == 1 and "VMMW_PRELOAD_SCOPE" in err and
              s["interposer"]["state"].startswith("passing") and not r["ok"], err.strip()[-200:])

    r = subprocess.run([args.vmmw, "exec", "--lib", args.lib, "--", "sh", "-c", "exit 7"], capture_output=True, timeout=60)
    check("vmmw exec passes the exit code on", r.returncode == 7, f"exit {r.returncode}")
    r = subprocess.run([args.vmmw, "exec", "--lib", args.lib, "--", "sh", "-c", "kill -TERM $$"], capture_output=True, timeout=60)
    check("vmmw exec ends by the program's signal", r.returncode == -signal.SIGTERM, f"exit {r.returncode}")
    p = subprocess.Popen([args.vmmw, "exec", "--lib", args.lib, "--", "sleep", "30"], stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    m = re.search(r"control socket (\S+)", line)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    t0 = time.time()
    rc = p.wait(timeout=20)
    check("vmmw exec passes a signal sent to it on to the program", rc == -signal.SIGTERM and time.time() - t0 < 10,
          f"exit {rc} after {time.time() - t0:.2f} s")
    check("vmmw exec removes the socket directory it made",
          m is not None and not os.path.exists(os.path.dirname(m.group(1))), m.group(1) if m else line)
    r = subprocess.run([args.vmmw, "exec", "--lib", args.lib + ".missing", "--", "true"], capture_output=True, text=True)
    check("vmmw exec: a missing library is bad input, exit 2", r.returncode == 2 and "cannot find" in r.stderr, r.stderr.strip()[:200])


def churn_flow(args):
    """Threads of the program allocate and free (never touching the memory)
    while the socket sleeps and wakes it again and again: every cudaMalloc
    served or refused as out of memory, every cudaFree of ours succeeds,
    the resident buffers keep their bytes."""
    sock = os.path.join(args.workdir, "churn.sock")
    t = Twin(args, sock, name="churn")
    t.ok("alloc r0 0 5000000 11")
    t.ok("alloc r1 0 3000 12")
    wait_for(sock, 10)
    c = Control(sock)
    t.ok("churn 8 3000")
    cycles, bad = 0, []
    end = time.time() + 2.5
    while time.time() < end:
        for op in ({"op": "sleep", "policy": "offload"}, {"op": "wake"},
                   {"op": "sleep", "policy": "offload"}, {"op": "wake", "wait_memory_ms": 100}):
            r = c.send(op)
            if not r["ok"] and r["code"] != "VMMW_OUT_OF_MEMORY":
                bad.append(r["error"][:160])
        cycles += 1
    if c.send({"op": "status"})["state"] != "awake":
        c.send({"op": "wake", "wait_memory_ms": 5000})
    kv, line = t.ok("churnwait", timeout=120)
    check("allocations and frees of 8 threads across sleeps and wakes: served or refused, never lost",
          int(kv["served"]) > 0 and kv["other"] == "0" and kv["free_failed"] == "0" and not bad,
          f"{cycles} cycles; {line}; {bad[:2]}")
    kv, _ = t.ok("verify all")
    s = c.send({"op": "status"})
    check("...and the buffers kept through it hold their bytes, nothing else left allocated",
          kv["checked"] == "2" and s["interposer"]["allocations"] == 2, f"{kv}; {s['interposer']}")
    c.close()
    t.ok("quit")
    t.p.wait(timeout=60)


def signal_flow(args):
    """The interposer's threads (the control socket's, its log's) leave the
    program's signals alone: a program that blocks a signal in every thread
    of its own and takes it with sigwait gets every one."""
    if args.backend != "host":
        report("SKIP", "the interposer's threads take no signal of the program's",
               "host only: the CUDA runtime's own threads are not the interposer's to check")
        return
    sock = os.path.join(args.workdir, "signal.sock")
    t = Twin(args, sock, name="signal")
    t.ok("alloc s 0 4194304 5")
    wait_for(sock, 10)
    c = Control(sock)
    r, w = c.send({"op": "sleep"}), c.send({"op": "wake"})
    try:
        got = t.cmd("sigwait 20", timeout=120)
    except RuntimeError as e:
        got = str(e)
    check("the interposer's threads take no signal of the program's (sigwait gets all 20)",
          r["ok"] and w["ok"] and got == "ok got=20", got[:300])
    c.close()
    if t.p.poll() is None:
        t.ok("quit")
    t.p.wait(timeout=60)


def late_flow(args):
    """A program that loads its runtime late (tests/preload/late.c, as Python
    does): probing the interposer first must not turn it off for good; the
    socket is served at the first intercepted call."""
    if not args.late:
        report("SKIP", "a runtime loaded late", "no --late program (the host twin builds it)")
        return
    runtime = os.path.join(os.path.dirname(args.twin), "libvmmw_standin_cudart.so")
    sock = os.path.join(args.workdir, "late.sock")
    cmd = [args.vmmw, "exec", "--socket", sock, "--backend", args.backend, "--lib", args.lib,
           "--", args.late, runtime]
    stderr = open(os.path.join(args.workdir, "late.stderr"), "w")
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
    probed = p.stdout.readline().strip()
    check("a program without a runtime may ask for its region and tag",
          probed == "probed region=0 tag=process", probed)
    allocated = p.stdout.readline().strip()
    doc = json.loads(allocated.split(" ", 3)[3]) if allocated.startswith("allocated rc=0 ") else {}
    i = doc.get("interposer", {})
    check("...and its first cudaMalloc once the runtime is loaded is ours",
          i.get("state") == "ready" and i.get("allocations") == 1, allocated[:300])
    check("...and the socket is served from then on", " socket_var=0 " in allocated and wait_for(sock, 10), sock)
    ok = False
    if os.path.exists(sock):
        c = Control(sock)
        r, w = c.send({"op": "sleep"}), c.send({"op": "wake"})
        ok = r["ok"] and w["ok"]
        c.close()
    p.stdin.write("go\n")
    p.stdin.flush()
    verified = p.stdout.readline().strip()
    check("...and sleeps and wakes with its bytes", ok and verified == "verified ok", verified)
    p.wait(timeout=60)


def bench_flow(args):
    """cuda only: cudaMalloc and cudaFree under the interposer against the runtime's own, same sizes."""
    out = {}
    budget = args.bytes or (17 << 30)
    big_n = max(4, min(64, budget // (256 * MIB)))
    for label, preload in (("runtime", False), ("interposer", True)):
        env = dict(os.environ)
        if preload:
            cmd = [args.vmmw, "exec", "--backend", args.backend, "--lib", args.lib, "--", args.twin]
        else:
            cmd = [args.twin]
        p = subprocess.run(cmd, input=f"mallocbench {big_n} 268435456\nmallocbench 256 1048576\nquit\n",
                           capture_output=True, text=True, env=env, timeout=600)
        lines = [l for l in p.stdout.splitlines() if l.startswith("ok malloc")]
        if len(lines) != 2:
            report("FAIL", "cudaMalloc timing", f"{label}: {p.stdout[-300:]} {p.stderr[-300:]}")
            return
        out[label] = [dict(kv.split("=") for kv in l.split()[1:]) for l in lines]
    for i, what in enumerate([f"{big_n} x 256 MiB", "256 x 1 MiB"]):
        r, o = out["runtime"][i], out["interposer"][i]
        print(f"FIGURE cudaMalloc {what}: median malloc {float(o['malloc_us']):.1f} us vs runtime "
              f"{float(r['malloc_us']):.1f} us ({float(o['malloc_us']) / float(r['malloc_us']):.2f}x), "
              f"free {float(o['free_us']):.1f} us vs {float(r['free_us']):.1f} us", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vmmw", required=True)
    ap.add_argument("--twin", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--backend", default="host", choices=["host", "cuda"])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--late", default=None, help="tests/preload/late.c built (host only)")
    args = ap.parse_args()
    args.vmmw, args.twin, args.lib = (os.path.abspath(p) for p in (args.vmmw, args.twin, args.lib))
    args.late = os.path.abspath(args.late) if args.late and args.backend == "host" else None
    if args.workdir is None:
        import tempfile
        args.workdir = tempfile.mkdtemp(prefix="vmmw-twin-")
    os.makedirs(args.workdir, exist_ok=True)
    if args.backend == "host":
        os.environ.setdefault("VMMW_HOST_MEMORY", "512M")
        os.environ.setdefault("VMMW_STANDIN_DEVICES", "2")
    for flow in (main_flow, scope_flow, churn_flow, signal_flow, late_flow) + ((bench_flow,) if args.backend == "cuda" else ()):
        try:
            flow(args)
        except Exception as e:  # a flow that cannot go on is one failure, the others still run
            report("FAIL", flow.__name__, f"{type(e).__name__}: {e}")
    print(f"{'FAILED' if failed else 'PASSED'}: {len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
