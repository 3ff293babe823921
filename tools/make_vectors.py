#!/usr/bin/env python3
"""Generate the DSSST1 golden vectors in ``tests/vectors/`` (see tests/vectors/README.md).

Deterministic: fixed values, no randomness, no timestamps, index fields in a fixed order, so running
it twice writes identical bytes. ``--check`` regenerates into a temporary directory and exits 1
when anything differs from the committed files.

Frames come from three sources, recorded per vector as ``origin``:

* ``v1-writer``  -- ``tests.v1ref.dumps`` / ``encode_byte_chunks``: exactly what the deployed writer
  emits (hazards included);
* ``new-writer`` -- built here byte by byte the way DSSST1.md §5 tells a conforming writer to;
* ``hand-built`` -- built here byte by byte to pin one reader rule (valid) or one reader check
  (invalid).

This script never imports ``dssst1``: the vectors must not depend on the codec they test.
It is the command line only: the package ``tools/vectors/`` builds the vectors, one module per
group, and ``vectors.output.build`` runs the groups in registry order.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the package tools/vectors/, whatever the working directory
    sys.path.insert(0, str(HERE))

from vectors.common import HAND_WRITTEN, VECTOR_DIR, VECTORS  # noqa: E402
from vectors.output import check, write  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=VECTOR_DIR, help="output directory")
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and diff against --out",
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.out)
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    if args.out.exists():  # drop stale vectors; keep the hand-written README.md
        for child in args.out.iterdir():
            if child.name not in HAND_WRITTEN:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    write(args.out)
    n_valid = sum(v.error_code is None for v in VECTORS)
    print(
        f"wrote {len(VECTORS)} vectors ({n_valid} valid, {len(VECTORS) - n_valid} invalid) "
        f"to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
