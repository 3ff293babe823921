"""OpenAI request bodies to sampler inputs: prompts as token ids and vLLM sampling params.

Each field is used, refused by name, or named as ignored (`request_fields.py`); a used field
with a bad value answers 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..rules import token_budget
from ..rules.errors import ProtocolError
from . import request_fields
from .sampler import OpenAIError, Sampler
from .sessions import Continuation, Session, continue_prompt
from .tool_calls import ToolCalls, ToolTurn

__all__ = ["Request", "chat_request", "completion_request"]

MAX_N = 128


@dataclass
class Request:
    model: str
    prompts: list[list[int]]
    params: dict[str, Any]
    stream: bool
    include_usage: bool
    logprobs: bool
    token_id_strings: bool
    echo_text: list[str]  # completions with echo: the prompt text per prompt (else empty)
    timing: bool
    raw: Mapping[str, Any]
    stream_interval: int = 1  # vLLM's: a streamed chunk per this many tokens (first, last at once)
    ignored: tuple[str, ...] = ()  # unknown fields, named in the reply (request_fields.py)
    tools: ToolTurn | None = None  # chat: tool calls to force or parse (tool_calls.py)
    session: Session | None = None  # chat: the session this turn continues (sessions.py)
    continuation: Continuation | None = None
    prompt_text: str = ""


def _bad(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {message}", param=param, code="invalid_value")


def _num(
    body: Mapping[str, Any],
    name: str,
    *,
    lo: float | None = None,
    integer: bool = False,
) -> Any:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or (integer and v != int(v)):
        raise _bad(name, f"{v!r} is not {'an integer' if integer else 'a number'}")
    if lo is not None and v < lo:
        raise _bad(name, f"{v} is below {lo}")
    return int(v) if integer else float(v)


def sampling_params(body: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
    sp: dict[str, Any] = {}
    n = _num(body, "n", lo=1, integer=True)
    if n is not None:
        if n > MAX_N:
            raise _bad("n", f"{n} is above {MAX_N}")
        sp["n"] = n
    mt = _num(body, "max_completion_tokens", lo=1, integer=True)
    if mt is None:
        mt = _num(body, "max_tokens", lo=1, integer=True)
    if mt is not None:  # absent: `fit_context` (chat: the room) or the engines' default
        sp["max_tokens"] = mt
    for name, lo in (
        ("temperature", 0.0),
        ("top_p", 0.0),
        ("presence_penalty", None),
        ("frequency_penalty", None),
        ("repetition_penalty", 0.0),
    ):
        v = _num(body, name, lo=lo)
        if v is not None:
            sp[name] = v
    for name in ("top_k", "seed", "min_tokens"):
        v = _num(body, name, integer=True)
        if v is not None:
            sp[name] = v
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise _bad("stop", "expected a string or a list of non-empty strings")
        if stop:
            sp["stop"] = stop
    ids = body.get("stop_token_ids")
    if ids:
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise _bad("stop_token_ids", "expected a list of token ids")
        sp["stop_token_ids"] = ids
    if body.get("ignore_eos"):
        sp["ignore_eos"] = True
    mp = _num(body, "min_p", lo=0.0)  # vLLM's extra sampling parameters
    if mp is not None:
        if mp > 1:
            raise _bad("min_p", f"{mp} is above 1")
        sp["min_p"] = mp
    if body.get("include_stop_str_in_output"):
        sp["include_stop_str_in_output"] = True
    want = body.get("logprobs")
    top = body.get("top_logprobs") if chat else (want if not isinstance(want, bool) else None)
    if top:
        raise OpenAIError(
            400,
            f"{'top_logprobs' if chat else 'logprobs'}={top}: alternatives are not returned by "
            "this sampler; ask for the sampled token's log-prob with "
            + ("logprobs=true (top_logprobs 0 or absent)" if chat else "logprobs=0"),
            param="top_logprobs" if chat else "logprobs",
            code="unsupported_value",
        )
    if (chat and want) or (not chat and want is not None and want is not False):
        sp["logprobs"] = 0
    return sp


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    opts = body.get("stream_options") or {}
    return bool(body.get("stream")), bool(isinstance(opts, Mapping) and opts.get("include_usage"))


def _stream_interval(body: Mapping[str, Any]) -> int:
    """vLLM's `stream_interval` (its OpenAI server's request field): tokens per streamed chunk,
    the first and the last chunk sent at once; it changes only how a stream is cut (vLLM, too,
    ignores it without `stream`)."""
    return int(_num(body, "stream_interval", lo=1, integer=True) or 1)


def special_tokens(body: Mapping[str, Any], default: bool) -> bool:
    """vLLM's `add_special_tokens` for a text prompt: the tokenizer's BOS and the like (vLLM's
    defaults: true for completions, false for chat, whose template writes them)."""
    v = body.get("add_special_tokens")
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad("add_special_tokens", f"{v!r} is not a boolean")
    return v


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "model: required (see GET /v1/models)", param="model")
    return model


def fit_context(
    body: Mapping[str, Any],
    prompts: Sequence[Sequence[int]],
    params: dict[str, Any],
    sampler: Sampler,
    *,
    chat: bool,
) -> None:
    """vLLM's OpenAI server's rule (`get_max_tokens`, its protocol's defaults): a prompt must
    leave room under `max_model_len`; an asked-for `max_tokens` / `max_completion_tokens` past
    the room is refused (400 naming the field, the prompt's length, `max_model_len` and the
    room: never clamped silently); absent, chat gets the room and completions 16 (capped by the
    room, by the engines: `rules/token_budget.py`)."""
    mct = body.get("max_completion_tokens") is not None
    name = "max_completion_tokens" if mct else "max_tokens"
    asked = params.get("max_tokens")
    limit = int(getattr(sampler, "max_model_len", 0) or 0)
    for i, p in enumerate(prompts):
        where = "messages" if chat else ("prompt" if len(prompts) == 1 else f"prompt[{i}]")
        try:
            b = token_budget.budget(
                asked,
                len(p),
                limit,
                default=None if chat else token_budget.DEFAULT_MAX_TOKENS,
                field=name,
                prompt_field=where,
                hint="",
            )
        except ProtocolError as exc:
            param = str(exc.details.get("field") or name)
            raise OpenAIError(400, exc.message, param=param, code="invalid_value") from None
        if chat and asked is None and limit > 0:
            params["max_tokens"] = b.max_tokens


def chat_request(
    body: Mapping[str, Any],
    sampler: Sampler,
    tool_calls: ToolCalls | None = None,
    session: Session | None = None,
    *,
    sample: bool = True,
) -> Request:
    """`sample` False: the prompt only (`/tokenize`), not checked against the context."""
    ignored = request_fields.check(body, chat=True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "expected a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}]", "expected an object with a role")
    kwargs = dict(body.get("chat_template_kwargs") or {})
    tools = (tool_calls or ToolCalls()).for_request(body, getattr(sampler, "tok", None))
    special = special_tokens(body, False)

    def render(msgs: Sequence[Mapping[str, Any]], gen: bool) -> str:
        return sampler.render_chat(
            msgs, add_generation_prompt=gen, tools=body.get("tools"), **kwargs
        )

    text = render(messages, bool(body.get("add_generation_prompt", True)))
    params = sampling_params(body, chat=True)
    if tools is not None and tools.constraint is not None:
        params["structured_outputs"] = tools.constraint
    cont = None
    if session is not None:
        if int(params.get("n") or 1) != 1:
            raise _bad("n", "a session continues one conversation: n must be 1 (session_id)")
        params.setdefault("logprobs", 0)  # a session's turns keep the sampler's log-probs
        cont = continue_prompt(
            session,
            messages,
            text,
            lambda msgs: render(msgs, False),
            lambda t: sampler.encode(t, add_special_tokens=False),
            sampler.decode_special,
            str(getattr(getattr(sampler, "tok", None), "eos_token", None) or ""),
        )
        if not cont.extends:
            cont.prompt = sampler.encode(text, add_special_tokens=special)
    stream, usage = _stream_flags(body)
    prompts = [cont.prompt if cont else sampler.encode(text, add_special_tokens=special)]
    if sample:
        fit_context(body, prompts, params, sampler, chat=True)
    return Request(
        model=_model(body),
        prompts=prompts,
        params=params,
        stream=stream,
        include_usage=usage,
        logprobs=bool(body.get("logprobs")),
        token_id_strings=bool(body.get("return_tokens_as_token_ids")),
        echo_text=[],
        timing=bool(body.get("arctic_timing")),
        raw=body,
        stream_interval=_stream_interval(body),
        ignored=tuple(ignored),
        tools=tools,
        session=session,
        continuation=cont,
        prompt_text=text,
    )


def completion_request(body: Mapping[str, Any], sampler: Sampler) -> Request:
    ignored = request_fields.check(body, chat=False)
    prompt = body.get("prompt")
    prompts: list[list[int]]
    texts: list[str]
    if isinstance(prompt, str):
        texts = [prompt]
    elif _token_list(prompt) and prompt:
        texts = []
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        texts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(_token_list(p) and p for p in prompt):
        texts = []
        prompts = [list(p) for p in prompt]
    else:
        raise _bad(
            "prompt",
            "expected a string, a list of strings, a list of token ids, or a "
            "list of token-id lists (none empty)",
        )
    if texts:
        special = special_tokens(body, True)
        prompts = [sampler.encode(t, add_special_tokens=special) for t in texts]
        if not all(prompts):
            raise _bad("prompt", "a prompt encodes to no tokens")
    echo = bool(body.get("echo"))
    stream, usage = _stream_flags(body)
    want = body.get("logprobs")
    params = sampling_params(body, chat=False)
    fit_context(body, prompts, params, sampler, chat=False)
    return Request(
        model=_model(body),
        prompts=prompts,
        params=params,
        stream=stream,
        include_usage=usage,
        logprobs=want is not None and want is not False,
        token_id_strings=bool(body.get("return_tokens_as_token_ids")),
        echo_text=[texts[i] if texts else sampler.decode(p) for i, p in enumerate(prompts)]
        if echo
        else [],
        timing=bool(body.get("arctic_timing")),
        raw=body,
        stream_interval=_stream_interval(body),
        ignored=tuple(ignored),
    )


def token_strings(sampler: Sampler, ids: Sequence[int], as_ids: bool) -> list[str]:
    return [f"token_id:{t}" if as_ids else sampler.token_text(t) for t in ids]
