"""torch_memory_saver.hooks.mode_preload: ``configure_subprocess`` for the
preload hook mode. Children started inside it load the interposer named by
:func:`get_binary_path_from_package` first on ``LD_PRELOAD``, as upstream's
do; where there is none, they route their allocations through vmmweights'
pluggable allocator from the first one instead."""

import contextlib
from typing import Iterator, Optional

from vmmweights.saver import preloaded_subprocess

from ..utils import get_binary_path_from_package

__all__ = ["INTERPOSER_STEM", "configure_subprocess", "get_binary_path_from_package"]

#: The file name stem of the preload hook mode's interposer.
INTERPOSER_STEM = "torch_memory_saver_hook_mode_preload"


@contextlib.contextmanager
def configure_subprocess() -> Iterator[Optional[str]]:
    """Environment for child processes in the preload hook mode (restored
    after the block); yields the library put first on ``LD_PRELOAD``, or
    None when the children route through the pluggable allocator."""
    # The module's name, looked up at the call: what a caller patched in wins.
    with preloaded_subprocess(lambda: get_binary_path_from_package(INTERPOSER_STEM)) as lib:
        yield lib
