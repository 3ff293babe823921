"""`min_p` and `include_stop_str_in_output` on the fake (NUMERICS.md §5), over HTTP."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M
from arctic_servers.engines.fake import numerics as nx
from arctic_servers.engines.fake import tokenizer

from .raw import Http


def gen(prompts: list[Any], **sp: Any) -> dict[str, Any]:
    return {"prompts": prompts, "sampling_params": sp}


def _allowed(prompt: list[int], tokens: list[int], step: int, min_p: float) -> bool:
    """Every token is at least min_p times as likely as the best printable one (§2 log-probs)."""
    prev = prompt[-1]
    for j, t in enumerate(tokens):
        lps = nx.token_logprob(np.asarray(nx.PRINTABLE_IDS), len(prompt) + j, prev, step)
        if nx.token_logprob(t, len(prompt) + j, prev, step) < lps.max() + math.log(min_p):
            return False
        prev = t
    return True


async def test_min_p_samples_only_likely_tokens(http: Http, job: str) -> None:
    p = [40, 41, 42]
    plain = await http.run(M.GENERATE, job, gen([p], n=4, max_tokens=24, seed=3, min_p=0.0))
    off = [s["token_ids"] for s in plain["results"][0]["samples"]]
    assert off == [nx.token_stream(3, k, 0, p, 24) for k in range(4)]  # 0 = off, the plain stream
    assert not all(_allowed(p, t, 0, 0.5) for t in off)  # the plain stream breaks the rule
    res = await http.run(
        M.GENERATE, job, gen([p], n=4, max_tokens=24, seed=3, min_p=0.5, logprobs=0)
    )
    for s in res["results"][0]["samples"]:
        assert _allowed(p, s["token_ids"], 0, 0.5)
        assert s["token_ids"] != nx.token_stream(3, 0, 0, p, 24)
    best = await http.run(M.GENERATE, job, gen([p], n=3, max_tokens=8, seed=9, min_p=1.0))
    samples = best["results"][0]["samples"]
    assert samples[0]["token_ids"] == samples[1]["token_ids"] == samples[2]["token_ids"]
    assert _allowed(p, samples[0]["token_ids"], 0, 1.0)  # always the most likely id


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "x", True])
async def test_min_p_out_of_range_is_refused(http: Http, job: str, bad: Any) -> None:
    resp = await http.dss(M.GENERATE, job, gen(["hi"], min_p=bad))
    assert resp.status == 400 and resp.code == "invalid_argument", resp.data
    assert resp.error["details"].get("field") == "sampling_params.min_p"


async def test_include_stop_str_in_output(http: Http, job: str) -> None:
    p = tokenizer.encode("x")
    stream = nx.token_stream(7, 0, 0, p, 40)
    text = tokenizer.decode(stream)
    stop = text[10:12]
    cut = text.find(stop)
    body = gen(["x"], seed=7, max_tokens=40, stop=[stop])
    off = (await http.run(M.GENERATE, job, body))["results"][0]["samples"][0]
    body["sampling_params"]["include_stop_str_in_output"] = True
    on = (await http.run(M.GENERATE, job, body))["results"][0]["samples"][0]
    assert off["text"] == text[:cut] and on["text"] == text[: cut + len(stop)]
    assert on["text"].endswith(stop) and on["token_ids"] == off["token_ids"]
    assert on["stop_reason"] == off["stop_reason"] == stop
    tok = stream[5]
    body = gen(["x"], seed=7, max_tokens=40, stop_token_ids=[tok], include_stop_str_in_output=True)
    s = (await http.run(M.GENERATE, job, body))["results"][0]["samples"][0]
    assert s["token_ids"] == stream[:6] and s["text"] == tokenizer.decode(stream[:6])
