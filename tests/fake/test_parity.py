"""The fake refuses what the on-prem server refuses, with the same codes (issue 15 point 4).

Each body below goes through the fake's check and the on-prem server's (both torch-free); the
outcome (accepted, or the error code and field) must be the same. The conformance cases of
`invalid_loss_fields.yaml` pin the same rules on a live server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from arctic_servers.engines import checks
from arctic_servers.engines.config import sub_job_specs
from arctic_servers.engines.fake import config, sampling, training
from arctic_servers.rules.errors import ProtocolError

VOCAB = 512
IDS = np.array([[5, 6, 7, 8]], np.int64)


def outcome(check: Callable[[], Any]) -> tuple[str, str]:
    try:
        check()
    except ProtocolError as exc:
        return exc.code, str(exc.details.get("field", ""))
    return "ok", ""


def training_config(conf: dict[str, Any]) -> dict[str, Any]:
    return {"sub_job_configs": [{"job_type": "training", "model_name": "tiny", **conf}]}


CONFIGS = [
    training_config({}),
    training_config({"training_config": {"optimizer": {"name": "adamw", "lr": 1e-3}}}),
    training_config({"training_config": {"optimizer": {"name": "adamw", "lr_decay": 0.5}}}),
    training_config({"training_config": {"optimizer": {"name": "lamb"}}}),
    training_config({"training_config": {"optimizer": {"lr": -1}}}),
    training_config({"training_config": {"optimizer": {"lr": 0}}}),
    training_config({"training_config": {"optimizer": {"betas": [0.9]}}}),
    training_config({"training_config": {"optimizer": {"betas": [0.9, 1.5]}}}),
    training_config({"training_config": {"optimizer": {"eps": float("nan")}}}),
    training_config({"training_config": {"optimizer": "adamw"}}),
    training_config({"training_config": {"zero_stage": 4}}),
    training_config({"training_config": {"zero_stage": 2}}),
    training_config({"training_config": {"micro_batch_size": 0}}),
    training_config({"training_config": {"train_batch_size": 1.5}}),
    training_config({"training_config": {"gradient_clipping": -1}}),
    training_config({"training_config": {"deepspeed": [1]}}),
    training_config({"training_config": {"max_seq_len": 0}}),
    training_config({"training_config": {"n_gpus": True}}),
    training_config({"training_config": {"warmup": 3}}),
    training_config({"inference_config": {"n_gpus": 1}}),
    training_config({"dtype": "int8"}),
    {"sub_job_configs": [{"job_type": "sampling", "model_name": "tiny",
                          "inference_config": {"vllm_config": 3}}]},
    {"sub_job_configs": [{"job_type": "sampling", "model_name": "tiny",
                          "inference_config": {"vllm_config": {"enforce_eager": True}}}]},
    {"sub_job_configs": [{"job_type": "gpu", "model_name": "tiny"}]},
    {"sub_job_configs": []},
]  # fmt: skip


@pytest.mark.parametrize("body", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
def test_sub_job_configs(body: dict[str, Any]) -> None:
    fake = outcome(lambda: config.sub_jobs_of(body, max_total_gpus=64))
    onprem = outcome(lambda: sub_job_specs(body, cuda=False))
    assert fake == onprem, body


def fb(**parts: Any) -> dict[str, Any]:
    return {"kwargs": {"input_ids": IDS}, **parts}


ONES = np.ones(IDS.shape, np.float32)
TRAIN_BODIES = [
    fb(),
    fb(kwargs={"input_ids": np.array([[1, VOCAB]])}),
    fb(kwargs={"input_ids": np.array([[1, VOCAB]]), "attention_mask": np.array([[1, 0]])}),
    fb(kwargs={"input_ids": IDS, "attention_mask": np.array([[1, 2, 1, 1]])}),
    fb(kwargs={"input_ids": IDS, "labels": np.array([[-100, 6, VOCAB, 8]])}),
    fb(context={"loss_mask": -ONES}),
    fb(context={"weights": np.full(IDS.shape, np.nan, np.float32)}),
    fb(context={"input_ids": IDS + 1}),
    fb(processing={"loss_fn": "grpo"}),
    fb(processing={"loss_fn": "grpo"}, context={"loss_mask": ONES}),
    fb(processing={"loss_fn": "weighted_logprob"}, context={"loss_mask": ONES}),
    fb(processing={"post": ["compute_nothing"]}),
    fb(processing={"config": {"kl_coeff": 0.1}}),
    fb(processing={"config": {"temperature": 0}}),
    fb(processing={"config": {"global_num_tokens": 3, "loss_agg_mode": "sum"}}),
    fb(processing={"config": {"global_num_tokens": 1.5}}),
    fb(processing={"config": {"entropy_coeff": float("inf")}}),
    fb(args=[1]),
]


@pytest.mark.parametrize("body", TRAIN_BODIES, ids=[str(i) for i in range(len(TRAIN_BODIES))])
def test_train_bodies(body: dict[str, Any]) -> None:
    fake = outcome(lambda: training.parse_train(body, VOCAB))
    onprem = outcome(lambda: checks.train_body(body, VOCAB))
    assert fake == onprem, body


SAMPLING = [
    {},
    {"n": 0},
    {"max_tokens": -1},
    {"min_tokens": 20},
    {"min_tokens": 4, "max_tokens": 2},
    {"temperature": -1},
    {"top_p": 0},
    {"top_p": 1.5},
    {"top_k": -2},
    {"logprobs": 21},
    {"prompt_logprobs": -1},
    {"repetition_penalty": -1},
    {"presence_penalty": 3},
    {"stop": [""]},
    {"logprobs": 5, "prompt_logprobs": 3, "top_p": 0.9, "temperature": 0.7},
]


@pytest.mark.parametrize("sp", SAMPLING, ids=[str(i) for i in range(len(SAMPLING))])
def test_sampling_params(sp: dict[str, Any]) -> None:
    body = {"prompts": ["x"], "sampling_params": sp}
    fake = outcome(lambda: sampling.parse_params(body))
    onprem = outcome(lambda: checks.sampling_params(body))
    assert fake == onprem, sp
