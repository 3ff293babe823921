"""What the protocol core asks of a servicer besides its ops, each hook declared once with its
default, so the core calls them directly (no `getattr` on a name) and a static checker follows
every call.

The generated `ServicerBase` (`_generated/servicer.py`) derives from `ServicerHooks`; a server
overrides the hooks it needs:
- `check_request(ctx, body)`: before a data-plane call is accepted, the semantic checks that
  the spec's field rules cannot say (4xx on failure). Default: none.
- `authorize_job(ctx, running=)`: on every job-scoped call, that the job exists, the caller may
  use it and (`running`) it runs. Default: none.
- `cancel_running(ctx, request_id)`: CancelRequest of a request whose servicer call has begun;
  True when the servicer ends it itself at its engine's next safe point. Default: False (the
  core cancels the request's task).
- `run_on_engine(ctx, method, body)`: an op the method table marks `engine` (forward-backward,
  forward, log-probs) that the server does not override: the target sub-job's engine runs the
  command `method.python_name` on the body. Default: `unimplemented`.
- `recovers_running`: on a restart, a request that was running is handed back
  (`ctx.recovered`) instead of failed. Default: False.
- `operation_types`, `config_keys`, `lora_support`: capabilities. Defaults: none, the standard
  keys, no LoRA.

Which ops a servicer serves (`implements`, the capabilities' `methods`) is read from the methods
it overrides: every default (the generated ops', `run_on_engine`) is marked `@default_op`, so
the core needs no import of the generated class it sits below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables.error_codes import ErrorCode

from ..rules.errors import ProtocolError
from .context import CallContext

F = TypeVar("F", bound=Callable[..., Any])
_DEFAULT = "__arctic_default_op__"


def default_op(fn: F) -> F:
    """Mark a method as the default a servicer overrides to serve that op."""
    setattr(fn, _DEFAULT, True)
    return fn


def _overridden(fn: object) -> bool:
    return fn is not None and not getattr(fn, _DEFAULT, False)


class ServicerHooks:
    """The hooks of a servicer, with their defaults (the list above)."""

    recovers_running: bool = False

    def implements(self, method: MethodInfo) -> bool:
        """This servicer serves `method`: it overrides the op's method or, for an op the
        method table marks `engine`, the one `run_on_engine` that forwards every such op."""
        cls = type(self)
        if _overridden(getattr(cls, method.python_name, None)):
            return True
        return method.engine and _overridden(cls.run_on_engine)

    @property
    def operation_types(self) -> Sequence[str]:
        """The `/operation` types the server runs (capabilities `operation_types`)."""
        return ()

    @property
    def config_keys(self) -> dict[str, list[str]] | None:
        """The sub-job config keys accepted per role; None: the standard ones."""
        return None

    @property
    def lora_support(self) -> dict[str, Any] | None:
        """The capabilities' `lora` (jobs.proto `LoraSupport`); None: no LoRA jobs."""
        return None

    def check_request(self, ctx: CallContext, body: dict[str, Any]) -> None:
        """Semantic checks before a data-plane call is accepted; raise `ProtocolError` (4xx)."""

    async def authorize_job(self, ctx: CallContext, *, running: bool) -> None:
        """Raise unless the job exists, the caller may use it and (`running`) it runs."""

    async def cancel_running(self, ctx: CallContext, request_id: str) -> bool:
        """A running request was cancelled: True when the servicer ends it itself."""
        return False

    @default_op
    async def run_on_engine(
        self, ctx: CallContext, method: MethodInfo, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Run an `engine` op (the method table's `engine`) on the target sub-job's engine: the
        command `method.python_name` with `body=body`; the result's `metrics` carry the job's
        `global_step`. Servers with engines implement it once for every such op."""
        raise ProtocolError(
            ErrorCode.UNIMPLEMENTED,
            f"{type(self).__name__} runs no engine, so it does not implement {method.name}",
            op=method.name,
        )
