"""NCCL broadcast updates (scripts/gpu.d/87-update-nccl.sh).

  world1   one GPU: libnccl opens, a communicator of one rank is made from a
           unique id, and a broadcast update whose root is that rank writes
           the negated checkpoint into its fused destinations, bitwise.
           Then the RDMA-capable tag check of step 3 below on that rank.
  pair     two GPUs, one process per GPU (torch.distributed for the
           baseline and to share the unique id):
           1. torch.distributed.broadcast of the same bytes, rank 0 -> 1 (bus
              bandwidth), then our broadcast update of the full weights from
              the trainer on rank 0 into the engine's fused destinations on
              rank 1: ratio (target >= 0.8), bitwise;
           2. TP=2: both ranks are engine ranks (rank 0 also the root), each
              keeping only its slices, bitwise against the negated
              checkpoint sliced in PyTorch;
           3. an RDMA-capable tag registered with NCCL (ncclCommRegister),
              slept and woken, registered again from the remap callback the
              epoch drives.
Prints PASS/FAIL/SKIP lines; NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_load_reference as ref  # noqa: E402
from bench_load_python import fused_params  # noqa: E402
import vmmweights as vw  # noqa: E402
import vmmweights.torch as vt  # noqa: E402
import vmmweights.torch.transport as vtt  # noqa: E402

SLOT = 256 << 20


def checkpoint_state(d, device):
    from safetensors.torch import load_file
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    state = {}
    for fn in files:
        state.update(load_file(os.path.join(d, fn), device=device))
    return state


def tp_params(layers, world, rank):
    """Fused destinations of one tensor-parallel rank (qwen3 preset)."""
    H, I, V, Q, K, D = ref.HIDDEN, ref.INTER, ref.VOCAB, ref.HEADS, ref.KV, ref.HD
    p, dt = {}, dict(device=f"cuda:{rank}", dtype=torch.bfloat16)
    p["model.embed_tokens.weight"] = torch.empty(V // world, H, **dt)
    p["lm_head.weight"] = torch.empty(V // world, H, **dt)
    p["model.norm.weight"] = torch.empty(H, **dt)
    for i in range(layers):
        q = f"model.layers.{i}"
        p[f"{q}.self_attn.qkv_proj.weight"] = torch.empty((Q + 2 * K) * D // world, H, **dt)
        p[f"{q}.mlp.gate_up_proj.weight"] = torch.empty(2 * I // world, H, **dt)
        for n, s in [("input_layernorm", H), ("post_attention_layernorm", H),
                     ("self_attn.q_norm", D), ("self_attn.k_norm", D)]:
            p[f"{q}.{n}.weight"] = torch.empty(s, **dt)
        p[f"{q}.self_attn.o_proj.weight"] = torch.empty(H, Q * D // world, **dt)
        p[f"{q}.mlp.down_proj.weight"] = torch.empty(H, I // world, **dt)
    return p


def nbytes(params):
    return sum(t.numel() * t.element_size() for t in params.values())


def world1(a):
    try:
        uid = vw.transport.nccl_unique_id()
    except vw.VmmwError as e:
        print(f"FAIL libnccl did not open: {e}")
        return 1
    torch.cuda.set_device(0)
    comm = vw.transport.NcclComm(vt.pool(0), uid, 1, 0)
    with vt.use_pool("weights"):
        params = fused_params(a.layers)
    vt.load_(params, a.dir, preset="qwen3")
    orig = {n: t.clone() for n, t in params.items()}
    state = checkpoint_state(a.dir, "cuda:0")
    for t in state.values():
        t.neg_()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = vtt.broadcast_(params, comm, 0, source=state, slot_bytes=SLOT)
    s = time.perf_counter() - t0
    ok = all(torch.equal(t, orig[n].neg()) for n, t in params.items())
    rdma = rdma_check(comm, 0)
    comm.close()
    print(rdma, flush=True)
    print(f"{'PASS' if ok else 'FAIL'} libnccl opened; a world of 1 broadcast {nbytes(params) / 1e9:.2f} GB "
          f"into its fused destinations in {s:.3f} s (version {r.version}), bitwise "
          f"{'equal' if ok else 'DIFFERENT'}")
    return 0 if ok else 1


def rdma_check(comm, rank):
    """An RDMA-capable tag registered with NCCL (ncclCommRegister) survives
    sleep/wake: the engine deregisters before the sleep and the remap
    callback registers it again at the new epoch. One PASS/FAIL/SKIP line."""
    p = vt.pool(rank)
    try:
        p.set_tag_rdma("rdma-buffers")
    except vw.VmmwError as e:
        return f"SKIP RDMA tag on rank {rank}: {e}"
    size = 64 << 20
    ptr = p.alloc(size, tag="rdma-buffers")
    handle = [comm.register(ptr, size)]
    registered = []

    def again(tag, epoch):
        if tag == "rdma-buffers":
            handle[0] = comm.register(ptr, size)
            registered.append(epoch)

    e0 = vw.remap_epoch("rdma-buffers")
    with vw.on_remap(again):
        comm.deregister(handle[0])  # the engine's sleep hook: pages are about to go
        p.sleep(**{"rdma-buffers": "offload"})
        p.wake("rdma-buffers")
    ok = registered == [e0 + 1] and vw.remap_epoch("rdma-buffers") == e0 + 1
    comm.deregister(handle[0])
    p.free(ptr)
    return (f"{'PASS' if ok else 'FAIL'} RDMA tag on rank {rank}: ncclCommRegister of 64 MiB, sleep/wake "
            f"raised the epoch {e0} -> {vw.remap_epoch('rdma-buffers')}, registered again from the remap "
            f"callback ({registered})")


def pair_rank(rank, a, port):
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank,
                            device_id=torch.device(f"cuda:{rank}"))
    out = []
    uid = [vw.transport.nccl_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = vw.transport.NcclComm(vt.pool(rank), uid[0], 2, rank)

    # 1. Full weights, trainer (rank 0) -> engine (rank 1), against torch.distributed.broadcast.
    if rank == 0:
        state = checkpoint_state(a.dir, "cuda:0")
        for t in state.values():
            t.neg_()
        total = sum(t.numel() * t.element_size() for t in state.values())
    else:
        with vt.use_pool("weights"):
            params = fused_params(a.layers)
        vt.load_(params, a.dir, preset="qwen3")
        orig = {n: t.clone() for n, t in params.items()}
        total = nbytes(params)
    flat = torch.empty(total // 2, dtype=torch.bfloat16, device=f"cuda:{rank}")
    for _ in range(2):
        dist.broadcast(flat, src=0)
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    dist.broadcast(flat, src=0)
    torch.cuda.synchronize()
    torch_s = time.perf_counter() - t0
    del flat
    torch.cuda.empty_cache()
    runs = []
    for _ in range(a.repeat):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if rank == 0:
            vtt.broadcast_(None, comm, 0, source=state, device=0, slot_bytes=SLOT)
        else:
            vtt.broadcast_(params, comm, 0, slot_bytes=SLOT)
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    if rank == 1:
        ok = all(torch.equal(t, orig[n].neg()) for n, t in params.items())
        ours = total / min(runs) / 1e9
        bus = total / torch_s / 1e9
        ratio = ours / bus
        out.append(f"{'PASS' if ok and ratio >= 0.8 else 'FAIL'} NCCL broadcast update rank 0 -> 1, "
                   f"{total / 1e9:.2f} GB: {ours:.1f} GB/s (best of {len(runs)}: {min(runs):.3f} s) = {ratio:.2f} of "
                   f"torch.distributed.broadcast {bus:.1f} GB/s (target >= 0.8); bitwise "
                   f"{'equal' if ok else 'DIFFERENT'}")
        del params, orig
    else:
        del state
    torch.cuda.empty_cache()

    # 2. TP=2: each rank keeps its slices; rank 0 is the root and an engine rank.
    with vt.use_pool("weights-tp"):
        tp = tp_params(a.layers, 2, rank)
    vt.load_(tp, a.dir, preset="qwen3", tp_rank=rank, tp_world=2)
    before = {n: t.clone() for n, t in tp.items()}
    dist.barrier()
    if rank == 0:
        state = checkpoint_state(a.dir, "cuda:0")
        for t in state.values():
            t.neg_()
        r = vtt.broadcast_(tp, comm, 0, source=state, slot_bytes=SLOT)
        del state
    else:
        r = vtt.broadcast_(tp, comm, 0, slot_bytes=SLOT)
    torch.cuda.synchronize()
    ok = all(torch.equal(t, before[n].neg()) for n, t in tp.items())
    out.append(f"{'PASS' if ok else 'FAIL'} TP=2 rank {rank}: {nbytes(tp) / 1e9:.2f} GB of slices, "
               f"version {r.version}, bitwise {'equal' if ok else 'DIFFERENT'} to its negated slices")
    del tp, before
    torch.cuda.empty_cache()

    # 3. An RDMA-capable tag registered with NCCL survives sleep/wake.
    out.append(rdma_check(comm, rank))
    comm.close()
    dist.barrier()
    dist.destroy_process_group()
    for line in out:
        print(line, flush=True)


def pair(a):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(pair_rank, args=(a, port), nprocs=2, join=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["world1", "pair"])
    ap.add_argument("--dir", default="/root/vmmw-ckpt-8b")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.dir, "model.safetensors.index.json")):
        print(f"generating the checkpoint in {a.dir}", flush=True)
        ref.generate(a.dir, a.layers)
    return world1(a) if a.mode == "world1" else pair(a)


if __name__ == "__main__":
    sys.exit(main())
