"""The public surface of `dssst1`: exports, error type, codes, limits, packaging."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dssst1
from dssst1 import DSSError, ErrorCode, Limits

ROOT = Path(__file__).resolve().parents[2]


def test_all_is_complete_and_public_module() -> None:
    public = {name for name in vars(dssst1) if not name.startswith("_")}
    public -= {"annotations"}  # the __future__ import
    assert set(dssst1.__all__) == public
    for name in dssst1.__all__:
        obj = getattr(dssst1, name)
        if callable(obj):
            assert obj.__module__ == "dssst1", name


def test_py_typed_ships() -> None:
    assert (ROOT / "dssst1" / "py.typed").is_file()


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys, numpy, dssst1; dssst1.loads(dssst1.dumps({'a': numpy.ones(2)}));"
        " print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "False"


def test_every_code_has_a_docstring_and_is_in_errors_proto() -> None:
    proto = (ROOT / "proto" / "arctic" / "v1" / "errors.proto").read_text()
    names = {m.lower() for m in re.findall(r"ERROR_CODE_([A-Z0-9_]+) =", proto)}
    for code in ErrorCode:
        assert code.__doc__ and code.__doc__ != ErrorCode.__doc__, code
        assert code.value in names, code
    assert ErrorCode("tree_invalid") is ErrorCode.TREE_INVALID
    assert ErrorCode.TREE_INVALID == "tree_invalid"


def test_every_code_in_the_spec_is_a_member() -> None:
    spec = (ROOT / "proto" / "DSSST1.md").read_text()
    codes = set(re.findall(r"^\| R\d+ \| `([a-z0-9_]+)` \|", spec, re.M))  # §6
    codes |= {  # §8: two-column rows "| `code` | condition |"
        m.group(1) for m in re.finditer(r"^\| `([a-z0-9_]+)` \|[^|]*\|$", spec, re.M)
    }
    codes |= set(re.findall(r"→ `([a-z0-9_]+)`", spec))  # §4, §9 "... → `code`"
    assert len(codes) >= 23 + 12
    table_codes = codes
    assert table_codes <= {c.value for c in ErrorCode}


def test_dsserror_carries_code_path_expected() -> None:
    err = DSSError(ErrorCode.TREE_INVALID, "tree[0]", "a node", "5")
    assert isinstance(err, ValueError)
    assert err.code is ErrorCode.TREE_INVALID
    assert (err.path, err.expected, err.got) == ("tree[0]", "a node", "5")
    text = str(err)
    assert "tree_invalid" in text and "tree[0]" in text and "a node" in text and "5" in text
    assert err.details() == {"field": "tree[0]", "expected": "a node", "got": "5"}
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, DSSError) and again.code is err.code and str(again) == text


def test_limits_defaults_and_validation() -> None:
    lim = Limits()
    assert lim.max_header_bytes == 64 * 1024 * 1024
    assert lim.max_tensors == 262_144
    assert lim.max_depth == 64
    assert lim.max_frame_bytes == 4 * 1024**3
    assert lim.max_chunk_bytes == 60 * 1024 * 1024
    assert lim.max_chunks == 65_536
    assert Limits.GRPC_CHUNK_BYTES == 4 * 1024 * 1024
    with pytest.raises(ValueError):
        Limits(max_depth=0)
    with pytest.raises(ValueError):
        Limits(max_tensors=True)
    with pytest.raises(AttributeError):
        lim.max_depth = 3  # type: ignore[misc]


def test_dtype_names_are_the_spec_table() -> None:
    assert dssst1.DTYPE_NAMES == (
        "F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2",
        "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "C64",
    )  # fmt: skip
    assert dssst1.VERSION == "DSSST1"


def test_ml_dtypes_is_imported_by_the_first_extension_dtype_only(tmp_path: Path) -> None:
    """Importing ml_dtypes costs seconds of CPU (it registers its types with NumPy): the codec
    loads it for a frame with a BF16 / F8 tensor, not at import nor for other frames."""
    import ml_dtypes
    import numpy as np

    frame = tmp_path / "bf16.dss"
    x = np.arange(5, dtype=np.float32).astype(ml_dtypes.bfloat16)
    frame.write_bytes(dssst1.dumps({"x": x, "f": np.ones(2, dtype=np.float32)}))
    child = f"""
import sys, numpy as np, dssst1
assert "ml_dtypes" not in sys.modules, "imported with dssst1"
assert dssst1.loads(dssst1.dumps({{"a": np.arange(3), "b": 1.5}}))["b"] == 1.5
assert "ml_dtypes" not in sys.modules, "imported for a frame without extension dtypes"
out = dssst1.loads(open({str(frame)!r}, "rb").read())
assert str(out["x"].dtype) == "bfloat16" and out["x"].astype("f4").tolist() == [0, 1, 2, 3, 4]
assert "ml_dtypes" in sys.modules
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr[-3000:]
