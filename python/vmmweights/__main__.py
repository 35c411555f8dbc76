"""``vmmw`` (the wheel's console command) and ``python -m vmmweights``.

With arguments, both run the ``vmmw`` command line the wheel carries
(``vmmweights/bin/vmmw``), with the same arguments and exit code:
``python -m vmmweights demo``. Without arguments, or with ``--diagnose``,
``python -m vmmweights`` prints what this installation uses: versions, the
library's path, the backend and device a pool opens on, and why.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import List, Optional

_HERE = Path(__file__).resolve().parent


def cli_path() -> Optional[Path]:
    """The ``vmmw`` executable inside the installed package, if the wheel carries one."""
    p = _HERE / "bin" / "vmmw"
    return p if p.is_file() and os.access(p, os.X_OK) else None


def diagnose() -> int:
    """Print what this installation uses; 0 when a pool opened, 1 otherwise."""
    from . import Pool, library_path, version

    print(f"vmmweights {version()} (Python {platform.python_version()}, {sys.executable})")
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


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args == ["--diagnose"]:
        return diagnose()
    cli = cli_path()
    if cli is None:
        print(
            "vmmw: this installation carries no vmmw command (a wheel built without it); "
            "`python -m vmmweights` shows what it has",
            file=sys.stderr,
        )
        return 1
    os.execv(str(cli), [str(cli), *args])


def console() -> None:
    """The ``vmmw`` console script: the command line, with its arguments as given."""
    sys.exit(main(sys.argv[1:] or ["--help"]))


if __name__ == "__main__":
    sys.exit(main())
