"""Sampling scenarios of the unmodified `tinker` 0.38 client (issue 31), run in a child process
as `python -m tests.tinker.scenarios_sampling NAME URL` (see `scenarios.py`): inflight
samplers, greedy samples, Tinker 0.38's sampling extras, a sampler of a base model alone,
tokenizers by the server's model names and the models the server lists."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import requests
import tinker
from tinker import types

from .scenarios import API_KEY, BASE_MODEL, _datum, _rest, _service

PROMPT = [5, 6, 7, 8, 9, 10]


def _version(server: str, sequence_id: str) -> int:
    r = requests.get(
        f"{server}/api/v1/sequences/{sequence_id}", headers={"X-API-Key": API_KEY}, timeout=30
    )
    assert r.status_code == 200, r.text
    return int(r.json()["weight_version"])


def _train(tc: tinker.TrainingClient) -> None:
    tc.forward_backward([_datum([5, 6, 7, 8, 9, 10])], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()


def scenario_inflight_sampler_follows_new_weights(server: str) -> dict:
    """kind="inflight": a sampling client that keeps sampling after newer weights are
    published, on them, each sample's version on record (issue 31 item 2); a snapshot client
    of the same model is refused once the weights moved (409)."""
    params = types.SamplingParams(max_tokens=3, seed=4)
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        # tinker 0.38 answers a future here: .result() so each publish has happened before
        # the next sample (the un-awaited publish raced the sample: CI saw (2, [2, 2]))
        inflight = tc.save_weights_and_get_sampling_client(kind="inflight").result()
        snapshot = tc.save_weights_and_get_sampling_client().result()
        first = inflight.sample(types.ModelInput.from_ints(PROMPT), 1, params).result()
        v0 = _version(server, first.sequences[0].sequence_id)
        _train(tc)
        tc.save_weights_and_get_sampling_client(kind="inflight").result()  # publishes them
        after = inflight.sample(types.ModelInput.from_ints(PROMPT), 2, params).result()
        v1 = [_version(server, s.sequence_id) for s in after.sequences]
        assert all(v > v0 for v in v1), (v0, v1)
        with pytest.raises(tinker.RequestFailedError, match="weight version"):
            snapshot.sample(types.ModelInput.from_ints(PROMPT), 1, params).result()
    return {"v0": v0, "v1": v1}


def scenario_greedy_samples(server: str) -> dict:
    """temperature 0 with num_samples > 1: n copies of the one greedy sample (issue 31
    item 6; vLLM refuses n > 1 without randomness)."""
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        sc = tc.save_weights_and_get_sampling_client()
        res = sc.sample(
            types.ModelInput.from_ints(PROMPT), 3, types.SamplingParams(max_tokens=5, temperature=0)
        ).result()
        toks = [list(s.tokens) for s in res.sequences]
        assert len(toks) == 3 and toks[0] == toks[1] == toks[2] and toks[0], toks
        assert len({s.sequence_id for s in res.sequences}) == 3
    return {"tokens": toks[0]}


def scenario_sampling_extras(server: str) -> dict:
    """Tinker 0.38's sampling extras: topk_sample_logprobs, topk_prompt_logprobs,
    prompt_logprobs_last_n, stop=[] (no stop, EOS included), per-sequence sequence_id; the
    ones this server cannot compute refused by name."""
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        sc = tc.save_weights_and_get_sampling_client()
        prompt = types.ModelInput.from_ints(PROMPT)
        res = sc.sample(
            prompt,
            2,
            types.SamplingParams(max_tokens=4, seed=2),
            include_prompt_logprobs=True,
            topk_prompt_logprobs=3,
            topk_sample_logprobs=2,
            prompt_logprobs_last_n=2,
        ).result()
        for s in res.sequences:
            assert s.sequence_id and s.topk_logprobs is not None
            assert len(s.topk_logprobs) == len(s.tokens)
            for row, lp in zip(s.topk_logprobs, s.logprobs or [], strict=True):
                assert row is not None and len(row) == 2
                assert row[0][1] >= row[1][1] and row[0][1] >= lp - 1e-4
        assert len({s.sequence_id for s in res.sequences}) == 2
        plp = res.prompt_logprobs
        assert plp is not None and len(plp) == len(PROMPT)
        assert plp[: len(PROMPT) - 2] == [None] * (len(PROMPT) - 2)
        assert all(v is not None for v in plp[-2:])
        top = res.topk_prompt_logprobs
        assert top is not None and top[0] is None and top[-1] is not None and len(top[-1]) == 3
        full = sc.compute_logprobs(prompt).result()
        np.testing.assert_allclose(plp[-2:], full[-2:], rtol=1e-5)
        free = sc.sample(prompt, 1, types.SamplingParams(max_tokens=6, seed=1, stop=[])).result()
        assert len(free.sequences[0].tokens) == 6 and free.sequences[0].stop_reason == "length"
        for kw, field in (
            ({"prompt_alt_tokens_k": 2}, "prompt_alt_tokens_k"),
            (
                {
                    "target_prompt_logprobs": types.TensorData(
                        data=[1] * 5, dtype="int64", shape=[5, 1]
                    )
                },
                "target_prompt_logprobs",
            ),
        ):
            with pytest.raises(tinker.BadRequestError) as e:
                sc.sample(prompt, 1, types.SamplingParams(max_tokens=2), **kw).result()
            assert e.value.body["field"] == field, e.value.body
    return {"prompt_logprobs": plp}


def scenario_base_model_sampler(server: str) -> dict:
    """A sampling client of a base model alone (Harbor's Tinker backend opens one): it
    samples, and GET /samplers/{id} names the base model."""
    with _service(server) as svc:
        sc = svc.create_sampling_client(base_model=BASE_MODEL).result()
        assert sc.get_base_model() == BASE_MODEL
        res = sc.sample(
            types.ModelInput.from_ints(PROMPT), 2, types.SamplingParams(max_tokens=3, seed=5)
        ).result()
        assert len(res.sequences) == 2 and all(s.tokens for s in res.sequences)
        lps = sc.compute_logprobs(types.ModelInput.from_ints(PROMPT)).result()
        assert lps[0] is None and all(v is not None for v in lps[1:])
    return {"tokens": [list(s.tokens) for s in res.sequences]}


def scenario_models_and_tokenizer(server: str) -> dict:
    """The server lists the models its engines serve with their real windows (issue 31 items
    4 and 10) and a Tinker client gets a model's tokenizer by the server's name through
    HF_ENDPOINT=<server>/hf (item 7): TrainingClient / SamplingClient.get_tokenizer() and the
    cookbook's tokenizer_utils.get_tokenizer(name)."""
    with _rest(server) as rc:
        caps = rc.get_server_capabilities().result()
    listed = {m.model_name: m.max_context_length for m in caps.supported_models}
    want = json.loads(os.environ["TINKER_TEST_WANT_MODELS"])
    assert listed == want, listed
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        assert tc.get_info().model_data.tokenizer_id == BASE_MODEL
        tok = tc.get_tokenizer()
        ids = tok.encode("hello tinker")
        sc = tc.save_weights_and_get_sampling_client()
        assert sc.get_tokenizer().encode("hello tinker") == ids
    out = {"ids": ids}
    try:
        from tinker_cookbook.tokenizer_utils import get_tokenizer
    except ImportError:
        return out
    assert get_tokenizer(BASE_MODEL).encode("hello tinker") == ids
    out["cookbook"] = True
    return out


def scenario_abandoned_sample_is_cancelled(server: str) -> dict:
    """A sample future the SDK abandons (its task cancelled: the SDK sends cancel_future, the
    server's dynamic config enables it), then one still running when the ServiceClient closes
    (the session's end cancels it). The test gives the fake's generate a 30 s latency and checks
    the server side: both generates cancelled, neither ran."""
    import asyncio
    import contextlib
    import time

    prompt = types.ModelInput.from_ints(PROMPT)
    params = types.SamplingParams(max_tokens=3, seed=5)
    with _service(server) as svc:
        sc = svc.create_sampling_client(base_model=BASE_MODEL).result()

        async def abandon() -> float:
            task = asyncio.ensure_future(sc.sample_async(prompt, 1, params))
            await asyncio.sleep(1.5)
            assert not task.done(), "the sample ended before it could be abandoned"
            t0 = time.monotonic()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return time.monotonic() - t0

        left = asyncio.run(abandon())
        time.sleep(1.0)  # the SDK's cancel drain sends cancel_future in the background
        left_running = sc.sample(prompt, 1, params)
        time.sleep(1.0)
        running_at_close = not left_running.done()
    return {"left_s": left, "running_at_close": running_at_close}


if __name__ == "__main__":
    name, url = sys.argv[1], sys.argv[2]
    result = globals()["scenario_" + name](url) or {}
    print("RESULT " + json.dumps(result, default=float))
