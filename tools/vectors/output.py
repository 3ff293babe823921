"""Build the registry in order, write the vector files and index, and diff against a checkout."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from tests import v1ref
from tests.v1ref.typed import canonical, to_typed

from .chunk_groups import INNER_SHA, chunk_groups
from .common import HAND_WRITTEN, UNSET, VECTORS, Vector, pickle_like
from .envelopes import envelopes
from .invalid_header import invalid_header_frames
from .invalid_tensors import invalid_tensor_frames
from .new_writer import new_writer_frames
from .v1_writer import v1_writer_frames


def v1_outcome(vec: Vector) -> tuple[str, Any]:
    """``("ok", value)`` or ``("error", class name)`` from the deployed-reader model."""
    try:
        if vec.kind == "frame":
            return "ok", v1ref.loads(vec.payload)
        if vec.kind == "chunks":
            return "ok", v1ref.loads(v1ref.decode_byte_chunks(vec.payload, kind=vec.chunk_kind))
        return "ok", v1ref.decode_envelope(vec.payload)
    except Exception as exc:  # the class is the record
        cls = type(exc)
        local = cls.__module__ in ("builtins", v1ref.__name__)
        return "error", cls.__name__ if local else f"{cls.__module__}.{cls.__name__}"


def frames_of(vec: Vector) -> list[bytes]:
    if vec.kind == "frame":
        return [vec.payload]
    if vec.kind == "chunks":
        return list(vec.payload)
    return []


def index_entry(vec: Vector, files: list[str]) -> dict[str, Any]:
    valid = vec.error_code is None
    out: dict[str, Any] = {
        "id": vec.id,
        "kind": vec.kind,
        "valid": valid,
        "origin": vec.origin,
        "files": files,
    }
    if vec.chunk_kind is not None:
        out["chunk_kind"] = vec.chunk_kind
    if vec.limits is not None:
        out["limits"] = vec.limits
    status, got = v1_outcome(vec)
    if valid:
        out["expected"] = to_typed(vec.expected)
        if vec.kind == "chunks":  # every valid group here carries INNER
            out["frame_sha256"] = INNER_SHA
        if vec.expected_op is not UNSET:
            out["expected_op"] = to_typed(vec.expected_op)
        want_v1 = out["expected"] if vec.expected_v1 is UNSET else to_typed(vec.expected_v1)
        if vec.v1_error is not None:
            if (status, got) != ("error", vec.v1_error):
                raise AssertionError(f"{vec.id}: v1 gave {status} {got!r}, not {vec.v1_error}")
            out["v1_error"] = vec.v1_error
        else:
            if status != "ok" or canonical(to_typed(got)) != canonical(want_v1):
                raise AssertionError(f"{vec.id}: v1 view differs: {status} {got!r}")
            if vec.expected_v1 is not UNSET:
                out["expected_v1"] = want_v1
        for f in frames_of(vec) if vec.origin == "new-writer" else []:
            if pickle_like(int.from_bytes(f[:8], "little")):  # DSSST1.md §5.1
                raise AssertionError(f"{vec.id}: a new-writer header length starts like a pickle")
    else:
        out["error_code"] = vec.error_code
        if vec.alt_error_codes:
            out["alt_error_codes"] = list(vec.alt_error_codes)
        out["v1_error" if status == "error" else "expected_v1"] = (
            got if status == "error" else to_typed(got)
        )
    out["spec_ref"] = vec.spec_ref
    out["description"] = vec.description
    return out


def build() -> None:
    VECTORS.clear()
    for make in (
        v1_writer_frames,
        new_writer_frames,
        invalid_header_frames,
        invalid_tensor_frames,
        chunk_groups,
        envelopes,
    ):
        make()


def write(out: Path) -> None:
    build()
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for vec in VECTORS:
        if vec.kind == "frame":
            files = [f"{vec.id}.bin"]
            (out / files[0]).write_bytes(vec.payload)
        elif vec.kind == "chunks":
            (out / vec.id).mkdir(exist_ok=True)
            files = [f"{vec.id}/{i:02d}.bin" for i in range(len(vec.payload))]
            for name, data in zip(files, vec.payload, strict=True):
                (out / name).write_bytes(data)
        else:
            files = [f"{vec.id}.json"]
            (out / files[0]).write_text(json.dumps(vec.payload, indent=1) + "\n")
        index.append(index_entry(vec, files))
    text = json.dumps(
        {"format": "dssst1-golden-vectors/1", "vectors": index}, indent=1, ensure_ascii=False
    )
    (out / "index.json").write_text(text + "\n", encoding="utf-8")


def tree_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def check(committed: Path) -> list[str]:
    """Differences between a fresh generation and ``committed`` (empty when identical)."""
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp))
        fresh = tree_files(Path(tmp))
    have = {k: v for k, v in tree_files(committed).items() if k not in HAND_WRITTEN}
    problems = [f"missing: {k}" for k in sorted(fresh.keys() - have.keys())]
    problems += [f"stale: {k}" for k in sorted(have.keys() - fresh.keys())]
    problems += [f"differs: {k}" for k in sorted(fresh.keys() & have.keys()) if fresh[k] != have[k]]
    return problems
