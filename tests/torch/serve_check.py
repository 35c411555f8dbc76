"""GPU: `vmmw serve` holds a checkpoint for other processes. This process
starts it on the cuda backend, attaches through the Python package
(`vmmweights.share`) on the last GPU, and compares every shared tensor on the
device with the same tensor read from the file by safetensors (torch.equal).
Then SIGHUP (a reload in place) must reach the attachment as version 2 with
the bytes still equal, and SIGTERM must stop the server cleanly (exit 0,
socket removed).

  python3 tests/torch/serve_check.py --vmmw .gpu/vmmw --dir /root/vmmw-ckpt-8b

Prints one line starting with PASS, FAIL or SKIP; exit status 0 unless FAIL."""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vmmw", default=".gpu/vmmw")
    ap.add_argument("--dir", default="/root/vmmw-ckpt-8b")
    args = ap.parse_args()
    try:
        import torch
        from safetensors import safe_open
    except ImportError as e:
        print(f"SKIP serve check: {e}")
        return 0
    if not torch.cuda.is_available():
        print("SKIP serve check: no CUDA device")
        return 0
    if not os.path.exists(os.path.join(args.dir, "model.safetensors.index.json")):
        print(f"SKIP serve check: no checkpoint at {args.dir} (20-load.sh or 70-multi.sh generates it)")
        return 0
    import vmmweights.torch as vt  # noqa: F401  (registers vt.shared)
    from vmmweights import share

    dev = torch.cuda.device_count() - 1
    with open(os.path.join(args.dir, "model.safetensors.index.json")) as f:
        where = json.load(f)["weight_map"]
    sock = os.path.join(tempfile.mkdtemp(prefix="vmmw-serve-"), "weights.sock")
    t0 = time.monotonic()
    srv = subprocess.Popen([args.vmmw, "serve", "--backend", "cuda", args.dir, "--socket", sock],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = srv.stdout.readline().strip()
        if not ready.startswith("serving "):
            print(f"FAIL serve check: no ready line from vmmw serve: {ready!r} {srv.stderr.read()[-500:]}")
            return 1
        ready_s = time.monotonic() - t0

        def compare(att, names):
            bad = []
            files = {}
            for n in names:
                got = vt.shared.tensor(att, n)
                path = os.path.join(args.dir, where[n])
                if path not in files:
                    files[path] = safe_open(path, framework="pt", device=f"cuda:{dev}")
                want = files[path].get_tensor(n)
                if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
                    bad.append(n)
                del got, want
            return bad

        t = time.monotonic()
        att = share.attach(sock, device=dev)
        attach_ms = (time.monotonic() - t) * 1e3
        names = att.names()
        total = sum(att.tensor(n).bytes for n in names)
        bad = compare(att, names)
        if bad:
            print(f"FAIL serve check: {len(bad)} of {len(names)} tensors differ from the file, e.g. {bad[:3]}")
            return 1
        srv.send_signal(signal.SIGHUP)
        line = srv.stdout.readline().strip()
        deadline = time.monotonic() + 30
        while att.version != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        if att.version != 2:
            print(f"FAIL serve check: after SIGHUP the attachment reads version {att.version}, want 2 ({line!r})")
            return 1
        bad = compare(att, names[:8] + names[-8:])
        if bad:
            print(f"FAIL serve check: after the reload {bad[:3]} differ from the file")
            return 1
        att.detach()
        srv.send_signal(signal.SIGTERM)
        rc = srv.wait(timeout=30)
        if rc != 0 or os.path.exists(sock):
            print(f"FAIL serve check: SIGTERM gave exit {rc}, socket still there: {os.path.exists(sock)}")
            return 1
        print(f"PASS serve check: vmmw serve loaded and served {len(names)} tensors ({total / 1e9:.2f} GB) in "
              f"{ready_s:.1f} s; attached from Python on cuda:{dev} in {attach_ms:.1f} ms, every tensor equal "
              f"to the file (torch.equal on the device); SIGHUP reloaded ({line}) and the attachment saw "
              f"version 2; SIGTERM: exit 0, socket removed")
        return 0
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


if __name__ == "__main__":
    sys.exit(main())
