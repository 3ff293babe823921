"""The fake gateway's tokenizer: byte-level, dependency-free, documented in NUMERICS.md §1.

Token id = byte value + 3; ids 0, 1, 2 are the special tokens pad, bos and eos. The vocabulary has
259 entries. `encode` never adds special tokens; `decode` drops them and replaces invalid UTF-8.
"""

from __future__ import annotations

from collections.abc import Iterable

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
SPECIAL_IDS = frozenset({PAD_ID, BOS_ID, EOS_ID})
BYTE_OFFSET = 3
VOCAB_SIZE = 256 + BYTE_OFFSET


def encode(text: str) -> list[int]:
    """UTF-8 bytes of `text`, each shifted by 3."""
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


def byte_of(token_id: int) -> int | None:
    """The byte a token id stands for, or None for a special or out-of-vocabulary id."""
    if BYTE_OFFSET <= token_id < VOCAB_SIZE:
        return token_id - BYTE_OFFSET
    return None


def decode(ids: Iterable[int]) -> str:
    """Text of `ids`: special and out-of-vocabulary ids are dropped, bad UTF-8 becomes U+FFFD."""
    data = bytes(b for b in (byte_of(int(i)) for i in ids) if b is not None)
    return data.decode("utf-8", errors="replace")


__all__ = [
    "BOS_ID",
    "BYTE_OFFSET",
    "EOS_ID",
    "PAD_ID",
    "SPECIAL_IDS",
    "VOCAB_SIZE",
    "byte_of",
    "decode",
    "encode",
]
