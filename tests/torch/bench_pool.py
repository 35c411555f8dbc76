"""Median cost of a cached alloc+free pair: the vmmweights Rust pool (measured
in Rust by `vmmw bench-pool`) against PyTorch's caching allocator (measured
from Python: torch.empty + del, and caching_allocator_alloc + delete), in the
same run on the same device. Prints a table; writes JSON with --out.

The PyTorch columns include the Python call overhead (a few hundred ns to a
few us per call); the Python-loop column shows that floor, measured the same
way on a call that allocates nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = [512, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def per_pair_ns(fn, batches, pairs):
    fn()  # warm: the first call creates the cached segment
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(pairs):
            fn()
        samples.append((time.perf_counter_ns() - t0) / pairs)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vmmw", default=None, help="path to the vmmw binary (default: next to VMMW_LIB)")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("SKIP bench_pool: no CUDA device")
        return 0
    vmmw = args.vmmw or str(Path(os.environ.get("VMMW_LIB", "target/release/libvmmweights.so")).parent / "vmmw")
    if not Path(vmmw).is_file():
        print(f"bench_pool: {vmmw} not found (pass --vmmw)", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory() as d:
        rust_json = Path(d) / "pool.json"
        cmd = [
            vmmw, "bench-pool", "--backend", "cuda",
            "--sizes", ",".join(str(s) for s in SIZES),
            "--batches", str(args.batches), "--pairs", str(args.pairs),
            "--json", str(rust_json),
        ]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        rust = json.loads(rust_json.read_text())
    rust_ns = {r["size"]: r["pair_ns_median"] for r in rust["rows"]}

    dev = torch.device("cuda", 0)
    torch.cuda.synchronize()
    floor = per_pair_ns(lambda: None, args.batches, args.pairs)
    rows = []
    for size in SIZES:
        def empty_del():
            x = torch.empty(size, dtype=torch.uint8, device=dev)
            del x

        def raw_alloc_delete():
            p = torch.cuda.caching_allocator_alloc(size, 0)
            torch.cuda.caching_allocator_delete(p)

        rows.append({
            "size": size,
            "vmmw_pool_ns": rust_ns[size],
            "torch_empty_del_ns": per_pair_ns(empty_del, args.batches, args.pairs),
            "torch_caching_allocator_alloc_delete_ns": per_pair_ns(raw_alloc_delete, args.batches, args.pairs),
            "python_call_floor_ns": floor,
        })

    print(f"\ncached alloc+free pair, median ns ({args.batches} batches x {args.pairs} pairs), "
          f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'size':>12} {'vmmw pool (Rust)':>18} {'torch.empty+del':>16} {'torch raw alloc+del':>20} {'python floor':>13}")
    for r in rows:
        print(f"{r['size']:>12} {r['vmmw_pool_ns']:>18.1f} {r['torch_empty_del_ns']:>16.1f} "
              f"{r['torch_caching_allocator_alloc_delete_ns']:>20.1f} {r['python_call_floor_ns']:>13.1f}")
    result = {
        "what": "median ns of a cached alloc+free pair: vmmweights Pool vs PyTorch caching allocator",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "unix_time": int(time.time()),
        "vmmw": rust,
        "rows": rows,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
