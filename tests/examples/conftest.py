"""The examples are scripts, not a package: their directory goes on sys.path, as `python
examples/X.py` puts it there."""

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
