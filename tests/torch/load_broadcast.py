"""A checkpoint load through the broadcast ring on two GPUs
(scripts/gpu.d/87-update-nccl.sh), one process per GPU, torch.distributed
for the baseline and to share the NCCL unique id:

  1. rank 0 reads the checkpoint and broadcasts it; both ranks apply it into
     their fused destinations (qwen3 preset). Bitwise against a local load
     of the same checkpoint on each rank; the rate as a ratio to
     torch.distributed.broadcast of the same bytes and to the local load,
     in the same run (the local load runs first, so both read the page
     cache).
  2. TP=2 with two readers, each owning about half of the files: each rank
     keeps its slices, bitwise against a local TP=2 load.

Prints PASS/FAIL lines (the PASS condition is the bitwise check; the
ratios are reported). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_load_reference as ref  # noqa: E402
from bench_load_python import fused_params  # noqa: E402
from update_nccl import tp_params  # noqa: E402
import vmmweights as vw  # noqa: E402
import vmmweights.torch as vt  # noqa: E402

SLOT = 256 << 20


def nbytes(params):
    return sum(t.numel() * t.element_size() for t in params.values())


def loader_for(d, params, tp_rank=0, tp_world=0):
    """A loader over the checkpoint with `params` registered as its
    destinations, as a load registers them."""
    ld = vw.Loader(d)
    ld.preset("qwen3", tp_rank, tp_world)
    for name, t in params.items():
        ld.register(name, t.data_ptr(), "BF16", list(t.shape))
    return ld


def timed(f):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = f()
    torch.cuda.synchronize()
    return r, time.perf_counter() - t0


def rank_main(rank, a, port):
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank,
                            device_id=torch.device(f"cuda:{rank}"))
    uid = [vw.transport.nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    pool = vt.pool(rank)
    comm = vw.transport.NcclComm(pool, uid[0], 2, rank)
    out = []

    # 1. Rank 0 reads, both apply.
    with vt.use_pool("load-local"):
        local = fused_params(a.layers)
    dist.barrier()
    _, local_s = timed(lambda: vt.load_(local, a.dir, preset="qwen3"))
    total = nbytes(local)
    flat = torch.empty(total // 2, dtype=torch.bfloat16, device=f"cuda:{rank}")
    for _ in range(2):
        dist.broadcast(flat, src=0)
    dist.barrier()
    _, torch_s = timed(lambda: dist.broadcast(flat, src=0))
    del flat
    torch.cuda.empty_cache()
    with vt.use_pool("load-bcast"):
        params = fused_params(a.layers)
    ld = loader_for(a.dir, params)
    runs, r = [], None
    for _ in range(a.repeat):
        dist.barrier()
        r, s = timed(lambda: comm.broadcast_load(ld, pool, [0], slot_bytes=SLOT))
        runs.append(s)
    ok = all(torch.equal(t, local[n]) for n, t in params.items())
    ours = total / min(runs) / 1e9
    bus = total / torch_s / 1e9
    own = total / local_s / 1e9
    out.append(f"{'PASS' if ok else 'FAIL'} broadcast load rank 0 -> 2 ranks, rank {rank}: {total / 1e9:.2f} GB "
               f"in {min(runs):.3f} s (best of {len(runs)}) = {ours:.1f} GB/s; {ours / bus:.2f} of "
               f"torch.distributed.broadcast of the same bytes ({bus:.1f} GB/s), {ours / own:.2f} of a local "
               f"load on this rank ({own:.1f} GB/s, {local_s:.3f} s); {r.buckets} buckets, read here "
               f"{r.bytes_read / 1e9:.2f} GB from {r.files_read} files; bitwise {'equal' if ok else 'DIFFERENT'} "
               f"to the local load")
    ld.close()
    del params, local
    torch.cuda.empty_cache()

    # 2. TP=2, two readers: each rank keeps its slices.
    with vt.use_pool("load-tp-local"):
        local = tp_params(a.layers, 2, rank)
    vt.load_(local, a.dir, preset="qwen3", tp_rank=rank, tp_world=2)
    with vt.use_pool("load-tp-bcast"):
        tp = tp_params(a.layers, 2, rank)
    ld = loader_for(a.dir, tp, rank, 2)
    dist.barrier()
    r, s = timed(lambda: comm.broadcast_load(ld, pool, [0, 1], slot_bytes=SLOT))
    ok = all(torch.equal(t, local[n]) for n, t in tp.items())
    out.append(f"{'PASS' if ok else 'FAIL'} broadcast load TP=2, readers 0 and 1, rank {rank}: "
               f"{nbytes(tp) / 1e9:.2f} GB of slices in {s:.3f} s, read here {r.bytes_read / 1e9:.2f} GB from "
               f"{r.files_read} files; bitwise {'equal' if ok else 'DIFFERENT'} to a local TP=2 load")
    ld.close()
    del tp, local
    torch.cuda.empty_cache()
    comm.close()
    dist.barrier()
    dist.destroy_process_group()
    for line in out:
        print(line, flush=True)


def main():
    import socket
    import torch.multiprocessing as mp
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/root/vmmw-ckpt-8b")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.dir, "model.safetensors.index.json")):
        print(f"generating the checkpoint in {a.dir}", flush=True)
        ref.generate(a.dir, a.layers)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(a, port), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
