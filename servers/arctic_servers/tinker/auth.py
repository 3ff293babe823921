"""Who calls the Tinker surface. The surface only says where a Tinker caller's key is — the
`X-API-Key` header (the SDK insists on a `tml-` prefix: `tml-<token>` or `<token>`) or, on the
`/hf/` tokenizer routes, `Authorization: Bearer` (`HF_TOKEN`) — and the server's protocol core
decides whether it is one of the server's tokens (`ProtocolCore.authenticate`, the rule every
arctic.v1 and OpenAI call meets, `protocol/auth.py`); a server without tokens accepts any key.
Free of the `tinker` package (`mount` uses it at start)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..rules.errors import ProtocolError

__all__ = ["NO_TOKEN", "Authenticate", "caller_token"]

NO_TOKEN = object()  # a server with tokens, a request without a valid one
# the core's rule: an `Authorization` header value -> the caller's token (None on a server
# without tokens), or `ProtocolError` `unauthenticated` (`CoreCalls.authenticate`)
Authenticate = Callable[[str], "str | None"]


def caller_token(headers: Mapping[str, str], authenticate: Authenticate) -> str | object | None:
    """The caller's token (None on a server without tokens), or `NO_TOKEN`."""
    keys = [headers.get("X-API-Key", "").strip()]
    auth = headers.get("Authorization", "").strip()
    if auth.lower().startswith("bearer "):
        keys.append(auth[7:].strip())
    candidates = [t for key in keys if key for t in dict.fromkeys((key.removeprefix("tml-"), key))]
    for token in candidates or [""]:
        try:
            return authenticate(f"Bearer {token}" if token else "")
        except ProtocolError:
            continue
    return NO_TOKEN
