"""The gateway as a subprocess (to kill -9 and restart it) and a raw, synchronous client.

No SDK on purpose: the tests pin the gateway to the wire protocol (requests + dssst1 frames).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import requests

import dssst1
from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M
from arctic_servers.serving.serve import free_port

from ..rawwire import OCTET, TERMINAL, Resp, path_of

ROOT = Path(__file__).resolve().parents[2]
TRAIN = {"job_type": "training", "model_name": "fake-model"}
SAMPLE = {"job_type": "sampling", "model_name": "fake-model"}


def env() -> dict[str, str]:
    e = dict(os.environ)
    paths = [str(ROOT / "servers"), str(ROOT / "sdk"), str(ROOT)]
    e["PYTHONPATH"] = os.pathsep.join([*paths, e.get("PYTHONPATH", "")])
    e.pop("PYTHONWARNINGS", None)
    return e


class Gateway:
    """`python -m arctic_servers.gateway` on fixed ports, restartable on the same state."""

    def __init__(self, root: Path, *, token: str = "pat-1", args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.db = root / "state.db"
        self.tokens = root / "tokens"
        # pat-1 in plaintext (hashed when read), pat-2 only as its digest
        digest = hashlib.sha256(b"pat-2").hexdigest()
        self.tokens.write_text(f"{token}  # tests\nsha256:{digest}  # pat-2\n")
        self.token = token
        self.args = args
        self.port, self.grpc_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready = root / "ready.json"
        self.log = root / "gateway.log"
        self.starts = 0

    @property
    def prefix_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v2/databases/d/schemas/s/cortex-training"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, crash_at: str = "", timeout: float = 60.0) -> dict[str, Any]:
        self.ready.unlink(missing_ok=True)
        e = env()
        if crash_at:
            e["ARCTIC_CRASH_AT"] = crash_at
        argv = [
            sys.executable, "-m", "arctic_servers.gateway", "--db", str(self.db),
            "--tokens-file", str(self.tokens), "--port", str(self.port),
            "--grpc-port", str(self.grpc_port), "--engine", "fake", "--admin",
            "--ready-file", str(self.ready), *self.args,
        ]  # fmt: skip
        with self.log.open("ab") as logf:
            logf.write(f"\n===== start {self.starts} crash_at={crash_at!r}\n".encode())
            logf.flush()
            self.proc = subprocess.Popen(argv, env=e, stdout=logf, stderr=subprocess.STDOUT)
        self.starts += 1
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start: {self.tail()}")
            time.sleep(0.05)
        info: dict[str, Any] = json.loads(self.ready.read_text())
        return info

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def terminate(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def cleanup(self) -> None:
        self.kill9()
        kill_workers(self.root)


def kill_workers(root: Path) -> None:
    """SIGKILL the worker processes (and their groups) started under `root`."""
    marker = str(root).encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"worker_host" in cmd and marker in cmd:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(d.name), signal.SIGKILL)


def chunks_of(method: MethodInfo, value: Any, group: str, max_bytes: int = 1 << 20) -> list[bytes]:
    frame = dssst1.dumps(value)
    chunks = dssst1.encode_chunks(
        frame, kind="request", max_bytes=max_bytes, operation=method.name, chunk_group_id=group
    )
    return [bytes(c) for c in chunks]


class Client:
    def __init__(self, prefix_url: str, token: str | None = "pat-1", timeout: float = 30) -> None:
        self.prefix = prefix_url
        self.token = token
        self.timeout = timeout
        self.s = requests.Session()

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
            h["X-Snowflake-Authorization-Token-Type"] = "PROGRAMMATIC_ACCESS_TOKEN"
        h.update(extra or {})
        return h

    def request(
        self, verb: str, url: str, headers: dict[str, str] | None = None, **kw: Any
    ) -> Resp:
        r = self.s.request(verb, url, headers=self.headers(headers), timeout=self.timeout, **kw)
        data: Any = r.content
        if r.headers.get("Content-Type", "").startswith("application/json"):
            data = r.json()
        return Resp(r.status_code, data, dict(r.headers))

    def call(self, method: MethodInfo, body: Any = None, *, headers: dict[str, str] | None = None,
             query: Any = None, **params: str) -> Resp:  # fmt: skip
        kw: dict[str, Any] = {}
        if body is not None:
            kw["json"] = body
        if query is not None:
            kw["params"] = query
        url = self.prefix + path_of(method, **params)
        return self.request(method.http_method, url, headers=headers, **kw)

    def dss(self, method: MethodInfo, job: str, value: Any, *, group: str | None = None,
            headers: dict[str, str] | None = None, max_bytes: int = 1 << 20) -> Resp:  # fmt: skip
        """A DSSST1 body as a chunk group; the answer of its last chunk (or of a refusal)."""
        url = self.prefix + path_of(method, job_id=job)
        h = {"Content-Type": OCTET, **(headers or {})}
        resp = None
        for chunk in chunks_of(method, value, group or str(uuid.uuid4()), max_bytes):
            resp = self.request("POST", url, headers=h, data=chunk)
            if resp.status != 200 or not resp.data.get("chunk_cached"):
                break
        assert resp is not None
        return resp

    def poll(self, job: str, request_id: str, **query: Any) -> Resp:
        return self.call(M.GET_REQUEST, job_id=job, request_id=request_id, query=query or None)

    def wait(self, job: str, resp: Resp, timeout: float = 30) -> dict[str, Any]:
        """The terminal RequestStatus of a 200 / 202 answer."""
        assert resp.status in (200, 202), (resp.status, resp.data)
        status: dict[str, Any] = resp.data
        deadline = time.monotonic() + timeout
        while status.get("status") not in TERMINAL:
            assert time.monotonic() < deadline, f"request {status} did not end"
            time.sleep(0.02)
            status = self.poll(job, resp.data["request_id"]).data
        return status

    def result(self, job: str, resp: Resp) -> Any:
        status = self.wait(job, resp)
        assert status["status"] == "completed", status
        res = status.get("result")
        if isinstance(res, dict) and res.get("wire_format") == "DSSST1":
            return dssst1.loads(dssst1.decode_inline_envelope(res))
        return res

    def create_job(self, *configs: dict[str, Any], **extra: Any) -> str:
        body = {"sub_job_configs": list(configs or (TRAIN,)), **extra}
        resp = self.call(M.CREATE_JOB, body)
        assert resp.status == 200, resp.data
        return str(resp.data["job_id"])

    def job(self, job: str) -> dict[str, Any]:
        resp = self.call(M.GET_JOB, job_id=job)
        assert resp.status == 200, resp.data
        out: dict[str, Any] = resp.data["job"]
        return out

    def wait_job(self, job: str, state: str = "running", timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            j = self.job(job)
            if j["state"] == state:
                return j
            assert time.monotonic() < deadline, f"job {job} is {j['state']}: {j['reason']}"
            time.sleep(0.05)

    def stats(self, base_url: str, job: str) -> dict[str, Any]:
        r = self.request("GET", f"{base_url}/_admin/jobs/{job}/stats")
        assert r.status == 200, r.data
        out: dict[str, Any] = r.data["workers"]
        return out


def fb_body(rows: int = 2, cols: int = 8, seed: int = 0) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 250, size=(rows, cols), dtype=np.int64)
    return {"kwargs": {"input_ids": ids}}
