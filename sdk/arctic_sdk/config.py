"""Client configuration: one pydantic model with a section per backend, and environment fallback.

Explicit arguments win; unset fields fall back to the environment:

| field | environment |
|---|---|
| `cortex.base_url` | `ARCTIC_CORTEX_BASE_URL` |
| `cortex.host` | `ARCTIC_CORTEX_HOST` (base URL `https://{host}`) |
| `cortex.database` | `ARCTIC_CORTEX_DATABASE` |
| `cortex.schema_name` | `ARCTIC_CORTEX_SCHEMA` |
| `cortex.endpoint` | `ARCTIC_CORTEX_ENDPOINT` |
| `cortex.pat_env_var` | `ARCTIC_CORTEX_PAT_ENV_VAR` |
| `cortex.pat` | the variable named by `pat_env_var`, then `ARCTIC_CORTEX_PAT`, then `CORTEX_PAT` |

The token is a `SecretStr`: it never appears in a repr, a log line or an error message.

    >>> cfg = ArcticConfig(cortex={"base_url": "http://127.0.0.1:8080", "pat": "s3cret"})
    >>> "s3cret" in repr(cfg)
    False
    >>> cfg.cortex.prefix_url()
    'http://127.0.0.1:8080/api/v2/databases/arctic/schemas/public/cortex-training'
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from .errors import InvalidArgumentError
from .spec.body_check import closest

__all__ = [
    "ArcticConfig",
    "CortexConfig",
    "GrpcConfig",
    "InprocConfig",
    "PollConfig",
    "RetryConfig",
]

MiB = 1024 * 1024

_ENV = {
    "base_url": "ARCTIC_CORTEX_BASE_URL",
    "host": "ARCTIC_CORTEX_HOST",
    "database": "ARCTIC_CORTEX_DATABASE",
    "schema_name": "ARCTIC_CORTEX_SCHEMA",
    "endpoint": "ARCTIC_CORTEX_ENDPOINT",
    "pat_env_var": "ARCTIC_CORTEX_PAT_ENV_VAR",
}
_PAT_ENV = ("ARCTIC_CORTEX_PAT", "CORTEX_PAT")


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


class CortexConfig(BaseModel):
    """The HTTP backend (the Cortex REST protocol, PROTOCOL.md §3)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    base_url: str | None = None
    """Server URL (`http://host:port`); wins over `host`."""
    host: str | None = None
    """Cortex host; the base URL is then `https://{host}`."""
    database: str = "arctic"
    schema_name: str = Field(default="public", alias="schema")
    endpoint: str = "cortex-training"
    pat: SecretStr | None = None
    """The programmatic access token (sent as `Authorization: Bearer`)."""
    pat_env_var: str | None = None
    """Name of an environment variable holding the token."""
    verify_ssl: bool = True

    @model_validator(mode="before")
    @classmethod
    def _from_env(cls, data: Any) -> Any:
        data = dict(data or {}) if isinstance(data, dict) or data is None else data
        if not isinstance(data, dict):
            return data
        if "schema" in data and "schema_name" not in data:
            data["schema_name"] = data.pop("schema")
        for name, var in _ENV.items():
            if data.get(name) is None and _env(var) is not None:
                if name == "host" and data.get("base_url") is not None:
                    continue
                data[name] = _env(var)
        if data.get("pat") is None:
            names = [data["pat_env_var"]] if data.get("pat_env_var") else []
            for var in [*names, *_PAT_ENV]:
                if _env(var) is not None:
                    data["pat"] = _env(var)
                    break
        return data

    def base(self) -> str | None:
        """The server's base URL, or None when neither `base_url` nor `host` is known."""
        if self.base_url:
            return self.base_url.rstrip("/")
        if self.host:
            host = self.host.rstrip("/")
            return host if "://" in host else f"https://{host}"
        return None

    def prefix_url(self) -> str:
        """`{base}/api/v2/databases/{db}/schemas/{schema}/{endpoint}` (PROTOCOL.md §3.1)."""
        base = self.base()
        if base is None:
            from ._urls import no_server

            raise no_server("http")
        return f"{base}/api/v2/databases/{self.database}/schemas/{self.schema_name}/{self.endpoint}"


class GrpcConfig(BaseModel):
    """The gRPC backend (PROTOCOL.md §4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str | None = None
    """`host:port`; default: the HTTP server's host and the `grpc_port` it advertises."""
    secure: bool = False
    max_message_bytes: int = 4 * MiB
    """Largest message the client sends or accepts (the server's limit, if smaller, wins)."""


class InprocConfig(BaseModel):
    """The in-process backend: a servicer object served by the protocol core in this process."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    servicer: Any = Field(default=None, exclude=True, repr=False)
    """A `ServicerBase` instance (the business logic of a server)."""
    protocol: Any = Field(default=None, exclude=True, repr=False)
    """An optional `arctic_servers.protocol.config.ProtocolConfig`."""
    server_key: str | None = None
    """Set by the SDK: the in-process server a pickled client re-attaches to."""


class RetryConfig(BaseModel):
    """Retries on 429 (honouring Retry-After), retryable 5xx and connection failures."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_retries: int = Field(default=10, ge=0)
    first_contact_retries: int = Field(default=2, ge=0)
    """Retries of a connection that never reached a server this client has not heard from yet
    (a wrong URL fails after these, in seconds, naming the address)."""
    initial_backoff: float = Field(default=0.5, ge=0)
    max_backoff: float = Field(default=10.0, ge=0)
    multiplier: float = Field(default=2.0, ge=1)
    jitter: float = Field(default=0.25, ge=0, le=1)
    """Each sleep is scaled by a random factor in [1 - jitter, 1 + jitter]."""


class PollConfig(BaseModel):
    """How a submitted request is polled: capped exponential backoff (deployed defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    initial: float = Field(default=0.5, ge=0)
    multiplier: float = Field(default=1.25, ge=1)
    max_interval: float = Field(default=6.0, ge=0)
    max_events: int | None = Field(default=None, ge=1, le=512)


class ArcticConfig(BaseModel):
    """Everything a client needs; pass it as `Client(config=...)` or as keyword arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    transport: Literal["http", "grpc", "inproc"] = "http"
    job_id: str | None = None
    """The job the client's data-plane calls go to (set by `create_job` when unset)."""
    timeout: float = Field(default=1800.0, gt=0)
    """Default deadline of one call in seconds, retries and polls included."""
    request_timeout: float = Field(default=600.0, gt=0)
    """Deadline of one HTTP request or gRPC call (one attempt)."""
    connect_timeout: float = Field(default=10.0, gt=0)
    job_ready_timeout: float = Field(default=1800.0, gt=0)
    """How long `wait_until_running` waits for a job to start."""
    sequencing: bool | None = None
    """Per-job sequence numbers on mutating calls (X-Arctic-Seq): None = for the jobs this
    client created (and its pickled copies), True = for every job, False = never."""
    lease_renewal: bool = True
    """Renew the lease of a job created with `lease_seconds` while the client lives."""
    progress: bool | None = None
    """Progress bars: None = when stderr is a terminal."""
    tensors: Literal["numpy", "torch"] = "numpy"
    """Array type of tensors in results."""
    max_in_flight: int = Field(default=64, ge=1)
    """Worker threads of the sync client's futures; connection pool size."""
    retry: RetryConfig = Field(default_factory=RetryConfig)
    poll: PollConfig = Field(default_factory=PollConfig)
    cortex: CortexConfig = Field(default_factory=CortexConfig)
    grpc: GrpcConfig = Field(default_factory=GrpcConfig)
    inproc: InprocConfig = Field(default_factory=InprocConfig)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("transport") == "cortex":
            data = {**data, "transport": "http"}
        return data

    def token(self) -> str | None:
        """The token in clear (for the Authorization header only)."""
        pat = self.cortex.pat
        return pat.get_secret_value() if pat is not None else None


# Keyword arguments of `Client(...)` -> path in the config.
KWARGS: dict[str, tuple[str, ...]] = {
    "base_url": ("cortex", "base_url"),
    "host": ("cortex", "host"),
    "database": ("cortex", "database"),
    "schema": ("cortex", "schema_name"),
    "endpoint": ("cortex", "endpoint"),
    "token": ("cortex", "pat"),
    "pat": ("cortex", "pat"),
    "pat_env_var": ("cortex", "pat_env_var"),
    "verify_ssl": ("cortex", "verify_ssl"),
    "grpc_target": ("grpc", "target"),
    "servicer": ("inproc", "servicer"),
    "inproc_server": ("inproc", "server_key"),
    "max_retries": ("retry", "max_retries"),
    "transport": ("transport",),
    "job_id": ("job_id",),
    "timeout": ("timeout",),
    "request_timeout": ("request_timeout",),
    "connect_timeout": ("connect_timeout",),
    "job_ready_timeout": ("job_ready_timeout",),
    "progress": ("progress",),
    "tensors": ("tensors",),
    "max_in_flight": ("max_in_flight",),
    "lease_renewal": ("lease_renewal",),
    "sequencing": ("sequencing",),
}


def _config_error(exc: ValidationError) -> InvalidArgumentError:
    """A pydantic `ValidationError` as the SDK's error: every bad field named with its value
    and what was expected (and the closest allowed value of a misspelt choice)."""
    parts, fields, expected = [], [], {}
    for e in exc.errors():
        where = ".".join(str(p) for p in e.get("loc", ())) or "config"
        fields.append(where)
        text = f"{where}={e.get('input')!r}: {e.get('msg')}"
        allowed = (e.get("ctx") or {}).get("expected")
        if e.get("type") == "literal_error" and allowed:
            choices = [c.strip().strip("'") for c in str(allowed).replace(" or ", ", ").split(",")]
            expected[where] = choices
            near = closest(str(e.get("input")), choices)
            if near:
                text += f" (did you mean {near!r}?)"
        parts.append(text)
    return InvalidArgumentError(
        "invalid client configuration: " + "; ".join(parts),
        details={
            "field": fields[0] if fields else "config",
            "fields": fields,
            "expected": expected,
        },
    )


def build_config(config: ArcticConfig | dict[str, Any] | None, **kwargs: Any) -> ArcticConfig:
    """A config from `config` (a model or a dict) updated by `Client(...)`-style keywords.

    Keywords given as None are ignored; an unknown keyword or a value the config refuses raises
    `InvalidArgumentError` naming it (with the closest known name or value), and so does a
    server address that can never work (`_urls.checked`).
    """
    from ._urls import checked

    if isinstance(config, ArcticConfig):
        data: dict[str, Any] = _explicit(config)
    else:
        data = dict(config or {})
    for key, value in kwargs.items():
        if value is None:
            continue
        path = KWARGS.get(key)
        if path is None:
            near = closest(key, KWARGS)
            raise InvalidArgumentError(
                f"unknown argument {key!r}"
                + (f" (did you mean {near!r}?)" if near else "")
                + f"; expected one of {sorted(KWARGS)}",
                details={"field": key, "expected": sorted(KWARGS)},
            )
        node = data
        for part in path[:-1]:
            sub = node.get(part)
            if isinstance(sub, BaseModel):
                sub = _explicit(sub)
            node[part] = dict(sub or {})
            node = node[part]
        node[path[-1]] = value
    try:
        cfg = ArcticConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc) from None
    return checked(cfg)


def _explicit(model: BaseModel) -> dict[str, Any]:
    """The fields of `model` as a dict, keeping nested models and non-serialisable values."""
    out: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        out[name] = _explicit(value) if isinstance(value, BaseModel) else value
    return out


def reconnect_kwargs(config: ArcticConfig) -> dict[str, Any]:
    """`Client(...)` keywords that rebuild `config` (the token stays a `SecretStr`)."""
    out: dict[str, Any] = {"transport": config.transport, "job_id": config.job_id}
    c = config.cortex
    for key, value in (
        ("base_url", c.base_url),
        ("host", c.host),
        ("token", c.pat),
        ("grpc_target", config.grpc.target),
        ("inproc_server", config.inproc.server_key),
    ):
        if value is not None:
            out[key] = value
    out.update(database=c.database, schema=c.schema_name, endpoint=c.endpoint)
    return out
