"""The real `openai` Python client and LiteLLM against the routes (sync, async, streaming)."""

from __future__ import annotations

import os
import time

import pytest

from arctic_sdk.rollouts import flatten_turns, turn_from_response
from arctic_servers.engines.fake import tokenizer

from .conftest import API_KEY, OpenAIServer

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "Say something."}]


def test_openai_models_chat_completions(openai_server: OpenAIServer) -> None:
    client = openai.OpenAI(base_url=openai_server.v1, api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == ["fake-tiny", "fake-base"]
    chat = client.chat.completions.create(
        model="fake-tiny",
        messages=MESSAGES,
        max_completion_tokens=6,
        seed=2,
        logprobs=True,
        extra_body={"return_token_ids": True, "top_k": 20, "repetition_penalty": 1.1},
    )
    choice = chat.choices[0]
    assert choice.finish_reason == "length" and choice.message.content
    ids = choice.model_extra["token_ids"]
    assert tokenizer.decode(ids) == choice.message.content
    assert [c.logprob for c in choice.logprobs.content] == pytest.approx(
        [c.logprob for c in choice.logprobs.content]
    )
    assert chat.model_extra["prompt_token_ids"][:2] == tokenizer.encode("<|")
    turn = turn_from_response(chat)  # what a multi-turn agent loop records
    assert turn.completion_token_ids == ids and turn.logprobs is not None
    comp = client.completions.create(model="fake-base", prompt=[[5, 6, 7]], max_tokens=4, seed=1)
    assert len(comp.choices[0].model_extra["token_ids"]) == 4
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        client.chat.completions.create(model="fake-base", messages=MESSAGES)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=openai_server.v1, api_key="nope", max_retries=0).models.list()


def test_openai_streaming(openai_server: OpenAIServer) -> None:
    client = openai.OpenAI(base_url=openai_server.v1, api_key=API_KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="fake-tiny",
        messages=MESSAGES,
        max_tokens=32,
        seed=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"arctic_timing": True},
    )
    arrivals, text, ids, last_generated = [], "", [], 0.0
    for chunk in stream:
        if not chunk.choices:
            assert chunk.usage.completion_tokens == 32
            continue
        delta = chunk.choices[0].delta
        if chunk.choices[0].model_extra.get("token_ids"):
            arrivals.append(time.time())
            ids += chunk.choices[0].model_extra["token_ids"]
            last_generated = chunk.model_extra["arctic_generated_at"]
        text += delta.content or ""
    assert len(arrivals) >= 32 / 4 and len(ids) == 32
    assert arrivals[0] < last_generated
    assert text == tokenizer.decode(ids)


async def test_async_openai_client(openai_server: OpenAIServer) -> None:
    client = openai.AsyncOpenAI(base_url=openai_server.v1, api_key=API_KEY, max_retries=0)
    out = await client.completions.create(model="fake-tiny", prompt="Hi", max_tokens=3, n=2)
    assert len(out.choices) == 2
    chunks = [
        c
        async for c in await client.completions.create(
            model="fake-tiny", prompt="Hi", max_tokens=8, stream=True
        )
    ]
    assert (
        sum(len(c.choices[0].model_extra.get("token_ids") or []) for c in chunks if c.choices) == 8
    )
    await client.close()


@pytest.fixture(scope="module")
def litellm():  # type: ignore[no-untyped-def]
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    mod = pytest.importorskip("litellm")
    mod.suppress_debug_info = True
    return mod


# LiteLLM's own imports warn (pydantic ReadOnly TypedDicts, deprecations): not ours to fix
LITELLM_WARNINGS = (
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
)


@LITELLM_WARNINGS[0]
@LITELLM_WARNINGS[1]
@LITELLM_WARNINGS[2]
def test_litellm_harbor_path(openai_server: OpenAIServer, litellm) -> None:  # type: ignore[no-untyped-def]
    """Harbor's `LiteLLM`: `hosted_vllm/<name>`, logprobs=True, extra_body return_token_ids;
    completion ids from `provider_specific_fields["token_ids"]`, prompt ids top level."""
    turns = []
    messages = list(MESSAGES)
    for _ in range(2):
        resp = litellm.completion(
            model="hosted_vllm/fake-tiny",
            api_base=openai_server.v1,
            api_key=API_KEY,
            messages=messages,
            max_tokens=5,
            logprobs=True,
            seed=8,
            extra_body={"return_token_ids": True, "session_id": "s-1"},
        )
        choice = resp.choices[0]
        completion_ids = choice.provider_specific_fields.get("token_ids")
        prompt_ids = getattr(resp, "prompt_token_ids", None)
        assert completion_ids and prompt_ids
        assert [c["logprob"] for c in choice["logprobs"]["content"]]
        turns.append((prompt_ids, completion_ids))
        messages += [
            {"role": "assistant", "content": choice.message.content},
            {"role": "tool", "content": "ok"},
        ]
    flat = flatten_turns([p for p, _ in turns], [c for _, c in turns], warn=False)
    assert flat.num_turns == 2


@LITELLM_WARNINGS[0]
@LITELLM_WARNINGS[1]
@LITELLM_WARNINGS[2]
def test_litellm_streaming(openai_server: OpenAIServer, litellm) -> None:  # type: ignore[no-untyped-def]
    stream = litellm.completion(
        model="hosted_vllm/fake-tiny",
        api_base=openai_server.v1,
        api_key=API_KEY,
        messages=MESSAGES,
        max_tokens=24,
        seed=1,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) >= 24 / 4
    full = litellm.completion(
        model="hosted_vllm/fake-tiny",
        api_base=openai_server.v1,
        api_key=API_KEY,
        messages=MESSAGES,
        max_tokens=24,
        seed=1,
    )
    assert "".join(pieces) == full.choices[0].message.content
