"""Scenarios of the unmodified `tinker` client, each run in a child process by the tests
(`python -m tests.tinker.scenarios NAME URL`): the 0.38 SDK keeps background threads and
leaves keep-alive sockets open after `ServiceClient.close()`, which must not leak into the
test process. A scenario fails by raising; it prints one JSON line of what it measured."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import tinker
from tinker import types

API_KEY = os.environ.get("TINKER_API_KEY", "tml-none")
BASE_MODEL = os.environ.get("TINKER_TEST_MODEL", "fake-tiny")
EPS = float(os.environ.get("TINKER_TEST_EPS", "1e-12"))  # the server's Adam eps
LORA = os.environ.get("TINKER_TEST_LORA") == "1"  # the server trains adapters for LoRA clients


@contextlib.contextmanager
def _rest(server: str) -> Iterator[tinker.RestClient]:
    rc = tinker.RestClient(base_url=server, api_key=API_KEY)
    try:
        yield rc
    finally:
        rc.holder.close()


@contextlib.contextmanager
def _service(server: str, key: str = API_KEY) -> Iterator[tinker.ServiceClient]:
    with tinker.ServiceClient(base_url=server, api_key=key) as svc:
        yield svc


def _datum(tokens: list[int], weights: list[float] | None = None) -> types.Datum:
    inp, tgt = tokens[:-1], tokens[1:]
    w = weights if weights is not None else [1.0] * len(tgt)
    return types.Datum(
        model_input=types.ModelInput.from_ints(inp),
        loss_fn_inputs={"target_tokens": tgt, "weights": w},
    )


def scenario_capabilities_and_auth(tinker_fake: str) -> dict:
    with _rest(tinker_fake) as rc:
        caps = rc.get_server_capabilities().result()
    assert [m.model_name for m in caps.supported_models] == [BASE_MODEL]
    with _service(tinker_fake, "tml-wrong") as bad, pytest.raises(tinker.AuthenticationError) as e:
        bad.create_lora_training_client(BASE_MODEL, rank=8).result()
    assert e.value.status_code == 401 and e.value.body["code"] == "unauthenticated"


def scenario_lora_rank_is_refused_by_default(tinker_refusing: str) -> dict:
    with _service(tinker_refusing) as svc:
        with pytest.raises(tinker.BadRequestError) as e:
            svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        assert e.value.body["field"] == "lora_config.rank"
        assert "lora_rank" in e.value.body["detail"] and "8" in e.value.body["detail"]


def scenario_unknown_base_model_is_refused(tinker_fake: str) -> dict:
    with _service(tinker_fake) as svc, pytest.raises(tinker.BadRequestError) as e:
        svc.create_lora_training_client("Qwen/Nope", rank=8).result()
    assert e.value.body["field"] == "base_model"


def scenario_sft_loop_sample_and_listing(tinker_fake: str) -> dict:
    with _service(tinker_fake) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        info = tc.get_info()
        assert info.model_data.model_name == BASE_MODEL and info.is_lora is LORA
        batch = [_datum([5, 6, 7, 8, 9, 10]), _datum([11, 12, 13], [0.0, 2.0])]
        losses = []
        for _ in range(3):  # pipelined: both futures submitted before either is awaited
            fb = tc.forward_backward(batch, "cross_entropy")
            opt = tc.optim_step(types.AdamParams(learning_rate=1e-3, eps=EPS))
            out = fb.result()
            opt.result()
            losses.append(out.metrics["loss:sum"])
            assert [o["logprobs"].shape for o in out.loss_fn_outputs] == [[5], [2]]
            lp = [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]
            # loss:sum is -(weights * target logprobs) summed, as Tinker defines it
            want = -(lp[0].sum() + 2.0 * lp[1][1])
            assert out.metrics["loss:sum"] == pytest.approx(float(want), rel=1e-4, abs=1e-4)
        assert all(np.isfinite(losses))
        fwd = tc.forward(batch, "cross_entropy").result()
        assert fwd.metrics["loss:sum"] > 0

        path = tc.save_weights_for_sampler("s1").result().path
        assert path == f"tinker://{info.model_id}/sampler_weights/s1"
        sc = svc.create_sampling_client(model_path=path).result()
        prompt = types.ModelInput.from_ints([5, 6, 7])
        res = sc.sample(
            prompt, 2, types.SamplingParams(max_tokens=6, seed=3, temperature=1.0)
        ).result()
        assert len(res.sequences) == 2
        for s in res.sequences:
            assert 1 <= len(s.tokens) <= 6 and s.logprobs is not None
            assert len(s.logprobs) == len(s.tokens) and s.stop_reason in ("stop", "length")

        saved = tc.save_state("step3").result().path
        assert saved == f"tinker://{info.model_id}/weights/step3"
    with _rest(tinker_fake) as rest:
        run = rest.get_training_run(info.model_id).result()
        assert run.training_run_id == info.model_id and run.base_model == BASE_MODEL
        cks = rest.list_checkpoints(info.model_id).result().checkpoints
        assert {c.tinker_path for c in cks} == {path, saved}


def scenario_rl_step_importance_sampling(tinker_fake: str) -> dict:
    with _service(tinker_fake) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=4).result()
        sc = tc.save_weights_and_get_sampling_client()
        prompt = [3, 4, 5]
        res = sc.sample(
            types.ModelInput.from_ints(prompt), 4, types.SamplingParams(max_tokens=5, seed=1)
        ).result()
        data = []
        for i, s in enumerate(res.sequences):
            full = prompt + list(s.tokens)
            n = len(full) - 1
            adv = [0.0] * (len(prompt) - 1) + [float(i) - 1.5] * len(s.tokens)
            lps = [0.0] * (len(prompt) - 1) + list(s.logprobs or [])
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={
                        "target_tokens": full[1:],
                        "logprobs": lps[:n],
                        "advantages": adv[:n],
                    },
                )
            )
        out = tc.forward_backward(data, "importance_sampling").result()
        assert np.isfinite(out.metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=1e-4, eps=EPS)).result()
        # the old sampling session is stale once new weights are synced
        sc2 = tc.save_weights_and_get_sampling_client()
        sc2.sample(
            types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=2)
        ).result()
        with pytest.raises(tinker.RequestFailedError, match="weight version"):
            sc.sample(
                types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=2)
            ).result()


def scenario_refusals_reach_the_client(tinker_fake: str) -> dict:
    with _service(tinker_fake) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        with pytest.raises(tinker.BadRequestError) as e:
            tc.forward_backward([_datum([1, 2, 3])], "stable_reinforce").result()
        assert e.value.body["field"] == "loss_fn" and "objective" in e.value.body["detail"]
        with pytest.raises(tinker.BadRequestError) as e:
            tc.optim_step(types.DimuonParams(learning_rate=1e-3)).result()
        assert e.value.body["field"] == "optim_params"


def scenario_lora_adapter_trains(tinker_lora: str) -> dict:
    """The default server settings: a LoRA client trains a LoRA adapter (training_config.lora)."""
    with _service(tinker_lora) as svc:
        # Tinker's default train_unembed=True: an lm_head adapter, which vLLM cannot serve; its
        # syncs merge it into the full weights and push those (PROTOCOL.md §3.6)
        tc = svc.create_lora_training_client(BASE_MODEL, rank=4).result()
        info = tc.get_info()
        assert info.is_lora is True and info.lora_rank == 4
        batch = [_datum([5, 6, 7, 8, 9, 10]), _datum([11, 12, 13, 14])]
        losses = []
        for _ in range(4):
            fb = tc.forward_backward(batch, "cross_entropy")
            opt = tc.optim_step(types.AdamParams(learning_rate=2e-2, eps=EPS))
            losses.append(float(fb.result().metrics["loss:sum"]))
            opt.result()
        assert all(np.isfinite(losses))  # on-prem: the caller checks that they fall
        sc = tc.save_weights_and_get_sampling_client()
        res = sc.sample(
            types.ModelInput.from_ints([5, 6, 7]), 2, types.SamplingParams(max_tokens=4, seed=3)
        ).result()
        assert len(res.sequences) == 2
    return {"losses": losses, "model_id": info.model_id}


def scenario_lora_clients_share_a_pool(server: str) -> dict:
    """Five LoRA training clients on one base model (Tinker's defaults: rank 32 by the SDK,
    train_unembed true) on a server that pools it: one trainer and one sampler hold them all
    (the server's admin view of its pools), each trains its own adapter and samples it."""
    import requests

    n = 5
    batch = [_datum([5, 6, 7, 8, 9, 10]), _datum([11, 12, 13, 14])]
    with _service(server) as svc:
        clients = [svc.create_lora_training_client(BASE_MODEL, rank=8) for _ in range(n)]
        tcs = [c.result() for c in clients]
        losses: list[list[float]] = [[] for _ in tcs]
        for _ in range(3):
            fbs = [tc.forward_backward(batch, "cross_entropy") for tc in tcs]
            opts = [tc.optim_step(types.AdamParams(learning_rate=2e-2, eps=EPS)) for tc in tcs]
            for i, (fb, opt) in enumerate(zip(fbs, opts, strict=True)):
                losses[i].append(float(fb.result().metrics["loss:sum"]))
                opt.result()
        token = API_KEY.removeprefix("tml-")
        r = requests.get(
            f"{server}/_admin/pools", headers={"Authorization": f"Bearer {token}"}, timeout=60
        )
        r.raise_for_status()
        ready = [p for p in r.json()["pools"] if p["state"] == "ready"]
        assert len(ready) == 1 and ready[0]["adapters"] == n, ready
        samples = []
        for tc in tcs:
            sc = tc.save_weights_and_get_sampling_client()
            res = sc.sample(
                types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=4, seed=3)
            ).result()
            samples.append(list(res.sequences[0].tokens))
    return {"losses": losses, "pool": ready[0]["pool_id"], "samples": samples}


def _step(tc: tinker.TrainingClient, batch: list[types.Datum]) -> float:
    """One forward_backward + optim_step, then the loss of a forward on the same batch."""
    tc.forward_backward(batch, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2, eps=EPS)).result()
    return float(tc.forward(batch, "cross_entropy").result().metrics["loss:sum"])


def scenario_load_state_and_weights_info(tinker_fake: str) -> dict:
    """save_state, load_state_with_optimizer into the same model and
    create_training_client_from_state_with_optimizer into a new one: the loss after the load
    equals the loss at save time, and the next step equals the step taken right after the save
    (Adam's moments resumed: a reset optimizer takes a different first step)."""
    batch = [_datum([5, 6, 7, 8, 9, 10]), _datum([11, 12, 13, 14])]
    with _service(tinker_fake) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        model_id = tc.get_info().model_id
        for _ in range(2):
            _step(tc, batch)
        saved = tc.save_state("ck1").result().path
        at_save = float(tc.forward(batch, "cross_entropy").result().metrics["loss:sum"])
        after_one = _step(tc, batch)
        moved = _step(tc, batch)
        assert moved != pytest.approx(at_save, rel=1e-6)
        tc.load_state_with_optimizer(saved).result()
        loaded = float(tc.forward(batch, "cross_entropy").result().metrics["loss:sum"])
        assert loaded == pytest.approx(at_save, rel=1e-5, abs=1e-6)
        resumed = _step(tc, batch)
        assert resumed == pytest.approx(after_one, rel=1e-5, abs=1e-6)
        tc2 = svc.create_training_client_from_state_with_optimizer(saved).result()
        assert tc2.get_info().model_id != model_id
        loss2 = float(tc2.forward(batch, "cross_entropy").result().metrics["loss:sum"])
        assert loss2 == pytest.approx(at_save, rel=1e-5, abs=1e-6)
        assert _step(tc2, batch) == pytest.approx(after_one, rel=1e-5, abs=1e-6)
        # weights only is not what our checkpoints restore: refused by name at submit
        with pytest.raises(tinker.BadRequestError) as e:
            tc.load_state(saved).result()
        assert e.value.body["field"] == "optimizer"
        with pytest.raises(tinker.NotFoundError):
            tc.load_state_with_optimizer(f"tinker://{model_id}/weights/nope").result()
        # GET /samplers/{id}: what the SDK asks when sampling from a model_path alone
        spath = tc.save_weights_for_sampler("s1").result().path
        sc = svc.create_sampling_client(model_path=spath).result()
        assert sc.get_base_model() == BASE_MODEL
    with _rest(tinker_fake) as rc:
        info = rc.get_weights_info_by_tinker_path(saved).result()
        assert info.base_model == BASE_MODEL and info.is_lora is LORA
        with pytest.raises(tinker.NotFoundError):
            rc.get_weights_info_by_tinker_path(f"tinker://{model_id}/weights/nope").result()
        got = rc.get_sampler(sc._sampling_session_id).result()  # the id the SDK asked about
        assert got.base_model == BASE_MODEL and got.model_path == spath
    return {"at_save": at_save, "loaded": loaded, "after_one": after_one, "resumed": resumed}


def scenario_session_expires(tinker_expiring: str) -> dict:
    """A session whose heartbeats stop (server timeout 3 s, the SDK beats every 10 s): a call
    of its model answers 410 (`tinker.APIStatusError`), and the SDK's heartbeat loop, answered
    410, stops itself."""
    import logging
    import time

    seen: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    lg = logging.getLogger("tinker")
    lg.setLevel(logging.INFO)
    lg.addHandler(Grab())
    with _service(tinker_expiring) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        time.sleep(4.0)
        with pytest.raises(tinker.APIStatusError) as e:
            tc.forward_backward([_datum([1, 2, 3])], "cross_entropy").result()
        assert e.value.status_code == 410 and e.value.body["code"] == "gone"
        assert "heartbeat" in e.value.body["detail"]
        deadline = time.time() + 20
        while time.time() < deadline and not any("stopping its heartbeat" in m for m in seen):
            time.sleep(0.5)
        assert any("stopping its heartbeat loop" in m for m in seen), seen
    return {"status": e.value.status_code}


def scenario_zstd_bodies(tinker_fake: str) -> dict:
    """The server's /client/config turns proto_compress_fwdbwd on: the SDK sends its
    forward_backward bodies zstd-compressed, and training runs on them."""
    with _service(tinker_fake) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        out = tc.forward_backward([_datum(list(range(1, 200)))], "cross_entropy").result()
        assert np.isfinite(out.metrics["loss:sum"])
    return {"loss": out.metrics["loss:sum"]}


def scenario_restart(server: str) -> dict:
    """Clients made before a real restart of the server (the test kills it -9 and starts it
    on the same state between the `ready` and `restarted` files in $TINKER_TEST_SIGNALS, with
    an optim_step running): the session, the training and sampling clients and the futures
    go on — the running step's future answers (re-driven under its idempotency key: the step
    runs once), training and sampling continue, heartbeats keep being answered."""
    import logging
    import pathlib
    import time

    sig = pathlib.Path(os.environ["TINKER_TEST_SIGNALS"])
    seen: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    lg = logging.getLogger("tinker")
    lg.setLevel(logging.INFO)
    lg.addHandler(Grab())
    batch = [_datum([5, 6, 7, 8])]
    prompt = types.ModelInput.from_ints([5, 6])
    with _service(server) as svc:
        tc = svc.create_lora_training_client(BASE_MODEL, rank=8).result()
        done = tc.forward_backward(batch, "cross_entropy")
        done.result()  # completed before the restart, read again after it
        sc = tc.save_weights_and_get_sampling_client()
        sc.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
        tc.forward_backward(batch, "cross_entropy").result()
        running = tc.optim_step(types.AdamParams(learning_rate=1e-3))  # slow: killed under it
        time.sleep(0.5)
        (sig / "ready").write_text(tc.get_info().model_id)
        deadline = time.time() + 120
        while not (sig / "restarted").exists():
            assert time.time() < deadline, "the test did not restart the server"
            time.sleep(0.2)
        step = running.result(timeout=120)
        assert "lr:mean" in step.metrics, step
        out = tc.forward_backward(batch, "cross_entropy").result(timeout=120)
        assert np.isfinite(out.metrics["loss:sum"])
        res = sc.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result(timeout=120)
        assert res.sequences[0].tokens
        time.sleep(12)  # a heartbeat after the restart (the SDK beats every 10 s)
        assert not any("stopping its heartbeat" in m for m in seen), seen
        model_id = tc.get_info().model_id
        (sig / "after").write_text("")  # the test reads the trainer's counters, then "done"
        while not (sig / "done").exists():
            assert time.time() < deadline + 300, "the test did not look"
            time.sleep(0.2)
    return {"model_id": model_id}


if __name__ == "__main__":
    name, url = sys.argv[1], sys.argv[2]
    out = globals()["scenario_" + name](url) or {}
    print("RESULT " + json.dumps(out, default=float))
