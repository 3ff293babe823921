"""Who calls the Tinker surface: `X-API-Key` (the SDK insists on a `tml-` prefix) or, on the
`/hf/` tokenizer routes, `Authorization: Bearer` (`HF_TOKEN`): `tml-<token>` or `<token>` must
be one of the server's tokens (clear, or sha256 digests as the gateway keeps them); a server
without tokens accepts any key. Free of the `tinker` package (`mount` uses it at start)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

__all__ = ["NO_TOKEN", "caller_token"]

NO_TOKEN = object()  # a server with tokens, a request without a valid one


def caller_token(
    headers: Mapping[str, str], tokens: frozenset[str], sha256: frozenset[str]
) -> str | object | None:
    """The caller's token (None on a server without tokens), or `NO_TOKEN`."""
    if not tokens and not sha256:
        return None
    keys = [headers.get("X-API-Key", "").strip()]
    auth = headers.get("Authorization", "").strip()
    if auth.lower().startswith("bearer "):
        keys.append(auth[7:].strip())
    for key in keys:
        for t in (key.removeprefix("tml-"), key):
            if t and (t in tokens or hashlib.sha256(t.encode()).hexdigest() in sha256):
                return t
    return NO_TOKEN
