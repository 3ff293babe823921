"""`/metrics` of the protocol core (issue 35): the per-call and per-request families, queue depth
and wait, chunk budgets, per-job families that go away when a job ends, bounded labels, and the
route's auth (open without tokens, operator token only with tokens, or its own listener)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

import dssst1
from arctic_sdk import Client, rollouts
from arctic_sdk.spec.tables import methods as M
from arctic_servers._generated.servicer import ServicerBase
from arctic_servers.protocol.config import ProtocolConfig, token_digest
from arctic_servers.protocol.context import CallContext
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.serving.http_app import DEFAULT_PATH
from arctic_servers.serving.serve import BackgroundServer, start_server
from arctic_servers.telemetry.metrics import BusyMeter
from conformance.fake import BackgroundFake, start_fake

BOUNDED = {"op", "transport", "code", "state", "route", "method", "status", "le", "scope", "server",
           "version"}  # fmt: skip
JOB = {
    "sub_job_configs": [
        {"job_type": "training", "model_name": "tiny"},
        {"job_type": "sampling", "model_name": "tiny"},
    ]
}


def scrape(url: str, **headers: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of a /metrics answer: name -> [(labels, value)]."""
    r = requests.get(url, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(
        v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())
    )


def _frame(client: Client) -> dict[str, Any]:
    out = client.generate(prompts=["a"], sampling_params={"n": 2, "max_tokens": 4, "seed": 1})
    return rollouts.forward_backward_frame(
        rollouts.from_generate(out), np.zeros(2, np.float32), loss_fn="grpo"
    )


def test_families_after_a_workload_on_the_fake() -> None:
    with BackgroundFake() as fake:
        with Client(fake.base_url, transport="http") as client:
            client.create_job(JOB)
            client.wait_until_running()
            frame = _frame(client)
            client.forward_backward(frame)
            client.step(learning_rate=1e-5)
            client.sync_weights()
            job_id = client.job_id
        with Client(fake.base_url, transport="grpc", job_id=job_id) as client:
            client.generate(prompts=["b"], sampling_params={"max_tokens": 3, "seed": 2})
        # a forward-backward the server refuses (no such job): counted by its code
        r = requests.post(
            fake.prefix_url + "/nope/forward-backward",
            data=dssst1.dumps(frame),
            headers={"Content-Type": "application/octet-stream"},
            timeout=10,
        )
        assert r.status_code == 404
        m = scrape(fake.base_url + "/metrics")

    fb = M.FORWARD_BACKWARD.name
    assert value(m, "arctic_calls_total", op=fb, code="ok", transport="http") == 1
    assert value(m, "arctic_calls_total", op=fb, code="job_not_found", transport="http") == 1
    assert value(m, "arctic_requests_total", op=fb, code="ok", transport="http") == 1
    assert value(m, "arctic_requests_total", op="generate", transport="grpc", code="ok") == 1
    assert value(m, "arctic_request_queue_wait_seconds_count", op=fb) == 1
    assert value(m, "arctic_request_duration_seconds_count", op=fb) == 1
    assert value(m, "arctic_call_duration_seconds_count", op=fb) == 2
    assert value(m, "arctic_requests_in_flight") == 0
    # per job: state, weight version, tokens, the sync's seconds and bytes
    assert value(m, "arctic_job_state", job_id=job_id, state="running") == 1
    assert value(m, "arctic_job_weight_version", job_id=job_id) == 1
    assert value(m, "arctic_job_tokens_sampled_total", job_id=job_id) == 2 * 4 + 3
    trained = value(m, "arctic_job_tokens_trained_total", job_id=job_id)
    assert trained == 2 * 4  # the fake trains the completion tokens the loss mask selects
    assert value(m, "arctic_job_weight_syncs_total", job_id=job_id) == 1
    assert value(m, "arctic_job_last_weight_sync_bytes", job_id=job_id) > 0
    assert value(m, "arctic_job_last_weight_sync_bytes", job_id=job_id) == value(
        m, "arctic_job_weight_sync_bytes_total", job_id=job_id
    )
    assert value(m, "arctic_jobs", state="running") == 1
    assert value(m, "arctic_chunk_open_bytes_budget", scope="server") == 8 * 1024**3
    assert value(m, "arctic_http_responses_total", route="unmatched") == 0
    assert value(m, "arctic_server_info", server="fake") == 1


def test_per_request_labels_are_bounded_and_job_series_end_with_the_job() -> None:
    with BackgroundFake() as fake, Client(fake.base_url) as client:
        client.create_job(JOB)
        client.wait_until_running()
        _frame(client)
        job_id = client.job_id
        m = scrape(fake.base_url + "/metrics")
        assert value(m, "arctic_job_state", job_id=job_id) == 1
        for name, samples in m.items():
            if not name.startswith("arctic_job_"):
                for labels, _ in samples:  # no job or request id outside the per-job families
                    assert set(labels) <= BOUNDED, name
        client.cancel_job()
        after = scrape(fake.base_url + "/metrics")
        assert not [n for n in after if n.startswith("arctic_job_")], after.keys()
        assert value(after, "arctic_jobs", state="cancelled") == 1
        assert job_id not in fake.server.core.metrics.jobs  # its meters are dropped too


class GatedServicer(ServicerBase):
    """`step` waits for `release`; learning_rate 13 fails as the engine would (sub_job_failed)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def step(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        await self.release.wait()
        if body.get("learning_rate") == 13:
            raise ProtocolError("sub_job_failed", "the trainer died", sub_job_id="j:training:0")
        return {"metrics": {"global_step": 1}}


async def test_queue_depth_wait_and_failed_requests_by_code() -> None:
    servicer = GatedServicer()
    server = await start_server(servicer, ProtocolConfig(answer_mode="inline"), grpc_port=None)
    url = server.base_url + "/metrics"
    step = server.base_url + DEFAULT_PATH + "/j1/step"

    async def post(session: aiohttp.ClientSession, seq: int, lr: float) -> dict[str, Any]:
        headers = {"X-Arctic-Seq": str(seq)}
        async with session.post(step, json={"learning_rate": lr}, headers=headers) as r:
            return dict(await r.json())

    try:
        async with aiohttp.ClientSession() as session:
            # sequenced: the second waits for the first, which waits for `release`
            calls = [asyncio.ensure_future(post(session, n, lr)) for n, lr in ((1, 1.0), (2, 13))]
            for _ in range(100):
                m = await asyncio.to_thread(scrape, url)
                if value(m, "arctic_requests_in_flight", op="step", state="pending") == 1:
                    break
                await asyncio.sleep(0.05)
            assert value(m, "arctic_requests_in_flight", op="step", state="running") == 1
            assert value(m, "arctic_requests_in_flight", op="step", state="pending") == 1
            await asyncio.sleep(0.3)
            servicer.release.set()
            first, second = await asyncio.gather(*calls)
        assert first["status"] == "completed", first
        assert second["error"]["code"] == "sub_job_failed", second
        m = await asyncio.to_thread(scrape, url)
        assert value(m, "arctic_requests_total", op="step", code="ok") == 1
        assert value(m, "arctic_requests_total", op="step", code="sub_job_failed") == 1
        # the inline answer of the failed one says so: its call is counted with the code too
        assert value(m, "arctic_calls_total", op="step", code="sub_job_failed") == 1
        assert value(m, "arctic_requests_in_flight", op="step") == 0
        # the second waited for the first (>= 0.3 s) before its servicer call began
        waited = value(m, "arctic_request_queue_wait_seconds_sum", op="step")
        assert waited >= 0.3, waited
        le_01 = value(m, "arctic_request_queue_wait_seconds_bucket", op="step", le="0.1")
        assert le_01 == 1  # the first started at once, the second did not
    finally:
        await server.close()


def test_chunk_bytes_in_flight_against_the_budget() -> None:
    with BackgroundFake() as fake, Client(fake.base_url) as client:
        client.create_job(JOB)
        client.wait_until_running()
        frame = dssst1.dumps(_frame(client))
        chunks = [bytes(c) for c in dssst1.encode_chunks(frame, kind="request", max_bytes=600)]
        assert len(chunks) > 2
        url = f"{fake.prefix_url}/{client.job_id}/forward-backward"
        r = requests.post(url, data=chunks[0], headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 200, r.text
        m = scrape(fake.base_url + "/metrics")
        held = value(m, "arctic_chunk_open_bytes")
        assert held > 0  # the payload of the chunk, plus bookkeeping
        assert value(m, "arctic_chunk_open_bytes_job_max") == held
        assert value(m, "arctic_chunk_groups_open") == 1
        for c in chunks[1:]:
            requests.post(url, data=c, headers={"Content-Type": "application/octet-stream"})
        m = scrape(fake.base_url + "/metrics")
        assert value(m, "arctic_chunk_open_bytes") == 0
        assert value(m, "arctic_chunk_groups_open") == 0


async def test_metrics_route_follows_the_servers_auth() -> None:
    operator = "op-secret"
    fake = await start_fake(
        token="tenant",
        grpc=False,
        metrics_token_sha256=frozenset({token_digest(operator)}),
        metrics_port=0,
    )
    bare = await start_fake(token="tenant", grpc=False)
    try:
        url = fake.base_url + "/metrics"

        def get(u: str, token: str | None = None) -> requests.Response:
            h = {"Authorization": f"Bearer {token}"} if token else {}
            return requests.get(u, headers=h, timeout=10)

        for who in (None, "tenant", "wrong"):  # a tenant's token does not see every job
            r = await asyncio.to_thread(get, url, who)
            assert r.status_code == 401, (who, r.text)
            assert r.json()["error"]["code"] == "unauthenticated"
            assert r.headers["X-Request-Id"]
        r = await asyncio.to_thread(get, url, operator)
        assert r.status_code == 200 and "arctic_server_info" in r.text
        # its own listener: no auth (a network only the operator reaches)
        assert fake.server.metrics is not None
        r = await asyncio.to_thread(get, fake.server.metrics.url)
        assert r.status_code == 200 and "arctic_calls_total" in r.text
        # tokens and no operator token: refused, naming the two ways to serve it
        r = await asyncio.to_thread(get, bare.base_url + "/metrics", "tenant")
        assert r.status_code == 401 and "--metrics-port" in r.json()["error"]["message"]
    finally:
        await fake.close()
        await bare.close()


def test_x_request_id_on_every_answer_and_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="arctic_servers")
    with BackgroundFake(admin=True) as fake:
        base = fake.base_url
        answers = [
            requests.get(fake.prefix_url + "/capabilities"),  # protocol, ok
            requests.get(fake.prefix_url + "/nope"),  # a protocol error (job_not_found)
            requests.get(base + "/no/such/route"),  # 404 of an unknown route
            requests.put(fake.prefix_url + "/capabilities"),  # 405
            requests.get(base + "/v1/models"),  # OpenAI
            requests.post(base + "/v1/chat/completions", json={}),  # OpenAI error
            requests.post(base + "/api/v1/create_model", json={}),  # Tinker
            requests.get(base + "/metrics"),
        ]
        for r in answers:
            rid = r.headers.get("X-Request-Id")
            assert rid and len(rid) == 32, (r.request.method, r.url, r.status_code)
        assert len({r.headers["X-Request-Id"] for r in answers}) == len(answers)
        # a malformed request aiohttp refuses before any route runs
        with socket.create_connection(("127.0.0.1", fake.server.http_port)) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
            head = s.recv(4096).decode()
        assert "400" in head.splitlines()[0] and "X-Request-Id: " in head
    failed = [r for r in answers if r.status_code >= 400]
    assert failed
    for r in failed:  # the log line of each failed call names its id
        assert any(r.headers["X-Request-Id"] in rec.getMessage() for rec in caplog.records), r.url
    line = next(
        rec.getMessage() for rec in caplog.records if answers[1].headers["X-Request-Id"] in
        rec.getMessage()
    )  # fmt: skip
    assert "[job_not_found]" in line and "404" in line


def test_sdk_exceptions_name_the_servers_request_id(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="arctic_servers")
    with BackgroundFake() as fake:
        for transport in ("http", "grpc"):
            with Client(fake.base_url, transport=transport) as client:
                with pytest.raises(Exception) as refused:
                    client.get_job(job_id="no-such-job")
                rid = refused.value.request_id  # type: ignore[attr-defined]
                assert rid and len(rid) == 32, (transport, refused.value)
                assert rid in str(refused.value)
                assert any(rid in rec.getMessage() for rec in caplog.records), transport
    # a request that ran and failed names its own request id, as logged
    with BackgroundServer(GatedServicer(), ProtocolConfig(answer_mode="inline")) as srv:
        srv.run(_release(srv))
        with Client(srv.base_url, job_id="j") as client, pytest.raises(Exception) as ran:
            client.step(learning_rate=13)
        rid = ran.value.request_id  # type: ignore[attr-defined]
        assert rid and any(
            rid in rec.getMessage() and "sub_job_failed" in rec.getMessage()
            for rec in caplog.records
        )


async def _release(srv: BackgroundServer) -> None:
    assert srv.server is not None
    srv.server.core.servicer.release.set()  # type: ignore[attr-defined]


def test_busy_meter_counts_overlapping_commands_once() -> None:
    now = [0.0]
    m = BusyMeter(window=10.0, clock=lambda: now[0])
    m.begin()
    now[0] = 1.0
    m.begin()  # a second command while the first runs: still one busy engine
    now[0] = 2.0
    m.end()
    now[0] = 3.0
    m.end()
    assert m.seconds() == 3.0
    now[0] = 10.0
    assert m.ratio() == pytest.approx(0.3)
    m.begin()
    now[0] = 12.0
    assert m.seconds() == 5.0
    assert m.ratio() == pytest.approx((1.0 + 2.0) / 10.0)  # [2, 3] and [10, 12] in [2, 12]


def test_in_process_refusals_name_the_request_id_too(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="arctic_servers")
    servicer = GatedServicer()
    servicer.release.set()
    with Client(transport="inproc", servicer=servicer, job_id="j") as client:
        with pytest.raises(Exception) as ran:  # ran and failed: its request's id
            client.step(learning_rate=13)
        with pytest.raises(Exception) as refused:  # refused (no such op here): the call's id
            client.get_job(job_id="j")
    assert refused.value.code == "unimplemented"  # type: ignore[attr-defined]
    for exc in (ran.value, refused.value):
        rid = exc.request_id  # type: ignore[attr-defined]
        assert rid and len(rid) == 32, exc
        assert any(rid in rec.getMessage() for rec in caplog.records), exc
