"""GGUF files written by the `gguf` package (llama.cpp's reader and writer,
pinned by scripts/test.d/70-python.sh), loaded by our loader on the host
backend: every tensor's loaded bytes equal, bit for bit, what gguf's own
GGUFReader returns for it, for every type gguf can write (its numpy
quantizers where it has one, raw blocks of the K- and i-quants otherwise),
for split files, after sleep and wake, and metadata of every type reads back
through our API as GGUFReader reads it."""

from __future__ import annotations

import pytest

import gguf  # pinned by scripts/test.d/70-python.sh
import numpy as np

import vmmweights as vw

Q = gguf.GGMLQuantizationType
RNG = np.random.default_rng(7)

# Types gguf quantizes itself (gguf.quants), and types it only writes as raw blocks.
QUANTIZED = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.TQ1_0, Q.TQ2_0, Q.MXFP4]
RAW_BLOCKS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_K, Q.IQ2_XXS, Q.IQ2_XS,
              Q.IQ3_XXS, Q.IQ1_S, Q.IQ4_NL, Q.IQ3_S, Q.IQ2_S, Q.IQ4_XS, Q.IQ1_M]


@pytest.fixture
def pool():
    p = vw.Pool(backend="host")
    yield p
    p.close()


def add_every_metadata_type(w):
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", -2.25)
    w.add_bool("t.bool", True)
    w.add_string("t.string", "ünïcode ✓")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, -1.0])
    w.add_array("t.strings", ["a", "bc", ""])
    w.add_array("t.nested", [[1, 2], [3]])


def write(path, tensors, split_max_tensors=0):
    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    add_every_metadata_type(w)
    for name, (arr, raw_dtype) in tensors.items():
        if raw_dtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def every_type():
    t = {}
    t["f32"] = (RNG.standard_normal((3, 64), dtype=np.float32), None)
    t["f16"] = (RNG.standard_normal((2, 48)).astype(np.float16), None)
    bf = RNG.standard_normal((4, 32), dtype=np.float32)
    t["bf16"] = (gguf.quants.quantize(bf, Q.BF16), Q.BF16)
    for q in QUANTIZED:
        block, _ = gguf.GGML_QUANT_SIZES[q]
        x = RNG.standard_normal((4, 2 * 256 if block == 256 else 2 * block), dtype=np.float32)
        t[q.name.lower()] = (gguf.quants.quantize(x, q), q)
    for q in RAW_BLOCKS:
        block, size = gguf.GGML_QUANT_SIZES[q]
        t[q.name.lower()] = (RNG.integers(0, 256, (3, 2 * size), dtype=np.uint8), q)
    return t


def reader_tensors(paths):
    out = {}
    for p in paths:
        for t in gguf.GGUFReader(str(p)).tensors:
            out[t.name] = t
    return out


def check_bytes(pool, dests, tensors):
    assert set(dests) == set(tensors)
    for name, t in tensors.items():
        d = dests[name]
        want = t.data.tobytes()
        assert d.dtype == t.tensor_type.name, name
        # Our shapes are row-major: gguf's ne (GGUFReader.shape) reversed.
        assert list(d.shape) == [int(x) for x in reversed(t.shape)], name
        assert d.bytes == len(want) == int(t.n_bytes), name
        assert pool.read(d.ptr, d.bytes) == want, name


def test_every_type_loads_bitwise_as_gguf_reads_it(pool, tmp_path):
    path = tmp_path / "model.gguf"
    write(path, every_type())
    tensors = reader_tensors([path])
    assert len(tensors) == 3 + len(QUANTIZED) + len(RAW_BLOCKS)
    dests, result = vw.load(str(path), pool, "weights")
    assert result.bytes == sum(int(t.n_bytes) for t in tensors.values())
    check_bytes(pool, dests, tensors)
    for policy in ("reload", "offload"):
        pool.sleep(weights=policy)
        pool.wake("weights")
        check_bytes(pool, dests, tensors)


def test_split_files_load_as_one_checkpoint(pool, tmp_path):
    path = tmp_path / "model.gguf"
    write(path, every_type(), split_max_tensors=5)
    parts = sorted(tmp_path.glob("model-*-of-*.gguf"))
    assert len(parts) > 2, parts
    tensors = reader_tensors(parts)
    dests, _ = vw.load(str(parts[-1]), pool, "weights")
    check_bytes(pool, dests, tensors)


def test_file_name_does_not_pick_the_format(pool, tmp_path):
    path = tmp_path / "weights.safetensors"
    write(path, {"x": (RNG.standard_normal((2, 32), dtype=np.float32), None)})
    dests, _ = vw.load(str(path), pool, "weights")
    check_bytes(pool, dests, reader_tensors([path]))


def test_metadata_of_every_type_reads_back(tmp_path):
    path = tmp_path / "model.gguf"
    write(path, {"x": (np.zeros((1, 32), dtype=np.float32), None)})
    ours = vw.gguf_metadata(str(path))
    reader = gguf.GGUFReader(str(path))
    assert list(ours) == [f.name for f in reader.fields.values() if not f.name.startswith("GGUF.")]
    for f in reader.fields.values():
        if f.name.startswith("GGUF."):
            continue
        want = f.contents()
        got = ours[f.name]
        if f.name == "t.nested":
            # gguf's reader flattens nested arrays; ours keeps their structure.
            got = [x for inner in got for x in inner]
        if isinstance(want, float):
            assert got == pytest.approx(want), f.name
        else:
            assert got == want, f.name
    assert ours["t.u64"] == 2**64 - 1 and ours["t.i64"] == -(2**63)
    assert ours["t.nested"] == [[1, 2], [3]]
    assert vw.gguf_metadata_types(str(path))["t.u16"] == "uint16"


def test_hostile_file_is_refused_with_its_name(pool, tmp_path):
    path = tmp_path / "model.gguf"
    write(path, {"x": (np.zeros((1, 32), dtype=np.float32), None)})
    data = path.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:-4])
    with pytest.raises(vw.VmmwError, match=r"cut\.gguf.*x.*past the end"):
        vw.load(str(bad), pool, "weights")
    assert pool.report()["tags"] == [] or all(t["live_bytes"] == 0 for t in pool.report()["tags"])
