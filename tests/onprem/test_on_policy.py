"""On-policy log-probs: the trainer's `forward` and `log-probs` equal, bit for bit, the log-probs
`forward-backward` computes on the same call (`TrainingEngine._scored`, `DataParallelTrainer`'s
`_rank_logprobs`).

A client (verl's `compute_log_prob`, PROTOCOL.md's PPO recipe) takes its old log-probs from a
`forward` and sends them back with the first update; the update is on-policy (ratio exactly 1,
`ppo_kl == 0`) only if the two passes round alike. They do when they run the same passes: the
same rows per rank, the same columns (each rank's window of real tokens), the same micro-batches.
A float GEMM's result depends on its shape on many CPUs (Intel AMX, and here: one 8-row pass and
eight 1-row passes differ by ~3e-6), so a forward that ran the whole call in one pass missed by
an ulp on such kernels.

Checked on calls of 1 to 8 rows, right- and left-padded, with empty-ish rows, ragged lengths,
entropy and a temperature, on a one-rank trainer with micro-batches of 1 (verl's
`ppo_micro_batch_size_per_gpu`: one pass keeping the graph for a 1-row call, else one per row) and
on a two-rank ZeRO-3 trainer with micro-batches of 2 (per-rank windows, token-balanced rows, a
short last micro-batch). Before forward ran forward-backward's passes, both failed here (AMD EPYC,
AVX-512): "8 short rows" on one rank (2.9e-06: one 8-row pass vs eight 1-row passes; each case
stops at its first failing call), "3 rows, ragged" on two ranks (9.5e-07: the column windows).
The kernels differ by CPU: run this module under `ATEN_CPU_CAPABILITY=default`, `avx2` and
`avx512` too (bench/results/2026-12-06-on-policy.md records those runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M

from .conftest import ServerInfo, cancel_job, create_job
from .helpers import pad
from .raw import Http

pytestmark = pytest.mark.slow

TRAIN = {
    "zero_stage": 1,
    "gradient_clipping": 1.0,
    "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0},
}
# (W ranks, micro_batch_size, ZeRO stage)
TRAINERS = {"W=1 mbs=1": (1, 1, 1), "W=2 mbs=2 ZeRO-3": (2, 2, 3)}


def _rows(n: int, seed: int, lo: int = 1, hi: int = 15) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 500, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


def _body(rows: list[list[int]], *, left: bool = False, **processing: Any) -> dict[str, Any]:
    ids, mask = pad(rows, left=left)
    return {
        "kwargs": {"input_ids": ids, "attention_mask": mask},
        "processing": {"loss_fn": "cross_entropy", **processing},
    }


CALLS = {
    "1 row": _body(_rows(1, 1)),
    "2 rows (one micro-batch)": _body(_rows(2, 2)),
    "3 rows, ragged": _body(_rows(3, 3, lo=2, hi=30)),
    "5 rows, left-padded": _body(_rows(5, 5), left=True),
    "8 short rows": _body(_rows(8, 8, lo=2, hi=7)),
    "7 rows, balanced": _body(_rows(7, 7, lo=1, hi=20), balance_rows=True),
    "4 rows, entropy, temperature 0.7": _body(
        _rows(4, 4), post=["compute_entropy"], config={"temperature": 0.7}
    ),
}


@pytest.fixture(scope="module")
def trainers(onprem: ServerInfo) -> Iterator[dict[str, str]]:
    jobs: dict[str, str] = {}
    try:
        for name, (w, mbs, stage) in TRAINERS.items():
            conf = {**TRAIN, "n_gpus": w, "micro_batch_size": mbs, "zero_stage": stage}
            jobs[name] = create_job(
                onprem,
                {
                    "sub_job_configs": [
                        {"job_type": "training", "dtype": "float32", "training_config": conf}
                    ],
                    "experiment_name": "on-policy",
                },
            )
        yield jobs
    finally:
        for job in jobs.values():
            cancel_job(onprem, job)


@pytest.mark.parametrize("trainer", list(TRAINERS))
async def test_forward_equals_forward_backward_bitwise(
    http: Http, trainers: dict[str, str], trainer: str
) -> None:
    job = trainers[trainer]
    # no `step`: the weights stay put while the gradients accumulate
    for name, body in CALLS.items():
        post = body["processing"].get("post", [])
        fwd = await http.run(M.FORWARD, job, body)
        fb_body = {
            **body,
            "processing": {**body["processing"], "post": [*post, "compute_logprobs"]},
        }
        fb = await http.run(M.FORWARD_BACKWARD, job, fb_body)
        a, b = fwd["outputs"]["logprobs_shifted"], fb["outputs"]["logprobs_shifted"]
        mask = np.asarray(body["kwargs"]["attention_mask"])
        assert (a[:, :-1][(mask[:, :-1] != 0) & (mask[:, 1:] != 0)] < 0).all(), name
        assert np.array_equal(a, b), (
            f"{trainer}, {name}: forward and forward-backward log-probs differ by "
            f"{np.abs(a - b).max():.3g} at {int((a != b).sum())} positions"
        )
        if "compute_entropy" in post:
            assert np.array_equal(fwd["outputs"]["entropy"], fb["outputs"]["entropy"]), name
        assert fwd["loss"] == fb["loss"], name  # the same loss on the same log-probs
        if "config" not in body["processing"]:  # log-probs: temperature 1, the inputs' tokens
            lp = await http.run(
                M.LOG_PROBS, job, {k: body["kwargs"][k] for k in ("input_ids", "attention_mask")}
            )
            assert np.array_equal(lp["outputs"]["logprobs_shifted"], b), f"{trainer}, {name}"
