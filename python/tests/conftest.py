"""The package's tests run on the host backend (no GPU needed) unless
VMMW_BACKEND says otherwise before the library is loaded."""

import os
import sys
from pathlib import Path

os.environ.setdefault("VMMW_BACKEND", "host")
sys.path.insert(0, str(Path(__file__).parent))
