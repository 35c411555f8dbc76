"""GPU soak through PyTorch: a transformers model (save_pretrained, loaded with
load_ into tag "weights") and a KV-cache-like tensor in tag "kv_cache" go
through thousands of sleep/wake cycles, with the weights' policy rotating
over offload and reload and the cache discarded, and a forward pass after
every wake. Shown each cycle: the logits bitwise equal to the first forward,
pointers unchanged, free device memory rising by the tracked bytes at sleep
and back at wake. Shown over the run: free device memory, the pool's host
backup and this process's resident memory flat (sampled every 100 cycles,
spread within a bound), so nothing leaks per cycle.

  python3 tests/torch/soak_torch.py [--cycles 3000] [--max-seconds 120]

Prints one line starting with PASS or FAIL (or SKIP without CUDA or
transformers), exit status 0 unless FAIL."""

import argparse
import os
import sys
import tempfile
import time

MiB = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=int(os.environ.get("VMMW_TORCH_SOAK_CYCLES", "3000")))
    ap.add_argument("--max-seconds", type=float, default=float(os.environ.get("VMMW_TORCH_SOAK_SECONDS", "120")))
    ap.add_argument("--family", default="llama-untied")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP torch soak: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("SKIP torch soak: no CUDA device")
        return 0
    if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
        print("SKIP torch soak: VMMW_BACKEND=host (PyTorch needs real device memory)")
        return 0
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("SKIP torch soak: transformers is not installed")
        return 0
    import hf_models as hf
    import vmmweights.torch as vt

    def tracked(*tags):
        rep = vt.report()
        return sum(vt.tag_usage(rep, t)["tracked_bytes"] for t in tags)

    def host_backup():
        return vt.report()["total"]["host_backup_bytes"]

    with tempfile.TemporaryDirectory() as tmp:
        cfg = hf.CONFIGS[args.family]()
        ids, want = hf.write(cfg, tmp)
        model = hf.empty_in_pool(cfg, vt)
        vt.load_(model, tmp)
        with vt.use_pool("kv_cache"):
            cache = torch.empty((32 * MiB // 2,), dtype=torch.bfloat16, device="cuda")
        with torch.no_grad():
            first = model(ids).logits.clone()
        if not torch.equal(first, want):
            print("FAIL torch soak: the first forward differs from the model's own before loading")
            return 1
        ptrs = [p.data_ptr() for p in model.parameters()]
        torch.cuda.synchronize()
        held = tracked("weights", "kv_cache")
        policies = ["offload", "reload"]
        samples = []  # (cycle, free awake, host backup asleep, rss)
        slack = 4 * MiB
        start = time.monotonic()
        done = 0
        worst_rise_gap = 0
        for i in range(args.cycles):
            if time.monotonic() - start > args.max_seconds:
                break
            policy = policies[i % len(policies)]
            free0, _ = torch.cuda.mem_get_info()
            vt.sleep(weights=policy, kv_cache="discard")
            free1, _ = torch.cuda.mem_get_info()
            backup = host_backup()
            vt.wake()
            free2, _ = torch.cuda.mem_get_info()
            gap = abs((free1 - free0) - held)
            worst_rise_gap = max(worst_rise_gap, gap)
            if gap > slack:
                print(f"FAIL torch soak: cycle {i} ({policy}): free memory rose {(free1 - free0) / MiB:.1f} MiB "
                      f"at sleep, tracked {held / MiB:.1f} MiB")
                return 1
            if abs(free2 - free0) > slack:
                print(f"FAIL torch soak: cycle {i} ({policy}): free memory {free0 / MiB:.1f} MiB before sleep, "
                      f"{free2 / MiB:.1f} MiB after wake")
                return 1
            if [p.data_ptr() for p in model.parameters()] != ptrs:
                print(f"FAIL torch soak: cycle {i} ({policy}): a parameter moved")
                return 1
            # The cache was discarded: the engine writes it again before use.
            cache.fill_(float(i % 7))
            with torch.no_grad():
                out = model(ids).logits
            if not torch.equal(out, first):
                diff = float((out.float() - first.float()).abs().max())
                print(f"FAIL torch soak: cycle {i} ({policy}): logits differ after wake (max abs diff {diff})")
                return 1
            if i % 100 == 0:
                torch.cuda.synchronize()
                samples.append((i, free2, backup, rss_bytes()))
            done = i + 1
        secs = time.monotonic() - start
        if done < 2:
            print("FAIL torch soak: fewer than 2 cycles ran")
            return 1
        # Flat: the spread of each series after the first sample (which pays
        # one-time costs: the backup arena, the reload source) stays bounded.
        later = samples[1:] or samples
        spread = lambda k: max(s[k] for s in later) - min(s[k] for s in later)  # noqa: E731
        free_spread, backup_spread, rss_spread = spread(1), spread(2), spread(3)
        ok = free_spread <= slack and backup_spread <= slack and rss_spread <= 64 * MiB
        verdict = "PASS" if ok else "FAIL"
        print(f"{verdict} torch soak: {done} sleep/wake cycles ({'/'.join(policies)} for {held / MiB:.0f} MiB "
              f"of weights+cache, forward bitwise equal after every wake) in {secs:.0f} s; over "
              f"{len(later)} samples free device memory spread {free_spread / MiB:.1f} MiB, host backup "
              f"spread {backup_spread / MiB:.1f} MiB, RSS spread {rss_spread / MiB:.1f} MiB; "
              f"free-memory rise at sleep within {worst_rise_gap / MiB:.1f} MiB of tracked")
        del model, cache
        vt.release_pools()
        vt.trim()
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
