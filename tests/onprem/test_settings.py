"""Fast checks of the on-prem server's configuration and request checks (no engines started)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from arctic_sdk.spec.pb.arctic.v1 import training_pb2
from arctic_servers.engines import checks
from arctic_servers.engines.config import resolve_model, sub_job_specs, thread_env
from arctic_servers.onprem.settings import ServerSettings, ThreadPlan
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.rules.fields import learning_rate
from arctic_servers.rules.validate import validate_body


def test_thread_plan() -> None:
    assert ThreadPlan.parse("") == ThreadPlan()
    plan = ThreadPlan.parse("2,training=1,pin")
    assert plan.threads("sampling") == 2 and plan.threads("training") == 1 and plan.pin
    assert plan.threads("sampling", override=3) == 3
    assert ThreadPlan().threads("training") >= 1
    with pytest.raises(ValueError, match="unknown role"):
        ThreadPlan.parse("trainer=1")
    env = thread_env(3)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"


def test_sub_job_specs() -> None:
    specs = sub_job_specs(
        {
            "sub_job_configs": [
                {
                    "job_type": "training",
                    "training_config": {
                        "zero_stage": 3,
                        "micro_batch_size": 2,
                        "optimizer": {"name": "sgd", "lr": 0.1},
                    },
                },
                {"job_type": "SUB_JOB_TYPE_SAMPLING"},
                {"job_type": "log_probability", "inference_config": {"engine": "vllm"}},
            ]
        },
        cuda=False,
    )
    assert [s.role for s in specs] == ["training", "sampling", "log_prob"]
    assert specs[0].dtype == "float32" and specs[0].config["zero_stage"] == 3


@pytest.mark.parametrize(
    ("cfg", "code", "field"),
    [
        ({}, "missing_field", "sub_job_configs[0].job_type"),
        ({"job_type": "training", "dtype": "int8"}, "invalid_argument", "sub_job_configs[0].dtype"),
        (
            {"job_type": "training", "training_config": {"zero_stage": 4}},
            "invalid_argument",
            "sub_job_configs[0].training_config.zero_stage",
        ),
        (
            {"job_type": "training", "training_config": {"bogus": 1, "other": 2}},
            "unsupported_option",
            "sub_job_configs[0].training_config.bogus",
        ),
        (
            {"job_type": "training", "training_config": {"optimizer": {"name": "lion"}}},
            "invalid_argument",
            "sub_job_configs[0].training_config.optimizer.name",
        ),
        (
            {"job_type": "sampling", "training_config": {"zero_stage": 1}},
            "invalid_argument",
            "sub_job_configs[0].training_config",
        ),
        (
            {"job_type": "sampling", "inference_config": {"engine": "hf"}},
            "invalid_argument",
            "sub_job_configs[0].inference_config.engine",
        ),
    ],
)
def test_sub_job_specs_refuse(cfg: dict[str, object], code: str, field: str) -> None:
    with pytest.raises(ProtocolError) as err:
        sub_job_specs({"sub_job_configs": [cfg]}, cuda=False)
    assert err.value.code == code and err.value.details["field"] == field
    if code == "unsupported_option":
        assert len(err.value.details["options"]) == 2


def test_resolve_model(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError) as err:
        resolve_model(str(tmp_path / "nope"), ServerSettings(data_dir=tmp_path))
    assert err.value.code == "invalid_argument"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert (
        resolve_model(str(tmp_path / "m"), ServerSettings(data_dir=tmp_path))
        == (tmp_path / "m").resolve()
    )
    assert (
        resolve_model("", ServerSettings(data_dir=tmp_path, model=str(tmp_path / "m")))
        == (tmp_path / "m").resolve()
    )


def test_request_checks() -> None:
    ids = np.array([[1, 2, 3], [0, 4, 5]], np.int64)
    checks.train_body(
        {"kwargs": {"input_ids": ids, "attention_mask": np.array([[1, 1, 1], [0, 1, 1]])}},
        512,
    )
    # padding columns may hold any id; real ones must be in the vocabulary
    checks.tokens(np.array([[999, 1]]), np.array([[0, 1]]), "", 512)
    for body, code in (
        ({"kwargs": {"input_ids": np.array([[1, 512]])}}, "invalid_argument"),
        (
            {"kwargs": {"input_ids": ids, "attention_mask": np.array([[1, 2, 1], [1, 1, 1]])}},
            "invalid_argument",
        ),
        ({"args": [1], "kwargs": {"input_ids": ids}}, "invalid_argument"),
        (
            {"kwargs": {"input_ids": ids}, "processing": {"post": ["compute_nothing"]}},
            "unsupported_option",
        ),
        (
            {"kwargs": {"input_ids": ids}, "context": {"loss_mask": -np.ones((2, 3))}},
            "invalid_argument",
        ),
    ):
        with pytest.raises(ProtocolError) as err:
            checks.train_body(body, 512)
        assert err.value.code == code, body
    assert checks.prompts({"prompts": ["a", [1, 2], {"token_ids": {"ids": [3]}}]}, 512) == [
        "a",
        [1, 2],
        [3],
    ]
    for prompts in ([], [""], [[]], [[1, 600]], [1.5]):
        with pytest.raises(ProtocolError):
            checks.prompts({"prompts": prompts}, 512)
    for sp in (
        {"n": 0},
        {"temperature": -1},
        {"top_p": 0},
        {"logprobs": 21},
        {"stop": [""]},
        {"min_tokens": 5, "max_tokens": 2},
    ):
        with pytest.raises(ProtocolError):
            checks.sampling_params({"sampling_params": sp})
    assert learning_rate({"learning_rate": 0.0}) == 0.0
    for lr in (float("nan"), -0.1):  # the spec's rule, checked by the protocol layer
        with pytest.raises(ProtocolError):
            validate_body(training_pb2.StepRequest.DESCRIPTOR, {"learning_rate": lr})
    for bad in ("", "../x", ".hidden", "a/b", "x" * 200):
        with pytest.raises(ProtocolError):
            checks.checkpoint_id(bad)
    assert checks.checkpoint_id("step-3") == "step-3"


def test_request_checks_do_not_import_torch() -> None:
    """The server runs `checks` on its event loop before a call is accepted: importing torch
    there stalled every request for seconds on the first training call (found when a call sent
    right after a job started reached its trainer only after a rank had died)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from arctic_servers.engines import checks\n"
        "body = {'input_ids': np.ones((1, 4), np.int64)}\n"
        "checks.train_body({'kwargs': body, 'processing': {'loss_fn': 'grpo'},\n"
        "                   'context': {'loss_mask': np.ones((1, 4), np.float32),\n"
        "                               'advantages': np.ones((1, 4), np.float32)}},\n"
        "                  100)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_engine_errors_keep_their_code_across_the_worker_boundary() -> None:
    """`error_body` matches an engine's error by shape, not class: a `WorkerError` of another
    module (the worker once ran its own copy as `__main__`), or `LossConfigError`, must still
    answer its code, not `internal` (found when a vLLM sub-job's unsupported_option came back as
    a 500)."""
    from arctic_servers.engines import errors

    class WorkerError(Exception):  # an error class of the same shape, not `errors.WorkerError`
        def __init__(self, code: str, message: str, **details: object) -> None:
            super().__init__(message)
            self.code, self.message, self.details = code, message, details

    for exc in (
        errors.WorkerError("unsupported_option", "no entropy", options=["entropy"]),
        WorkerError("unsupported_option", "no entropy", options=["entropy"]),
    ):
        body = errors.error_body(exc, "forward")
        assert body == {
            "code": "unsupported_option",
            "message": "no entropy",
            "details": {"options": ["entropy"]},
        }
    assert errors.error_body(RuntimeError("boom"), "forward")["code"] == "internal"
    assert errors.error_body(WorkerError("not-a-code", "x"), "forward")["code"] == "internal"


def test_lora_without_peft_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without peft in the environment the capabilities say `lora.training: false` and CreateJob
    refuses `lora` with the reason, instead of a job that fails at start."""
    from arctic_servers.engines import config as settings
    from arctic_servers.rules.lora_config import LoraSupport

    off = LoraSupport(training=False, sampling=False, why="peft is not installed")
    monkeypatch.setattr(settings, "LORA", off)
    body = {"sub_job_configs": [{"job_type": "training", "training_config": {"lora": {}}}]}
    with pytest.raises(ProtocolError) as e:
        settings.sub_job_specs(body, cuda=False)
    assert e.value.code == "unsupported_option" and "peft is not installed" in e.value.message
    assert e.value.details["field"] == "sub_job_configs[0].training_config.lora"
    monkeypatch.setattr(settings, "LORA", LoraSupport())  # with peft
    (spec,) = settings.sub_job_specs(body, cuda=False)
    assert spec.config["lora"]["rank"] == 8
