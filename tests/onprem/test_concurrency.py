"""Concurrent sampling on the real vLLM sampler (issue 21), through the on-prem server.

- Every sampling path shares the engine's continuous batch: protocol generates (the SDK, its
  calls sequenced: the job is its own), OpenAI completions and chat completions, streamed or not,
  and `log-probs` / `forward` targeted at the sampler, all sent at once are served together —
  the worker's busy-period line (`engine batch: ...`, read with tail-logs) counts every one of
  them and shows them in the engine at once, in about as many engine steps as one call's tokens,
  not one call's steps after another's (no timing is asserted); the scores match those of the
  same rows scored alone (1e-4).
- A weight sync under concurrency: 12 generates, a sync-weights and 12 more generates submitted
  at once (sequenced). The sync waits for the first 12 (they report the old `weight_version`),
  the last 12 wait for the sync (the new one), and every sample equals the greedy reference of
  the version it reports — so none mixes the two versions' weights (the two references differ
  for every prompt, which a sample with tokens from both would not match). Four OpenAI streams
  go with them (unsequenced, so before or after the sync): every token chunk of a stream names
  the same `weight_version`, and the stream's tokens are that version's greedy reference.

One job of its own (a trainer with a high learning rate, so one step changes greedy outputs).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
import pytest

from arctic_servers.engines.vllm.engine_batch import IDLE_MARK

from .conftest import ServerInfo
from .helpers import sft_body

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

JOB = {
    "sub_job_configs": [
        {
            "job_type": "training",
            "dtype": "float32",
            "training_config": {
                "zero_stage": 1,
                "optimizer": {"name": "adamw", "lr": 2e-2, "weight_decay": 0.0},
            },
        },
        {"job_type": "sampling", "dtype": "float32"},
    ],
    "experiment_name": "onprem-concurrency",
}
TOKENS = 48
GREEDY = {"max_tokens": TOKENS, "ignore_eos": True, "temperature": 0.0}
BURST = 128  # tokens per call of the 12-call burst: long enough that arrival spread is small
PROMPTS = [[11 + 7 * i, 23, 5 + i, 42, 77 + i] for i in range(6)]
BUSY = re.compile(
    IDLE_MARK + r" (\d+) calls \((\d+) requests\) in (\d+) engine steps, .* at most (\d+) requests"
)


async def _settled_log_length(client: Any, quiet_s: float = 1.0, limit_s: float = 60.0) -> int:
    """The sampler log's length once it has not grown for `quiet_s` (the worker writes a busy
    period's line after the period's last answer has gone out)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    n = len(await _logs(client))
    while loop.time() < end:
        await asyncio.sleep(quiet_s)
        m = len(await _logs(client))
        if m == n:
            return n
        n = m
    return n


async def _logs(client: Any) -> list[str]:
    lines: list[str] = []
    while True:
        res = await client.operation(
            operation_type="tail-logs",
            sub_job_type="sampling",
            payload={"cursor": len(lines), "limit": 1000},
        )
        page = res["result"]
        lines += [str(e) for e in page["entries"]]
        if page["eof"] or not page["entries"]:
            return lines


def _busy_periods(lines: list[str]) -> list[tuple[int, int, int, int]]:
    """(calls, requests, engine steps, most requests at once) of each busy period."""
    out = []
    for ln in lines:
        m = BUSY.search(ln)
        if m:
            calls, requests, steps, peak = (int(g) for g in m.groups())
            out.append((calls, requests, steps, peak))
    return out


def _tokens(gen: Any) -> list[list[int]]:
    return [list(r["samples"][0]["token_ids"]) for r in gen["results"]]


async def _stream_versions(oai: Any, job: str, prompt: list[int]) -> tuple[list[int], list[int]]:
    """A greedy OpenAI stream of `prompt`: the `weight_version` of each token chunk, the tokens."""
    versions: list[int] = []
    tokens: list[int] = []
    s = await oai.completions.create(
        model=job, prompt=prompt, max_tokens=TOKENS, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    async for c in s:
        ids = c.choices[0].model_extra.get("token_ids") if c.choices else None
        if ids:
            tokens += ids
            versions.append(int(c.model_extra["weight_version"]))
    return versions, tokens


SCORE = {"input_ids": [[3, 14, 15, 92, 65, 35, 89, 79]], "attention_mask": [[1] * 8]}


async def _every_path_at_once(client: Any, oai: Any, job: str, scored: Any) -> None:
    from arctic_sdk import CallOptions

    extra = {"ignore_eos": True}
    at_sampler = CallOptions(sub_job_id=f"{job}:sampling:0")

    async def stream() -> int:
        n = 0
        s = await oai.completions.create(
            model=job, prompt="Once", max_tokens=BURST, temperature=0, stream=True,
            extra_body=extra,
        )  # fmt: skip
        async for c in s:
            if c.choices:
                n += len(c.choices[0].model_extra.get("token_ids") or [])
        return n

    calls = [
        *(
            client.generate(prompts=[p], sampling_params={**GREEDY, "max_tokens": BURST})
            for p in PROMPTS[:4]
        ),
        *(
            oai.completions.create(
                model=job, prompt=p, max_tokens=BURST, temperature=0, extra_body=extra
            )
            for p in PROMPTS[:4]
        ),
        *(
            oai.chat.completions.create(
                model=job,
                messages=[{"role": "user", "content": f"Hi {i}"}],
                max_tokens=BURST,
                temperature=0,
                extra_body=extra,
            )
            for i in range(2)
        ),
        stream(),
        stream(),
        client.log_probs(**SCORE, options=at_sampler),
        client.forward({"kwargs": SCORE}, options=at_sampler),
    ]
    out = await asyncio.gather(*calls)
    assert all(len(t) == BURST for g in out[:4] for t in _tokens(g))
    assert all(len(c.choices[0].model_extra["token_ids"]) == BURST for c in out[4:10])
    assert out[10:12] == [BURST, BURST]
    for res in out[12:]:  # scored inside the batch: the log-probs of the rows scored alone
        got = np.asarray(res["outputs"]["logprobs_shifted"])
        np.testing.assert_allclose(got, scored, atol=1e-4)  # fp32: the batch may move last bits


async def test_every_path_shares_the_batch_and_a_sync_never_mixes_versions(
    onprem: ServerInfo,
) -> None:
    from arctic_sdk import AsyncClient, CallOptions

    async with AsyncClient(onprem.base_url, timeout=600) as client:
        await client.create_job(**JOB)
        try:
            await client.wait_until_running(timeout=600)
            job = str(client.job_id)
            oai = openai.AsyncOpenAI(
                base_url=onprem.base_url + "/v1", api_key="none", max_retries=0
            )
            # warm: the first OpenAI call of a model loads its tokenizer in the server
            await client.generate(prompts=PROMPTS[:1], sampling_params=GREEDY)
            await oai.completions.create(model=job, prompt="Hi", max_tokens=1)
            alone = await client.log_probs(
                **SCORE, options=CallOptions(sub_job_id=f"{job}:sampling:0")
            )
            scored = np.asarray(alone["outputs"]["logprobs_shifted"])
            assert scored.shape == (1, 8) and (scored[0, :7] < 0).all()
            # the warm-up calls' busy-period lines reach the log after their answers: wait for
            # them, so that they are not counted with the 14 calls below
            seen = await _settled_log_length(client)

            # 1. protocol, OpenAI completions, chat, streams, sampler scoring: 14 calls at once
            await _every_path_at_once(client, oai, job, scored)
            periods = _busy_periods((await _logs(client))[seen:])
            print(f"busy periods (calls, requests, steps, peak): {periods}")
            assert sum(p[0] for p in periods) == 14  # scoring too goes through the batch
            assert max(p[3] for p in periods) >= 6  # one after another: never more than 1
            assert sum(p[2] for p in periods) <= 4 * BURST  # one after another: 12 * BURST

            # 2. a sync between two runs of concurrent generates
            ref0 = await client.generate(prompts=PROMPTS, sampling_params=GREEDY)
            await client.forward_backward(sft_body())
            await client.step()
            one = [[p] for p in PROMPTS] * 2
            got = await asyncio.gather(
                *(client.generate(prompts=p, sampling_params=GREEDY) for p in one),
                *(_stream_versions(oai, job, p) for p in PROMPTS[:2]),
                client.sync_weights(),
                *(_stream_versions(oai, job, p) for p in PROMPTS[2:4]),
                *(client.generate(prompts=p, sampling_params=GREEDY) for p in one),
            )
            before, sync, after = got[:12], got[14], got[17:]
            streams = [*got[12:14], *got[15:17]]  # of PROMPTS[0], [1] and [2], [3]
            ref1 = await client.generate(prompts=PROMPTS, sampling_params=GREEDY)
        finally:
            await oai.close()
            await client.cancel_job()
    v0 = int(ref0["weight_version"])
    assert int(sync["weight_version"]) == int(ref1["weight_version"]) == v0 + 1
    t0, t1 = _tokens(ref0), _tokens(ref1)
    assert all(a != b for a, b in zip(t0, t1, strict=True)), "the step did not change outputs"
    for results, version, ref in ((before, v0, t0), (after, v0 + 1, t1)):
        for i, r in enumerate(results):
            assert int(r["weight_version"]) == version
            assert _tokens(r) == [ref[i % len(PROMPTS)]], (version, i)
    # OpenAI streams (unsequenced: before or after the sync): every token chunk of a stream names
    # one version, and the stream's tokens are that version's greedy reference
    for i, (versions, tokens) in enumerate(streams):
        assert versions and len(set(versions)) == 1, (i, versions)
        version = versions[0]
        assert version in (v0, v0 + 1), (i, version)
        assert tokens == (t0 if version == v0 else t1)[i], (i, version)
