#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into fuzz/corpus/<target>/.
Valid inputs plus the hostile shapes docs/RELIABILITY.md lists; libFuzzer mutates from
these. Run from the repository root: python3 fuzz/make_seeds.py"""
import json, os, struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F16": 2, "BF16": 2, "I16": 2, "F32": 4, "I32": 4, "F64": 8, "I64": 8}


def st(tensors, raw_header=None, data=None, hlen=None):
    """A safetensors file: tensors = [(name, dtype, shape)] laid out in order."""
    header, at = {}, 0
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}
        at += n
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    body = data if data is not None else bytes(i % 251 for i in range(at))
    return struct.pack("<Q", len(text) if hlen is None else hlen) + text + body


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def entry(dtype, shape, a, b):
    return {"dtype": dtype, "shape": shape, "data_offsets": [a, b]}


t = "safetensors_header"
write(t, "valid-two", st([("a", "F32", [2, 2]), ("b", "BF16", [3])]))
write(t, "valid-metadata", st([], raw_header=json.dumps({"__metadata__": {"format": "pt"}, "x": entry("U8", [4], 0, 4)}).encode(), data=b"abcd"))
write(t, "valid-empty-tensor", st([("e", "F16", [0, 3]), ("f", "I64", [1])]))
write(t, "header-len-max", st([("a", "U8", [1])], hlen=2**64 - 1))
write(t, "header-len-past-end", st([("a", "U8", [1])], hlen=4096))
write(t, "offsets-past-end", st([], raw_header=json.dumps({"a": entry("U8", [16], 0, 16)}).encode(), data=b"1234"))
write(t, "overlap", st([], raw_header=json.dumps({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 2, 6)}).encode(), data=b"12345678"))
write(t, "out-of-order", st([], raw_header=json.dumps({"a": entry("U8", [4], 4, 8), "b": entry("U8", [4], 0, 4)}).encode(), data=b"12345678"))
write(t, "shape-overflow", st([], raw_header=json.dumps({"a": entry("F32", [2**32, 2**32, 16], 0, 0)}).encode(), data=b""))
write(t, "duplicate-names", st([], raw_header=b'{"a":' + json.dumps(entry("U8", [2], 0, 2)).encode() + b',"a":' + json.dumps(entry("U8", [2], 2, 4)).encode() + b"}", data=b"1234"))
write(t, "nested-json", st([], raw_header=b'{"a":' + b"[" * 200 + b"]" * 200 + b"}", data=b""))
write(t, "non-utf8-name", st([], raw_header=b'{"\xff\xfe":' + json.dumps(entry("U8", [1], 0, 1)).encode() + b"}", data=b"1"))
write(t, "control-char-name", st([], raw_header=json.dumps({"a\u0007\n": entry("U8", [1], 0, 1)}).encode(), data=b"1"))
write(t, "unknown-dtype", st([], raw_header=json.dumps({"a": entry("Q4", [1], 0, 1)}).encode(), data=b"1"))
write(t, "short", b"\x01\x00")

t = "index"
good = {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors", "d": "sub/d.safetensors"}
write(t, "valid", json.dumps({"metadata": {"total_size": 31}, "weight_map": good}))
write(t, "dot-dot", json.dumps({"weight_map": dict(good, d="../sub/d.safetensors")}))
write(t, "absolute", json.dumps({"weight_map": dict(good, d="/etc/passwd")}))
write(t, "missing-shard", json.dumps({"weight_map": dict(good, d="model-00003-of-00003.safetensors")}))
write(t, "wrong-shard", json.dumps({"weight_map": dict(good, c="model-00001-of-00002.safetensors")}))
write(t, "tensor-not-in-index", json.dumps({"weight_map": {k: v for k, v in good.items() if k != "b"}}))
write(t, "empty-name", json.dumps({"weight_map": dict(good, d="")}))
write(t, "dot-slash", json.dumps({"weight_map": dict(good, d="./sub/d.safetensors")}))
write(t, "not-a-map", '{"weight_map": [1, 2]}')
write(t, "deep", '{"weight_map": ' + "[" * 300 + "]" * 300 + "}")

llama = {
    "tp": {"rank": 1, "world": 2},
    "ties": [{"to": "lm_head.weight", "from": "model.embed_tokens.weight"}],
    "rules": [
        {"match": r"model\.layers\.(\d+)\.self_attn\.rotary_emb\.inv_freq", "skip": True},
        {"match": r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", "to": "model.layers.$1.self_attn.qkv_proj.weight", "fuse": {"dim": 0, "index": 0}, "shard": {"dim": 0, "head_dim": 2}},
        {"match": r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", "to": "model.layers.$1.self_attn.qkv_proj.weight", "fuse": {"dim": 0, "index": 1}, "shard": {"dim": 0, "head_dim": 2}},
        {"match": r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", "to": "model.layers.$1.self_attn.qkv_proj.weight", "fuse": {"dim": 0, "index": 2}, "shard": {"dim": 0, "head_dim": 2}},
        {"match": r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", "to": "model.layers.$1.mlp.gate_up_proj.weight", "fuse": {"dim": 0, "index": 0}, "shard": {"dim": 0}},
        {"match": r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", "to": "model.layers.$1.mlp.gate_up_proj.weight", "fuse": {"dim": 0, "index": 1}, "shard": {"dim": 0}},
        {"match": r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", "shard": {"dim": 1}},
        {"match": r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", "shard": {"dim": 1}},
        {"match": r"model\.embed_tokens\.weight", "shard": {"dim": 0}, "pad": {"dim": 0, "multiple_of": 16}},
    ],
}
rules_seeds = {
    "empty": "{}",
    "llama-tp": json.dumps(llama),
    "llama-notp": json.dumps(dict(llama, tp=None)),
    "dtype": json.dumps({"dtype": "F32", "rules": [{"match": ".*norm.*", "pad": {"dim": 0, "to": 8}}]}),
    "fuse-offset": json.dumps({"rules": [{"match": r"model\.layers\.0\.(.*)", "to": "all", "fuse": {"dim": 1, "offset": 3}}]}),
    "bad-regex": json.dumps({"rules": [{"match": "a("}]}),
    "bad-tp": json.dumps({"tp": {"rank": 3, "world": 2}}),
    "huge-pad": json.dumps({"rules": [{"match": ".*", "pad": {"dim": 0, "to": 2**62}}]}),
    "shard-dim-3": json.dumps({"tp": {"rank": 0, "world": 4}, "rules": [{"match": ".*", "shard": {"dim": 3, "head_dim": 0}}]}),
    "tie-to-self": json.dumps({"ties": [{"to": "x", "from": "x"}]}),
}
for name, text in rules_seeds.items():
    write("rules", name, text)
    write("planner", name, text.encode() + b"\0")
write("planner", "llama-tp-own-file", json.dumps(llama).encode() + b"\0" + st([("model.layers.0.self_attn.q_proj.weight", "BF16", [4, 4]), ("model.layers.0.self_attn.k_proj.weight", "BF16", [2, 4])]))
write("planner", "noop-own-file", b"{}\0" + st([("a", "F32", [2, 2]), ("b", "BF16", [3])]))

G = 2 << 20
def manifest(**kw):
    m = {"format": 1, "version": 1, "backend": "host", "tag": "weights", "owner_pid": 1, "writable": False,
         "chunks": [G, 2 * G], "tensors": [{"name": "w", "dtype": "BF16", "shape": [1024, 1024], "offset": G}]}
    m.update(kw)
    return json.dumps({"manifest": m})
t = "share_manifest"
write(t, "valid", manifest())
write(t, "valid-cuda-two-tensors", manifest(backend="cuda", tensors=[
    {"name": "a", "dtype": "F32", "shape": [16], "offset": 0}, {"name": "b", "dtype": "U8", "shape": [3, 5], "offset": 64}]))
write(t, "refused", json.dumps({"refused": "owner is asleep"}))
write(t, "tensor-past-end", manifest(tensors=[{"name": "w", "dtype": "F32", "shape": [G], "offset": 2 * G}]))
write(t, "offset-overflow", manifest(tensors=[{"name": "w", "dtype": "U8", "shape": [2], "offset": 2**64 - 1}]))
write(t, "shape-overflow", manifest(tensors=[{"name": "w", "dtype": "F64", "shape": [2**40, 2**40], "offset": 0}]))
write(t, "chunk-sum-overflow", manifest(chunks=[2**63, 2**63]))
write(t, "odd-chunk", manifest(chunks=[G + 1]))
write(t, "no-chunks", manifest(chunks=[]))
write(t, "duplicate-names", manifest(tensors=[{"name": "w", "dtype": "U8", "shape": [1], "offset": 0}] * 2))
write(t, "misaligned", manifest(tensors=[{"name": "w", "dtype": "F32", "shape": [1], "offset": 2}]))
write(t, "bad-format", manifest(format=2))

# The wire, client side (fuzz_share_client): one mode byte (descriptors to
# send = mode % 4, bit 2 = unsealed), then what a hostile owner sends as is.
G64 = 64 << 10
def framed(text):
    return b"VMMWSHR1" + struct.pack("<Q", len(text)) + text.encode()
def m64(**kw):
    m = {"format": 1, "version": 1, "backend": "host", "tag": "weights", "owner_pid": 1, "writable": False,
         "chunks": [G64], "tensors": [{"name": "w", "dtype": "F32", "shape": [16], "offset": 0}]}
    m.update(kw)
    return json.dumps({"manifest": m})
t = "share_client"
write(t, "valid", b"\x01" + framed(m64()))
write(t, "valid-two-chunks-notices", b"\x02" + framed(m64(chunks=[G64, G64])) + b"V" + struct.pack("<Q", 7))
write(t, "unsealed", b"\x05" + framed(m64()))
write(t, "too-many-fds", b"\x03" + framed(m64()))
write(t, "too-few-fds", b"\x01" + framed(m64(chunks=[G64, G64])))
write(t, "chunk-bigger-than-fd", b"\x01" + framed(m64(chunks=[2 * G64])))
write(t, "oversized-chunk", b"\x01" + framed(m64(chunks=[2**46])))
write(t, "refused", b"\x00" + framed(json.dumps({"refused": "no"})))
write(t, "refused-control-chars", b"\x00" + framed(json.dumps({"refused": "x\n\u001b[31m\u202e"})))
write(t, "wrong-magic", b"\x01NOTVMMW\0" + struct.pack("<Q", 2) + b"{}")
write(t, "huge-length", b"\x00VMMWSHR1" + struct.pack("<Q", 2**63))
write(t, "short-json", b"\x00VMMWSHR1" + struct.pack("<Q", 100) + b"{")
write(t, "bad-notice", b"\x01" + framed(m64()) + b"Z")
write(t, "evicted-in-handshake", b"\x01" + framed(m64()) + b"X")
write(t, "empty", b"")

# The wire, server side (fuzz_share_server): what a hostile importer sends.
t = "share_server"
for name, data in {"read": b"r", "write": b"w", "junk-request": b"x", "nothing": b"",
                   "read-then-junk": b"r" + b"\0" * 64, "write-then-notices": b"wVVVVRRX",
                   "magic": b"VMMWSHR1" + struct.pack("<Q", 2) + b"{}", "many": b"r" * 4096}.items():
    write(t, name, data)


# GGUF (fuzz_gguf_header opens the file as a checkpoint, fuzz_gguf_metadata
# parses the header alone): valid files of every metadata type, quantized
# tensors, a split part, and the hostile shapes docs/GGUF.md refuses.
def gstr(s):
    s = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(s)) + s


def gval(t, v):
    """A typed value: t is GGUF's type number; arrays are (elem_type, [values])."""
    fmt = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    if t == 8:
        return gstr(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gval(et, x) for x in items)
    return struct.pack(fmt[t], v)


def gguf(kv, tensors, version=3, align=32, n_tensors=None, n_kv=None, data=None):
    """kv = [(key, type, value)]; tensors = [(name, ne, ggml_type, nbytes)] laid out aligned."""
    b = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                              len(kv) if n_kv is None else n_kv)
    for k, t, v in kv:
        b += gstr(k) + struct.pack("<I", t) + gval(t, v)
    off, body = 0, b""
    for name, ne, ty, n in tensors:
        b += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        b += struct.pack("<IQ", ty, off)
        body += bytes(i % 251 for i in range(n)) + b"\0" * ((-n) % align)
        off += n + (-n) % align
    b += b"\0" * ((-len(b)) % align)
    return b + (body if data is None else data)


EVERY = [("general.architecture", 8, "llama"), ("u8", 0, 7), ("i8", 1, -7), ("u16", 2, 7), ("i16", 3, -7),
         ("u32", 4, 7), ("i32", 5, -7), ("f32", 6, 0.5), ("bool", 7, True), ("u64", 10, 2**64 - 1),
         ("i64", 11, -2**63), ("f64", 12, 0.25), ("strs", 9, (8, ["a", "bc"])),
         ("nested", 9, (9, [(4, [1, 2]), (8, ["x"])])), ("empty", 9, (6, []))]
TENSORS = [("w.q8", [64, 2], 8, 2 * 2 * 34), ("w.f32", [4], 0, 16), ("w.q4k", [256], 12, 144)]
for t in ("gguf_header", "gguf_metadata"):
    write(t, "valid-every-type", gguf(EVERY, TENSORS))
    write(t, "valid-v2", gguf(EVERY[:3], TENSORS, version=2))
    write(t, "valid-align-64", gguf([("general.alignment", 4, 64)], TENSORS, align=64))
    write(t, "valid-split-part", gguf([("split.no", 2, 0), ("split.count", 2, 1), ("split.tensors.count", 5, 3)], TENSORS))
    write(t, "valid-no-tensors", gguf(EVERY, []))
    write(t, "truncated", gguf(EVERY, TENSORS)[:-7])
    write(t, "huge-counts", gguf(EVERY, TENSORS, n_tensors=2**62, n_kv=2**40))
    write(t, "huge-string", gguf([("k", 8, "x")], [])[:32] + struct.pack("<Q", 2**60))
    write(t, "unknown-type", gguf([], [("w", [32], 99, 32)]))
    write(t, "removed-type", gguf([], [("w", [32], 31, 32)]))
    write(t, "bad-version", gguf(EVERY, TENSORS, version=4))
    write(t, "big-endian", gguf(EVERY, TENSORS, version=3 << 24))
    write(t, "deep-array", gguf([("d", 9, (9, [(9, [(9, [(9, [(4, [1])])])])]))], []))
    write(t, "bad-alignment", gguf([("general.alignment", 4, 48)], TENSORS))

# The backup codec's frames (fuzz_codec_frame): byte 0 even = a frame to
# decode, odd = raw bytes to encode, corrupt and decode.
t = "codec_frame"
def raw_frame(raw, width):
    """A frame whose blocks are all stored raw (src/codec/format.rs)."""
    B = 65536
    nb = (len(raw) + B - 1) // B
    blocks = []
    for b in range(nb):
        chunk = raw[b * B:(b + 1) * B]
        blocks.append(struct.pack("<QBBHI", 0, 0, 0, 0, 0) + chunk)
    start = 32 + 8 * nb
    index, at = b"", start
    for blk in blocks:
        index += struct.pack("<Q", at)
        at += len(blk)
    header = b"VMWC" + struct.pack("<BBHII", 1, width, 0, B, 0) + struct.pack("<QQ", len(raw), at)
    return header + index + b"".join(blocks)
write(t, "frame-empty", b"\x00" + raw_frame(b"", 2))
write(t, "frame-raw-bad-checksum", b"\x00" + raw_frame(bytes(range(200)), 2))
write(t, "frame-two-blocks", b"\x00" + raw_frame(bytes(i % 7 for i in range(70000)), 1))
write(t, "frame-short", b"\x00VMWC\x01\x02")
write(t, "frame-huge-len", b"\x00VMWC" + struct.pack("<BBHII", 1, 4, 0, 65536, 0) + struct.pack("<QQ", 2**62, 40))
bf16 = b"".join(struct.pack("<H", 0x3C00 + (i * 37) % 0x300) for i in range(5000))
write(t, "encode-bf16-clean", b"\x01\x01\x00" + bf16)
write(t, "encode-bf16-one-flip", b"\x01\x01\x01" + struct.pack("<HB", 100, 0x10) + bf16)
write(t, "encode-fp32-flips", b"\x01\x02\x03" + struct.pack("<HBHBHB", 0, 1, 40, 2, 33, 0x80) + bytes(i % 13 for i in range(4000)))
write(t, "encode-bytes-tail", b"\x01\x00\x01" + struct.pack("<HB", 7, 0xFF) + b"\x05" * 65537)
