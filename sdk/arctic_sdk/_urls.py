"""The server address a client is given, checked and normalised before anything is sent.

Mistakes that can never succeed are refused at construction with `InvalidArgumentError`
naming the URL, the mistake and the URL to use, instead of being retried for a minute:

- a URL without a scheme (`127.0.0.1:8080`): on HTTP, refused with the `http://` form; with
  `transport="grpc"` it is the gRPC target (`host:port`);
- a `grpc://` URL given to the HTTP transport (refused, naming `transport="grpc"`); with
  `transport="grpc"`, `grpc://host:port` is the gRPC target;
- a scheme other than `http`/`https`, or no host;
- no URL at all (`Client(token=...)`, refused when the client's transport is made).

The server's *prefix URL* (`{base}/api/v2/databases/{db}/schemas/{schema}/{endpoint}`, which
the servers print beside the base URL) is accepted: it becomes the base URL and the database,
schema and endpoint it names (a conflicting explicit `database=` etc. is refused).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .config import ArcticConfig

_PREFIX = re.compile(
    r"^(?P<root>.*?)/api/v2/databases/(?P<database>[^/]+)/schemas/(?P<schema>[^/]+)/(?P<endpoint>[^/]+)/?$"
)
_PREFIX_FIELDS = (("database", "database"), ("schema", "schema_name"), ("endpoint", "endpoint"))


def _refuse(url: str, why: str, field: str = "base_url", **details: Any) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{field}={url!r}: {why}", details={"field": field, "value": url, **details}
    )


def no_server(transport: str) -> InvalidArgumentError:
    """The error of a client with no server address at all."""
    grpc = " (or grpc_target='host:port' with transport='grpc')" if transport == "grpc" else ""
    return InvalidArgumentError(
        "no server configured: pass the server's URL, e.g. Client('http://127.0.0.1:8080', "
        f"token=...){grpc}, or set ARCTIC_CORTEX_BASE_URL or ARCTIC_CORTEX_HOST",
        details={"field": "base_url", "expected": "http://host:port or https://host"},
    )


def checked(config: ArcticConfig) -> ArcticConfig:
    """`config` with its server address checked and normalised (see the module docstring)."""
    if config.transport == "inproc":
        return config
    c = config.cortex
    url = c.base_url or c.host
    field = "base_url" if c.base_url else "host"
    if not url:
        return config  # refused when a transport is made (`no_server`): a config may be partial
    url = url.strip()
    if "://" not in url:
        if config.transport == "grpc" and field == "base_url":
            return _as_grpc_target(config, url)
        if field == "host":
            return config  # a bare host means https://{host}
        raise _refuse(
            url,
            f"the URL has no scheme; use {'http://' + url!r} (or 'https://' for a TLS server)"
            + (", or transport='grpc' for a gRPC host:port" if _hostport(url) else ""),
            expected="http://host:port or https://host",
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("grpc", "grpcs"):
        if config.transport == "grpc":
            return _as_grpc_target(config, parts.netloc, secure=scheme == "grpcs")
        raise _refuse(
            url,
            "a gRPC address given to the HTTP transport; pass "
            f"transport='grpc', grpc_target={parts.netloc!r} (or the server's http:// URL)",
            expected="http://host:port or https://host",
        )
    if scheme not in ("http", "https"):
        raise _refuse(
            url,
            f"scheme {parts.scheme!r} is not served; use http:// or https://",
            expected="http://host:port or https://host",
        )
    if not parts.hostname:
        raise _refuse(url, "the URL names no host", expected="http://host:port")
    return _split_prefix(config, url, field)


def _hostport(url: str) -> bool:
    return bool(re.fullmatch(r"[\w.\-\[\]:]+:\d+", url))


def _as_grpc_target(config: ArcticConfig, target: str, *, secure: bool = False) -> ArcticConfig:
    if not _hostport(target):
        raise _refuse(target, "a gRPC target is host:port", expected="host:port")
    if config.grpc.target and config.grpc.target != target:
        raise _refuse(
            target,
            f"conflicts with grpc_target={config.grpc.target!r}; pass one of them",
        )
    grpc = config.grpc.model_copy(update={"target": target, "secure": secure or config.grpc.secure})
    cortex = config.cortex.model_copy(update={"base_url": None})
    return config.model_copy(update={"grpc": grpc, "cortex": cortex})


def _split_prefix(config: ArcticConfig, url: str, field: str) -> ArcticConfig:
    """A prefix URL becomes the base URL and the database, schema and endpoint it names."""
    parts = urlsplit(url)
    if "/api/v2/" not in parts.path:
        return config
    m = _PREFIX.match(parts.path)
    root = f"{parts.scheme}://{parts.netloc}"
    if m is None or parts.query or parts.fragment:
        raise _refuse(
            url,
            f"not a server URL: pass the base URL {root + (m['root'] if m else '')!r} or the "
            "prefix URL the server prints ({base}/api/v2/databases/{db}/schemas/{schema}/"
            "{endpoint}), without an operation path",
            field,
            expected=root,
        )
    c = config.cortex
    update: dict[str, Any] = {"base_url": root + m["root"], "host": None}
    for key, attr in _PREFIX_FIELDS:
        given = getattr(c, attr)
        if attr in c.model_fields_set and given != m[key]:
            raise _refuse(
                url,
                f"the prefix URL names {key} {m[key]!r} but {key}={given!r} was given; "
                "pass the base URL with it, or drop it",
                field,
            )
        update[attr] = m[key]
    return config.model_copy(update={"cortex": c.model_copy(update=update)})
