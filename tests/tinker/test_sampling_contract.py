"""Issue 31, sampling and sessions, with the unmodified `tinker` 0.38 client over the fake
gateway: inflight sampling clients, greedy samples, the 0.38 sampling extras, a base-model
sampler, the models a server lists and their tokenizers by name, sessions whose end frees
their jobs on the surface's own clock, and a server without the `[tinker]` extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import requests

from .conftest import API_KEY, ROOT, TOKEN, TinkerServer, run_scenario, scenario_env


def _run(name: str, url: str, **kw: object) -> dict:
    return run_scenario(name, url, module="scenarios_sampling", timeout=300, **kw)  # type: ignore[arg-type]


def test_inflight_sampler_follows_new_weights(tinker_fake: TinkerServer) -> None:
    """Item 2: kind="inflight" was accepted and behaved as a snapshot (409 once newer weights
    were published); now it samples the newest weights and each sample's version is kept."""
    out = _run("inflight_sampler_follows_new_weights", tinker_fake.url)
    assert all(v > out["v0"] for v in out["v1"])


def test_greedy_samples(tinker_fake: TinkerServer) -> None:
    """Item 6 (on the fake; the real engines' test is test_onprem.py's)."""
    _run("greedy_samples", tinker_fake.url)


def test_sampling_extras(tinker_fake: TinkerServer) -> None:
    _run("sampling_extras", tinker_fake.url)


def test_base_model_sampler(tinker_fake: TinkerServer) -> None:
    """A sampler opened from a base model alone: a sampling job of its own, cancelled with
    the session."""
    before = set(tinker_fake.fake.servicer.jobs.jobs)
    _run("base_model_sampler", tinker_fake.url)
    new = [j for k, j in tinker_fake.fake.servicer.jobs.jobs.items() if k not in before]
    assert len(new) == 1 and [s.role for s in new[0].sub_jobs] == ["sampling"]
    _wait_for(lambda: new[0].state == "cancelled", 10, new[0].state)


def test_abandoned_sample_is_cancelled(tinker_fake: TinkerServer) -> None:
    """Issue 37: a sample future the `tinker` SDK abandons (a cancelled task: it sends
    cancel_future) and one still running when its ServiceClient closes are cancelled on the
    server: their generates (30 s each on the fake here) end cancelled at once and never ran
    (no generate in the fake job's execution log), and retrieve_future says so."""
    fake, routes = tinker_fake.fake, tinker_fake.routes
    before = set(fake.servicer.jobs.jobs)
    fake.servicer.behaviour["latency_s"] = {"generate": 30}
    t0 = time.monotonic()
    try:
        out = _run("abandoned_sample_is_cancelled", tinker_fake.url)
    finally:
        fake.servicer.behaviour.pop("latency_s", None)
    assert out["left_s"] < 1.0, out  # the SDK gives the task up at once
    assert out["running_at_close"], out
    (job,) = [j for k, j in fake.servicer.jobs.jobs.items() if k not in before]
    recs = [r for (jid, _), r in fake.core.requests._by_id.items() if jid == job.job_id]
    gens = [r for r in recs if r.op == "generate"]
    _wait_for(lambda: all(fake.core.requests.get(job.job_id, r.request_id).terminal
                          for r in gens), 10, "generates still running")  # fmt: skip
    first, second = sorted(
        (fake.core.requests.get(job.job_id, r.request_id) for r in gens),
        key=lambda r: r.created_at if r is not None else 0.0,
    )
    assert first is not None and second is not None
    assert (first.status, second.status) == ("cancelled", "cancelled"), (first, second)
    # the abandoned one by cancel_future, before the second was even sent; the second by the
    # session's end
    assert first.updated_at < second.created_at, (first, second)
    assert not [e for e in job.execution_log if e["op"] == "generate"], job.execution_log
    assert time.monotonic() - t0 < 25, "a generate ran its 30 s"
    samplers = routes.state.samplers
    futures = [f for f in routes.state.futures.values() if f.kind == "sample"
               and samplers[f.spec["sampling_session_id"]].job_id == job.job_id]  # fmt: skip
    cancelled = [f for f in futures if f.task is not None and f.task.cancelled()]
    assert len(cancelled) == 2, [(f.request_id, f.task) for f in futures]
    for f in cancelled:
        r = requests.post(
            tinker_fake.url + "/api/v1/retrieve_future",
            json={"request_id": f.request_id},
            headers={"X-API-Key": API_KEY},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["error"].startswith("request_cancelled"), r.text
        assert r.json()["category"] == "user", r.text


def test_models_listed_and_tokenizer_by_name(tinker_embedded: TinkerServer) -> None:
    """Items 10, 4 and 7: with no model list configured the server lists the models its
    engines serve (tiny-qwen2, tiny-4l) with their real window (1024 positions, not a
    2048 default), and get_tokenizer() of "tiny-qwen2" works through HF_ENDPOINT=<server>/hf
    (it went to the hub and failed)."""
    want = {"tiny-qwen2": 1024, "tiny-4l": 1024}
    out = _run(
        "models_and_tokenizer",
        tinker_embedded.url,
        model="tiny-qwen2",
        HF_ENDPOINT=tinker_embedded.url + "/hf",
        HF_HUB_OFFLINE="0",
        TRANSFORMERS_OFFLINE="0",
        HF_TOKEN=API_KEY,
        HF_HOME=str(Path(os.environ.get("TMPDIR", "/tmp")) / f"tinker-hf-{os.getpid()}"),
        TINKER_TEST_WANT_MODELS=json.dumps(want),
    )
    from transformers import AutoTokenizer

    from arctic_servers.engines.tiny_model import build_tiny_model
    from arctic_servers.onprem.settings import default_cache_dir

    local = AutoTokenizer.from_pretrained(
        build_tiny_model(default_cache_dir() / "tiny-qwen2-seed0")
    )
    assert out["ids"] == local.encode("hello tinker")


def test_the_context_window_is_the_models(tinker_embedded: TinkerServer) -> None:
    """Item 4 with the on-prem engines' catalog: 1024, the model's positions, on every route
    (and the sampler job is made with max_seq_len 1024, so the engine agrees)."""
    out = run_scenario(
        "context_window", tinker_embedded.url, model="tiny-qwen2", module="scenarios_training"
    )
    assert out["window"] == 1024
    jobs = tinker_embedded.fake.servicer.jobs.jobs.values()
    samplers = [s for j in jobs for s in j.sub_jobs if s.role == "sampling"]
    assert samplers and all(s.config.get("max_seq_len") == 1024 for s in samplers)


def _wait_for(cond: object, timeout: float, what: object) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"still {what!r} after {timeout} s"
        time.sleep(0.2)


CLOSE_CHILD = textwrap.dedent(
    """
    import os, sys, time, pathlib, tinker
    sig = pathlib.Path(os.environ["TINKER_TEST_SIGNALS"])
    svc = tinker.ServiceClient(base_url=sys.argv[1], api_key=os.environ["TINKER_API_KEY"])
    tc = svc.create_lora_training_client(os.environ["TINKER_TEST_MODEL"], rank=8).result()
    (sig / "model").write_text(tc.get_info().model_id)
    if sys.argv[2] == "close":
        svc.close("success").result()
    time.sleep(float(sys.argv[3]))  # a quiet client: nothing more reaches the server
    """
)


def _quiet_client(server: TinkerServer, tmp: Path, mode: str, hold: float) -> tuple[str, object]:
    sig = tmp / mode
    sig.mkdir()
    env = scenario_env(TINKER_TEST_SIGNALS=str(sig))
    child = subprocess.Popen(
        [sys.executable, "-c", CLOSE_CHILD, server.url, mode, str(hold)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _wait_for(lambda: (sig / "model").exists() or child.poll() is not None, 120, "no model")
    assert (sig / "model").exists(), child.stdout.read() if child.stdout else ""
    model = server.routes.state.models[(sig / "model").read_text()]
    return model.job_id, child


def test_close_cancels_the_jobs_at_once(tinker_fake: TinkerServer, tmp_path: Path) -> None:
    """Item 5: ServiceClient.close() frees the engines then, with no later request (before,
    the jobs ran on until some other Tinker request came)."""
    job_id, child = _quiet_client(tinker_fake, tmp_path, "close", 30)
    try:
        jobs = tinker_fake.fake.servicer.jobs.jobs
        _wait_for(lambda: jobs[job_id].state == "cancelled", 10, jobs[job_id].state)
    finally:
        child.kill()  # type: ignore[attr-defined]
        child.communicate()  # type: ignore[attr-defined]


def test_expiry_cancels_the_jobs_on_its_own_clock(
    tinker_expiring: TinkerServer, tmp_path: Path
) -> None:
    """Item 5: a session whose heartbeats stop (timeout 3 s; the SDK beats every 10 s, and
    this client is silent) expires and its jobs are cancelled with nothing else arriving."""
    job_id, child = _quiet_client(tinker_expiring, tmp_path, "expire", 30)
    try:
        jobs = tinker_expiring.fake.servicer.jobs.jobs
        _wait_for(lambda: jobs[job_id].state == "cancelled", 9, jobs[job_id].state)
    finally:
        child.kill()  # type: ignore[attr-defined]
        child.communicate()  # type: ignore[attr-defined]


NO_EXTRA_SERVER = textwrap.dedent(
    """
    import asyncio, importlib.util, sys
    real = importlib.util.find_spec
    importlib.util.find_spec = lambda n, *a: None if n == "tinker" else real(n, *a)
    from aiohttp import web
    from arctic_servers.tinker.mount import mount

    async def main():
        app = web.Application()
        assert mount(app) is None
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def test_a_server_without_the_extra_fails_the_client_in_seconds() -> None:
    """From issue 37: a client against a server without the [tinker] extra retried its 501s
    for 356 s; now the first call fails at once, naming the extra."""
    server = subprocess.Popen(
        [sys.executable, "-c", NO_EXTRA_SERVER],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        client = (
            "import tinker, os\n"
            "try:\n"
            f"    svc = tinker.ServiceClient(base_url='http://127.0.0.1:{port}', api_key='tml-k')\n"
            "    svc.create_lora_training_client('tiny-qwen2', rank=8).result()\n"
            "except Exception as e:\n"
            "    print('ERROR', type(e).__name__, e)\n"
        )
        t0 = time.monotonic()
        p = subprocess.run(
            [sys.executable, "-c", client],
            env={**os.environ, "TINKER_TELEMETRY": "0", "TINKER_API_KEY": f"tml-{TOKEN}"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - t0
    finally:
        server.kill()
        server.communicate()
    assert "ERROR" in p.stdout and "[tinker]" in p.stdout, p.stdout + p.stderr[-3000:]
    assert took < 30, took
