"""Which protocol request the current task serves: the core's execution sets it around each
request's servicer call; an engine's worker link reads it to tell which request a command belongs
to. A context variable, so neither side imports the other."""

from __future__ import annotations

from contextvars import ContextVar

RUNNING_REQUEST: ContextVar[str | None] = ContextVar("arctic_running_request", default=None)
"""The id of the request whose servicer call runs in this task (the core sets it around each
request's execution), so an engine client can tell which request a command belongs to (the
on-prem server's `cancel_running`: a trainer's command runs to its end)."""
