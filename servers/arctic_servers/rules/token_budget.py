"""How many tokens a sample may have: `max_tokens` against the room its prompt leaves in the
sampler's context (`max_model_len` - prompt tokens).

One rule for every surface (arctic.v1 generate, `/v1/completions`, `/v1/chat/completions`, the
Tinker sampler) and every engine (vLLM, the fake): a `max_tokens` past the room is refused with
`invalid_argument` naming the prompt's length, `max_model_len` and the room (what vLLM's own
OpenAI server says: "'max_tokens' is too large: N. This model's maximum context length is L
tokens and your request has P input tokens (N > L - P)"), unless the caller asked for clamping
(`GenerateRequest.clamp_max_tokens`); then it is lowered to the room and the reply says so
(`Completion.clamped_max_tokens`). An absent `max_tokens` is the surface's default, capped by
the room (a default is not the caller's ask).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Final

from arctic_sdk.spec.pb.arctic.v1 import training_pb2

from .errors import ProtocolError


def _proto_default() -> int:
    """`SamplingParams.max_tokens`'s `(arctic.v1.field).default_value`: the spec is its source."""
    from arctic_sdk.spec.pb.arctic.v1 import options_pb2

    fd = training_pb2.SamplingParams.DESCRIPTOR.fields_by_name["max_tokens"]
    return int(fd.GetOptions().Extensions[options_pb2.field].default_value)


#: arctic.v1 `SamplingParams.max_tokens` when absent (vLLM's `SamplingParams` and its
#: `/v1/completions` default too); the OpenAI chat route's default is the room instead.
DEFAULT_MAX_TOKENS: Final[int] = _proto_default()
#: The field the arctic.v1 body names; the OpenAI and Tinker surfaces name their own.
FIELD: Final[str] = "sampling_params.max_tokens"


@dataclass(frozen=True)
class Budget:
    """The `max_tokens` a prompt's samples run with; `clamped`: lowered to the room on request."""

    max_tokens: int
    clamped: bool = False


def requested(value: Any, field: str = FIELD) -> int | None:
    """A body's `max_tokens`: None when absent or null, else an integer >= 1 (a bool, a float
    with a fraction, a string, 0 or a negative number is `invalid_argument` naming `field`)."""
    if value is None:
        return None
    whole = isinstance(value, numbers.Integral) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or int(value) < 1:
        raise ProtocolError(
            "invalid_argument",
            f"field {field}: {value!r} is not an integer >= 1",
            field=field,
            expected="an integer >= 1",
        )
    return int(value)


def no_room(prompt_tokens: int, max_model_len: int, prompt_field: str) -> ProtocolError:
    """A prompt that leaves no token of room (vLLM refuses it too)."""
    return ProtocolError(
        "invalid_argument",
        f"field {prompt_field}: {prompt_tokens} tokens leave no room under the model's maximum "
        f"context length {max_model_len} (max_model_len; at least one token must be sampled)",
        field=prompt_field,
        expected=f"fewer than {max_model_len} tokens",
        prompt_tokens=prompt_tokens,
        max_model_len=max_model_len,
        room=0,
    )


def too_large(
    asked: int,
    prompt_tokens: int,
    max_model_len: int,
    field: str = FIELD,
    prompt_field: str = "prompts[0]",
    hint: str = "",
) -> ProtocolError:
    room = max_model_len - prompt_tokens
    return ProtocolError(
        "invalid_argument",
        f"field {field}: {asked} is too large: the model's maximum context length is "
        f"{max_model_len} tokens (max_model_len) and the prompt ({prompt_field}) has "
        f"{prompt_tokens} tokens, leaving room for {room} "
        f"({asked} > {max_model_len} - {prompt_tokens}){hint}",
        field=field,
        expected=f"1..{room}",
        prompt_tokens=prompt_tokens,
        max_model_len=max_model_len,
        room=room,
    )


def budget(
    asked: int | None,
    prompt_tokens: int,
    max_model_len: int,
    *,
    clamp: bool = False,
    default: int | None = DEFAULT_MAX_TOKENS,
    field: str = FIELD,
    prompt_field: str = "prompts[0]",
    hint: str = "; set clamp_max_tokens to lower it to the room instead",
) -> Budget:
    """The `max_tokens` one prompt's samples run with. `asked`: the caller's (None = absent:
    `default`, or the room when `default` is None or larger); `max_model_len` 0 = no known
    context (nothing to check against). Raises `ProtocolError` as the module says."""
    if max_model_len <= 0:
        return Budget(asked or default or DEFAULT_MAX_TOKENS)
    if prompt_tokens >= max_model_len:
        raise no_room(prompt_tokens, max_model_len, prompt_field)
    room = max_model_len - prompt_tokens
    if asked is None:
        return Budget(room if default is None else min(default, room))
    if asked <= room:
        return Budget(asked)
    if clamp:
        return Budget(room, clamped=True)
    raise too_large(asked, prompt_tokens, max_model_len, field, prompt_field, hint)
