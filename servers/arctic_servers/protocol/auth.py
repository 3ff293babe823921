"""Bearer auth: the one rule every call of a server meets, whatever its surface.

`Authorization: Bearer <token>` (printable ASCII, at most 4096 bytes: `limits.bearer_token`),
accepted when the token is one of the server's (in clear, or as its sha256 digest,
`config.token_digest`). A server with no tokens has auth off: every caller is accepted. The
protocol core authenticates its calls with it (`core_state.CoreState.authenticate`), and so do the
surfaces served beside it (the OpenAI routes ask the core; a stand-alone OpenAI test server with
no core asks this module).
"""

from __future__ import annotations

from collections.abc import Set

from ..rules import limits as input_limits
from ..rules.errors import ProtocolError
from .config import token_digest

__all__ = ["accepted_token"]


def accepted_token(
    authorization: str, tokens: Set[str] = frozenset(), token_sha256: Set[str] = frozenset()
) -> str | None:
    """The caller's token from an `Authorization` header value (None when absent); with auth on
    (`tokens` or `token_sha256` non-empty), `unauthenticated` unless it is one of them."""
    token = input_limits.bearer_token(authorization)
    if tokens or token_sha256:
        if not token:
            raise ProtocolError("unauthenticated", "missing Authorization: Bearer <token>")
        if token not in tokens and token_digest(token) not in token_sha256:
            raise ProtocolError("unauthenticated", "the bearer token is not accepted")
    return token
