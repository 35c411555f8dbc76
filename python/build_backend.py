"""The build backend of ``pip install ./python``: maturin's PEP 517 hooks,
with two defaults for a build from a checkout of the repository.

- The Rust build goes to the repository's ``target/`` (``CARGO_TARGET_DIR``,
  when it is not set already), so a checkout builds once for cargo, CMake
  and pip, and a second ``pip install`` rebuilds only what changed.
- The wheel gets the manylinux tag its binaries meet: maturin checks the
  glibc symbol versions and libraries the ``vmmw`` binary needs and tags it
  ``manylinux_2_X`` (a plain PEP 517 build of maturin's tags it
  ``linux_x86_64``, which claims nothing). scripts/test.d/70-python.sh checks
  that the C library in the wheel needs no newer glibc than the tag says.

``MATURIN_PEP517_ARGS`` or ``--config-settings build-args=...`` with a
``--compatibility`` of their own (``manylinux_2_28`` in a manylinux
container, ``linux``) take precedence. Build output shows with ``pip
install -v ./python``.
"""

from __future__ import annotations

import os
import shlex

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)

if "CARGO_TARGET_DIR" not in os.environ and os.path.isfile(os.path.join(_REPO, "scripts", "build-clib.sh")):
    os.environ["CARGO_TARGET_DIR"] = os.path.join(_REPO, "target")

_args = shlex.split(os.environ.get("MATURIN_PEP517_ARGS", ""))
if "--compatibility" not in _args and "--manylinux" not in _args:
    # With no value, maturin picks the newest manylinux policy the binary meets.
    os.environ["MATURIN_PEP517_ARGS"] = shlex.join([*_args, "--compatibility"])

from maturin import (  # noqa: E402  (after the environment it reads)
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_wheel",
]
