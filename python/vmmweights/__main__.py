"""``python -m vmmweights``.

With arguments it runs the ``vmmw`` command line the wheel installs (the
``vmmw`` command in the environment's scripts folder), with the same
arguments and exit code: ``python -m vmmweights demo``. Without arguments,
or with ``--diagnose``, it prints what this installation uses: versions, the
library's path, the command line's, and the backend and device a pool opens
on. ``--help`` says both, then shows the command line's help.
"""

from __future__ import annotations

import os
import platform
import sys
import sysconfig
from pathlib import Path
from typing import List, Optional

_HERE = Path(__file__).resolve().parent


def cli_path() -> Optional[Path]:
    """The ``vmmw`` command installed with this package (in the scripts
    folder of its environment, or of the user's scheme for ``pip install
    --user``), if there is one."""
    folders = [sysconfig.get_path("scripts")]
    try:
        folders.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:  # no user scheme on this platform
        pass
    for folder in folders:
        p = Path(folder) / "vmmw"
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def diagnose() -> int:
    """Print what this installation uses; 0 when a pool opened, 1 otherwise."""
    from . import Pool, __version__, library_path, version

    print(
        f"vmmweights {__version__}, library {version()} "
        f"(Python {platform.python_version()}, {sys.executable})"
    )
    print(f"library:   {library_path()}")
    cli = cli_path()
    print(f"vmmw:      {cli if cli else 'not in this installation'}")
    print(f"VMMW_BACKEND={os.environ.get('VMMW_BACKEND', '(unset: auto)')}")
    try:
        with Pool(backend=os.environ.get("VMMW_BACKEND", "auto")) as pool:
            r = pool.report()
            print(f"backend:   {r['backend']}")
            print(f"device:    {r['ordinal']}: {r['device']}")
    except Exception as e:  # the diagnosis reports what failed instead of raising
        print(f"backend:   no pool could be opened: {e}")
        return 1
    return 0


USAGE = """\
usage: python -m vmmweights [--diagnose | COMMAND [ARGS...]]

  (no arguments), --diagnose
      what this installation uses: the package's and the library's version,
      the library's and the vmmw command's paths, and the backend and device a
      pool opens on (VMMW_BACKEND=host|cuda|auto); exit 0 when a pool opened
  COMMAND [ARGS...]
      the vmmw command line installed with the package, e.g.
      `python -m vmmweights demo`; its commands follow
"""


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args == ["--diagnose"]:
        return diagnose()
    cli = cli_path()
    if args in (["--help"], ["-h"]):
        print(USAGE)
        sys.stdout.flush()
        if cli is None:
            print("(no vmmw command is installed with this package)")
            return 0
        import subprocess

        return subprocess.run([str(cli), "--help"], check=False).returncode
    if cli is None:
        print(
            "vmmw: no vmmw command is installed with this package (a source checkout on "
            "PYTHONPATH?); `python -m vmmweights` shows what it has",
            file=sys.stderr,
        )
        return 1
    os.execv(str(cli), [str(cli), *args])


if __name__ == "__main__":
    sys.exit(main())
