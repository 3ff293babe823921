"""Every field of an OpenAI request body is used, refused by name, or named as ignored.

The routes take vLLM's OpenAI request fields (its `CompletionRequest` / `ChatCompletionRequest`,
vLLM 0.32) and OpenAI's. A field is one of:

- **used** (`USED_*`): `requests.py` reads it and it changes the prompt, the sampling or the
  reply;
- **no effect by nature** (`NO_EFFECT`): bookkeeping that changes no token of the reply
  (`user`, `metadata`, `request_id`, ...; `cache_salt`: each job's engine serves one token's
  calls, so there is no one to isolate its prefix cache from; `truncation_side`: only read
  with `truncate_prompt_tokens`, which is refused; `session_id` on `/v1/completions`: a
  completion has no conversation to keep, chat's sessions are `sessions.py`);
- **refused unless at its default** (`REFUSED`): a field that would change the prompt, the
  sampling or the reply and that this server does not implement — 400 `unsupported_value` naming
  the field and the value (absent, null or the listed default values are accepted: a client that
  sends vLLM's defaults is not refused);
- **unknown**: any other field (clients and agent frameworks send vendor fields). It is accepted,
  as vLLM's server accepts it, and named: the reply's `X-Arctic-Ignored-Fields` header and a
  warning in the server's log, as vLLM logs it (once per route and set of names).

`tests/openai/test_request_fields.py` checks that every field of the installed vLLM's request
models is classified here, so a vLLM upgrade that adds one fails there, not silently here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .sampler import OpenAIError

__all__ = ["IGNORED_HEADER", "NO_EFFECT", "REFUSED", "USED_CHAT", "USED_COMPLETIONS", "check"]

IGNORED_HEADER = "X-Arctic-Ignored-Fields"
MAX_NAMED = 16  # unknown fields named in the header; the rest counted
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

_USED_BOTH = {
    "model", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "min_tokens", "stop",
    "stop_token_ids", "ignore_eos", "min_p", "include_stop_str_in_output", "logprobs", "stream",
    "stream_options", "return_tokens_as_token_ids", "return_token_ids", "stream_interval",
    "add_special_tokens", "arctic_timing",
}  # fmt: skip
USED_CHAT = frozenset(
    _USED_BOTH
    | {"messages", "top_logprobs", "tools", "tool_choice", "add_generation_prompt"}
    | {"chat_template_kwargs", "parallel_tool_calls", "session_id"}
)
USED_COMPLETIONS = frozenset(_USED_BOTH | {"prompt", "echo"})

NO_EFFECT = frozenset({
    "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
    "request_id", "cache_salt", "truncation_side",
    "session_id",  # completions: no conversation to keep (chat uses it: sessions.py)
    "mm_payload", "prediction",
})  # fmt: skip

_SAMPLING = "it changes what is sampled"
_PROMPT = "it changes the prompt"
_REPLY = "it adds to the reply"
_VLLM = "a vLLM serving feature"
# field -> (values that count as its default besides absent / null, why it cannot be honoured)
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "logit_bias": (({},), _SAMPLING),
    "allowed_token_ids": (([],), _SAMPLING),
    "bad_words": (([],), _SAMPLING),
    "use_beam_search": ((False,), _SAMPLING),
    "best_of": ((1,), _SAMPLING),
    "length_penalty": ((1, 1.0), _SAMPLING),
    "early_stopping": ((False,), _SAMPLING),
    "watermarking": ((False,), _SAMPLING),
    "response_format": (({"type": "text"},), _SAMPLING),
    "structured_outputs": ((), _SAMPLING),
    "guided_json": ((), _SAMPLING),
    "guided_regex": ((), _SAMPLING),
    "guided_choice": ((), _SAMPLING),
    "guided_grammar": ((), _SAMPLING),
    "guided_decoding_backend": ((), _SAMPLING),
    "guided_whitespace_pattern": ((), _SAMPLING),
    "repetition_detection": (({},), _SAMPLING),
    "thinking_token_budget": ((), _SAMPLING),
    "reasoning_effort": ((), _PROMPT + " (a template that reads it: chat_template_kwargs)"),
    "vllm_xargs": (({},), _SAMPLING),
    "skip_special_tokens": ((True,), "it changes the reply's text"),
    "spaces_between_special_tokens": ((True,), "it changes the reply's text"),
    "include_reasoning": ((True,), "the reply does not separate reasoning"),
    "suffix": (("",), _PROMPT),
    "truncate_prompt_tokens": ((), _PROMPT),
    "prompt_embeds": ((), _PROMPT),
    "chat_template": ((), _PROMPT),
    "continue_final_message": ((False,), _PROMPT),
    "documents": (([],), _PROMPT),
    "media_io_kwargs": (({},), _PROMPT),
    "mm_processor_kwargs": (({},), _PROMPT),
    "functions": (([],), _PROMPT + " (use tools)"),
    "function_call": (("none", "auto"), "the legacy function-call form (use tool_choice)"),
    "modalities": ((["text"],), "only text is generated"),
    "audio": ((), "only text is generated"),
    "web_search_options": ((), _VLLM + " it lacks"),
    "prompt_logprobs": ((), _REPLY),
    "logprob_token_ids": (([],), _REPLY),
    "return_token_offsets": ((False,), _REPLY),
    "return_prompt_text": ((False,), _REPLY),
    "return_mm_kwargs": ((False,), _REPLY),
    "routed_experts_prompt_start": ((0,), _REPLY),
    "return_token_strs": ((False,), _REPLY),  # vLLM's /tokenize
    "priority": ((0,), "requests are served first come, first served"),
    "kv_transfer_params": (({},), _VLLM),
    "ec_transfer_params": (({},), _VLLM),
}
# chat only: `echo` (vLLM's: the last message echoed back); completions use their own `echo`
_REFUSED_CHAT = {"echo": ((False,), _REPLY)}


def _is_default(value: Any, defaults: tuple[Any, ...]) -> bool:
    """Absent / null, or equal to a default (`true` is not 1, `false` is not 0)."""
    return value is None or any(
        value == d and isinstance(value, bool) == isinstance(d, bool) for d in defaults
    )


def _refuse(name: str, value: Any, why: str, defaults: tuple[Any, ...] = ()) -> OpenAIError:
    shown = json.dumps(value, default=str)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    hint = "omit it" + (f" or send {json.dumps(defaults[0])}" if defaults else "")
    return OpenAIError(
        400,
        f"{name}={shown}: not supported by this server ({why}); {hint}",
        param=name,
        code="unsupported_value",
    )


def named(unknown: list[str]) -> list[str]:
    """What the reply says of the unknown fields: their names, sorted, the first `MAX_NAMED`
    (a name outside [A-Za-z0-9_.-]{1,64} is not echoed into a header or a log line), then a
    count of the rest."""
    plain = sorted(n for n in unknown if _PLAIN_NAME.fullmatch(n))
    shown = plain[:MAX_NAMED]
    rest = len(unknown) - len(shown)
    return shown + ([f"({rest} more)"] if rest else [])


def check(body: Mapping[str, Any], *, chat: bool) -> list[str]:
    """Raise `OpenAIError` (400) for a field this server cannot honour; what the reply says of
    the unknown fields it ignores (`named`)."""
    used = USED_CHAT if chat else USED_COMPLETIONS
    unknown: list[str] = []
    for name, value in body.items():
        rule = REFUSED.get(name) or (_REFUSED_CHAT.get(name) if chat else None)
        if rule is not None:
            if not _is_default(value, rule[0]):
                raise _refuse(name, value, rule[1], rule[0])
        elif name in used:
            continue
        elif name not in NO_EFFECT:
            unknown.append(str(name))
    opts = body.get("stream_options")
    if isinstance(opts, Mapping) and opts.get("continuous_usage_stats"):
        raise _refuse(
            "stream_options.continuous_usage_stats", True, "usage comes in the last chunk", ()
        )
    return named(unknown)
