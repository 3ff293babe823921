"""Misuse of a client method, refused before anything else happens (issue: the SDK's errors,
never Python's `ValueError` / `AttributeError` from deep inside).

A body that is not a mapping (an array passed as the body), `options` that are not
`CallOptions` (a plain dict), and keyword arguments the op does not have (named, with the closest
known one) all raise `InvalidArgumentError` naming what was wrong and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import descriptor_pool

import arctic_sdk.spec.pb.arctic.v1 as _pb  # noqa: F401  (registers the spec's messages)

from .errors import InvalidArgumentError
from .spec.body_check import closest
from .spec.model import MethodInfo

_POOL = descriptor_pool.Default()


def _kind(value: Any) -> str:
    shape = getattr(value, "shape", None)
    name = type(value).__name__
    return f"a {name} of shape {list(shape)}" if shape is not None else f"a {name}"


def keyword_names(method: MethodInfo) -> list[str]:
    """The keyword arguments of a client method: the request fields, path parameters, options."""
    names: list[str] = []
    if method.request_type:
        names += [f.name for f in _POOL.FindMessageTypeByName(method.request_type).fields]
    names += [p for p in method.path_params if p not in names]
    return [*names, "options"]


def check_call(
    method: MethodInfo,
    body: Any,
    options: Any,
    unknown: Mapping[str, Any],
) -> None:
    from ._client_base import CallOptions

    op = f"{method.python_name}()"
    if body is not None and not isinstance(body, Mapping):
        hint = ""
        if getattr(body, "shape", None) is not None:
            hint = (
                "; tensors go inside the body, e.g. "
                f"{method.python_name}(kwargs={{'input_ids': ids}})"
                if method.request_type.endswith(("ForwardBackwardRequest", "ForwardRequest"))
                else "; tensors go inside the body, under their field names"
            )
        raise InvalidArgumentError(
            f"{op}: the body must be a mapping of {method.request_type or 'request'} fields, "
            f"got {_kind(body)}{hint}",
            op=method.name,
            details={"field": "body", "expected": f"a mapping ({method.request_type})"},
        )
    if options is not None and not isinstance(options, CallOptions):
        raise InvalidArgumentError(
            f"{op}: options must be arctic_sdk.CallOptions, got {_kind(options)}; "
            "e.g. options=CallOptions(timeout=30)",
            op=method.name,
            details={"field": "options", "expected": "CallOptions"},
        )
    if unknown:
        known = keyword_names(method)
        parts = []
        hints: dict[str, str] = {}
        for name in unknown:
            near = closest(name, known)
            if near:
                hints[name] = near
            parts.append(name + (f" (did you mean {near}?)" if near else ""))
        raise InvalidArgumentError(
            f"{op}: unknown field(s) {', '.join(parts)}; it takes {', '.join(known)}",
            op=method.name,
            details={
                "field": next(iter(unknown)),
                "unknown_fields": list(unknown),
                "expected": known,
                "did_you_mean": hints,
            },
        )
