"""Base classes of the generated `Client` and `AsyncClient`.

The generated classes (`arctic_sdk._generated.client`) hold one documented, typed method per op
that only merges its arguments and calls `_call` / `_submit` with the op's `MethodInfo`. All
behaviour lives behind the `Transport` / `AsyncTransport` these bases delegate to; the bases add
construction from configuration, job binding, job start-up, pickling and closing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Self

from .spec.model import MethodInfo
from .spec.tables import methods as _M

if TYPE_CHECKING:
    from ._lease import LeaseRenewer
    from .config import ArcticConfig


@dataclass(frozen=True)
class CallOptions:
    """Per-call overrides; `None` means "use the client's default".

    `timeout` is the call's whole deadline in seconds (retries and polls included);
    `idempotency_key` replaces the generated key of a keyed op (reuse it to make a resent call
    a replay); `job_id` and `sub_job_id` target another job or sub-job (`X-Arctic-Sub-Job`).
    """

    timeout: float | None = None
    max_retries: int | None = None
    idempotency_key: str | None = None
    job_id: str | None = None
    sub_job_id: str | None = None


class Transport(Protocol):
    """What a sync transport offers the generated `Client`."""

    def call(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> Any: ...

    def submit(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> concurrent.futures.Future[Any]: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    """What an async transport offers the generated `AsyncClient`."""

    async def call(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> Any: ...

    def submit(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> asyncio.Future[Any]: ...

    async def close(self) -> None: ...


def merge_body(
    method: MethodInfo,
    body: Any,
    fields: Mapping[str, Any],
    options: Any,
    unknown: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The request body: the positional mapping, updated by the keyword fields that are set.

    Misuse is refused before anything else happens, as `InvalidArgumentError`: a body that is
    not a mapping, `options` that are not `CallOptions`, an unknown keyword (named, with the
    closest known one).
    """
    from ._misuse import check_call

    check_call(method, body, options, unknown or {})
    merged: dict[str, Any] = dict(body) if body is not None else {}
    merged.update((k, v) for k, v in fields.items() if v is not None)
    return merged


class _Common:
    """Configuration, job binding, pickling: shared by both clients."""

    _transport: Any
    _renewer: LeaseRenewer | None = None
    _config: ArcticConfig | None = None

    def _setup(
        self,
        transport: Any,
        config: ArcticConfig | Mapping[str, Any] | None,
        options: dict[str, Any],
        *,
        is_async: bool,
        seq_start: dict[str, int] | None = None,
    ) -> None:
        self._renewer = None
        if transport is not None and not isinstance(transport, str):
            if config is not None or any(v is not None for v in options.values()):
                raise TypeError("pass either a transport object or configuration, not both")
            self._transport, self._config = transport, None
            return
        from .config import build_config
        from .transports import make_async_transport, make_sync_transport

        cfg = build_config(config, transport=transport, **options)  # type: ignore[arg-type]
        make: Callable[..., Any] = make_async_transport if is_async else make_sync_transport
        self._transport = make(cfg, seq_start=seq_start)
        self._config = self._transport.config

    # ------------------------------------------------------------------ job binding

    @property
    def config(self) -> ArcticConfig:
        """The client's effective configuration (the bound job included)."""
        if self._config is None:
            raise TypeError("a client built on a custom transport object has no configuration")
        job_id = self.job_id
        cfg = self._config
        return cfg if cfg.job_id == job_id else cfg.model_copy(update={"job_id": job_id})

    @property
    def job_id(self) -> str | None:
        """The job data-plane calls go to; set by the first `create_job` when unset."""
        state = getattr(self._transport, "state", None)
        return getattr(state, "job_id", None)

    @job_id.setter
    def job_id(self, value: str | None) -> None:
        self._transport.state.job_id = value

    def _created(self, method: MethodInfo, body: Mapping[str, Any], result: Any) -> None:
        """After `create_job`: bind the new job, and keep its lease alive."""
        if method is not _M.CREATE_JOB or not isinstance(result, Mapping):
            return
        job_id = result.get("job_id")
        if not job_id or self._config is None:
            return
        state = getattr(self._transport, "state", None)
        if state is not None:
            state.seq.own(str(job_id))  # a job it created: this client numbers its calls
        if self.job_id is None:
            self.job_id = str(job_id)
        lease = body.get("lease_seconds") or 0
        if lease and self._config.lease_renewal and str(job_id) == self.job_id:
            from ._lease import LeaseRenewer

            if self._renewer is not None:
                self._renewer.stop()
            cfg = self.config
            self._renewer = LeaseRenewer(cfg, str(job_id), float(lease)).start()

    def _stop_renewer(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None

    def reconnect_config(self) -> dict[str, Any]:
        """Keyword arguments that re-attach a new client to this client's server and job.

        >>> from arctic_sdk import Client
        >>> c = Client("http://127.0.0.1:9", job_id="job-7")
        >>> c.reconnect_config()["job_id"]
        'job-7'
        >>> Client(**c.reconnect_config()).job_id
        'job-7'
        """
        from .config import reconnect_kwargs

        return reconnect_kwargs(self.config)

    # ------------------------------------------------------------------ pickling

    def __getstate__(self) -> dict[str, Any]:
        if self._config is None:
            raise TypeError("a client built on a custom transport object cannot be pickled")
        cfg = self.config
        seq = self._transport.state.seq.snapshot()
        return {"config": cfg, "seq": seq}

    def __repr__(self) -> str:
        if self._config is None:
            return f"{type(self).__name__}(transport={self._transport!r})"
        cfg = self._config
        if cfg.transport == "inproc":
            where = "in-process"
        elif cfg.transport == "grpc":
            where = cfg.grpc.target or cfg.cortex.base() or "?"
        else:
            where = cfg.cortex.base() or "?"
        return (
            f"{type(self).__name__}(transport={cfg.transport!r}, server={where!r}, "
            f"job_id={self.job_id!r})"
        )


class ClientBase(_Common):
    """Sync client core: the generated subclass adds one method per op.

    Construct from keywords, a config, or both (keywords win); nothing is sent until the first
    call. `transport` is "http" (default), "grpc" or "inproc" (with `servicer=`).

        client = Client("http://127.0.0.1:8080", token="...", job_id="job-1")
        client = Client(transport="grpc", grpc_target="127.0.0.1:50051", token="...")
        client = Client(config=ArcticConfig(...))
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: Any = None,
        job_id: str | None = None,
        transport: str | Transport | None = None,
        config: ArcticConfig | Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self._setup(
            transport,
            config,
            {"base_url": base_url, "token": token, "job_id": job_id, **options},
            is_async=False,
        )

    @classmethod
    def connect(
        cls,
        base_url: str | None = None,
        *,
        create_job: Mapping[str, Any] | None = None,
        wait: bool = True,
        **kwargs: Any,
    ) -> Self:
        """A client attached to a job: the `job_id` given, or a new one from `create_job`
        (a `CreateJobRequest` body); waits until the job is running unless `wait=False`."""
        client = cls(base_url, **kwargs)
        try:
            if create_job is not None:
                client._call(_M.CREATE_JOB, create_job, {}, None)
            if wait and client.job_id is not None:
                client.wait_until_running()
        except BaseException:
            client.close()
            raise
        return client

    def _call(
        self,
        method: MethodInfo,
        body: Mapping[str, Any] | None,
        fields: Mapping[str, Any],
        options: CallOptions | None,
        unknown: Mapping[str, Any] | None = None,
    ) -> Any:
        merged = merge_body(method, body, fields, options, unknown)
        result = self._transport.call(method, merged, options)
        self._created(method, merged, result)
        return result

    def _submit(
        self,
        method: MethodInfo,
        body: Mapping[str, Any] | None,
        fields: Mapping[str, Any],
        options: CallOptions | None,
        unknown: Mapping[str, Any] | None = None,
    ) -> concurrent.futures.Future[Any]:
        merged = merge_body(method, body, fields, options, unknown)
        fut: concurrent.futures.Future[Any] = self._transport.submit(method, merged, options)
        if method is _M.CREATE_JOB:
            fut.add_done_callback(
                lambda f: None if f.exception() else self._created(method, merged, f.result())
            )
        return fut

    def wait_until_running(
        self, job_id: str | None = None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Block until the job is `running` (its state shown as it starts); returns the job.

        Raises `ConflictError` (`job_terminal`) when the job ends instead, and
        `ArcticTimeoutError` after `timeout` (default `job_ready_timeout`).
        """
        flow = _wait_flow(self, job_id, timeout)
        return self._transport.run(flow)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close connections and stop background work; in-flight futures finish first."""
        self._stop_renewer()
        self._transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(None, state["config"], {}, is_async=False, seq_start=state["seq"])


class AsyncClientBase(_Common):
    """Async client core: the generated subclass adds one coroutine method per op.

    Same construction as `Client`; one aiohttp session (or gRPC channel) per event loop, closed
    on `await client.close()`, on `async with` exit, and when its loop shuts down.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: Any = None,
        job_id: str | None = None,
        transport: str | AsyncTransport | None = None,
        config: ArcticConfig | Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self._setup(
            transport,
            config,
            {"base_url": base_url, "token": token, "job_id": job_id, **options},
            is_async=True,
        )

    @classmethod
    async def connect(
        cls,
        base_url: str | None = None,
        *,
        create_job: Mapping[str, Any] | None = None,
        wait: bool = True,
        **kwargs: Any,
    ) -> Self:
        """`Client.connect` for asyncio."""
        client = cls(base_url, **kwargs)
        try:
            if create_job is not None:
                await client._call(_M.CREATE_JOB, create_job, {}, None)
            if wait and client.job_id is not None:
                await client.wait_until_running()
        except BaseException:
            await client.close()
            raise
        return client

    async def _call(
        self,
        method: MethodInfo,
        body: Mapping[str, Any] | None,
        fields: Mapping[str, Any],
        options: CallOptions | None,
        unknown: Mapping[str, Any] | None = None,
    ) -> Any:
        merged = merge_body(method, body, fields, options, unknown)
        result = await self._transport.call(method, merged, options)
        self._created(method, merged, result)
        return result

    def _submit(
        self,
        method: MethodInfo,
        body: Mapping[str, Any] | None,
        fields: Mapping[str, Any],
        options: CallOptions | None,
        unknown: Mapping[str, Any] | None = None,
    ) -> asyncio.Future[Any]:
        merged = merge_body(method, body, fields, options, unknown)
        fut: asyncio.Future[Any] = self._transport.submit(method, merged, options)
        if method is _M.CREATE_JOB:
            fut.add_done_callback(
                lambda f: (
                    None
                    if f.cancelled() or f.exception()
                    else self._created(method, merged, f.result())
                )
            )
        return fut

    async def wait_until_running(
        self, job_id: str | None = None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """`Client.wait_until_running` for asyncio."""
        return await self._transport.run(_wait_flow(self, job_id, timeout))  # type: ignore[no-any-return]

    async def close(self) -> None:
        self._stop_renewer()
        await self._transport.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(None, state["config"], {}, is_async=True, seq_start=state["seq"])


def _wait_flow(client: _Common, job_id: str | None, timeout: float | None) -> Any:
    from ._core.jobs import wait_running
    from ._core.retry import Deadline
    from .errors import InvalidArgumentError

    job = job_id or client.job_id
    if not job:
        raise InvalidArgumentError("no job to wait for: create one or pass job_id=")
    state = client._transport.state
    cfg = state.config
    limit = timeout if timeout is not None else cfg.job_ready_timeout
    deadline = Deadline(state.clock() + limit, state.clock)
    send = state.send(deadline, cfg.retry.max_retries)
    return wait_running(job, send=send, cfg=cfg.poll, clock=state.clock, timeout=limit)
