"""What the `openai/*` cases read on the wire beyond JSON: a Server-Sent Events answer joined
into one reply, and an OpenAI-shaped refusal that names the field it refuses.

A stream (`text/event-stream`, `data: {...}` events then `data: [DONE]`) becomes
`{"chunks": [...], "done": bool, "choices": [...], ...}`: every chunk as sent, whether `[DONE]`
came, and per choice index the joined `content`, `token_ids`, `finish_reason` and `tool_calls`
(each call's `id`, `type` and `function.name` from its first delta, its `function.arguments`
the concatenation of every fragment, in order), plus the top-level fields of the first chunk
that had them (`prompt_token_ids`, `model`). The join is the runner's own, from the OpenAI
streaming format; no client library is used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .wire import Reply

__all__ = ["join_stream", "refusal_of_any", "refusal_problem"]

TOP_LEVEL = ("id", "model", "prompt_token_ids", "usage")


def join_stream(content: bytes) -> tuple[dict[str, Any], str | None]:
    """The joined reply of an SSE body, and a problem with the stream's framing (or None)."""
    chunks: list[Any] = []
    done = False
    problem: str | None = None
    for raw in content.decode("utf-8", "replace").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in raw.splitlines() if line.startswith("data:"))
        if not data:
            continue
        if data == "[DONE]":
            done = True
            continue
        if done and problem is None:
            problem = "an event came after data: [DONE]"
        try:
            chunks.append(json.loads(data))
        except ValueError as exc:
            problem = problem or f"an event is not JSON ({exc}): {data[:80]!r}"
    out: dict[str, Any] = {"chunks": chunks, "done": done, "choices": _choices(chunks)}
    for key in TOP_LEVEL:
        for c in chunks:
            if isinstance(c, Mapping) and c.get(key) is not None:
                out[key] = c[key]
                break
    errors = [c["error"] for c in chunks if isinstance(c, Mapping) and "error" in c]
    if errors:
        out["error"] = errors[0]
    return out, problem


def _choices(chunks: list[Any]) -> list[dict[str, Any]]:
    joined: dict[int, dict[str, Any]] = {}
    for c in chunks:
        for ch in (c.get("choices") if isinstance(c, Mapping) else None) or []:
            if not isinstance(ch, Mapping):
                continue
            into = joined.setdefault(
                int(ch.get("index") or 0),
                {"index": int(ch.get("index") or 0), "content": "", "token_ids": []},
            )
            delta = ch.get("delta") or {}
            if isinstance(delta.get("role"), str):
                into["role"] = delta["role"]
            if isinstance(delta.get("content"), str):
                into["content"] += delta["content"]
            into["token_ids"] += list(ch.get("token_ids") or [])
            if ch.get("finish_reason") is not None:
                into["finish_reason"] = ch["finish_reason"]
            for call in delta.get("tool_calls") or []:
                _join_call(into.setdefault("tool_calls", []), call)
    return [joined[i] for i in sorted(joined)]


def _join_call(calls: list[dict[str, Any]], delta: Mapping[str, Any]) -> None:
    index = int(delta.get("index") or 0)
    while len(calls) <= index:
        calls.append({"index": len(calls), "function": {"arguments": ""}})
    call, fn = calls[index], delta.get("function") or {}
    for key in ("id", "type"):
        if delta.get(key) is not None:
            call.setdefault(key, delta[key])
    if fn.get("name") is not None:
        call["function"].setdefault("name", fn["name"])
    if isinstance(fn.get("arguments"), str):
        call["function"]["arguments"] += fn["arguments"]


def refusal_of_any(reply: Reply, fields: str | list[str]) -> str | None:
    """`refusal_problem` for one field or any of a list (`or_refuses: [a, b]`)."""
    names = [fields] if isinstance(fields, str) else [str(f) for f in fields]
    problems = [refusal_problem(reply, f) for f in names]
    return None if None in problems else problems[0]


def refusal_problem(reply: Reply, field: str) -> str | None:
    """Why the reply is not a refusal naming `field`: a 4xx with OpenAI's error body
    (`{"error": {"message", "type", "param", "code"}}`) whose `param` is the field, or whose
    message names it. None when it is one."""
    if reply.transport_error is not None:
        return f"no answer: {reply.transport_error}"
    status = reply.status or 0
    if not 400 <= status < 500:
        return f"answered HTTP {status}, expected a 4xx refusal naming {field}"
    err = reply.error
    if err is None:
        return f"HTTP {status} without an error object: {reply.received[:200]}"
    message = err.get("message")
    if not isinstance(message, str) or not message:
        return f"HTTP {status}: error.message is not a non-empty string: {err}"
    if not isinstance(err.get("type"), str):
        return f"HTTP {status}: error.type is not a string: {err}"
    param = str(err.get("param") or "")
    if param != field and not param.startswith((field + ".", field + "[")) and field not in message:
        return (
            f"HTTP {status} does not name {field} (param {err.get('param')!r}, "
            f"message {message[:200]!r})"
        )
    return None
