"""GPU: weights shared across processes feed a transformers forward.

Process A (this test) writes a small model with save_pretrained, loads the
checkpoint into a tag of our pool (``vmmweights.share.serve_checkpoint``),
serves it, builds the model over its own pool memory and runs a forward on
fixed input ids. Process B (``share_importer.py``, a subprocess) attaches,
builds the same architecture with its parameters replaced by torch tensors
over the imported read-only memory (``vmmweights.torch.shared``; B computes
only the non-persistent buffers, the rotary ``inv_freq``), runs the same
forward: the logits are bitwise equal (``torch.equal``). B runs on GPU 0 and,
where there are two GPUs, on GPU 1 reading GPU 0's memory over peer access.
Skips with the reason without PyTorch, CUDA or transformers."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the share forward test needs a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)
pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models as hf  # noqa: E402
import share_importer  # noqa: E402
import vmmweights.torch as vt  # noqa: E402
from vmmweights import share  # noqa: E402

HERE = Path(__file__).resolve().parent
TAG = "share-weights"


def importer(sock: Path, family: str, device: int, work: Path) -> tuple:
    """Run process B; its logits (CPU) and its report."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *[p for p in sys.path if p]])
    cmd = [sys.executable, str(HERE / "share_importer.py"), "--socket", str(sock), "--family", family,
           "--device", str(device), "--inputs", str(work / "ids.pt"), "--out", str(work / "b.pt"),
           "--report", str(work / "b.json")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"process B failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    return torch.load(work / "b.pt"), json.loads((work / "b.json").read_text())


@pytest.mark.parametrize("importer_device", [0, 1])
@pytest.mark.parametrize("family", sorted(hf.CONFIGS))
def test_importer_forward_bitwise_equal(tmp_path, family, importer_device):
    if importer_device >= torch.cuda.device_count():
        pytest.skip(f"one GPU here: the importer on GPU {importer_device} needs {importer_device + 1}")
    torch.cuda.set_device(0)
    cfg = hf.CONFIGS[family]()
    ckpt = tmp_path / "ckpt"
    ids, want = hf.write(cfg, ckpt)
    pool = vt.pool(0)
    server = share.serve_checkpoint(ckpt, tmp_path / "w.sock", pool, TAG)
    try:
        views = vt.tensors(server.destinations, device=0)
        model = hf.build(cfg).eval()
        mine = share_importer.install(model, views, "cuda:0", cfg.tie_word_embeddings)
        with torch.no_grad():
            got_a = model(ids).logits
        torch.cuda.synchronize()
        # A over pool memory against the model save_pretrained wrote (ordinary
        # torch memory; a different alignment may pick other kernels, so close).
        diff = float((got_a.float() - want.float()).abs().max())
        assert diff <= 0.05 * float(want.float().abs().max()), f"A's forward is off the reference by {diff}"
        torch.save(ids.cpu(), tmp_path / "ids.pt")

        got_b, rep = importer(tmp_path / "w.sock", family, importer_device, tmp_path)
        assert rep["version"] == 1 and rep["tensors"] == len(server.destinations), rep
        assert rep["param_device"] == f"cuda:{importer_device}" == rep["device"], rep
        assert rep["computed_buffers"] == mine["computed_buffers"], (rep, mine)
        print(f"\nshare forward {family}, B on cuda:{importer_device}: {rep['tensors']} tensors imported, "
              f"B computed {rep['computed_buffers']}")
        assert torch.equal(got_b, got_a.cpu()), (
            f"B's logits differ from A's: max abs diff {float((got_b.float() - got_a.cpu().float()).abs().max())}")
        for _ in range(200):  # the owner notices B's closed connection
            if server.attached() == 0:
                break
            time.sleep(0.01)
        assert server.attached() == 0, "B detached when it exited"
    finally:
        server.stop()
        model = views = got_a = None  # noqa: F841
        torch.cuda.synchronize()
        for d in server.destinations.values():
            pool.free(d.ptr)
        pool.trim()
