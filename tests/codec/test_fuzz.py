"""Seeded mutation fuzzing of every golden vector: only `DSSError` may come out.

Each vector gets ``MUTATIONS`` mutants: bit flips, byte overwrites, truncation and extension,
length-prefix edits, structured edits of the header JSON and of the ``dss`` / ``op`` documents
inside it, and for chunk groups reordering, duplication, dropping and corruption of chunks. A
mutant may decode (many edits are harmless) or fail with a `DSSError`; any other exception — a
``KeyError``, ``TypeError``, ``IndexError``, ``struct.error``, ``UnicodeDecodeError``,
``OverflowError``, ``RecursionError``, a NumPy error — fails the test.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest

import dssst1

from .test_vectors import VECTOR_DIR, VECTORS, files_of

MUTATIONS = 200
_POOL: list[Any] = [
    None, True, False, -1, 0, 1, 7, 2**31, 2**63, 2**64 + 1, -(2**70), 1.5, -0.0, 1e308,
    "", "x", "t", "j", "d", "l", "u", "I64", "U8", "F64", "BOOL", "C64", "DSSST1", "__dss_empty__",
    "__metadata__", "float", "bytes", [], {}, [0], [1, 2], ["t", "x"], ["j", 1], {"scalar": True},
    {"py": "float", "scalar": True}, {"py": "bytes"}, [[["deep"]]],
]  # fmt: skip

try:  # the torch adapter is fuzzed too when torch is installed
    import torch  # noqa: F401

    TORCH = True
except ImportError:
    TORCH = False


def _json_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_json_paths(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out.extend(_json_paths(item, (*path, index)))
    return out


def mutate_json(value: Any, rnd: random.Random) -> Any:
    """Replace, delete or insert at a random place of a JSON value (a copy)."""
    value = json.loads(json.dumps(value))
    paths = _json_paths(value)
    path = rnd.choice(paths)
    if not path:
        return rnd.choice(_POOL)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    action = rnd.random()
    if action < 0.55:
        parent[last] = json.loads(json.dumps(rnd.choice(_POOL)))
    elif action < 0.8:
        del parent[last]
    elif isinstance(parent, list):
        parent.insert(last, rnd.choice(_POOL))
    else:
        parent[
            rnd.choice(["dtype", "shape", "data_offsets", "v", "tree", "extra", "op", "dss"])
        ] = rnd.choice(_POOL)
    return value


def mutate_header(frame: bytes, rnd: random.Random) -> bytes:
    try:
        return _mutate_header(frame, rnd)
    except RecursionError:  # a vector too deep for the stdlib parser the mutator uses
        return flip(frame, rnd)


def _mutate_header(frame: bytes, rnd: random.Random) -> bytes:
    n = int.from_bytes(frame[:8], "little")
    try:
        header = json.loads(frame[8 : 8 + n])
    except ValueError:
        return flip(frame, rnd)
    data = frame[8 + n :]
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    choice = rnd.random()
    if isinstance(meta, dict) and choice < 0.5:
        key = rnd.choice([k for k in meta if isinstance(meta[k], str)] or ["dss"])
        try:
            inner = json.loads(meta.get(key, "{}"))
            meta[key] = json.dumps(mutate_json(inner, rnd))
        except (ValueError, TypeError):
            meta[key] = rnd.choice(["", "{", "[]", "null", '{"v": "DSSST1"}'])
    elif choice < 0.9:
        header = mutate_json(header, rnd)
    else:  # a textual duplicate key
        text = json.dumps(header)
        text = text.replace("{", '{"dtype": "U8", ', 1) if rnd.random() < 0.5 else text + " "
        return rebuild(text.encode(), data)
    text = json.dumps(header, allow_nan=True).encode()
    if rnd.random() < 0.2:
        data = data[: rnd.randrange(len(data) + 1)] + bytes(rnd.randrange(3))
    return rebuild(text, data)


def rebuild(text: bytes, data: bytes) -> bytes:
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data


def flip(frame: bytes, rnd: random.Random) -> bytes:
    if not frame:
        return bytes([rnd.randrange(256)])
    buf = bytearray(frame)
    for _ in range(rnd.choice([1, 1, 2, 8])):
        pos = (
            rnd.randrange(min(len(buf), 8 + 256)) if rnd.random() < 0.7 else rnd.randrange(len(buf))
        )
        buf[pos] ^= 1 << rnd.randrange(8)
    return bytes(buf)


def mutate_frame(frame: bytes, rnd: random.Random) -> bytes:
    kind = rnd.random()
    if kind < 0.3:
        return flip(frame, rnd)
    if kind < 0.4:
        return frame[: rnd.randrange(len(frame) + 1)]
    if kind < 0.45:
        return frame + bytes(rnd.randrange(1, 9))
    if kind < 0.55 and len(frame) >= 8:
        n = int.from_bytes(frame[:8], "little")
        new = rnd.choice([0, 1, n - 1, n + 1, n + 8, 2**63, 2**64 - 1, 0x0280, len(frame)])
        return max(new, 0).to_bytes(8, "little") + frame[8:]
    if kind < 0.6 and frame:
        pos = rnd.randrange(len(frame))
        return frame[:pos] + bytes([rnd.randrange(256)]) * rnd.randrange(1, 4) + frame[pos + 1 :]
    return mutate_header(frame, rnd)


def decode_frame(data: bytes, n: int) -> None:
    dssst1.loads(data)
    dssst1.peek_metadata(data)
    if n % 3 == 0:
        dssst1.read_metadata(data)
        dssst1.read_chunk_descriptor(data)
    if TORCH and n % 4 == 0:
        dssst1.loads(bytearray(data), tensors="torch")


def decode_group(chunks: list[bytes], kind: str, n: int) -> None:
    frame = dssst1.decode_chunks(chunks, kind=kind if n % 2 else None)  # type: ignore[arg-type]
    dssst1.loads(frame)


def mutate_group(chunks: list[bytes], rnd: random.Random) -> list[bytes]:
    chunks = list(chunks)
    kind = rnd.random()
    if kind < 0.5 and chunks:
        i = rnd.randrange(len(chunks))
        chunks[i] = mutate_frame(chunks[i], rnd)
    elif kind < 0.65:
        rnd.shuffle(chunks)
    elif kind < 0.75 and chunks:
        chunks.insert(rnd.randrange(len(chunks) + 1), rnd.choice(chunks))
    elif kind < 0.85 and chunks:
        del chunks[rnd.randrange(len(chunks))]
    elif chunks:
        i, j = rnd.randrange(len(chunks)), rnd.randrange(len(chunks))
        chunks[i] = chunks[j]
    return chunks


def mutate_envelope(envelope: Any, rnd: random.Random) -> Any:
    envelope = json.loads(json.dumps(envelope))
    items = envelope if isinstance(envelope, list) else [envelope]
    if not items or rnd.random() < 0.1:
        return mutate_json(envelope, rnd)
    item = rnd.choice(items)
    if not isinstance(item, dict):
        return envelope
    kind = rnd.random()
    if kind < 0.5 and isinstance(item.get("payload_b64"), str):
        try:
            raw = base64.b64decode(item["payload_b64"])
        except ValueError:  # already mutated beyond decoding
            return envelope
        raw = mutate_frame(raw, rnd)
        item["payload_b64"] = base64.b64encode(raw).decode()
        if rnd.random() < 0.5 and "payload_sha256" in item:
            item.pop("payload_sha256")
    elif kind < 0.7 and isinstance(item.get("payload_b64"), str):
        text = item["payload_b64"]
        pos = rnd.randrange(len(text) + 1)
        item["payload_b64"] = text[:pos] + rnd.choice(["=", "*", " ", "A", "\n", "é"]) + text[pos:]
    else:
        return mutate_json(envelope, rnd)
    return envelope


def decode_envelope(envelope: Any) -> None:
    if isinstance(envelope, dict):
        dssst1.loads(dssst1.decode_inline_envelope(envelope))
    else:
        dssst1.loads(dssst1.assemble_result_events(envelope))


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["id"])
def test_mutants_raise_only_dsserror(vector: dict[str, Any]) -> None:
    rnd = random.Random(f"dssst1-fuzz-{vector['id']}")
    if vector["kind"] == "envelope":
        original = json.loads((VECTOR_DIR / vector["files"][0]).read_text())
    else:
        files = files_of(vector)
    for n in range(MUTATIONS):
        try:
            if vector["kind"] == "frame":
                decode_frame(mutate_frame(files[0], rnd), n)
            elif vector["kind"] == "chunks":
                decode_group(mutate_group(files, rnd), vector["chunk_kind"], n)
            else:
                decode_envelope(mutate_envelope(original, rnd))
        except dssst1.DSSError:
            pass


def test_random_bytes_raise_only_dsserror() -> None:
    rnd = random.Random(1234)
    for size in list(range(0, 40)) * 5 + [rnd.randrange(40, 4000) for _ in range(200)]:
        data = rnd.randbytes(size)
        if size >= 8 and rnd.random() < 0.7:
            data = min(size - 8, rnd.randrange(size)).to_bytes(8, "little") + data[8:]
        with pytest.raises(dssst1.DSSError):
            dssst1.loads(data)


def test_fast_paths_and_ordered_checks_agree_on_mutants() -> None:
    """The one-pass header validator and the fast tree walk decide exactly like the ordered checks:
    where a fast path accepts, the ordered checks accept the same; where it declines, the
    ordered checks alone decide."""
    from dssst1._fast import parse_fast
    from dssst1._header import as_buffer, parse_ordered, read_pairs
    from dssst1._tree import diagnose

    rnd = random.Random(99)
    limits = dssst1.Limits()
    checked = 0
    for vector in VECTORS:
        if vector["kind"] != "frame":
            continue
        data = files_of(vector)[0]
        for _ in range(40):
            mutant = mutate_header(data, rnd)
            buffer = as_buffer(mutant)
            try:
                pairs = read_pairs(buffer, limits)
            except dssst1.DSSError:
                continue
            fast = parse_fast(buffer, pairs, limits)
            try:
                header = parse_ordered(buffer, pairs, limits)
            except dssst1.DSSError:
                assert fast is None, vector["id"]
                continue
            if fast is not None:
                assert (fast.entries, fast.op, fast.tree) == (
                    header.entries,
                    header.op,
                    header.tree,
                )
            finding = diagnose(header, 64)
            fallback = "recursion limit" in finding.expected
            try:
                dssst1.loads(mutant)
            except dssst1.DSSError as exc:
                assert not fallback and exc.code is finding.code, (vector["id"], str(exc))
            else:
                assert fallback, (vector["id"], str(finding))
            checked += 1
    assert checked > 1000
