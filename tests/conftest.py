import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# tools/ holds the spec loader and the vector generator; tests import them directly.
sys.path.insert(0, str(ROOT / "tools"))
