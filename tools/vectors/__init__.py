"""The DSSST1 golden-vector generator behind ``tools/make_vectors.py``, one module per group."""

from __future__ import annotations

import sys
from pathlib import Path

#: the repository root: on sys.path so that ``tests.v1ref`` (the deployed codec's model) imports
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
