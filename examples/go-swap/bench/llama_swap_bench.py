"""go-swap's proxy mode on a GPU with real llama-server processes: three
models (one GGUF each, or one GGUF that the three share) under the
interposer, one awake at a time, the others asleep in host memory.

    python3 llama_swap_bench.py --service .gpu/go-swap --vmmw .gpu/vmmw \
        --llama-server $LLAMA_SERVER --gguf $LLAMA_GGUF [--gguf ...] --out llama-swap.json

It measures the link first (pinned host <-> device with torch, both
directions, in a child process that exits before the servers start), then
starts the service with loadAtStart (every server cold-started once and put
to sleep), asks each model a fixed prompt at temperature 0 for its
reference answer, and times a swap for every pair of sleep policies (the
sleeping server's, the waking server's): offload, offload_compressed,
discard. During each timed swap it sends requests for both models; every
one must be answered (none lost), those for the waking model after the
swap, and every answer from a model whose memory was kept (not discard)
must equal its reference. A long prompt asked before and after swaps shows
the prompt cache surviving (timings.prompt_n small the second time).

A swap's time (issuing the sleep and the wake together, both done) is
compared with the link time of the larger of the two servers' device bytes:
max(bytes_slept / D2H, bytes_woken / H2D). The goal is 1.1x or less.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

POLICIES = ["offload", "offload_compressed", "discard"]
PROMPT = "The quick brown fox jumps over the lazy dog. Write three sentences about foxes:"

LINK_CODE = r"""
import json, sys, time, torch
n = int(sys.argv[1])
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
out = {}
for name, f in (("h2d", lambda: dev.copy_(host, non_blocking=True)), ("d2h", lambda: host.copy_(dev, non_blocking=True))):
    ts = []
    for _ in range(6):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(); torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    out[name] = n / sorted(ts)[len(ts) // 2] / 1e9
free, total = torch.cuda.mem_get_info()
out["total"] = total
print(json.dumps(out))
"""


def log(*a):
    print(*a, flush=True)


def http(url, body=None, method=None, timeout=900):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw), dict(e.headers)
        except json.JSONDecodeError:
            return e.code, {"raw": raw.decode(errors="replace")}, dict(e.headers)


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class Service:
    def __init__(self, binary, config, log_path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([binary, "-config", config, "-listen", "127.0.0.1:0", "-shutdown-wait", "60s"],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = None

    def wait_listening(self, timeout):
        box = {}

        def read():
            for line in self.proc.stdout:
                if "listening on " in line:
                    box["url"] = line.split("listening on ", 1)[1].strip()
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if "url" not in box:
            raise RuntimeError(f"the service did not listen within {timeout} s (exit {self.proc.poll()})")
        self.url = box["url"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def ask(svc, model, prompt=PROMPT, n=32):
    """A completion through the proxy's pass-through to llama-server's
    /completion (it reports timings.prompt_n); returns (status, text, prompt_n, seconds)."""
    t0 = time.perf_counter()
    code, body, headers = http(f"{svc.url}/upstream/{model}/completion",
                               {"prompt": prompt, "n_predict": n, "temperature": 0, "seed": 1,
                                "cache_prompt": True})
    dt = time.perf_counter() - t0
    if code != 200:
        return code, json.dumps(body)[:300], None, dt
    return code, body.get("content", ""), body.get("timings", {}).get("prompt_n"), dt


def ask_openai(svc, model, results, key):
    """(status, text, seconds, held seconds: how long the service held it for a swap)."""
    t0 = time.perf_counter()
    # cache_prompt off: every answer computes the whole prompt the same way,
    # so answers compare exactly (a prompt served from the cache goes through
    # other kernels, whose rounding can flip a greedy choice); the prompt
    # cache is checked on its own.
    code, body, headers = http(f"{svc.url}/v1/completions",
                               {"model": model, "prompt": PROMPT, "max_tokens": 32, "temperature": 0, "top_k": 1,
                                "seed": 1, "cache_prompt": False})
    text = body["choices"][0]["text"] if code == 200 else json.dumps(body)[:300]
    held = float(headers.get("X-Go-Swap-Held-Seconds", 0) or 0)
    results[key] = (code, text, time.perf_counter() - t0, held)


def servers(svc):
    return {m["name"]: m for m in http(f"{svc.url}/models")[1]["models"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--service", required=True)
    ap.add_argument("--vmmw", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--gguf", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra-args", default="", help="more llama-server options")
    ap.add_argument("--assume-link", default="", help="H2D_GBPS:D2H_GBPS:CARD_BYTES instead of measuring "
                    "(a dry run of this script on the stand-in server, without a GPU)")
    args = ap.parse_args()

    sizes = [os.path.getsize(g) for g in args.gguf]
    if args.assume_link:
        h2d, d2h, total = args.assume_link.split(":")
        link = {"h2d": float(h2d), "d2h": float(d2h), "total": int(float(total))}
    else:
        link = json.loads(subprocess.check_output([sys.executable, "-c", LINK_CODE, str(2 << 30)], text=True))
    card = link["total"]
    host = mem_available()
    log(f"link: H2D {link['h2d']:.1f} GB/s, D2H {link['d2h']:.1f} GB/s (pinned, 2 GiB, median of 6)")
    log(f"card: {card / 1e9:.1f} GB; host memory available: {host / 1e9:.1f} GB; GGUF: "
        + ", ".join(f"{os.path.basename(g)} {s / 1e9:.1f} GB" for g, s in zip(args.gguf, sizes)))
    # Context from the card: the KV cache of an 8B-shaped model (36 layers,
    # 8 kv heads of 128, f16) is 144 KiB a position. During a swap two
    # servers' memory may be on the card at once (the wake maps chunks as
    # the sleep frees them).
    kv = 144 << 10
    ctx = 32768 if card > 120e9 else 16384
    per_model = max(sizes) + ctx * kv + (2 << 30)
    while ctx > 2048 and (2 * per_model > 0.9 * card or 2 * per_model > 0.8 * mem_available()):
        ctx //= 2
        per_model = max(sizes) + ctx * kv + (2 << 30)
    if per_model > 0.9 * card:
        log(f"SKIP one model needs about {per_model / 1e9:.1f} GB of the card's {card / 1e9:.1f} GB")
        return 0
    asleep_need = 2 * per_model
    if asleep_need > 0.85 * host:
        log(f"SKIP two asleep models need about {asleep_need / 1e9:.1f} GB of host memory; {host / 1e9:.1f} GB available")
        return 0
    budget = int(0.85 * host)
    names = ["m0", "m1", "m2"]
    work = tempfile.mkdtemp(prefix="llama-swap-bench-")
    cfg = os.path.join(work, "config.yaml")
    with open(cfg, "w") as f:
        f.write(f"""# written by llama_swap_bench.py
vmmw: {args.vmmw}
startPort: 0
healthCheckTimeout: 600
swapTimeout: 900
loadAtStart: true
maxAwake: 1
hostMemoryBudget: {budget}
linkGBps: {min(link['h2d'], link['d2h']):.3f}
macros:
  server: {args.llama_server} --host 127.0.0.1 -ngl 999 -c {ctx} -np 1 --seed 1 {args.extra_args}
models:
""")
        for i, n in enumerate(names):
            f.write(f"  {n}:\n    cmd: ${{server}} --port ${{PORT}} -m {args.gguf[i % len(args.gguf)]} --alias {n}\n"
                    f"    policy: offload\n")
    log(f"config: {cfg} (ctx {ctx}, host budget {budget / 1e9:.1f} GB)")
    log_path = os.path.join(work, "service.log")
    svc = Service(args.service, cfg, log_path)
    # timeout(1) sends SIGTERM: stop the service (and so its servers) on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    report = {"link_gbps": link, "card_bytes": card, "host_available": host, "ctx": ctx, "gguf": args.gguf,
              "gguf_bytes": sizes, "pairs": [], "checks": {}}
    failures = []
    try:
        t0 = time.perf_counter()
        svc.wait_listening(900)
        report["load_at_start_seconds"] = time.perf_counter() - t0
        log(f"service up after {report['load_at_start_seconds']:.1f} s (three cold starts, two sleeps)")

        ref = {}
        long_prompt = " ".join(f"word{i % 97}" for i in range(min(1500, ctx // 6)))  # ~3 tokens a word
        first_long = {}
        for n in names:
            box = {}
            ask_openai(svc, n, box, n)
            code, text, dt, _ = box[n]
            if code != 200:
                raise RuntimeError(f"{n}: reference ask: {code} {text}")
            ref[n] = text
            code, _, pn, _ = ask(svc, n, long_prompt, 4)
            first_long[n] = pn
            log(f"{n}: reference in {dt:.2f} s; long prompt computed {pn} positions")
        # Each model was put to sleep and woken since its long prompt: the
        # second ask must come from its KV cache.
        for n in names:
            http(f"{svc.url}/models/{names[(names.index(n) + 1) % 3]}/activate", {})  # n goes to sleep
            code, _, pn, _ = ask(svc, n, long_prompt, 4)
            ok = code == 200 and pn is not None and pn <= 8
            report["checks"][f"prompt cache {n}"] = {"first_prompt_n": first_long[n], "after_swap_prompt_n": pn, "ok": ok}
            log(f"{n}: long prompt after a swap computed {pn} positions (first time {first_long[n]})")
            if not ok:
                failures.append(f"{n}: prompt cache lost across a swap (prompt_n {pn})")

        tainted = set()
        pairs = [(p, q) for p in POLICIES for q in POLICIES]
        pairs.sort(key=lambda pq: ("discard" in pq, pq))  # kept memory first: discard leaves garbage
        for i, (pa, pb) in enumerate(pairs):
            a, b = names[i % 3], names[(i + 1) % 3]
            # b goes to sleep with pb, a is awake; then a sleeps with pa while b wakes.
            # A model that ever sleeps with discard keeps garbage: its answers are not checked from then on.
            tainted.update(m for m, pol in ((a, pa), (b, pb)) if pol == "discard")
            http(f"{svc.url}/models/{b}/policy", {"policy": pb})
            http(f"{svc.url}/models/{b}/activate", {})
            http(f"{svc.url}/models/{a}/activate", {})
            http(f"{svc.url}/models/{a}/policy", {"policy": pa})
            before = servers(svc)
            if before[a]["state"] != "awake" or before[b]["state"] != "asleep":
                raise RuntimeError(f"pair {pa}->{pb}: {a} {before[a]['state']}, {b} {before[b]['state']}")
            results, threads = {}, []
            for k in range(4):
                threads.append(threading.Thread(target=ask_openai, args=(svc, b, results, f"{b}#{k}")))
            for k in range(2):
                threads.append(threading.Thread(target=ask_openai, args=(svc, a, results, f"{a}#{k}")))
            sent = time.perf_counter()
            for t in threads[:4]:
                t.start()
            time.sleep(0.05)  # the swap to b has begun: these wait for the swap back
            for t in threads[4:]:
                t.start()
            for t in threads:
                t.join()
            swaps = http(f"{svc.url}/swaps")[1]["swaps"]
            rec = next((s for s in reversed(swaps) if s["model"] == b and s["from"] == [a]), None)
            if rec is None or rec.get("error"):
                raise RuntimeError(f"pair {pa}->{pb}: no successful swap {a}->{b}: {rec}")
            if rec["wake"]["kind"] != "wake":
                failures.append(f"{pa}->{pb}: {b} was started cold, not woken ({rec['wake'].get('reason')})")
            # The bytes each server's memory spans: what the sleep released, what the wake mapped.
            bytes_a, bytes_b = sum(x["bytes"] for x in rec["slept"]), rec["wake"]["bytes"]
            link_s = max(bytes_a / (link["d2h"] * 1e9), bytes_b / (link["h2d"] * 1e9))
            lost = [k for k, v in results.items() if v[0] != 200]
            # Those for b that arrived while it slept were held until the swap
            # had made it awake: at least the one that started the swap (the
            # others may arrive after a short swap ended; any answered by a
            # sleeping server would show as lost or wrong).
            held_b = [v[3] for k, v in results.items() if k.startswith(b + "#") and v[0] == 200]
            # (The header gives milliseconds: a millisecond of slack.)
            unheld = [] if held_b and max(held_b) >= rec["swap_seconds"] / 2 - 0.001 else [k for k in results if k.startswith(b + "#")]
            wrong = [k for k, v in results.items() if v[0] == 200 and k.split("#")[0] not in tainted
                     and v[1] != ref[k.split("#")[0]]]
            row = {"sleep_policy": pa, "wake_policy": pb, "from": a, "to": b, "bytes_slept": bytes_a, "bytes_woken": bytes_b,
                   "sleep_s": rec["sleep_seconds"], "wake_s": rec["wake"]["seconds"], "swap_s": rec["swap_seconds"],
                   "drain_s": rec["drain_seconds"], "link_s": link_s, "ratio": rec["swap_seconds"] / link_s,
                   "requests": len(results), "lost": lost, "wrong": wrong,
                   "latency_max_s": max(v[2] for v in results.values()),
                   "held_s": {k: v[3] for k, v in results.items()}, "record": rec}
            report["pairs"].append(row)
            log(f"{pa:>18} -> {pb:<18} {a}->{b} sleep {row['sleep_s']:.2f} s wake {row['wake_s']:.2f} s "
                f"swap {row['swap_s']:.2f} s link {link_s:.2f} s ratio {row['ratio']:.2f}; "
                f"{len(results) - len(lost)}/{len(results)} answered, {len(wrong)} wrong")
            if lost:
                failures.append(f"{pa}->{pb}: requests lost: {lost} {[results[k] for k in lost]}")
            if unheld:
                failures.append(f"{pa}->{pb}: none of {unheld} was held through the swap ({[results[k][3] for k in unheld]} s, "
                                f"the swap {rec['swap_seconds']:.3f} s)")
            if wrong:
                failures.append(f"{pa}->{pb}: answers changed: {[(k, results[k][1][:80]) for k in wrong]}")
            if row["ratio"] > 1.1 and not args.assume_link:  # a dry run's link is made up
                failures.append(f"{pa}->{pb}: swap {row['swap_s']:.2f} s is {row['ratio']:.2f}x the link's {link_s:.2f} s")
        report["models"] = servers(svc)
        report["timeline_entries"] = len(http(f"{svc.url}/timeline")[1]["timeline"])
    except Exception as e:
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        svc.stop()
    if failures:
        with open(log_path) as f:
            tail = f.readlines()[-80:]
        log(f"--- the service's log ({log_path}), last {len(tail)} lines")
        log("".join(tail).rstrip())
    report["failures"] = failures
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)

    log("")
    log(f"| sleep policy | wake policy | slept GB | woken GB | sleep s | wake s | swap s | link s | swap/link | answered | wrong |")
    log("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in report["pairs"]:
        log(f"| {r['sleep_policy']} | {r['wake_policy']} | {r['bytes_slept'] / 1e9:.2f} | {r['bytes_woken'] / 1e9:.2f} | "
            f"{r['sleep_s']:.3f} | {r['wake_s']:.3f} | {r['swap_s']:.3f} | {r['link_s']:.3f} | {r['ratio']:.2f} | "
            f"{r['requests'] - len(r['lost'])}/{r['requests']} | {len(r['wrong'])} |")
    ratios = [r["ratio"] for r in report["pairs"]] or [float("nan")]
    summary = (("dry run on an assumed link (ratios not judged): " if args.assume_link else "") + f"{len(ratios)} policy pairs, swap/link median {statistics.median(ratios):.2f} max {max(ratios):.2f} "
               f"(H2D {link['h2d']:.1f}, D2H {link['d2h']:.1f} GB/s); "
               f"{sum(r['requests'] - len(r['lost']) for r in report['pairs'])}/{sum(r['requests'] for r in report['pairs'])} "
               f"requests during swaps answered")
    if failures:
        for f_ in failures:
            log("  " + f_)
        log("FAIL " + summary)
        return 1
    log("PASS " + summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
