"""vmmweights: model weights in GPU memory through CUDA virtual memory management.

Load safetensors checkpoints in place, put memory to sleep (offload, discard,
reload) and wake it at the same addresses. This package calls the library's
C ABI (``libvmmweights.so``, carried in the wheel) through ctypes; everything
here works without PyTorch, on the GPU or on the host backend
(``VMMW_BACKEND=host``, no GPU needed). PyTorch integration lives in
:mod:`vmmweights.torch`.

    import vmmweights as vw
    pool = vw.Pool.default()
    dests, result = vw.load("/models/qwen", pool, "weights", preset="qwen2")
    pool.sleep(weights="offload")
    pool.wake("weights")
    print(pool.report_table())

Weights shared with other processes (one copy, mapped by many):
:mod:`vmmweights.share`.
"""

from __future__ import annotations

from ._native import VmmwError, library_path, status_name, version
from .devices import (
    load_devices,
    sleep_replicas,
    wake_replicas,
    wake_replicas_by_reload,
    wake_replicas_from_backup,
    wake_replicas_from_checkpoint,
)
from .metadata import ggml_type, gguf_metadata, gguf_metadata_types
from .loader import STRATEGIES, Destination, Loader, LoadResult, PlanSummary, load
from .pack import PackReport, pack, unpack
from .pool import BACKENDS, POLICIES, Pool
from .report import table as report_table
from .report import tag_usage
from .tags import scope as tag_scope
from .tags import on_remap, remap_epoch, tag_id, tag_name
from .update import UpdateResult, UpdateSource, update
from . import transport  # noqa: E402
from . import share  # noqa: E402  (after the names it uses)


def _package_version() -> str:
    """The installed distribution's version; from a source checkout, which
    has no distribution metadata, the library's (the same number: both come
    from Cargo.toml)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as distribution_version

    try:
        return distribution_version("vmmweights")
    except PackageNotFoundError:
        return version()


#: The package's version, "MAJOR.MINOR.PATCH" (:func:`version` is the
#: loaded library's, and equals it in an installed package).
__version__: str = _package_version()

__all__ = [
    "BACKENDS",
    "POLICIES",
    "STRATEGIES",
    "Destination",
    "LoadResult",
    "Loader",
    "PackReport",
    "PlanSummary",
    "Pool",
    "UpdateResult",
    "UpdateSource",
    "VmmwError",
    "ggml_type",
    "gguf_metadata",
    "gguf_metadata_types",
    "library_path",
    "load",
    "load_devices",
    "on_remap",
    "pack",
    "remap_epoch",
    "report_table",
    "share",
    "transport",
    "sleep_replicas",
    "status_name",
    "tag_id",
    "tag_name",
    "tag_scope",
    "tag_usage",
    "unpack",
    "update",
    "version",
    "wake_replicas",
    "wake_replicas_by_reload",
    "wake_replicas_from_backup",
    "wake_replicas_from_checkpoint",
]
