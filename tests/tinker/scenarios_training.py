"""Training scenarios of the unmodified `tinker` 0.38 client (issue 31), run in a child process
as `python -m tests.tinker.scenarios_training NAME URL` (see `scenarios.py`): refusals that
free the model's turn, Tinker's loss definitions and defaults, per-call AdamParams, the
context window, custom-target log-probs."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from .scenarios import BASE_MODEL, _datum, _rest, _service

TURN_TIMEOUT = 60.0  # a call after a refusal answers within this (it hung forever before)


def _ok_after(tc: tinker.TrainingClient, what: str) -> None:
    """A call after a refusal completes: the refused call's turn was freed."""
    out = tc.forward([_datum([5, 6, 7, 8])], "cross_entropy").result(timeout=TURN_TIMEOUT)
    assert np.isfinite(out.metrics["loss:sum"]), what


def scenario_refused_calls_free_their_turn(server: str) -> dict:
    """Every route the SDK sequences, refused at submit — by its own route or by the
    catch-all of a route this server does not serve (`save_weights_external`, the cookbook's
    weights download) — and the model's next call still runs (issue 31 item 1)."""
    seen = []
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        with pytest.raises(tinker.NotFoundError) as e:
            tc.save_weights_external("hf-export").result(timeout=TURN_TIMEOUT)
        assert e.value.body["route"] == "/api/v1/save_weights_external"
        seen.append("save_weights_external")
        _ok_after(tc, "save_weights_external")
        bad = _datum([1, 2, 3])
        refusals = {
            "forward_backward": lambda: tc.forward_backward([bad], "stable_reinforce"),
            "forward": lambda: tc.forward([bad], "custom"),
            "optim_step": lambda: tc.optim_step(types.DimuonParams(learning_rate=1e-3)),
            "save_state": lambda: tc.save_state("../escape"),
            "save_weights_for_sampler": lambda: tc.save_weights_for_sampler("bad/name"),
            "load_state": lambda: tc.load_state("tinker://nothing/weights/x"),
        }
        for name, call in refusals.items():
            with pytest.raises(tinker.APIStatusError):
                call().result(timeout=TURN_TIMEOUT)
            seen.append(name)
            _ok_after(tc, name)
        # and an optim_step still runs in its turn after all of them
        tc.forward_backward([_datum([5, 6, 7, 8])], "cross_entropy").result(timeout=TURN_TIMEOUT)
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=TURN_TIMEOUT)
    return {"refused": seen}


def _rl_datum(tokens: list[int], q: list[float], adv: list[float], **extra: list[float]):
    inputs = {"target_tokens": tokens[1:], "logprobs": q, "advantages": adv, **extra}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def _tinker_doc_loss(loss: str, lp: torch.Tensor, q: torch.Tensor, adv: torch.Tensor, **kw):
    """The loss as Tinker's docs write it ("Loss functions"), with their constants."""
    ratio = torch.exp(lp - q)
    if loss == "cispo":  # docs: default thresholds 0.0 / 4.0
        clipped = torch.clamp(ratio, kw.get("lo", 0.0), kw.get("hi", 4.0))
        return -(clipped.detach() * lp * adv).sum()
    if loss == "ppo":  # docs: epsilon 0.2
        clipped = torch.clamp(ratio, kw.get("lo", 0.8), kw.get("hi", 1.2))
        return -torch.min(ratio * adv, clipped * adv).sum()
    if loss == "importance_sampling":
        return -(ratio * adv).sum()
    if loss == "dro":
        return -(lp * adv - 0.5 * kw["beta"] * (lp - q) ** 2).sum()
    if loss == "gspo":
        in_ratio = kw["mask"] != 0
        log_ratio = (lp.detach() - q)[in_ratio].mean()
        r = torch.exp(log_ratio + lp - lp.detach())
        clipped = torch.clamp(r, kw.get("lo", 0.8), kw.get("hi", 1.2))
        return -torch.min(r * adv, clipped * adv).sum()
    raise AssertionError(loss)


def scenario_tinker_losses_and_defaults(server: str) -> dict:
    """Each RL loss with no loss_fn_config (and dro with its beta): the loss the server
    answers equals Tinker's documented formula (with the documented defaults) on the
    log-probs it answers; ratios are set far from 1 so that the defaults matter."""
    tokens = [11, 12, 13, 14, 15, 16, 17, 18]
    n = len(tokens) - 1
    out: dict[str, float] = {}
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        lp0 = tc.forward([_datum(tokens)], "cross_entropy").result().loss_fn_outputs[0]
        lp0 = np.asarray(lp0["logprobs"].to_numpy(), np.float64)
        shift = np.array([1.0, -2.0, 0.1, 1.7, -0.05, 2.5, -1.0])  # log r: e, e^-2, ...
        q = (lp0 - shift).tolist()
        adv = [1.0, -1.0, 0.5, -0.5, 2.0, 1.0, -2.0]
        mask = [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
        cases = {
            "cispo": ({}, {}),
            "ppo": ({}, {}),
            "importance_sampling": ({}, {}),
            "dro": ({"beta": 0.05}, {}),
            "gspo": ({}, {"sequence_ratio_mask": mask}),
        }
        for loss, (cfg, extra) in cases.items():
            res = tc.forward([_rl_datum(tokens, q, adv, **extra)], loss, cfg or None).result()
            lp = torch.tensor(res.loss_fn_outputs[0]["logprobs"].to_numpy(), dtype=torch.float64)
            assert lp.shape == (n,)
            want = _tinker_doc_loss(
                loss,
                lp,
                torch.tensor(q, dtype=torch.float64),
                torch.tensor(adv, dtype=torch.float64),
                beta=cfg.get("beta", 0.0),
                mask=torch.tensor(mask),
            )
            got = res.metrics["loss:sum"]
            assert got == pytest.approx(float(want), rel=1e-4, abs=1e-4), (loss, got, float(want))
            out[loss] = got
        # dro without beta: Tinker documents no default, refused by name
        with pytest.raises(tinker.BadRequestError) as e:
            tc.forward([_rl_datum(tokens, q, adv)], "dro").result()
        assert e.value.body["field"] == "loss_fn_config.beta"
    return out


def scenario_per_call_adam_params(server: str) -> dict:
    """The cookbook's AdamParams (eps 1e-8) and a script's defaults (eps 1e-12), then other
    betas / weight decay / clipping, on one model of one server: every step runs with its own
    hyper-parameters (issue 31 item 9). Returns the model id; the caller reads what the
    trainer holds."""
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        batch = [_datum([5, 6, 7, 8, 9])]
        params = [
            types.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8),
            types.AdamParams(learning_rate=1e-3),
            types.AdamParams(
                learning_rate=2e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1,
                grad_clip_norm=0.5,
            ),
        ]  # fmt: skip
        lrs = []
        for p in params:
            tc.forward_backward(batch, "cross_entropy").result()
            res = tc.optim_step(p).result()
            lrs.append(res.metrics.get("lr:mean"))
        model_id = tc.get_info().model_id
        assert lrs[-1] == pytest.approx(2e-3), lrs
        _hold(server)
    return {"model_id": model_id, "lrs": lrs}


def scenario_adam_params_change_the_update(server: str) -> dict:
    """One model, the same batch and two steps from the same saved state (weights and Adam's
    moments, reloaded each time): with the same AdamParams twice (a control: equal losses
    after) and with weight decay (another update). On the fake nothing reads Adam's
    parameters; this is for a real trainer."""
    batch = [_datum([5, 6, 7, 8, 9, 10, 11])]
    base = types.AdamParams(learning_rate=5e-3, eps=1e-8)
    decayed = types.AdamParams(learning_rate=5e-3, eps=1e-8, weight_decay=50.0)
    out = {}
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        start = tc.save_state("start").result().path
        for name, p in (("base", base), ("control", base), ("decayed", decayed)):
            tc.load_state_with_optimizer(start).result()
            for _ in range(2):
                tc.forward_backward(batch, "cross_entropy").result()
                tc.optim_step(p).result()
            out[name] = float(tc.forward(batch, "cross_entropy").result().metrics["loss:sum"])
    return out


def _hold(server: str) -> None:
    """Signal the test (`TINKER_TEST_SIGNALS`) and wait until it has looked at the server."""
    sig = os.environ.get("TINKER_TEST_SIGNALS")
    if not sig:
        return
    from pathlib import Path

    (Path(sig) / "ready").write_text("")
    deadline = time.time() + 120
    while not (Path(sig) / "done").exists():
        assert time.time() < deadline, "the test did not look"
        time.sleep(0.2)


def scenario_context_window(server: str) -> dict:
    """The advertised window is what every route enforces (issue 31 item 4): a datum of
    exactly that many input tokens trains, one more is refused; a prompt plus max_tokens up to
    it samples, one more is refused; compute_logprobs of a prompt past it is refused."""
    with _rest(server) as rc:
        caps = rc.get_server_capabilities().result()
    with _service(server) as svc:
        window = {m.model_name: m.max_context_length for m in caps.supported_models}[BASE_MODEL]
        assert window and window > 8
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        ok = list(np.arange(window + 1) % 200 + 3)
        res = tc.forward([_datum(ok)], "cross_entropy").result()  # N = window inputs
        assert res.loss_fn_outputs[0]["logprobs"].shape == [window]
        with pytest.raises(tinker.BadRequestError) as e:
            tc.forward_backward([_datum([*ok, 7])], "cross_entropy").result()
        assert "context window" in e.value.body["detail"], e.value.body
        sc = tc.save_weights_and_get_sampling_client()
        prompt = types.ModelInput.from_ints(ok[: window - 4])
        got = sc.sample(prompt, 1, types.SamplingParams(max_tokens=4, seed=1)).result()
        assert 1 <= len(got.sequences[0].tokens) <= 4
        with pytest.raises(tinker.BadRequestError) as e:
            sc.sample(prompt, 1, types.SamplingParams(max_tokens=5)).result()
        detail = e.value.body["detail"]
        assert f"{window - 4} + 5 > {window}" in detail and "context window" in detail, detail
        assert e.value.body["room"] == 4 and "room for 4" in detail, e.value.body
        # absent: the room left (vLLM's chat default); 0 or negative: refused by name (issue 37)
        free = sc.sample(prompt, 1, types.SamplingParams(seed=1)).result()
        assert 1 <= len(free.sequences[0].tokens) <= 4
        for bad in (0, -3):
            with pytest.raises(tinker.BadRequestError) as e:
                sc.sample(prompt, 1, types.SamplingParams(max_tokens=bad)).result()
            assert e.value.body["field"] == "sampling_params.max_tokens", e.value.body
        with pytest.raises(tinker.BadRequestError):
            sc.compute_logprobs(types.ModelInput.from_ints(ok[:window])).result()
    return {"window": window}


def scenario_custom_target_logprobs(server: str) -> dict:
    """cross_entropy whose target_tokens are not the next inputs: the log-probs answered are
    the targets' (issue 31 item 8); the fake's are NUMERICS.md §2's, computed here."""
    inp = [40, 41, 42, 43, 44]
    tgt = [50, 61, 72, 83, 94]
    w = [1.0, 0.5, 2.0, 0.0, 1.0]
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        d = types.Datum(
            model_input=types.ModelInput.from_ints(inp),
            loss_fn_inputs={"target_tokens": tgt, "weights": w},
        )
        res = tc.forward([d], "cross_entropy").result()
        lp = res.loss_fn_outputs[0]["logprobs"].to_numpy()
    if os.environ.get("TINKER_TEST_FAKE_NUMERICS") == "1":
        # position i predicts tgt[i] at position i + 1 after input token inp[i], model step 0
        want = [-(((31 * t + 13 * q + 17 * (i + 1)) % 97) + 1) / 16 for i, (t, q) in
                enumerate(zip(tgt, inp, strict=True))]  # fmt: skip
        np.testing.assert_allclose(lp, want)
    assert res.metrics["loss:sum"] == pytest.approx(-float(np.dot(w, lp)), rel=1e-5)
    return {"logprobs": [float(x) for x in lp]}


if __name__ == "__main__":
    name, url = sys.argv[1], sys.argv[2]
    result = globals()["scenario_" + name](url) or {}
    print("RESULT " + json.dumps(result, default=float))
