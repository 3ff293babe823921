"""The OpenAI surface of the Cortex gateway (`arctic_servers.openai.gateway`), on the gateway's own
HTTP port, with the real `openai` client and LiteLLM.

Fake workers for the surface (their byte-level tokenizer and Qwen-style template give text and
chat); one module-scoped gateway with the real vLLM sampler on the tiny model for the model
directory's tokenizer and chat template (skipped only when vLLM is not installed).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from arctic_sdk.rollouts import flatten_turns, turn_from_response
from arctic_sdk.spec.tables import methods as M
from arctic_servers.engines.fake import tokenizer

from ..gateway.harness import SAMPLE, Client, Gateway
from .disconnect import leave_stream_and_wait_abort

openai = pytest.importorskip("openai")

TOKEN, OTHER = "pat-1", "pat-2"  # the harness's tokens: pat-1 in clear, pat-2 as its digest
MESSAGES = [{"role": "user", "content": "Say something."}]
GEN_LATENCY_S = 0.05  # each fake generate call takes this long: a stream's chunks spread out
SAMPLING_BOUND = 2  # the gateway's limits.max_sampling_requests_per_job in this module


@pytest.fixture(scope="module")
def fake_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    g = Gateway(
        tmp_path_factory.mktemp("gw-openai"),
        args=(
            "--gpus",
            "4",
            "--fake-latency",
            f"generate={GEN_LATENCY_S}",
            "--max-sampling-requests-per-job",
            str(SAMPLING_BOUND),
        ),
    )
    g.start()
    try:
        c, c2 = Client(g.prefix_url, token=TOKEN), Client(g.prefix_url, token=OTHER)
        job, other = c.create_job(SAMPLE), c2.create_job(SAMPLE)
        c.wait_job(job)
        c2.wait_job(other)
        c.s.close()
        c2.s.close()
        yield {"v1": g.base_url + "/v1", "base": g.base_url, "prefix": g.prefix_url, "job": job,
               "other": other}  # fmt: skip
    finally:
        g.cleanup()


CLIENTS: list[Any] = []


def _client(gw: dict[str, Any], key: str = TOKEN) -> Any:
    client = openai.OpenAI(base_url=gw["v1"], api_key=key, max_retries=0)
    CLIENTS.append(client)  # closed after each test (no sockets left to the garbage collector)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while CLIENTS:
        CLIENTS.pop().close()


def test_bearer_auth_is_mandatory(fake_gw: dict[str, Any]) -> None:
    r = requests.get(fake_gw["v1"] + "/models", timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        _client(fake_gw, "sk-wrong").models.list()
    with pytest.raises(openai.AuthenticationError):
        _client(fake_gw, "sk-wrong").completions.create(
            model=fake_gw["job"], prompt=[5, 6], max_tokens=2
        )


def test_models_are_the_tokens_jobs(fake_gw: dict[str, Any]) -> None:
    assert [m.id for m in _client(fake_gw).models.list()] == [fake_gw["job"]]
    assert [m.id for m in _client(fake_gw, OTHER).models.list()] == [fake_gw["other"]]
    with pytest.raises(openai.NotFoundError) as err:  # another token's job does not exist
        _client(fake_gw, OTHER).completions.create(
            model=fake_gw["job"], prompt=[5, 6, 7], max_tokens=2
        )
    assert err.value.body["code"] == "model_not_found"
    by_name = _client(fake_gw).completions.create(model="fake-model", prompt=[5], max_tokens=2)
    assert by_name.model == "fake-model" and len(by_name.choices[0].model_extra["token_ids"]) == 2


def test_completions_token_ids_strings_batched_n(fake_gw: dict[str, Any]) -> None:
    client = _client(fake_gw)
    out = client.completions.create(
        model=fake_gw["job"],
        prompt=[[5, 6, 7], [8, 9]],
        max_tokens=5,
        n=2,
        seed=3,
        logprobs=0,
        extra_body={"return_token_ids": True, "some_unknown_field": {"x": 1}},
    )
    assert len(out.choices) == 4
    assert [c.model_extra["prompt_token_ids"] for c in out.choices] == [[5, 6, 7]] * 2 + [
        [8, 9]
    ] * 2
    for c in out.choices:
        ids = c.model_extra["token_ids"]
        assert len(ids) == 5 and c.finish_reason == "length"
        assert c.text == tokenizer.decode(ids) and len(c.logprobs.token_logprobs) == 5
    assert out.choices[0].model_extra["token_ids"] != out.choices[1].model_extra["token_ids"]
    assert out.model_extra["weight_version"] == 0
    # seeded: the same request answers the same tokens (the fake numerics are exact)
    again = client.completions.create(
        model=fake_gw["job"], prompt=[[5, 6, 7], [8, 9]], max_tokens=5, n=2, seed=3
    )
    assert [c.model_extra["token_ids"] for c in again.choices] == [
        c.model_extra["token_ids"] for c in out.choices
    ]
    text = client.completions.create(
        model=fake_gw["job"], prompt=["Hello", "Hi there"], max_tokens=4, seed=1
    )
    assert [c.model_extra["prompt_token_ids"] for c in text.choices] == [
        tokenizer.encode("Hello"),
        tokenizer.encode("Hi there"),
    ]
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=fake_gw["job"], prompt="x", max_tokens=0)


def test_chat_and_multi_turn(fake_gw: dict[str, Any]) -> None:
    client = _client(fake_gw)
    chat = client.chat.completions.create(
        model=fake_gw["job"],
        messages=MESSAGES,
        max_completion_tokens=6,
        seed=2,
        n=2,
        logprobs=True,
        extra_body={"return_token_ids": True, "top_k": 20},
    )
    assert len(chat.choices) == 2
    choice = chat.choices[0]
    ids = choice.model_extra["token_ids"]
    assert len(ids) == 6 and tokenizer.decode(ids) == choice.message.content
    assert len(choice.logprobs.content) == 6
    prompt = chat.model_extra["prompt_token_ids"]
    assert tokenizer.decode(prompt).startswith("<|im_start|>user\nSay something.<|im_end|>")
    turn = turn_from_response(chat)
    msgs2 = [
        *MESSAGES,
        {"role": "assistant", "content": choice.message.content},
        {"role": "user", "content": "more"},
    ]
    chat2 = client.chat.completions.create(model=fake_gw["job"], messages=msgs2, max_tokens=3)
    flat = flatten_turns([turn, turn_from_response(chat2)], warn=False)
    assert flat.num_turns == 2


def test_stop_and_penalties(fake_gw: dict[str, Any]) -> None:
    client = _client(fake_gw)
    full = client.completions.create(model=fake_gw["job"], prompt=[5, 6], max_tokens=24, seed=9)
    text = full.choices[0].text
    stop = next((ch for ch in text[2:] if ch.strip()), None)
    if stop is not None:
        cut = client.completions.create(
            model=fake_gw["job"], prompt=[5, 6], max_tokens=24, seed=9, stop=[stop]
        )
        assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].text
    pen = client.completions.create(
        model=fake_gw["job"],
        prompt=[5, 6],
        max_tokens=4,
        presence_penalty=0.5,
        frequency_penalty=0.1,
        extra_body={"repetition_penalty": 1.1},
    )
    assert len(pen.choices[0].model_extra["token_ids"]) == 4


def test_streaming_openai_client(fake_gw: dict[str, Any]) -> None:
    n = 32
    stream = _client(fake_gw).chat.completions.create(
        model=fake_gw["job"],
        messages=MESSAGES,
        max_tokens=n,
        seed=4,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"arctic_timing": True, "ignore_eos": True},
    )
    arrivals: dict[int, list[float]] = {0: [], 1: []}
    ids: dict[int, list[int]] = {0: [], 1: []}
    text = {0: "", 1: ""}
    last_generated = 0.0
    usage = None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        ch = chunk.choices[0]
        text[ch.index] += ch.delta.content or ""
        if ch.model_extra.get("token_ids"):
            arrivals[ch.index].append(time.time())
            ids[ch.index] += ch.model_extra["token_ids"]
            last_generated = max(last_generated, chunk.model_extra["arctic_generated_at"])
    assert usage is not None and usage.completion_tokens == 2 * n
    for k in (0, 1):
        assert len(ids[k]) == n and len(arrivals[k]) >= n / 4
        assert text[k] == tokenizer.decode(ids[k])
    assert min(arrivals[0][0], arrivals[1][0]) < last_generated  # before the last token existed


def test_async_client_completions_stream(fake_gw: dict[str, Any]) -> None:
    import asyncio

    async def go() -> list[int]:
        client = openai.AsyncOpenAI(base_url=fake_gw["v1"], api_key=TOKEN, max_retries=0)
        out: list[int] = []
        async for c in await client.completions.create(
            model=fake_gw["job"], prompt="Hi", max_tokens=9, stream=True, seed=5
        ):
            if c.choices:
                out += c.choices[0].model_extra.get("token_ids") or []
        await client.close()
        return out

    streamed = asyncio.run(go())
    assert len(streamed) == 9


def test_sampling_backpressure_429_with_retry_after(fake_gw: dict[str, Any]) -> None:
    """Two long streams hold the job's two sampling slots: a completion past the bound is 429
    `rate_limited` with Retry-After (the openai client's RateLimitError); with its retries on,
    the client waits it out and the same completion succeeds once a stream has ended."""
    import asyncio

    async def go() -> tuple[Any, Any]:
        strict = openai.AsyncOpenAI(base_url=fake_gw["v1"], api_key=TOKEN, max_retries=0)
        patient = openai.AsyncOpenAI(base_url=fake_gw["v1"], api_key=TOKEN, max_retries=5)
        started = [asyncio.Event(), asyncio.Event()]

        async def long_stream(k: int) -> int:
            n = 0
            stream = await strict.completions.create(
                model=fake_gw["job"], prompt="Hi", max_tokens=64, stream=True, seed=k,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            async for c in stream:
                n += len((c.choices[0].model_extra.get("token_ids") or []) if c.choices else [])
                started[k].set()
            return n

        streams = [asyncio.create_task(long_stream(k)) for k in (0, 1)]
        await asyncio.gather(*(e.wait() for e in started))
        try:
            await strict.completions.create(model=fake_gw["job"], prompt="Hi", max_tokens=2)
            refused: Any = None
        except openai.RateLimitError as exc:
            refused = exc
        waited = await patient.completions.create(model=fake_gw["job"], prompt="Hi", max_tokens=2)
        assert await asyncio.gather(*streams) == [64, 64]
        await strict.close()
        await patient.close()
        return refused, waited

    refused, waited = asyncio.run(go())
    assert refused is not None, "a completion past the bound was admitted"
    assert refused.status_code == 429 and refused.response.headers["retry-after"] == "1"
    assert refused.body["code"] == "rate_limited"
    assert "max_sampling_requests_per_job" in refused.body["message"]
    assert len(waited.choices[0].model_extra["token_ids"]) == 2
    caps = requests.get(fake_gw["prefix"] + "/capabilities", timeout=10).json()
    assert caps["limits"]["max_sampling_requests_per_job"] == SAMPLING_BOUND


def test_tool_calls_and_sessions_through_the_gateway(fake_gw: dict[str, Any]) -> None:
    """The gateway's routes (fake workers): a forced call valid under the tool's schema, whole
    and streamed (a fake worker's stream of a constrained sample is generated whole, then sent:
    a continuation would restart the constraint), and a session's second turn holding the first
    turn's sampled ids verbatim; another token cannot read the session."""
    import json

    pytest.importorskip("vllm")
    jsonschema = pytest.importorskip("jsonschema")
    tool = {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["a"],
            },
        },
    }
    client = _client(fake_gw)
    kw: dict[str, Any] = {"model": fake_gw["job"], "messages": MESSAGES, "tools": [tool]}
    first = client.chat.completions.create(
        **kw, tool_choice="required", parallel_tool_calls=False, max_tokens=80, seed=1,
        extra_body={"session_id": "gw-1"},
    )  # fmt: skip
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    args = ""
    for chunk in client.chat.completions.create(
        **kw, tool_choice="required", parallel_tool_calls=False, max_tokens=80, seed=2,
        stream=True,
    ):  # fmt: skip
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            args += (d.function.arguments or "") if d.function else ""
    jsonschema.validate(json.loads(args), tool["function"]["parameters"])
    msgs = [
        *MESSAGES,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "3"},
    ]
    second = client.chat.completions.create(
        model=fake_gw["job"], messages=msgs, tools=[tool], tool_choice="none", max_tokens=4,
        seed=1, extra_body={"session_id": "gw-1"},
    )  # fmt: skip
    head = first.model_extra["prompt_token_ids"] + first.choices[0].model_extra["token_ids"]
    assert second.model_extra["prompt_token_ids"][: len(head)] == head
    own = requests.get(
        fake_gw["v1"] + "/sessions/gw-1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert own.status_code == 200 and len(own.json()["turns"]) == 2
    theirs = requests.get(
        fake_gw["v1"] + "/sessions/gw-1", headers={"Authorization": f"Bearer {OTHER}"}, timeout=10
    )
    assert theirs.status_code == 404


# LiteLLM's own imports warn (pydantic ReadOnly TypedDicts, deprecations): not ours to fix
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_litellm(fake_gw: dict[str, Any]) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
    litellm = pytest.importorskip("litellm")
    resp = litellm.completion(
        model=f"hosted_vllm/{fake_gw['job']}",
        api_base=fake_gw["v1"],
        api_key=TOKEN,
        messages=MESSAGES,
        max_tokens=5,
        logprobs=True,
        seed=8,
        extra_body={"return_token_ids": True},
    )
    choice = resp.choices[0]
    assert choice.provider_specific_fields.get("token_ids")
    assert getattr(resp, "prompt_token_ids", None)
    pieces = [
        c.choices[0].delta.content or ""
        for c in litellm.completion(
            model=f"hosted_vllm/{fake_gw['job']}",
            api_base=fake_gw["v1"],
            api_key=TOKEN,
            messages=MESSAGES,
            max_tokens=16,
            seed=8,
            stream=True,
        )
        if c.choices
    ]
    assert len([p for p in pieces if p]) >= 16 / 4
    with pytest.raises(litellm.exceptions.AuthenticationError):
        litellm.completion(
            model=f"hosted_vllm/{fake_gw['job']}",
            api_base=fake_gw["v1"],
            api_key="sk-wrong",
            messages=MESSAGES,
            max_tokens=2,
        )


# ---------------------------------------------------------------------- real engines (vLLM)

VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def real_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not VLLM:
        pytest.skip("vLLM is not installed (`import vllm` fails): no real sampler to start")
    python = os.environ.get("ARCTIC_ENGINES_PYTHON") or sys.executable
    g = Gateway(
        Path(tmp_path_factory.mktemp("gw-openai-real")),
        args=("--engine", "onprem", "--worker-python", python, "--worker-threads", "1"),
    )
    g.start(timeout=120)
    try:
        c = Client(g.prefix_url, token=TOKEN, timeout=300)
        job = c.create_job({"job_type": "sampling", "model_name": "tiny"})
        c.wait_job(job, timeout=600)
        yield {"v1": g.base_url + "/v1", "base": g.base_url, "job": job, "client": c}
        c.call(M.CANCEL_JOB, job_id=job)
        c.s.close()
    finally:
        g.cleanup()


@pytest.mark.slow
def test_real_sampler_text_chat_stream(real_gw: dict[str, Any]) -> None:
    client = _client(real_gw)
    assert [m.id for m in client.models.list()] == [real_gw["job"]]
    chat = client.chat.completions.create(
        model=real_gw["job"],
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=6,
        seed=1,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    ids = chat.choices[0].model_extra["token_ids"]
    assert 0 < len(ids) <= 6 and len(chat.choices[0].logprobs.content) == len(ids)
    assert "<|im_start|>" not in (chat.choices[0].message.content or "")
    comp = client.completions.create(
        model=real_gw["job"], prompt=["Once upon", "a time"], max_tokens=3, n=2, seed=2
    )
    assert len(comp.choices) == 4


@pytest.mark.slow
def test_real_sampler_streams_token_by_token(real_gw: dict[str, Any]) -> None:
    n = 32
    stream = _client(real_gw).completions.create(
        model=real_gw["job"],
        prompt="Count: one two",
        max_tokens=n,
        n=2,
        seed=3,
        stream=True,
        extra_body={"ignore_eos": True, "arctic_timing": True, "min_tokens": 8,
                    "presence_penalty": 0.3},
    )  # fmt: skip
    arrivals: dict[int, list[float]] = {0: [], 1: []}
    ids: dict[int, list[int]] = {0: [], 1: []}
    made: dict[int, list[float]] = {0: [], 1: []}  # when each chunk's last token was generated
    for c in stream:
        for ch in c.choices:
            if ch.model_extra.get("token_ids"):
                arrivals[ch.index].append(time.time())
                ids[ch.index] += ch.model_extra["token_ids"]
                made[ch.index].append(c.model_extra["arctic_generated_at"])
    generated = made[0] + made[1]
    for k in (0, 1):
        # Incremental, not one chunk at the end: each choice arrives in several chunks, the
        # first before its last token existed. Not one chunk per token: a client that falls
        # behind the engine gets what piled up as one chunk (`merge_stream`), so the count
        # depends on the machine (32 tokens came in 10-16 chunks on a fast 2-core one).
        assert len(ids[k]) == n and len(arrivals[k]) >= 4
        assert arrivals[k][0] < made[k][-1]
        assert made[k] == sorted(made[k])
    assert ids[0] != ids[1]
    first = min(arrivals[0][0], arrivals[1][0])
    assert first < max(generated)  # the first chunk arrived before the last token existed
    print(
        f"gateway stream: max_tokens {n} x 2, chunks {len(arrivals[0])} + {len(arrivals[1])}; "
        f"first chunk received {max(generated) - first:.3f} s before the last token was generated"
    )


def _tail(real_gw: dict[str, Any]) -> list[str]:
    c, lines = real_gw["client"], []
    while True:
        body = {
            "operation_type": "tail-logs",
            "sub_job_type": "sampling",
            "payload": {"cursor": len(lines), "limit": 1000},
        }
        page = c.result(real_gw["job"], c.call(M.OPERATION, body, job_id=real_gw["job"]))
        page = page.get("result", page)
        lines += page["entries"]
        if page["eof"] or not page["entries"]:
            return lines


@pytest.mark.slow
def test_real_sampler_disconnect_aborts(real_gw: dict[str, Any]) -> None:
    got, line = leave_stream_and_wait_abort(
        real_gw["v1"], real_gw["job"], TOKEN, lambda: _tail(real_gw)
    )
    print(f"gateway: client left after {got} chunks; {line}")


@pytest.mark.slow
def test_real_sampler_serves_concurrent_calls_in_one_batch(real_gw: dict[str, Any]) -> None:
    """Protocol generates (the SDK through the gateway's request queue) and OpenAI completions,
    whole and streamed, sent at once share the vLLM engine's batch in the gateway's worker: its
    busy-period line shows them in the engine together (engine steps, not timing)."""
    import asyncio
    import re

    from arctic_sdk import AsyncClient
    from arctic_servers.engines.vllm.engine_batch import IDLE_MARK

    tokens, job = 96, real_gw["job"]
    busy = re.compile(IDLE_MARK + r" (\d+) calls .* in (\d+) engine steps, .* at most (\d+) ")

    async def go() -> None:
        oai = openai.AsyncOpenAI(base_url=real_gw["v1"], api_key=TOKEN, max_retries=0)
        extra = {"ignore_eos": True}

        async def stream() -> int:
            n = 0
            s = await oai.completions.create(
                model=job, prompt="Once", max_tokens=tokens, stream=True, extra_body=extra
            )
            async for c in s:
                ids = c.choices[0].model_extra.get("token_ids") if c.choices else None
                if ids:
                    n += len(ids)
                    versions.add(int(c.model_extra["weight_version"]))  # each token chunk's
            return n

        versions: set[int] = set()

        await oai.completions.create(model=job, prompt="Hi", max_tokens=1)  # loads the tokenizer
        async with AsyncClient(real_gw["base"], token=TOKEN, job_id=job, timeout=300) as client:
            sp = {"max_tokens": tokens, "ignore_eos": True}
            out = await asyncio.gather(
                *(client.generate(prompts=[[5 + i, 6, 7]], sampling_params=sp) for i in range(4)),
                *(
                    oai.completions.create(
                        model=job, prompt=f"Say {i}", max_tokens=tokens, extra_body=extra
                    )
                    for i in range(4)
                ),
                stream(),
                stream(),
            )
        await oai.close()
        assert all(len(g["results"][0]["samples"][0]["token_ids"]) == tokens for g in out[:4])
        assert all(len(c.choices[0].model_extra["token_ids"]) == tokens for c in out[4:8])
        assert out[8:] == [tokens, tokens]
        assert versions == {int(out[0]["weight_version"])}  # the weights of the streams' tokens

    seen = len(_tail(real_gw))
    asyncio.run(go())
    periods = [tuple(int(x) for x in m.groups()) for ln in _tail(real_gw)[seen:]
               if (m := busy.search(ln))]  # fmt: skip
    print(f"gateway busy periods (calls, steps, peak): {periods}")
    assert sum(p[0] for p in periods) >= 10  # the ten calls (and the warm-up one)
    assert max(p[2] for p in periods) >= 5  # one after another: never more than 1
    assert sum(p[1] for p in periods) <= 4 * tokens + 1  # one after another: 10 * tokens


def test_the_protocols_field_rules_answer_in_openais_shape(fake_gw: dict[str, Any]) -> None:
    """The routes call the gateway's core in process: a value the arctic.v1 field rules refuse
    (`SamplingParams.top_k` >= -1, `top_p` in (0, 1]) is refused by the core before anything
    runs, as OpenAI's 400 naming the request's field, its value and what was expected; a stream
    too, before any event is sent (a plain error reply, not a broken event stream)."""
    client = _client(fake_gw)
    cases = [(f, v, e, st) for f, v, e in (("top_k", -5, ">= -1"), ("top_p", 1.5, "(0, 1]"))
             for st in (False, True)]  # fmt: skip
    for field, value, expected, stream in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(
                model=fake_gw["job"],
                prompt="Hi",
                max_tokens=2,
                stream=stream,
                extra_body={field: value},
            )
        err = info.value
        assert err.status_code == 400 and err.param == field, (field, err.body)
        assert err.body["code"] == "invalid_argument"
        assert err.body["type"] == "invalid_request_error"
        assert str(value) in err.message and expected in err.message, err.message
