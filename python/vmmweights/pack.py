"""Packed checkpoints (docs/PACKED.md): a safetensors file or folder, or a
GGUF file, with each tensor's bytes losslessly compressed as codec frames.

``pack`` writes one, ``unpack`` gives the original files back bit for bit.
Loading needs nothing new: :func:`vmmweights.load`, :class:`vmmweights.Loader`
and ``vmmweights.torch.load_`` recognize a packed checkpoint by its content
and decode it on the device.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, fields
from typing import Any, Callable, List, Optional, Union

from . import _structs as S
from ._native import call

#: ``progress(done_bytes, total_bytes)``: a truthy return (or an exception)
#: stops the pack (``VMMW_CANCELLED``; the exception is re-raised). Called
#: from one of the packer's threads, one call at a time.
Progress = Callable[[int, int], Optional[bool]]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class PackReport:
    """What a pack or unpack wrote: bytes of the original and packed files,
    the files written, the checkpoint's tensors, seconds reading, coding and
    writing, and seconds syncing and renaming into place."""

    original_bytes: int
    packed_bytes: int
    files: int
    tensors: int
    seconds: float
    sync_seconds: float

    @property
    def ratio(self) -> float:
        """Packed bytes over original bytes."""
        return self.packed_bytes / max(self.original_bytes, 1)


def _run(fn: str, src: PathLike, dst: PathLike, opts: S.PackOptions, progress: Optional[Progress]) -> PackReport:
    failure: List[BaseException] = []

    def on_progress(done: int, total: int, _user: Any) -> int:
        if progress is None or failure:
            return 1 if failure else 0
        try:
            return 1 if progress(done, total) else 0
        except BaseException as e:  # noqa: BLE001 - re-raised after the call
            failure.append(e)
            return 1

    cb = S.PROGRESS_FN(on_progress) if progress is not None else S.PROGRESS_FN()
    out = S.PackReport()
    try:
        call(fn, os.fsencode(src), os.fsencode(dst), ctypes.byref(opts), cb, None, ctypes.byref(out))
    except Exception:
        if failure:
            raise failure[0] from None
        raise
    return PackReport(**{f.name: getattr(out, f.name) for f in fields(PackReport)})


def pack(
    src: PathLike,
    dst: PathLike,
    *,
    frame_bytes: int = 0,
    threads: int = 0,
    cpu: bool = False,
    force: bool = False,
    device: int = 0,
    progress: Optional[Progress] = None,
) -> PackReport:
    """Pack the checkpoint at `src` (a safetensors file, a folder with its
    index, or a GGUF file) into `dst` (a folder for a folder, else a file).

    Encodes on the GPU (`device`) where one opens and ``VMMW_BACKEND`` allows,
    on CPU threads otherwise or with ``cpu=True``. `frame_bytes` (0: 16 MiB)
    is the raw bytes per frame, a multiple of 64 KiB up to 256 MiB. `dst`
    must not exist, unless ``force`` and it is a file. Nothing is left at
    `dst` when it fails."""
    opts = S.PackOptions(frame_bytes=frame_bytes, threads=threads, cpu=int(cpu), force=int(force), device=device)
    return _run("vmmw_pack", src, dst, opts, progress)


def unpack(
    src: PathLike,
    dst: PathLike,
    *,
    threads: int = 0,
    force: bool = False,
    progress: Optional[Progress] = None,
) -> PackReport:
    """Write the original files of the packed checkpoint `src` into `dst`,
    bit for bit (every frame's checksums checked)."""
    opts = S.PackOptions(threads=threads, force=int(force))
    return _run("vmmw_unpack", src, dst, opts, progress)
