"""Sub-jobs placed as Ray actors (the gateway's `--ray-address`).

Each sub-job gets one detached, named actor that reserves its resources — `num_gpus = n_gpus` on a
cluster with GPUs, one CPU otherwise — and starts the sub-job's worker host on its node (with
`CUDA_VISIBLE_DEVICES` from Ray's assignment, listening on the node's address). The gateway then
talks to the worker host exactly as to a local one; the actor is the placement and the lifetime:
it is detached, so it outlives the gateway, and a restarted gateway finds it by name. Killing
the actor takes the worker host down with it (the host exits when its parent, the actor, is gone).

Multi-GPU engines run inside the worker host: vLLM tensor parallel through its own executor
(`vllm_config.tensor_parallel_size`, the actor holding all the GPUs); a multi-rank DeepSpeed
trainer needs a torch.distributed launch inside the host, which the on-prem training engine does
not do yet (it is single-rank).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from ..protocol.errors import ProtocolError
from .model import SubJob


@ray.remote(max_restarts=0)
class WorkerActor:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        host = spec.get("host") or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        gpus = [str(g) for g in ray.get_gpu_ids()]
        spec = dict(spec, host=host, parent_pid=os.getpid())
        status = Path(spec["status_file"])
        if not status.parent.is_dir():  # another node: keep the files on this one
            local = Path(tempfile.gettempdir()) / "arctic-gateway" / status.parent.name
            local.mkdir(parents=True, exist_ok=True)
            spec["status_file"] = str(local / status.name)
            spec["log"] = str(local / Path(spec["log"]).name)
            status = Path(spec["status_file"])
        status.unlink(missing_ok=True)
        spec_file = status.with_suffix(".ray.json")
        fd = os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        env = dict(env)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        python = spec.get("python") or sys.executable
        with open(spec["log"], "ab") as logf:
            self.proc = subprocess.Popen(
                [python, "-m", "arctic_servers.gateway.worker_host", "--spec", str(spec_file)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while not status.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker host did not listen (exit {self.proc.poll()})")
            time.sleep(0.02)
        st = json.loads(status.read_text())
        return {"pid": st["pid"], "address": st["address"], "node": host, "gpus": gpus}

    def ping(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:  # DeepSpeed's CPU all-reduce buffer outlives the process unless removed
                maps = Path(f"/proc/{self.proc.pid}/maps").read_text().splitlines()
                shm = {ln.split()[-1] for ln in maps if " /dev/shm/deepspeed_" in ln}
            except OSError:
                shm = set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            for f in shm:
                with contextlib.suppress(OSError):
                    os.unlink(f)


def actor_name(sub: SubJob) -> str:
    return f"arctic-worker:{sub.sub_job_id}"


class RayPlacement:
    def __init__(self, address: str, namespace: str) -> None:
        self.namespace = namespace
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
        self.gpu = float(resources.get("GPU", 0)) > 0
        self._alive: dict[str, str | None] = {}  # sub-job id -> why gone (None = alive)
        self._watch: asyncio.Task[None] | None = None

    async def place(
        self, sub: SubJob, spec: dict[str, Any], env: dict[str, str], timeout: float
    ) -> dict[str, Any]:
        """Create the sub-job's actor and start its worker; `sub_job_failed` when Ray cannot
        place it (no resources, or killed) within `timeout` seconds."""
        opts: dict[str, Any] = {
            "name": actor_name(sub),
            "namespace": self.namespace,
            "lifetime": "detached",
            "runtime_env": {"env_vars": {"PYTHONPATH": env.get("PYTHONPATH", "")}},
        }
        if self.gpu:
            opts.update(num_gpus=sub.n_gpus, num_cpus=1)
        else:
            opts.update(num_cpus=1)
        actor = WorkerActor.options(**opts).remote()  # type: ignore[attr-defined]
        try:
            placed: dict[str, Any] = await asyncio.wait_for(actor.start.remote(spec, env), timeout)
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.kill(actor)
            why = (
                f"was not placed within {timeout:.0f} s"
                if isinstance(exc, TimeoutError)
                else (f"could not start the worker: {exc}")
            )
            raise ProtocolError(
                "sub_job_failed",
                f"sub-job {sub.sub_job_id}: its Ray actor {why}",
                sub_job_id=sub.sub_job_id,
            ) from None
        self._alive[sub.sub_job_id] = None
        self._ensure_watch()
        return {"actor": actor_name(sub), **placed}

    def _actor(self, sub: SubJob) -> Any:
        try:
            return ray.get_actor(actor_name(sub), namespace=self.namespace)
        except ValueError:
            return None

    def _ensure_watch(self) -> None:
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        """Ping every placed actor: the answer feeds `gone` (which must not block)."""
        while True:
            await asyncio.sleep(1.0)
            for sid in list(self._alive):
                try:
                    actor = ray.get_actor(f"arctic-worker:{sid}", namespace=self.namespace)
                    ok: bool = await asyncio.wait_for(actor.ping.remote(), 10)
                    self._alive[sid] = None if ok else "its worker host on the Ray node exited"
                except (ValueError, TimeoutError, ray.exceptions.RayError) as exc:
                    self._alive[sid] = f"its Ray actor is gone ({type(exc).__name__})"

    def gone(self, sub: SubJob) -> str | None:
        if sub.sub_job_id not in self._alive:  # re-attached after a restart: watch it too
            self._alive[sub.sub_job_id] = None if self._actor(sub) else "its Ray actor is gone"
            with contextlib.suppress(RuntimeError):
                self._ensure_watch()
        return self._alive.get(sub.sub_job_id)

    async def stop(self, sub: SubJob) -> None:
        self._alive.pop(sub.sub_job_id, None)
        actor = self._actor(sub)
        if actor is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(actor.stop.remote(), 15)
        with contextlib.suppress(Exception):
            ray.kill(actor)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        with contextlib.suppress(Exception):
            ray.shutdown()
