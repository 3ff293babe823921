"""A completion whose HTTP client went away stops (issue 37: an abandoned call must not keep
running on the server).

aiohttp does not cancel a handler when its client disconnects (`handler_cancellation` is off,
and must stay off on these apps: the protocol's routes share them, and PROTOCOL.md §3.3 says
an HTTP connection that drops is not a cancel there). An OpenAI client has no request id to
cancel with, so on these routes the dropped connection is the cancel: `DisconnectWatch.run`
runs the route's work as a task and one ticker per server cancels the task of every client
whose connection has closed (checked every `POLL_S`). Cancelling the work stops it where it is:
a completion waiting for its session's turn or a sampling slot never starts; a generate queued
on the sampler's worker is dropped there, a running one is aborted in the engine (vLLM
`abort_request`; the fake between latency slices), a stream's engine request likewise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web

__all__ = ["CLIENT_CLOSED", "POLL_S", "DisconnectWatch", "client_gone"]

log = logging.getLogger("arctic_servers.openai")
T = TypeVar("T")
POLL_S = 0.1
CLIENT_CLOSED = 499  # nginx's "client closed request": written nowhere (the socket is gone)


def client_gone(request: web.BaseRequest) -> bool:
    """The request's connection has closed (the client left, or its timeout fired)."""
    transport = request.transport
    return transport is None or transport.is_closing()


class DisconnectWatch:
    """Cancels the work of requests whose clients disconnected."""

    def __init__(self, interval: float = POLL_S) -> None:
        self.interval = interval
        self._watched: dict[asyncio.Task[Any], web.BaseRequest] = {}
        self._left: set[asyncio.Task[Any]] = set()
        self._ticker: asyncio.Task[None] | None = None

    async def run(self, request: web.BaseRequest, work: Awaitable[T]) -> T | web.Response:
        """`work`'s result, or (its client gone, the work cancelled) a 499 nobody reads."""
        task = asyncio.ensure_future(work)
        self._watched[task] = request
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        try:
            return await task  # the handler cancelled (a shutdown): the work is cancelled too
        except asyncio.CancelledError:
            if task not in self._left:
                raise
            log.info("%s %s: the client disconnected; its work was cancelled",
                     request.method, request.path)  # fmt: skip
            return web.Response(status=CLIENT_CLOSED, text="client disconnected")
        finally:
            self._watched.pop(task, None)
            self._left.discard(task)
            if not self._watched and self._ticker is not None:
                self._ticker.cancel()  # nothing to watch: no task left asleep behind the route
                self._ticker = None

    async def _tick(self) -> None:
        while self._watched:
            await asyncio.sleep(self.interval)
            for task, request in list(self._watched.items()):
                if not task.done() and client_gone(request):
                    self._left.add(task)
                    task.cancel()
