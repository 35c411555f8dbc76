#!/usr/bin/env python3
"""An unmodified llama-server on vmmweights memory, measured against the
alternatives in the same run (docs/PRELOAD.md, bench/results/llama.md).

llama-server runs under `vmmw exec` (the CUDA runtime interposer): its
cudaMalloc'd weights, KV cache and compute buffers live in our pool, and the
control socket sleeps and wakes them. Phases, each reported on its own line
(PASS, FAIL, SKIP or INFO) and in the JSON written with --out:

  link       host<->device copy rates of pinned memory (torch), the reference
             every rate here is divided by
  outputs    the small model of the same architecture: greedy tokens of a
             plain llama-server equal those under the interposer, and those
             after an Offload and an OffloadCompressed round trip
  cycle      the big model: the bytes resident in our memory, the first sleep
             and wake, then steady cycles, each against the link (target 0.9)
  soak       N sleep/wake cycles (default 100): greedy tokens equal to those
             before, device memory and pinned host memory flat
  cache      a long prompt (8k tokens) asked again after a sleep/wake round
             trip is served from the KV cache (timings.prompt_n)
  ttft       time to first token after an idle period: waking our sleeping
             server, against llama.cpp's own --sleep-idle-seconds reload and
             against a llama-swap-style process restart (target 10x faster)

    python3 tests/llama/proof.py --server .llama/build/bin/llama-server \
        --vmmw .gpu/vmmw --model big.gguf --small small.gguf --out proof.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

RESULTS: list[dict] = []


def say(status: str, name: str, detail: str, **fig) -> None:
    RESULTS.append({"status": status, "name": name, "detail": detail, **fig})
    print(f"{status} {name}: {detail}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ctl:
    """The interposer's control socket: one JSON object a line each way."""

    def __init__(self, path: str):
        self.path = path

    def __call__(self, op: str, timeout: float = 300.0, **kw) -> dict:
        req = json.dumps({"op": op, **kw}) + "\n"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(self.path)
            s.sendall(req.encode())
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
        ans = json.loads(buf)
        if not ans.get("ok"):
            raise RuntimeError(f"control {op}: {ans.get('code')}: {ans.get('error')}")
        return ans


class Server:
    """One llama-server process (under the interposer when `vmmw` is given)."""

    def __init__(self, a, model: str, log: Path, interposed: bool, extra: list[str] = ()):
        self.dry = bool(a.assume_link)
        self.port = free_port()
        self.sock = None
        cmd = [
            a.server, "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
            "-ngl", "999", "-c", str(a.ctx), "-np", "1", "--seed", "1", *extra,
        ]
        env = dict(os.environ)
        if interposed:
            self.sock = str(Path(tempfile.mkdtemp(prefix="vmmw-llama-")) / "control.sock")
            cmd = [a.vmmw, "exec", "--socket", self.sock, "--", *cmd]
        self.log = open(log, "ab")
        self.log.write(f"\n$ {' '.join(cmd)}\n".encode())
        self.log.flush()
        self.t_start = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.ctl = Ctl(self.sock) if self.sock else None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, timeout: float = 300.0) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} while starting; see its log")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - self.t_start
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"llama-server not ready after {timeout} s")

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url(path), timeout=30) as r:
            return json.loads(r.read())

    def complete(self, prompt, n_predict: int, timeout: float = 600.0, cache: bool = True) -> dict:
        body = {
            "prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
            "seed": 1, "cache_prompt": cache, "return_tokens": True, "stream": False,
        }
        req = urllib.request.Request(self.url("/completion"), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def first_token(self, prompt, n_predict: int = 4, timeout: float = 600.0) -> tuple[float, dict]:
        """Seconds from the request to the first streamed token, and the last chunk."""
        body = {
            "prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
            "seed": 1, "cache_prompt": True, "stream": True,
        }
        req = urllib.request.Request(self.url("/completion"), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        first = None
        last: dict = {}
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if first is None and (chunk.get("content") or chunk.get("tokens")):
                    first = time.perf_counter() - t0
                last = chunk
                if chunk.get("stop"):
                    break
        return (first if first is not None else time.perf_counter() - t0), last

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def proc_mem(pid: int) -> dict:
    """The server's VmRSS, VmLck and VmPin (kB) from /proc: pinned host memory shows there."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmLck", "VmPin"):
                out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def server_pid(srv: Server) -> int:
    """The llama-server process: `vmmw exec` runs it as its child (it stays
    to forward signals and remove the socket). Without a child found, the
    process we started, named in the report."""
    me = srv.proc.pid
    try:
        kids = Path(f"/proc/{me}/task/{me}/children").read_text().split()
    except OSError:
        kids = []
    return int(kids[0]) if len(kids) == 1 else me


def ours(status: dict) -> int:
    return sum(t.get("tracked_bytes", 0) for t in status.get("tags", []))


def device_used(srv: "Server") -> int:
    """The card's used memory (every process). In a dry run without a GPU,
    the interposed server's device as its control socket reports it."""
    if srv.dry:
        dev = srv.ctl("status")["devices"][0]
        return dev["total"] - dev["free"]
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free


# ---------------------------------------------------------------- phases


def phase_link(a, fig: dict) -> None:
    if a.assume_link:
        h2d, d2h = (float(x) * 1e9 for x in a.assume_link.split(":"))
        fig["link_h2d"], fig["link_d2h"] = h2d, d2h
        say("INFO", "link", f"assumed {h2d / 1e9:.1f} / {d2h / 1e9:.1f} GB/s: a dry run of this harness "
            "(the stand-in server, no GPU); its ratios mean nothing")
        return
    import torch

    n = a.link_gib << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host.fill_(7)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    rates = {"h2d": [], "d2h": []}
    for _ in range(4):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        rates["h2d"].append(n / (time.perf_counter() - t))
        t = time.perf_counter()
        host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize()
        rates["d2h"].append(n / (time.perf_counter() - t))
    fig["link_h2d"] = statistics.median(rates["h2d"][1:])
    fig["link_d2h"] = statistics.median(rates["d2h"][1:])
    del host, dev
    torch.cuda.empty_cache()
    say("INFO", "link", f"pinned host->device {fig['link_h2d'] / 1e9:.1f} GB/s, device->host "
        f"{fig['link_d2h'] / 1e9:.1f} GB/s ({a.link_gib} GiB, median of 3)",
        h2d=fig["link_h2d"], d2h=fig["link_d2h"])


PROMPT = "The history of the river begins in the mountains, where"


def greedy(srv: "Server", n: int) -> list:
    """Greedy tokens with the whole prompt computed every time. A prompt
    served from the KV cache has its last token evaluated alone, through
    other kernels than a batch: their rounding can flip a greedy choice of a
    random-weight model, so answers that must match are computed one way."""
    return srv.complete(PROMPT, n, cache=False)["tokens"]


def phase_outputs(a, fig: dict, logdir: Path) -> None:
    if not a.small:
        say("SKIP", "outputs", "no --small model given")
        return
    plain = Server(a, a.small, logdir / "llama-small.log", interposed=False)
    try:
        plain.wait_ready()
        ref = greedy(plain, 48)
    finally:
        plain.stop()
    srv = Server(a, a.small, logdir / "llama-small.log", interposed=True)
    try:
        srv.wait_ready()
        got = greedy(srv, 48)
        checks = {"interposed": got == ref}
        st = srv.ctl("status")
        for pol in ("offload", "offload_compressed"):
            srv.ctl("sleep", policy=pol)
            srv.ctl("wake")
            checks[pol] = greedy(srv, 48) == ref
        ok = all(checks.values())
        say("PASS" if ok else "FAIL", "outputs: small model, greedy tokens",
            f"plain llama-server = interposed = after offload and offload_compressed round trips: {checks}; "
            f"{ours(st) / 1e6:.0f} MB in our pool", checks=checks)
    finally:
        srv.stop()


def cycle_once(srv: Server, policy: str) -> tuple[dict, dict]:
    s = srv.ctl("sleep", policy=policy)
    w = srv.ctl("wake")
    return s, w


def phase_big(a, fig: dict, logdir: Path) -> None:
    """cycle, soak and cache on one interposed server of the big model."""
    srv = Server(a, a.model, logdir / "llama-big.log", interposed=True)
    try:
        fig["start_s"] = srv.wait_ready()
        ref = greedy(srv, 32)
        st = srv.ctl("status")
        resident = ours(st)
        fig["resident_bytes"] = resident
        say("INFO", "cycle: resident", f"{resident / 1e9:.2f} GB of weights, KV cache and buffers in our pool; "
            f"device used {device_used(srv) / 1e9:.2f} GB in all (the rest is ggml's own VMM pool, cuBLAS and the "
            f"context); server ready in {fig['start_s']:.1f} s", resident=resident)
        rows = []
        for policy in ("offload", "offload_compressed"):
            for k in range(a.cycles_timed + 1):
                s, w = cycle_once(srv, policy)
                rows.append({"policy": policy, "k": k, "sleep_s": s["seconds"], "sync_s": s.get("sync_seconds"),
                             "wake_s": w["seconds"], "bytes": s.get("bytes", resident),
                             "backup_bytes": s.get("backup_bytes")})
        for policy in ("offload", "offload_compressed"):
            mine = [r for r in rows if r["policy"] == policy]
            first, steady = mine[0], mine[1:]
            sl = statistics.median(r["sleep_s"] for r in steady)
            wk = statistics.median(r["wake_s"] for r in steady)
            nbytes = first["bytes"]
            rs = nbytes / sl / fig["link_d2h"]
            rw = nbytes / wk / fig["link_h2d"]
            target = 0.9
            ok = rs >= target and rw >= target
            verdict = "INFO" if a.assume_link else ("PASS" if ok else "FAIL")  # a dry run's rates mean nothing
            say(verdict, f"cycle: {policy} sleep/wake vs link",
                f"{nbytes / 1e9:.2f} GB: first sleep {first['sleep_s']:.3f} s, wake {first['wake_s']:.3f} s; "
                f"steady (median of {len(steady)}) sleep {sl:.3f} s = {rs:.3f} of device->host, wake {wk:.3f} s = "
                f"{rw:.3f} of host->device (target {target}); backup {(first['backup_bytes'] or 0) / 1e9:.2f} GB",
                policy=policy, sleep_ratio=rs, wake_ratio=rw, rows=mine)
        after = greedy(srv, 32)
        say("PASS" if after == ref else "FAIL", "cycle: greedy tokens after the timed cycles",
            "equal" if after == ref else f"differ: {after[:8]} vs {ref[:8]}")

        # soak
        pid = server_pid(srv)
        if pid == srv.proc.pid:
            say("INFO", "soak", "llama-server's pid not found under vmmw exec: the RSS below is vmmw exec's")
        cycle_once(srv, "offload")  # the timed cycles ended on another policy: its backup has another size
        used0, mem0 = device_used(srv), proc_mem(pid)
        host0 = srv.ctl("status").get("host_backup_bytes")
        t = time.perf_counter()
        for _ in range(a.soak):
            cycle_once(srv, "offload")
        soak_s = time.perf_counter() - t
        used1, mem1 = device_used(srv), proc_mem(pid)
        host1 = srv.ctl("status").get("host_backup_bytes")
        after = greedy(srv, 32)
        flat_dev = abs(used1 - used0) <= (64 << 20)
        flat_host = host0 == host1 and abs(mem1.get("VmRSS", 0) - mem0.get("VmRSS", 0)) <= 256 * 1024
        ok = after == ref and flat_dev and flat_host
        say("PASS" if ok else "FAIL", f"soak: {a.soak} offload cycles",
            f"greedy tokens {'equal' if after == ref else 'DIFFER'}; device used {used0 / 1e9:.3f} -> {used1 / 1e9:.3f} GB; "
            f"pinned backup {host0} -> {host1} bytes; server VmRSS {mem0.get('VmRSS')} -> {mem1.get('VmRSS')} kB; "
            f"{soak_s:.1f} s", used0=used0, used1=used1, host0=host0, host1=host1, mem0=mem0, mem1=mem1)

        # cache: a long prompt of token ids, asked again after a round trip
        import random

        rnd = random.Random(7)
        long_prompt = [rnd.randrange(1000, 150000) for _ in range(a.long_tokens)]
        r1 = srv.complete(long_prompt, 8)
        # The same prompt again, awake: served from the cache (its last token
        # evaluated alone), the answer a cached ask must give.
        r_cached = srv.complete(long_prompt, 8)
        srv.ctl("sleep", policy="offload")
        srv.ctl("wake")
        r2 = srv.complete(long_prompt, 8)
        n1, n2 = r1["timings"]["prompt_n"], r2["timings"]["prompt_n"]
        n_cached = r_cached["timings"]["prompt_n"]
        same = r_cached["tokens"] == r2["tokens"]
        ok = n1 >= a.long_tokens - 1 and n_cached <= 16 and n2 <= 16 and same
        say("PASS" if ok else "FAIL", f"cache: {a.long_tokens}-token prompt after a sleep/wake",
            f"first ask computed {n1} prompt tokens in {r1['timings']['prompt_ms']:.0f} ms; asked again awake "
            f"{n_cached}; after the round trip {n2} in {r2['timings']['prompt_ms']:.0f} ms (served from the KV "
            f"cache); tokens equal to the awake cached ask: {same}", prompt_n=[n1, n_cached, n2])
        fig["long_prompt"] = long_prompt

        # ttft, ours: asleep, then a request arrives: wake + first token
        for policy in ("offload", "offload_compressed"):
            ttft = []
            for _ in range(3):
                srv.ctl("sleep", policy=policy)
                time.sleep(0.5)
                t0 = time.perf_counter()
                srv.ctl("wake")
                woken = time.perf_counter() - t0
                ft, last = srv.first_token(long_prompt, 4)
                ttft.append(woken + ft)  # to the first streamed token, as the references
            fig[f"ttft_ours_{policy}"] = statistics.median(ttft)
            fig[f"ttft_ours_prompt_n_{policy}"] = last.get("timings", {}).get("prompt_n")
        fig["ttft_policy"] = min(("offload", "offload_compressed"), key=lambda p: fig[f"ttft_ours_{p}"])
        fig["ttft_ours"] = fig[f"ttft_ours_{fig['ttft_policy']}"]
        fig["ttft_ours_prompt_n"] = fig[f"ttft_ours_prompt_n_{fig['ttft_policy']}"]
    finally:
        srv.stop()


def phase_ttft_reference(a, fig: dict, logdir: Path) -> None:
    if "ttft_ours" not in fig:
        say("SKIP", "ttft", "the big model's phase did not get that far")
        return
    long_prompt = fig["long_prompt"]
    # llama.cpp's own sleep: frees the model after an idle period, reloads on the next request.
    ref = Server(a, a.model, logdir / "llama-ref.log", interposed=False,
                 extra=["--sleep-idle-seconds", str(a.idle)])
    try:
        start_s = ref.wait_ready()
        ref.complete(long_prompt, 4)
        deadline = time.time() + a.idle + 120
        while time.time() < deadline and not ref.get("/props").get("is_sleeping"):
            time.sleep(0.2)
        asleep = ref.get("/props").get("is_sleeping")
        ft, last = ref.first_token(long_prompt, 4)
        fig["ttft_idle"] = ft
        fig["ttft_idle_prompt_n"] = last.get("timings", {}).get("prompt_n")
        say("INFO", "ttft: llama.cpp --sleep-idle-seconds", f"server slept: {asleep}; first token {ft:.2f} s after "
            f"the request, prompt tokens computed {fig['ttft_idle_prompt_n']} (started in {start_s:.1f} s)")
        # A llama-swap-style swap: stop the process, start it again, ask.
        t0 = time.perf_counter()
        ref.stop()
        again = Server(a, a.model, logdir / "llama-ref.log", interposed=False)
        try:
            again.wait_ready()
            ready = time.perf_counter() - t0
            ft2, last2 = again.first_token(long_prompt, 4)
            fig["ttft_restart"] = ready + ft2
        finally:
            again.stop()
    finally:
        ref.stop()
    o, i, r = fig["ttft_ours"], fig["ttft_idle"], fig["ttft_restart"]
    ok = i / o >= 10 and r / o >= 10
    if a.assume_link:  # a dry run: the stand-in's times mean nothing, what it computed does
        ok = fig.get("ttft_ours_prompt_n", 99) <= 16 and (fig.get("ttft_idle_prompt_n") or 0) >= a.long_tokens - 1
    say(("INFO" if ok else "FAIL") if a.assume_link else ("PASS" if ok else "FAIL"),
        f"ttft: first token after idle, {a.long_tokens}-token prompt",
        f"ours (wake + cached prompt, {fig['ttft_policy']}; offload {fig['ttft_ours_offload']:.3f} s, "
        f"offload_compressed {fig['ttft_ours_offload_compressed']:.3f} s) {o:.3f} s; llama.cpp's own sleep {i:.2f} s ({i / o:.1f}x ours); "
        f"process restart {r:.2f} s ({r / o:.1f}x ours); target 10x",
        ours=o, idle=i, restart=r, ours_prompt_n=fig.get("ttft_ours_prompt_n"),
        idle_prompt_n=fig.get("ttft_idle_prompt_n"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="llama-server binary")
    ap.add_argument("--vmmw", required=True, help="the vmmw command line (runs `vmmw exec`)")
    ap.add_argument("--model", required=True, help="the big GGUF (8B-shaped, ~16 GB)")
    ap.add_argument("--small", help="a small GGUF of the same architecture, to check outputs")
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--soak", type=int, default=100)
    ap.add_argument("--cycles-timed", type=int, default=3)
    ap.add_argument("--long-tokens", type=int, default=8000)
    ap.add_argument("--idle", type=int, default=2, help="llama.cpp's --sleep-idle-seconds for the reference")
    ap.add_argument("--link-gib", type=int, default=4)
    ap.add_argument("--phases", default="link,outputs,big,ttft")
    ap.add_argument("--logdir", type=Path, default=Path("."))
    ap.add_argument("--assume-link", default="", metavar="H2D_GBPS:D2H_GBPS",
                    help="a dry run of the harness without a GPU (the stand-in server, "
                    "examples/go-swap/standin): the link is not measured, device memory comes from the control socket")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    phases = a.phases.split(",")
    fig: dict = {}
    a.logdir.mkdir(parents=True, exist_ok=True)
    steps = [("link", lambda: phase_link(a, fig)), ("outputs", lambda: phase_outputs(a, fig, a.logdir)),
             ("big", lambda: phase_big(a, fig, a.logdir)), ("ttft", lambda: phase_ttft_reference(a, fig, a.logdir))]
    for name, run in steps:
        if name not in phases:
            continue
        t = time.perf_counter()
        try:
            run()
        except Exception as e:  # a phase that breaks is reported, the next still runs
            say("FAIL", name, f"{type(e).__name__}: {e}")
        print(f"--- phase {name}: {time.perf_counter() - t:.1f} s", flush=True)
    fig.pop("long_prompt", None)
    if a.out:
        a.out.write_text(json.dumps({"results": RESULTS, "figures": fig}, indent=1))
    failed = [r for r in RESULTS if r["status"] == "FAIL"]
    print(("FAIL " if failed else "PASS ") + f"llama proof: {len(RESULTS) - len(failed)} of {len(RESULTS)} lines not failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
