"""`max_tokens` against the sampler's context, through the SDK on every transport (issue 37):
0 and hostile values refused naming the field, a value past the room refused naming the room,
clamping only on request (`clamp_max_tokens`) and then said in the reply; the fake bounded by
its model's context like a real engine (`max_tokens=10**6` is an instant refusal, not minutes of
sampling)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from arctic_sdk.errors import ArcticError
from arctic_servers.engines.fake.sampling import CONTEXT_LENGTH

from .conftest import Env


async def _refused(env: Env, client: Any, **body: Any) -> ArcticError:
    with pytest.raises(ArcticError) as info:
        await env.run(client.generate(**body))
    return info.value


@pytest.mark.parametrize("value", [0, -1, -(2**40), 1.5, "16", True])
async def test_hostile_max_tokens_are_refused_naming_the_field(env: Env, value: Any) -> None:
    client = env.client()
    await env.job(client)
    err = await _refused(env, client, prompts=["hi"], sampling_params={"max_tokens": value})
    assert err.code == "invalid_argument"
    assert err.details.get("field") == "sampling_params.max_tokens", err.details


async def test_past_the_room_is_refused_naming_it(env: Env) -> None:
    client = env.client()
    await env.job(client)
    prompt = [65] * 10
    room = CONTEXT_LENGTH - len(prompt)
    t0 = time.monotonic()
    for asked in (room + 1, 10**6, 2**62):
        err = await _refused(env, client, prompts=[prompt], sampling_params={"max_tokens": asked})
        assert err.code == "invalid_argument"
        d = err.details
        assert d["field"] == "sampling_params.max_tokens" and d["room"] == room
        assert d["prompt_tokens"] == 10 and d["max_model_len"] == CONTEXT_LENGTH
        assert str(room) in str(err) and str(CONTEXT_LENGTH) in str(err)
    assert time.monotonic() - t0 < 30  # refused up front, nothing sampled
    # strict does not change it (nor does it clamp)
    err = await _refused(
        env, client, prompts=[prompt], sampling_params={"max_tokens": room + 1}, strict=True
    )
    assert err.details["room"] == room
    # a prompt that fills the context leaves no room at all
    err = await _refused(env, client, prompts=[[65] * CONTEXT_LENGTH])
    assert err.details["field"] == "prompts[0]" and err.details["room"] == 0


async def test_the_edge_and_clamping_on_request(env: Env) -> None:
    client = env.client()
    await env.job(client)
    prompt = [65] * (CONTEXT_LENGTH - 3)  # room 3
    ok = await env.run(
        client.generate(prompts=[prompt], sampling_params={"max_tokens": 3, "seed": 1})
    )
    assert len(ok["results"][0]["samples"][0]["token_ids"]) == 3
    assert not ok["results"][0].get("clamped_max_tokens")
    out = await env.run(
        client.generate(
            prompts=[prompt, [65, 66]],
            sampling_params={"max_tokens": 20, "seed": 1},
            clamp_max_tokens=True,
        )
    )
    long, short = out["results"]
    assert long["clamped_max_tokens"] == 3 and len(long["samples"][0]["token_ids"]) == 3
    assert long["samples"][0]["finish_reason"] == "length"
    assert not short.get("clamped_max_tokens") and len(short["samples"][0]["token_ids"]) == 20
    # absent: 16, capped by the room (a default, not the caller's ask: nothing to report)
    dflt = await env.run(client.generate(prompts=[prompt, [65]], sampling_params={"seed": 1}))
    assert [len(r["samples"][0]["token_ids"]) for r in dflt["results"]] == [3, 16]
