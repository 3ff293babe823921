"""Issue 15, point by point: nothing silently ignored, one error class per code, misuse raises
the SDK's errors, typed op signatures (waits and fast failures: test_core_flows.py)."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import arctic_sdk
from arctic_sdk import (
    Client,
    InvalidArgumentError,
    MissingFieldError,
    UnsupportedOptionError,
    errors,
    rollouts,
)
from arctic_sdk._core.effects import GrpcResponse
from arctic_sdk._core.grpc_wire import GrpcWire
from arctic_sdk._generated.error_classes import ERROR_CLASSES
from arctic_sdk.spec.tables import methods as M
from arctic_sdk.spec.tables.error_codes import ERRORS

from .conftest import Env

ROOT = Path(__file__).resolve().parents[2]
IDS = np.array([[5, 6, 7, 8], [9, 10, 11, 12]], np.int64)


def _refused(bad: Any) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as err:
        bad()
    return err.value


# ---------------------------------------------------------------- 1. per-loss fields


async def test_cross_entropy_honours_weights_and_refuses_what_it_does_not_read(env: Env) -> None:
    client = env.client()
    await env.job(client)
    base = {"kwargs": {"input_ids": IDS}, "processing": {"config": {"loss_agg_mode": "sum"}}}
    plain = (await env.run(client.forward(base)))["loss"]
    zero = {**base, "context": {"weights": np.zeros(IDS.shape, np.float32)}}
    two = {**base, "context": {"weights": np.full(IDS.shape, 2.0, np.float32)}}
    assert plain > 0
    assert (await env.run(client.forward(zero)))["loss"] == 0.0
    assert (await env.run(client.forward(two)))["loss"] == pytest.approx(2 * plain, rel=1e-6)
    assert (await env.run(client.forward_backward(zero)))["loss"] == 0.0
    # the ratio losses' inputs are not read by cross_entropy: refused by name, nothing sent
    for ctx, cfg, unread in (
        ({"advantages": np.ones(IDS.shape, np.float32)}, {}, ["context.advantages"]),
        ({"old_log_probs_shifted": -np.ones(IDS.shape, np.float32)}, {"eps_clip": 0.1},
         ["context.old_log_probs_shifted", "processing.config.eps_clip"]),
    ):  # fmt: skip
        body = {"kwargs": {"input_ids": IDS}, "context": ctx, "processing": {"config": cfg}}
        err = _refused(lambda b=body: client.submit_forward_backward(b))
        assert type(err) is InvalidArgumentError and err.status is None  # refused locally
        assert err.details["unread_fields"] == unread and err.details["loss_fn"] == "cross_entropy"
    # grpo does not read weights
    grpo = {
        "kwargs": {"input_ids": IDS},
        "context": {
            "advantages": np.ones(IDS.shape, np.float32),
            "loss_mask": np.ones_like(IDS),
            "weights": np.ones(IDS.shape, np.float32),
        },
        "processing": {"loss_fn": "grpo"},
    }
    err = _refused(lambda: client.submit_forward_backward(grpo))
    assert err.details["unread_fields"] == ["context.weights"] and "grpo" in str(err)


def test_the_per_loss_table_is_declared_once_in_the_spec() -> None:
    """The SDK reads the table from the proto options (what servers read too)."""
    from arctic_sdk.spec.pb.arctic.v1 import options_pb2, training_pb2

    def losses(msg: Any, name: str) -> list[str]:
        return list(
            msg.DESCRIPTOR.fields_by_name[name].GetOptions().Extensions[options_pb2.field].losses
        )

    assert losses(training_pb2.LossContext, "weights") == ["cross_entropy", "weighted_logprob"]
    assert "cross_entropy" not in losses(training_pb2.LossContext, "advantages")
    assert losses(training_pb2.LossContext, "loss_mask") == []  # every loss reads it
    text = (ROOT / "proto" / "PROTOCOL.md").read_text()
    assert "| `cross_entropy` | `kwargs.labels`, `context.weights` |" in text


# ---------------------------------------------------------------- 2. top-k / prompt log-probs


async def test_top_k_and_prompt_logprobs(env: Env) -> None:
    client = env.client()
    await env.job(client)
    out = await env.run(
        client.generate(
            prompts=[[50, 51, 52]],
            sampling_params={"max_tokens": 4, "logprobs": 3, "prompt_logprobs": 2, "seed": 3},
        )
    )
    c = out["results"][0]
    s = c["samples"][0]
    assert len(s["top_logprobs"]) == len(s["token_ids"]) == len(s["logprobs"])
    for lp, top in zip(s["logprobs"], s["top_logprobs"], strict=True):
        assert len(top["token_ids"]) == len(top["logprobs"]) == 3
        assert top["logprobs"] == sorted(top["logprobs"], reverse=True) and lp <= top["logprobs"][0]
    assert len(c["prompt_logprobs"]) == 3 and c["prompt_logprobs"][0] == 0.0
    assert c["prompt_logprobs"][1] < 0 and c["prompt_top_logprobs"][0] == {
        "token_ids": [],
        "logprobs": [],
    }
    assert all(len(t["token_ids"]) == 2 for t in c["prompt_top_logprobs"][1:])
    # the prompt's log-probs are the trainer's forward log-probs of the same tokens (step 0)
    fwd = await env.run(client.forward(kwargs={"input_ids": np.array([[50, 51, 52]])}))
    assert list(fwd["outputs"]["logprobs_shifted"][0][:2]) == c["prompt_logprobs"][1:]


# ---------------------------------------------------------------- 3. weight_version on load


async def test_loading_a_checkpoint_into_the_sampler_bumps_weight_version(env: Env) -> None:
    client = env.client()
    job_id = await env.job(client)
    await env.run(client.save_checkpoint(checkpoint_id="w0"))
    v0 = (await env.run(client.generate(prompts=["x"])))["weight_version"]
    sampler = f"{job_id}:sampling:0"
    await env.run(client.load_checkpoint(checkpoint_id="w0", target_sub_job_id=sampler))
    v1 = (await env.run(client.generate(prompts=["x"])))["weight_version"]
    assert v1 == v0 + 1
    await env.run(client.load_checkpoint(checkpoint_id="w0"))  # into training: no change
    assert (await env.run(client.generate(prompts=["x"])))["weight_version"] == v1


# ---------------------------------------------------------------- 5. forward's default loss


async def test_forward_and_forward_backward_default_to_the_same_loss(env: Env) -> None:
    client = env.client()
    await env.job(client)
    fb = await env.run(client.forward_backward(kwargs={"input_ids": IDS}))
    fwd = await env.run(client.forward(kwargs={"input_ids": IDS}))
    assert fb["loss"] > 0 and fwd["loss"] == fb["loss"]
    assert fwd["metrics"]["num_tokens"] == fb["metrics"]["num_tokens"]


# ---------------------------------------------------------------- 6. one class per code


def test_every_code_has_one_class_and_input_codes_are_invalid_argument_errors() -> None:
    assert set(ERROR_CLASSES) == set(ERRORS)
    assert len(set(ERROR_CLASSES.values())) == len(ERRORS)  # one class per code
    for code, cls in ERROR_CLASSES.items():
        assert cls.default_code == code, code
        assert errors.error_from_code(code, "m").__class__ is cls
        assert getattr(arctic_sdk, cls.__name__) is cls and hasattr(errors, cls.__name__)
        invalid = ERRORS[code].grpc_status == "INVALID_ARGUMENT"
        assert issubclass(cls, InvalidArgumentError) is invalid, code
    assert ERROR_CLASSES["invalid_argument"] is InvalidArgumentError
    assert issubclass(errors.JobNotFoundError, errors.NotFoundError)
    assert issubclass(errors.ChunkGroupConflictError, errors.ChunkGroupError)
    assert issubclass(errors.RateLimitedError, errors.RateLimitError)
    err = errors.error_from_code("missing_field", "field x", failed=True)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and isinstance(again, errors.RequestFailedError)


async def test_server_refusals_raise_the_pre_checks_class(env: Env) -> None:
    """The same refusal, once by the SDK before sending and once by the server, raises the same
    class (the pre-check is bypassed by sending a body only the server can judge)."""
    client = env.client()
    await env.job(client)
    # the server refuses: a token id outside the vocabulary (only the server knows its size)
    with pytest.raises(InvalidArgumentError) as server:
        await env.run(client.forward_backward(kwargs={"input_ids": np.array([[1, 10**9]])}))
    assert type(server.value) is InvalidArgumentError and server.value.status == 400
    assert server.value.code == "invalid_argument"
    # the SDK refuses a missing field before sending, and the class names the code
    with pytest.raises(MissingFieldError) as local:
        await env.run(client.forward_backward(kwargs={}))
    assert local.value.code == "missing_field" and local.value.status is None
    # an unknown loss option: unsupported_option, from the SDK as from the servers
    bad = {"kwargs": {"input_ids": IDS}, "processing": {"config": {"eps_clip_higher": 0.3}}}
    with pytest.raises(UnsupportedOptionError) as opt:
        await env.run(client.forward_backward(bad))
    assert opt.value.details["did_you_mean"] == {
        "processing.config.eps_clip_higher": "processing.config.eps_clip_high"
    }
    text = str(server.value)
    if env.transport == "grpc":  # gRPC errors name their gRPC status, never an HTTP one
        assert "gRPC INVALID_ARGUMENT" in text and "HTTP" not in text
    elif env.transport == "http":
        assert "HTTP 400" in text


def test_grpc_errors_never_mention_http() -> None:
    wire = GrpcWire(token=None, redact=lambda s: s)
    trailer = b'{"error": {"code": "shape_mismatch", "message": "field x: bad", "details": {}}}'
    reply = wire._error(
        M.FORWARD_BACKWARD, GrpcResponse("INVALID_ARGUMENT", "", {"x-arctic-error-bin": trailer})
    )
    err = reply.error  # type: ignore[union-attr]
    assert type(err) is errors.ShapeMismatchError and err.grpc_status == "INVALID_ARGUMENT"
    assert "HTTP" not in str(err) and "gRPC INVALID_ARGUMENT" in str(err)


# ---------------------------------------------------------------- 7. unknown fields, by path


def test_unknown_fields_are_named_at_their_path_with_a_suggestion() -> None:
    client = Client("http://127.0.0.1:9", job_id="job-1")
    err = _refused(
        lambda: client.forward_backward(kwargs={"input_ids": IDS}, processing={"loss_fun": "grpo"})
    )
    assert err.details["unknown_fields"] == ["processing.loss_fun"]
    assert err.details["expected_fields"] == {
        "processing.loss_fun": ["post", "loss_fn", "config", "balance_rows"]
    }
    assert err.details["did_you_mean"] == {"processing.loss_fun": "processing.loss_fn"}
    # a misspelt body key is unknown, not a missing `kwargs`
    err = _refused(lambda: client.forward_backward({"kwargz": {"input_ids": IDS}}))
    assert err.details["unknown_fields"] == ["kwargz"] and err.code == "invalid_argument"
    assert err.details["did_you_mean"] == {"kwargz": "kwargs"}
    # a misspelt keyword argument is named, with the closest parameter
    err = _refused(lambda: client.forward_backward(kwargz={"input_ids": IDS}))  # type: ignore[call-arg]
    assert err.details["unknown_fields"] == ["kwargz"]
    assert err.details["did_you_mean"] == {"kwargz": "kwargs"}
    client.close()


# ---------------------------------------------------------------- 8. misuse


def test_misuse_raises_the_sdks_errors() -> None:
    client = Client("http://127.0.0.1:9", job_id="job-1")
    err = _refused(lambda: client.forward_backward(IDS))  # type: ignore[arg-type]
    assert err.details["field"] == "body" and "kwargs={'input_ids'" in str(err)
    err = _refused(lambda: client.step(options={"timeout": 3}))  # type: ignore[arg-type]
    assert err.details["field"] == "options" and "CallOptions" in str(err)
    err = _refused(lambda: Client("http://127.0.0.1:9", transport="htp"))
    assert "did you mean 'http'" in str(err)
    err = _refused(lambda: Client("http://127.0.0.1:9", tokn="t"))
    assert "did you mean 'token'" in str(err)
    client.close()


# ---------------------------------------------------------------- 11. typed op signatures


def test_op_methods_have_real_documented_signatures() -> None:
    step = inspect.signature(Client.step).parameters
    assert step["learning_rate"].kind is inspect.Parameter.KEYWORD_ONLY
    assert step["learning_rate"].annotation == "float | None"
    gen = inspect.signature(Client.generate).parameters
    assert gen["prompts"].annotation == "Sequence[types.Prompt] | None"
    assert gen["sampling_params"].annotation == "types.SamplingParams | None"
    doc = inspect.getdoc(Client.generate) or ""
    assert "    sampling_params: vLLM-named sampling parameters" in doc
    assert "learning_rate: Learning-rate override" in (inspect.getdoc(Client.step) or "")
    from arctic_sdk.types import LossFn, SamplingParams

    assert "temperature" in SamplingParams.__annotations__
    assert LossFn.__args__[0] == "cross_entropy"  # type: ignore[attr-defined]


def test_type_checkers_see_the_signatures(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(
        "from arctic_sdk import Client, LossFn, SamplingParams\n"
        "def f(c: Client) -> int:\n"
        '    sp: SamplingParams = {"max_tokens": 8, "logprobs": 0}\n'
        '    out = c.generate(prompts=["hi", [1, 2]], sampling_params=sp)\n'
        '    loss: LossFn = "grpo"\n'
        '    c.forward_backward(kwargs={"input_ids": [[1, 2]]}, processing={"loss_fn": loss})\n'
        '    return out["weight_version"] + int(c.step(learning_rate=1e-5)["metrics"]["lr"])\n'
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from arctic_sdk import Client, LossFn\n"
        "def f(c: Client) -> None:\n"
        "    c.step(learning_rte=1e-5)\n"
        '    loss: LossFn = "gpro"\n'
    )
    run = [sys.executable, "-m", "mypy", "--strict", str(good), str(bad)]
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, check=False)
    errors_at = [ln for ln in proc.stdout.splitlines() if ": error:" in ln]
    assert all("bad.py:" in ln for ln in errors_at), proc.stdout  # good.py is clean
    assert any('Argument "learning_rte" to "step" of "Client"' in ln for ln in errors_at)
    assert any("'gpro'" in ln and "[assignment]" in ln for ln in errors_at), proc.stdout


# ---------------------------------------------------------------- 12. single-turn RL frame


def test_single_turn_frame_from_generate_aligns_the_columns() -> None:
    first = {"token_ids": [7, 8], "logprobs": [-1.0, -2.0]}
    second = {"token_ids": [9], "logprobs": [-3.0]}
    out = {
        "results": [
            {"prompt_token_ids": [1, 2, 3], "samples": [first]},
            {"prompt_token_ids": [4], "samples": [second]},
        ]
    }
    rows = rollouts.from_generate(out)
    frame = rollouts.forward_backward_frame(rows, [0.5, -0.5], loss_fn="grpo")
    ids = frame["kwargs"]["input_ids"]
    ctx = frame["context"]
    assert ids.tolist() == [[1, 2, 3, 7, 8], [4, 9, 0, 0, 0]]
    assert ctx["loss_mask"].tolist() == [[0, 0, 0, 1, 1], [0, 1, 0, 0, 0]]
    assert ctx["advantages"].tolist() == [[0, 0, 0, 0.5, 0.5], [0, -0.5, 0, 0, 0]]
    # shifted: column i holds the sampler's log-prob of token i + 1
    assert ctx["old_log_probs_shifted"].tolist() == [[0, 0, -1.0, -2.0, 0], [-3.0, 0, 0, 0, 0]]


# ---------------------------------------------------------------- 13. the example, on the fake


def test_grpo_tiny_runs_against_the_fake_with_only_url() -> None:
    from conformance.fake import BackgroundFake

    with BackgroundFake() as fake:
        args = [sys.executable, "examples/grpo_tiny.py", "--url", fake.base_url, "--steps", "3"]
        args += ["--out", ""]
        proc = subprocess.run(
            args,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "seed 0: reward first 5 steps" in proc.stdout
