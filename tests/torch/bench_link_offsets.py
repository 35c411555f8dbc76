"""The pinned link in 32 MiB copies at host offsets that are not page- or
word-aligned, on one and two streams, against one 1 GiB copy in the same
run: whether where a backup's frames land in the pinned arena (packed at any
byte offset) or how many streams carry them costs link rate. Prints one line
per case; needs PyTorch with CUDA."""

import time

import torch

N = 2 << 30
CHUNK = 32 << 20


def rate(host, dev, direction, host_off, nstreams, chunk=CHUNK, reps=3):
    streams = [torch.cuda.Stream() for _ in range(nstreams)]
    best = 0.0
    n = N // chunk
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(n):
            with torch.cuda.stream(streams[i % nstreams]):
                h = host[host_off + i * chunk: host_off + (i + 1) * chunk]
                d = dev[i * chunk:(i + 1) * chunk]
                if direction == "h2d":
                    d.copy_(h, non_blocking=True)
                else:
                    h.copy_(d, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, n * chunk / (time.perf_counter() - t) / 1e9)
    return best


def main():
    host = torch.empty(N + (1 << 20), dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(N + (1 << 20), dtype=torch.uint8, device="cuda")
    host.fill_(7)
    dev.fill_(3)
    for direction in ("h2d", "d2h"):
        link = rate(host, dev, direction, 0, 1, chunk=1 << 30)
        print(f"{direction} one 1 GiB copy: {link:.2f} GB/s")
        for off in (0, 16, 1000, 4096, 65536 + 16):
            for ns in (1, 2):
                r = rate(host, dev, direction, off, ns)
                print(f"{direction} 32 MiB copies, host offset {off}, {ns} stream(s): {r:.2f} GB/s = "
                      f"{r / link:.3f} of one copy")


if __name__ == "__main__":
    main()
