"""The installed package: every module compiles (also vmmweights.torch and
the shims, which need PyTorch to import), every public name exists, and the
PyTorch part says what it needs where PyTorch is missing."""

from __future__ import annotations

import compileall
import importlib.util
from pathlib import Path

import pytest

import vmmweights as vw


def test_every_module_compiles():
    root = Path(vw.__file__).parent
    assert compileall.compile_dir(str(root), quiet=1, force=True)
    names = {p.relative_to(root).as_posix() for p in root.rglob("*.py")}
    assert {"torch/__init__.py", "torch/memory_saver.py", "torch/cumem.py", "loader.py", "pool.py"} <= names


def test_public_names_exist_and_are_documented():
    for name in vw.__all__:
        obj = getattr(vw, name)
        if callable(obj):
            assert obj.__doc__, f"vmmweights.{name} has no docstring"
    assert (Path(vw.__file__).parent / "py.typed").is_file()


def test_torch_part_needs_torch():
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed here; tests/torch covers vmmweights.torch")
    with pytest.raises(ImportError):
        import vmmweights.torch  # noqa: F401


def test_version_is_the_package_and_the_library_version():
    import re

    assert re.fullmatch(r"\d+\.\d+\.\d+", vw.__version__), vw.__version__
    assert vw.__version__ == vw.version(), "package and library versions differ"


def test_python_m_help_lists_the_diagnosis(capsys):
    from vmmweights.__main__ import main

    rc = main(["--help"])
    out = capsys.readouterr().out
    assert "--diagnose" in out and "python -m vmmweights" in out, out
    # The command line's own help follows where the package carries it.
    assert rc == 0
