"""The pieces of an OpenAI-shaped reply that the whole and the streamed replies share: the
envelope, `usage`, `finish_reason`, log-prob blocks, and the header naming ignored fields."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from . import request_fields
from .requests import Request, token_strings
from .sampler import Sample, Sampler
from .sessions import record_turn
from .tool_calls import raw_text

log = logging.getLogger("arctic_servers.openai")
FINISH = {"stop": "stop", "length": "length", "abort": "content_filter"}


_LOGGED: set[tuple[str, str]] = set()  # (route, names) already warned about


def ignored_header(request: web.Request | None, ignored: Sequence[str]) -> dict[str, str]:
    """The reply's header naming the request's unknown fields (none: no header), and a warning
    in the server's log the first time a route sees that set of names (a client sends the same
    vendor fields on every request; `request` None: not logged)."""
    if not ignored:
        return {}
    names = ", ".join(ignored)
    if request is not None and (request.path, names) not in _LOGGED and len(_LOGGED) < 1024:
        _LOGGED.add((request.path, names))
        log.warning("%s: request fields ignored (unknown here): %s", request.path, names)
    return {request_fields.IGNORED_HEADER: names}


def finish_reason(reason: str | None) -> str:
    return FINISH.get(reason or "stop", "stop")


def usage(prompts: Sequence[Sequence[int]], completion_tokens: int) -> dict[str, int]:
    p = sum(len(x) for x in prompts)
    return {
        "prompt_tokens": p,
        "completion_tokens": completion_tokens,
        "total_tokens": p + completion_tokens,
    }


def chat_logprobs(
    sampler: Sampler, req: Request, ids: Sequence[int], lps: Sequence[float] | None
) -> dict[str, Any] | None:
    if not req.logprobs or lps is None:
        return None
    toks = token_strings(sampler, ids, req.token_id_strings)
    return {
        "content": [
            {"token": t, "logprob": float(v), "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, v in zip(toks, lps, strict=False)
        ]
    }


def text_logprobs(
    sampler: Sampler, req: Request, ids: Sequence[int], lps: Sequence[float] | None, offset: int = 0
) -> dict[str, Any] | None:
    if not req.logprobs or lps is None:
        return None
    toks = token_strings(sampler, ids, req.token_id_strings)
    offsets, pos = [], offset
    for t in toks:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": toks,
        "token_logprobs": [float(v) for v in lps],
        "top_logprobs": None,
        "text_offset": offsets,
    }


def chat_message(sampler: Sampler, req: Request, s: Sample) -> tuple[dict[str, Any], str]:
    """One sample's reply message (tool calls parsed when the request asks for them) and its
    OpenAI finish reason."""
    reason = finish_reason(s.finish_reason)
    if req.tools is None or not req.tools.parses:
        return {"role": "assistant", "content": s.text, "tool_calls": []}, reason
    text = raw_text(sampler, s.token_ids, s.finish_reason, s.stop_reason, s.text)
    return req.tools.message(text, s.token_ids, reason)


def record_session_turn(
    req: Request, message: dict[str, Any], s: Sample, version: int | None, reason: str
) -> None:
    """A session's turn, once its reply is known (whole or streamed alike)."""
    if req.session is None or req.continuation is None:
        return
    record_turn(
        req.session,
        req.raw["messages"],
        req.continuation,
        req.prompt_text,
        message,
        s.token_ids,
        s.logprobs,
        int(version or 0),
        reason,
    )


def chat_reply(
    sampler: Sampler, req: Request, samples: Sequence[Sample], version: int
) -> dict[str, Any]:
    """The whole `chat.completion` of one prompt's samples; a session's turn is recorded."""
    choices = []
    for i, s in enumerate(samples):
        message, reason = chat_message(sampler, req, s)
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": chat_logprobs(sampler, req, s.token_ids, s.logprobs),
                "finish_reason": reason,
                "stop_reason": s.stop_reason,
                "token_ids": s.token_ids,
            }
        )
        if i == 0:
            record_session_turn(req, message, s, version, reason)
    out = envelope("chat.completion", "chatcmpl", req, version)
    out["choices"] = choices
    out["usage"] = usage(req.prompts, sum(len(s.token_ids) for s in samples))
    out["prompt_token_ids"] = req.prompts[0]
    return out


def envelope(obj: str, prefix: str, req: Request, version: int | None) -> dict[str, Any]:
    """A reply's (or a stream chunk's) fields beside its choices."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex[:24]}",
        "object": obj,
        "created": int(time.time()),
        "model": req.model,
        "weight_version": version,
    }
