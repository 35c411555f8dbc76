"""Write one GGUF file (version 3, BF16/F16/F32 tensors, 32-byte alignment)
holding the tensors of a safetensors checkpoint (a file, or a folder with
its index), with the same names and row-major shapes (GGUF's `ne` reversed),
copying each tensor's bytes with copy_file_range: a GGUF of the same size as
the checkpoint, for the packed benchmark (scripts/gpu.d/26-packed.sh). Needs
only the standard library.

    python3 tests/torch/gguf_from_safetensors.py CHECKPOINT OUT.gguf
"""

from __future__ import annotations

import json
import os
import struct
import sys

ALIGN = 32
GGML = {"F32": 0, "F16": 1, "BF16": 30}


def tensors_of(src):
    """(name, shape, dtype, file, start, end) of every tensor, in file order."""
    if os.path.isdir(src):
        with open(os.path.join(src, "model.safetensors.index.json")) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        paths = [os.path.join(src, n) for n in files]
    else:
        paths = [src]
    out = []
    for p in paths:
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        entries = [(k, v) for k, v in header.items() if k != "__metadata__"]
        entries.sort(key=lambda kv: kv[1]["data_offsets"][0])
        for k, v in entries:
            a, b = v["data_offsets"]
            out.append((k, v["shape"], v["dtype"], p, 8 + n + a, 8 + n + b))
    return out


def string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def main(src, dst):
    ts = tensors_of(src)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(ts), 2)
    head += string("general.architecture") + struct.pack("<I", 8) + string("qwen3")
    head += string("general.alignment") + struct.pack("<I", 4) + struct.pack("<I", ALIGN)
    offset = 0
    for name, shape, dtype, _, a, b in ts:
        ne = list(reversed(shape)) or [1]
        head += string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        head += struct.pack("<IQ", GGML[dtype], offset)
        offset = (offset + (b - a) + ALIGN - 1) // ALIGN * ALIGN
    head += b"\0" * ((-len(head)) % ALIGN)
    with open(dst, "wb") as out:
        out.write(head)
        at = len(head)
        for _, _, _, path, a, b in ts:
            with open(path, "rb") as f:
                left, pos = b - a, a
                while left:
                    n = os.copy_file_range(f.fileno(), out.fileno(), left, pos, at)
                    if n <= 0:
                        raise OSError(f"copy_file_range returned {n} at {path}:{pos}")
                    left, pos, at = left - n, pos + n, at + n
            pad = (-at) % ALIGN
            if pad:
                os.pwrite(out.fileno(), b"\0" * pad, at)
                at += pad
    print(f"wrote {dst}: {len(ts)} tensors, {at} bytes")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
