"""What the legacy client keeps beside its connections: the log-prob arrays it returned (so one
sent back unchanged is lowered in its known alignment) and the `transport` attribute the
Arctic-Platform verl plugin reads."""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from .knobs import LOGPROB_KEYS


class Issued:
    """Log-prob arrays this client returned (weakly, by identity) with their alignment."""

    def __init__(self, keep: int = 32) -> None:
        self._refs: deque[tuple[weakref.ref[Any], str]] = deque(maxlen=keep)

    def add(self, obj: Any, align: str) -> None:
        with contextlib.suppress(TypeError):  # not weak-referenceable: nothing to remember
            self._refs.append((weakref.ref(obj), align))

    def aligned(self, batch: Mapping[str, Any]) -> dict[str, str]:
        """The known alignment of each log-prob input that is one of those arrays."""
        out: dict[str, str] = {}
        for name in LOGPROB_KEYS:
            value = batch.get(name)
            for ref, align in self._refs:
                if value is not None and ref() is value:
                    out[name] = align
        return out


class Transport:
    """`client.transport`, as the Arctic-Platform verl plugin reads it (`get_server_state`)."""

    def __init__(self, server_state: Callable[[], Any]) -> None:
        self._server_state = server_state

    def get_server_state(self) -> Any:
        """The client's `get_server_state()`: what re-attaches another process to the job."""
        return self._server_state()
