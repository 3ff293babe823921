"""The OpenAI surface of the real on-prem server (vLLM sampler on the tiny model).

Runs only with `ARCTIC_ONPREM_TESTS=1` and the engines installed: it starts the server and a
sampling sub-job (tens of seconds on a small CPU box).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from arctic_sdk import Client
from arctic_sdk.rollouts import flatten_turns, turn_from_response

from ..compat.conftest import SKIP_ONPREM, free_port, onprem_available

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow
KEY = "sk-onprem-openai-7d2c"


@pytest.fixture(scope="module")
def onprem() -> Iterator[dict[str, Any]]:
    if not onprem_available():
        pytest.skip(SKIP_ONPREM)
    from arctic_sdk.compat import launch_onprem

    srv = launch_onprem("127.0.0.1", free_port(), tokens=(KEY,), timeout=120)
    try:
        with Client(srv.base_url, token=KEY, progress=False) as c:
            c.create_job(sub_job_configs=[{"job_type": "sampling", "model_name": "tiny"}])
            c.wait_until_running(timeout=300)
            yield {"v1": srv.base_url + "/v1", "job": c.job_id}
            c.cancel_job()
    finally:
        srv.stop()


def test_models_chat_completions(onprem: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=onprem["v1"], api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == [onprem["job"]]
    msgs = [{"role": "user", "content": "Hello there"}]
    chat = client.chat.completions.create(
        model=onprem["job"],
        messages=msgs,
        max_tokens=8,
        seed=1,
        logprobs=True,
        extra_body={"return_token_ids": True, "top_k": 50},
    )
    choice = chat.choices[0]
    ids, prompt = choice.model_extra["token_ids"], chat.model_extra["prompt_token_ids"]
    assert 0 < len(ids) <= 8 and prompt[-3:]  # rendered with the model's own chat template
    assert len(choice.logprobs.content) == len(ids)
    by_name = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, seed=1)
    # the model name resolves to the job too (tokens may differ: seeded vLLM sampling on CPU is
    # not bitwise reproducible once the prefix cache holds the prompt)
    assert by_name.choices[0].model_extra["token_ids"] and by_name.model == "tiny"
    comp = client.completions.create(
        model=onprem["job"], prompt=[prompt, prompt[:5]], max_tokens=4, n=2, seed=3
    )
    assert len(comp.choices) == 4
    two_turn = [turn_from_response(chat)]
    msgs2 = [
        *msgs,
        {"role": "assistant", "content": choice.message.content},
        {"role": "user", "content": "more"},
    ]
    chat2 = client.chat.completions.create(model=onprem["job"], messages=msgs2, max_tokens=4)
    two_turn.append(turn_from_response(chat2))
    flat = flatten_turns(two_turn, warn=False)
    assert flat.num_turns == 2


def test_stream_is_incremental(onprem: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=onprem["v1"], api_key=KEY, max_retries=0)
    n = 32
    stream = client.chat.completions.create(
        model=onprem["job"],
        messages=[{"role": "user", "content": "Count"}],
        max_tokens=n,
        seed=2,
        stream=True,
        extra_body={"arctic_timing": True, "ignore_eos": True},
    )
    arrivals, gen_times, ids = [], [], []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].model_extra.get("token_ids"):
            arrivals.append(time.time())
            gen_times.append(chunk.model_extra["arctic_generated_at"])
            ids += chunk.choices[0].model_extra["token_ids"]
    assert len(ids) == n and len(arrivals) >= n / 4
    assert arrivals[0] < gen_times[-1]  # the first chunk arrived before the last token existed


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_litellm(onprem: dict[str, Any]) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    resp = litellm.completion(
        model=f"hosted_vllm/{onprem['job']}",
        api_base=onprem["v1"],
        api_key=KEY,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    assert resp.choices[0].provider_specific_fields.get("token_ids")
    assert getattr(resp, "prompt_token_ids", None)
    chunks = list(
        litellm.completion(
            model=f"hosted_vllm/{onprem['job']}",
            api_base=onprem["v1"],
            api_key=KEY,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            stream=True,
        )
    )
    assert chunks
    asyncio.get_event_loop_policy()
