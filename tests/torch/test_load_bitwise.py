"""GPU test: a transformers model's state dict saved as safetensors, the model
rebuilt inside our MemPool with every parameter zeroed, loaded in place by our
loader through the C API (vmmw_loader_*): the forward output is bitwise equal.

Run with PYTHONPATH=examples/torch and VMMW_LIB=<path to libvmmweights.so>.
Skips (with the reason) without PyTorch, CUDA, transformers, or a library
that does not export the vmmw_loader_* functions yet.

C API used (src/ffi/loader.rs; each returns a vmmw status and takes a trailing
`vmmw_error_t** error`):
  vmmw_loader_open(path, &loader), vmmw_loader_register(loader, name, ptr, dtype, shape, ndim),
  vmmw_loader_set_options(loader, &vmmw_load_options_t), vmmw_loader_load(loader, pool, progress, user),
  vmmw_loader_result(loader, &vmmw_load_result_t), vmmw_loader_free(loader)
"""

import ctypes
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the loader's PyTorch test needs a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
st = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")

import vmmweights_torch as vt  # noqa: E402

PROGRESS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p)
DTYPES = {torch.bfloat16: b"BF16", torch.float16: b"F16", torch.float32: b"F32"}
STRATEGIES = {"auto": 0, "direct": 1, "staged": 2, "read": 3, "simple": 4}


class LoadOptions(ctypes.Structure):
    # vmmw_load_options_t: `size` first (set to sizeof by __init__), as the header says.
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("allow_missing", ctypes.c_uint32),
        ("allow_unexpected", ctypes.c_uint32),
        ("strategy", ctypes.c_int32),
        ("threads", ctypes.c_uint32),
        ("window_bytes", ctypes.c_uint64),
        ("slot_bytes", ctypes.c_uint64),
    ]


    def __init__(self, **fields):
        super().__init__(size=ctypes.sizeof(LoadOptions), **fields)


class LoadResult(ctypes.Structure):
    _fields_ = [
        ("bytes", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("gbps", ctypes.c_double),
        ("direct_bytes", ctypes.c_uint64),
        ("staged_bytes", ctypes.c_uint64),
        ("read_bytes", ctypes.c_uint64),
        ("filled_bytes", ctypes.c_uint64),
        ("threads", ctypes.c_uint32),
    ]


def loader_api():
    lib = vt.lib()
    if getattr(lib, "vmmw_loader_open", None) is None:
        pytest.skip(f"{vt.library_path()} does not export vmmw_loader_* (rebuild the library)")
    err = ctypes.POINTER(ctypes.c_void_p)
    vp = ctypes.c_void_p
    sigs = {
        "vmmw_loader_open": [ctypes.c_char_p, ctypes.POINTER(vp), err],
        "vmmw_loader_register": [
            vp, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, err,
        ],
        "vmmw_loader_set_options": [vp, ctypes.POINTER(LoadOptions), err],
        "vmmw_loader_load": [vp, vp, PROGRESS, vp, err],
        "vmmw_loader_result": [vp, ctypes.POINTER(LoadResult), err],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = args
    lib.vmmw_loader_free.restype = None
    lib.vmmw_loader_free.argtypes = [vp]
    return lib


def build(cfg):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()


@pytest.mark.parametrize("strategy", ["auto", "direct", "staged"])
def test_forward_is_bitwise_equal_after_loading_into_our_pool(tmp_path, strategy):
    lib = loader_api()
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    ref_model = build(cfg)
    path = tmp_path / "model.safetensors"
    st.save_file({k: v.contiguous() for k, v in ref_model.state_dict().items()}, str(path))
    ids = torch.randint(0, cfg.vocab_size, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        want = ref_model(ids).logits.clone()
    del ref_model
    torch.cuda.empty_cache()

    with vt.use_pool("weights"):
        model = transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert all(int(p.abs().sum()) == 0 for p in model.parameters())

    loader = ctypes.c_void_p()
    vt._call("vmmw_loader_open", str(path).encode(), ctypes.byref(loader))
    result = LoadResult()
    seen = []

    def on_progress(done, total, user):
        seen.append((done, total))
        return 0

    cb = PROGRESS(on_progress)
    try:
        for name, t in model.state_dict().items():
            shape = (ctypes.c_uint64 * max(t.dim(), 1))(*t.shape)
            vt._call("vmmw_loader_register", loader, name.encode(), ctypes.c_uint64(t.data_ptr()),
                     DTYPES[t.dtype], shape, ctypes.c_size_t(t.dim()))
        opts = LoadOptions(strategy=STRATEGIES[strategy])
        vt._call("vmmw_loader_set_options", loader, ctypes.byref(opts))
        vt._call("vmmw_loader_load", loader, vt._pool_handle(0), cb, None)
        vt._call("vmmw_loader_result", loader, ctypes.byref(result))
    finally:
        lib.vmmw_loader_free(loader)
    torch.cuda.synchronize()
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert result.bytes == total, (result.bytes, total)
    assert seen and seen[-1] == (total, total)
    with torch.no_grad():
        got = model(ids).logits
    assert torch.equal(got, want), f"max abs diff {float((got.float() - want.float()).abs().max())}"
    if strategy != "direct":  # staged loads leave their pinned ring cached; it can be freed
        cached = vt.staging_bytes()
        assert cached > 0
        assert vt.release_staging() == cached
        assert vt.staging_bytes() == 0
    del model
    vt.release_pools("weights")
