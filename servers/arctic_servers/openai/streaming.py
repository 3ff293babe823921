"""The Server-Sent Events reply of a streamed completion (`stream: true`): one chunk per group of
tokens a sample's stream produced since the last chunk (what piled up while the client or the
server was busy goes out as one), each naming its choice `index` and the `weight_version` of
its tokens; `stream_interval` k holds a choice's tokens back until k have piled up (its first
tokens and its finish go out at once); a usage chunk with `stream_options.include_usage`; then
`data: [DONE]`."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from .reply_parts import (
    chat_logprobs,
    chat_message,
    envelope,
    finish_reason,
    ignored_header,
    record_session_turn,
    text_logprobs,
    usage,
)
from .requests import Request
from .sampler import OpenAIError, Sample, Sampler, StreamEvent, hold_back, merge_events
from .tool_calls import raw_text


def _record(sampler: Sampler, req: Request, ev: StreamEvent, version: int | None) -> None:
    """A streamed session turn, recorded as its whole reply would be (`chat_reply`)."""
    sample = Sample(ev.token_ids, ev.text, ev.finish_reason or "stop", ev.logprobs, ev.stop_reason)
    message, reason = chat_message(sampler, req, sample)
    record_session_turn(req, message, sample, version, reason)


async def stream_reply(
    request: web.Request,
    sampler: Sampler,
    req: Request,
    *,
    chat: bool,
) -> web.StreamResponse:
    n = int(req.params.get("n") or 1)
    params = {k: v for k, v in req.params.items() if k != "n"}
    env = envelope(
        "chat.completion.chunk" if chat else "text_completion",
        "chatcmpl" if chat else "cmpl",
        req,
        None,
    )
    env.pop("weight_version")
    jobs = [(pi, k) for pi in range(len(req.prompts)) for k in range(n)]
    # every stream opened (checked) before anything is sent: a refusal is a plain error reply
    streams = [await sampler.open_stream(req.prompts[pi], params, index=k) for pi, k in jobs]
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            **ignored_header(None, req.ignored),
        }
    )
    await resp.prepare(request)

    async def send(obj: Any) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        await resp.write(f"data: {data}\n\n".encode())

    queue: asyncio.Queue[tuple[int, int, StreamEvent | BaseException | None]] = asyncio.Queue()

    async def pump(choice: int, pi: int, k: int) -> None:
        try:
            async for ev in streams[choice]:
                await queue.put((choice, pi, ev))
        except BaseException as exc:
            await queue.put((choice, pi, exc))
        finally:
            await queue.put((choice, pi, None))

    tasks = [asyncio.create_task(pump(c, pi, k)) for c, (pi, k) in enumerate(jobs)]
    stops = list(params.get("stop") or [])
    sent = {c: "" for c in range(len(jobs))}
    held: dict[int, list[StreamEvent]] = {}  # stream_interval: each choice's unsent events
    got: dict[int, StreamEvent] = {}  # each choice's tokens and log-probs so far (merged)
    parsed = {c: "" for c in range(len(jobs))}  # tool parsing: the text handed to the parser
    called: set[int] = set()  # the choices whose tool calls streamed
    tools = req.tools if chat and req.tools is not None and req.tools.parses else None
    started: set[int] = set()  # the choices whose first tokens went out
    done, total = 0, 0
    try:
        for c, (pi, _) in enumerate(jobs):
            first: dict[str, Any] = {"index": c, "logprobs": None, "finish_reason": None}
            if chat:
                first["delta"] = {"role": "assistant", "content": ""}
            else:
                first["text"] = req.echo_text[pi] if req.echo_text else ""
            await send({**env, "choices": [first], "prompt_token_ids": req.prompts[pi]})
        while done < len(jobs):
            c, pi, ev = await queue.get()
            flushed = False
            if ev is None:  # that choice's stream has ended (its held tokens go out now)
                done += 1
                if c not in held:
                    continue
                ev, flushed = merge_events(held.pop(c)), True
            if isinstance(ev, BaseException):
                held.pop(c, None)
                err = (
                    ev
                    if isinstance(ev, OpenAIError)
                    else OpenAIError(500, str(ev), type="server_error")
                )
                await send(err.body())
                continue
            if req.stream_interval > 1 and not flushed:
                pending = held.setdefault(c, [])
                pending.append(ev)
                count = sum(len(e.token_ids) for e in pending)
                if c in started and not ev.finished and count < req.stream_interval:
                    continue
                ev = merge_events(held.pop(c))
                started.add(c)
            total += len(ev.token_ids)
            so_far = got[c] = merge_events([got[c], ev]) if c in got else ev
            text = ev.text if ev.finished else ev.text[: len(ev.text) - hold_back(ev.text, stops)]
            delta = text[len(sent[c]) :] if text.startswith(sent[c]) else ""
            sent[c] += delta
            reason = finish_reason(ev.finish_reason) if ev.finished else None
            choice: dict[str, Any] = {
                "index": c,
                "token_ids": ev.token_ids,
                "finish_reason": reason,
            }
            if tools is not None:
                raw = raw_text(
                    sampler, so_far.token_ids, ev.finish_reason, ev.stop_reason, so_far.text
                )
                if not ev.finished:
                    raw = raw.rstrip("\ufffd")  # an incomplete character: wait for its bytes
                fresh = raw[len(parsed[c]) :] if raw.startswith(parsed[c]) else ""
                parsed[c] += fresh
                d = tools.delta(c, fresh, ev.token_ids, req.prompts[pi], ev.finished)
                if d and d.get("tool_calls"):
                    called.add(c)
                choice["delta"] = d or {}
                if reason is not None:
                    choice["finish_reason"] = tools.stream_finish(c in called, reason)
            elif chat:
                choice["delta"] = {"content": delta}
            if chat:
                choice["logprobs"] = chat_logprobs(sampler, req, ev.token_ids, ev.logprobs)
            else:
                choice["text"] = delta
                choice["logprobs"] = text_logprobs(sampler, req, ev.token_ids, ev.logprobs)
            if ev.finished:
                choice["stop_reason"] = ev.stop_reason
                if c == 0 and req.session is not None and req.continuation is not None:
                    _record(sampler, req, so_far, ev.weight_version)
            chunk: dict[str, Any] = {**env, "choices": [choice]}
            if ev.weight_version is not None:
                chunk["weight_version"] = ev.weight_version  # the weights of these tokens
            if req.timing:
                chunk["arctic_generated_at"] = ev.generated_at
                chunk["arctic_sent_at"] = time.time()
            await send(chunk)
        if req.include_usage:
            await send({**env, "choices": [], "usage": usage(req.prompts, total)})
        await send("[DONE]")
    finally:
        for t in tasks:
            t.cancel()
    await resp.write_eof()
    return resp
