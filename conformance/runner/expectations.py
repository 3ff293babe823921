"""The checks of a step's `expect` against the reply it got: the error code and body, the HTTP
or gRPC status, the request status, headers and fields (`matchers`). Each answers the difference
it found, or None."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import matchers
from .openai_wire import refusal_of_any
from .session import is_terminal, status_of
from .values import Scope
from .wire import Reply

__all__ = ["check_reply"]


def check_reply(
    expect: Mapping[str, Any], reply: Reply, scope: Scope, variables: Mapping[str, Any]
) -> str | None:
    """The difference between a step's `expect` and the reply, or None when it holds."""
    exp = dict(expect)
    exp.update(expect.get(reply.transport) or {})
    if reply.transport_error is not None:
        return f"no answer: {reply.transport_error}"
    if exp.get("refuses"):  # an OpenAI-shaped 4xx naming the field (openai/* cases)
        diff = refusal_of_any(reply, exp["refuses"])
        if diff or reply.body is None:
            return diff
        return matchers.check_fields(exp.get("fields") or {}, reply.body, scope, variables)
    if exp.get("not_error"):  # just inside a limit: anything but these codes (or a 5xx)
        return _not_error(list(exp["not_error"]), reply)
    if exp.get("fails_with"):  # refused with the code, or ran and failed with it
        code = str(exp["fails_with"])
        if reply.is_error:
            return matchers.check_error(reply, [code], False)
        exp = {**exp, "failed": code}
    codes = [exp["error"]] if exp.get("error") else list(exp.get("error_any") or [])
    if codes:  # the refusal, then what `fields` say of its body (`error.details.field`, ...)
        diff = matchers.check_error(reply, codes, exp.get("error_body") == "optional")
        if diff or reply.body is None:
            return diff
        return matchers.check_fields(exp.get("fields") or {}, reply.body, scope, variables)
    want_http, want_grpc = exp.get("http_status"), exp.get("grpc_status")
    if reply.transport == "http" and want_http is not None and reply.status != int(want_http):
        return f"answered {reply.describe_status()}, expected HTTP {want_http}"
    if reply.transport == "grpc" and want_grpc and reply.grpc_code != want_grpc:
        return f"answered {reply.describe_status()}, expected gRPC {want_grpc}"
    if reply.is_error and exp.get("http_status") is None and not exp.get("grpc_status"):
        return _unexpected_error(exp, reply)
    if reply.decode_error:
        return reply.decode_error
    if "not_codec_error" in exp and not reply.is_error:
        pass  # accepted: a valid frame may also be a valid body
    diff = _status(exp, reply)
    if diff:
        return diff
    for name, spec in (exp.get("headers") or {}).items():
        if reply.transport != "http":
            break
        diff = matchers.check_fields({name.lower(): spec}, reply.headers, scope, variables)
        if diff:
            return f"header {diff}"
    return matchers.check_fields(exp.get("fields") or {}, reply.body, scope, variables)


def _not_error(codes: list[str], reply: Reply) -> str | None:
    """A call just inside an advertised limit: accepted, or refused for another reason (its
    body is deliberately incomplete), never with the limit's own codes nor a server error."""
    if not reply.is_error:
        return reply.decode_error or None
    if reply.code in codes:
        err = reply.error or {}
        return f"refused with {reply.code} inside the limit: {str(err.get('message'))[:200]}"
    status = reply.status if reply.transport == "http" else None
    if (status or 0) >= 500 or reply.grpc_code in ("INTERNAL", "UNKNOWN"):
        return f"answered {reply.describe_status()}: a server error, never the answer to input"
    return None


def _unexpected_error(exp: Mapping[str, Any], reply: Reply) -> str | None:
    nce = exp.get("not_codec_error")
    if nce:
        allowed = set(nce.get("allow") or []) if isinstance(nce, Mapping) else set()
        code = reply.code
        if code is None:
            return f"answered {reply.describe_status()} without an error body"
        if code in matchers.CODEC_CODES and code not in allowed:
            return f"a valid frame was refused with the codec code {code}"
        status = reply.status if reply.transport == "http" else None
        if (status or 0) >= 500 or reply.grpc_code in ("INTERNAL", "UNKNOWN"):
            return f"answered {reply.describe_status()}: a server error, never the answer to input"
        return matchers.error_body_problem(reply)
    err = reply.error or {}
    return f"refused: {reply.describe_status()}: {str(err.get('message', reply.received))[:200]}"


def _status(exp: Mapping[str, Any], reply: Reply) -> str | None:
    want = exp.get("status")
    failed = exp.get("failed")
    got = status_of(reply)
    if want == "chunk_cached":
        ok = isinstance(reply.body, Mapping) and reply.body.get("chunk_cached") is True
        return None if ok else f"answered {got or reply.received[:120]}, expected chunk_cached"
    if failed:
        err = reply.body.get("error") if isinstance(reply.body, Mapping) else None
        code = err.get("code") if isinstance(err, Mapping) else None
        if got != "failed" or code != failed:
            return f"status {got} ({code}), expected failed with {failed}"
        return None
    if want and got != want:
        err = reply.body.get("error") if isinstance(reply.body, Mapping) else None
        extra = f" ({err.get('code')}: {err.get('message')})" if isinstance(err, Mapping) else ""
        return f"status {got or '?'}{extra}, expected {want}"
    implicit = want is None and reply.request_status and not exp.get("not_codec_error")
    if implicit and is_terminal(reply) and got != "completed" and exp.get("ok", True):
        err = reply.body.get("error") if isinstance(reply.body, Mapping) else {}
        return f"status {got}: {err}, expected completed"
    return None
