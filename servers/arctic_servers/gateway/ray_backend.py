"""Sub-jobs placed as Ray actors (the gateway's `--ray-address`).

Each sub-job gets one detached, named actor that reserves its resources — `num_gpus = n_gpus` on a
cluster with GPUs, one CPU otherwise, and the custom resources the gateway's `--ray-resources`
names for its role (how a trainer and its samplers are put on the nodes meant for them: nodes
started with `ray start --resources '{"trainer_node": 1}'` and so on) — and starts the sub-job's
worker host on its node (with
`CUDA_VISIBLE_DEVICES` from Ray's assignment, listening on the node's address). The gateway then
talks to the worker host exactly as to a local one; the actor is the placement and the lifetime:
it is detached, so it outlives the gateway, and a restarted gateway finds it by name. Killing
the actor takes the worker host down with it (the host exits when its parent, the actor, is gone).

Multi-GPU engines: vLLM tensor parallel runs through its own executor inside the worker host
(`vllm_config.tensor_parallel_size`, the actor holding all the GPUs). A multi-rank DeepSpeed
trainer (a training sub-job with `n_gpus` = W > 1, `engines/deepspeed/dp_training.py`) is placed as
W actors, one per rank, each with one GPU (one CPU on a cluster without GPUs): the sub-job's actor
is rank 0 and runs the worker host; it picks torch.distributed's `MASTER_ADDR`/`MASTER_PORT` and
rank 0's control port on its node, and the rank actors (`arctic-worker:{sub_job}:rank{r}`) start
the followers (`python -m arctic_servers.engines.deepspeed.follower`) against them. A rank that dies
ends rank 0 (its worker host exits with the reason in its log), so the sub-job fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray

from ..rules.errors import ProtocolError
from .model import SubJob


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _local_file(path: Path) -> Path:
    """`path`, or the same name in a local temp dir when its directory is on another node."""
    if path.parent.is_dir():
        return path
    local = Path(tempfile.gettempdir()) / "arctic-gateway" / path.parent.name
    local.mkdir(parents=True, exist_ok=True)
    return local / path.name


class _Process:
    proc: subprocess.Popen[bytes] | None = None

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


@ray.remote(max_restarts=0)
class RankActor(_Process):
    """Rank r > 0 of a multi-rank trainer (`arctic_servers.engines.deepspeed.follower`)."""

    def start(self, fspec: dict[str, Any], env: dict[str, str], log: str) -> dict[str, Any]:
        from ..engines.deepspeed.ranks import SPEC_ENV, dist_env

        host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        gpus = [str(g) for g in ray.get_gpu_ids()]
        rank, world = int(fspec["rank"]), int(fspec["world_size"])
        env = dict(env)
        # one GPU (or none) per actor: the rank's local device is always 0
        env.update(dist_env(rank, world, 0, fspec["master_addr"], int(fspec["master_port"])))
        env["LOCAL_SIZE"] = "1"
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        env[SPEC_ENV] = json.dumps(dict(fspec, parent_pid=os.getpid()))
        with open(_local_file(Path(log)), "ab") as logf:
            self.proc = subprocess.Popen(
                [
                    fspec.get("python") or sys.executable,
                    "-m",
                    "arctic_servers.engines.deepspeed.follower",
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return {"pid": self.proc.pid, "node": host, "gpus": gpus, "rank": rank}


@ray.remote(max_restarts=0)
class WorkerActor(_Process):
    def start(self, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        host = spec.get("host") or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        gpus = [str(g) for g in ray.get_gpu_ids()]
        spec = dict(spec, host=host, parent_pid=os.getpid())
        es = spec.get("engine_spec") or {}
        if isinstance(es.get("dist"), dict):  # rank 0 of a multi-rank trainer: its addresses
            dist = dict(es["dist"], master_addr=host)
            dist.setdefault("master_port", _free_port(host))
            dist.setdefault("control_port", _free_port(host))
            spec["engine_spec"] = dict(es, dist=dist)
            env = dict(env, LOCAL_RANK="0", LOCAL_SIZE="1")
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
        node_id = ray.get_runtime_context().get_node_id()
        out = {"pid": st["pid"], "address": st["address"], "node": host, "node_id": node_id,
               "gpus": gpus}  # fmt: skip
        if isinstance(es.get("dist"), dict):
            out["dist"] = spec["engine_spec"]["dist"]
        return out


def actor_name(sub: SubJob, rank: int = 0) -> str:
    return f"arctic-worker:{sub.sub_job_id}" + (f":rank{rank}" if rank else "")


def ranks_of(sub: SubJob, spec: dict[str, Any]) -> int:
    """Actors a sub-job takes: W for a multi-rank on-prem trainer, else 1."""
    if spec.get("engine") != "onprem":
        return 1
    from ..engines.deepspeed.ranks import world_size

    return world_size(spec.get("engine_spec") or {})


UNREACHABLE_S = 60.0  # an actor Ray calls unavailable this long is gone


def node_alive(node_id: str) -> bool | None:
    """Whether the Ray node `node_id` is alive (None: not known to the cluster)."""
    for n in ray.nodes():  # type: ignore[no-untyped-call]
        if n.get("NodeID") == node_id:
            return bool(n.get("Alive"))
    return None


class RayPlacement:
    def __init__(
        self,
        address: str,
        namespace: str,
        resources: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        self.namespace = namespace
        self.resources = {k: dict(v) for k, v in (resources or {}).items()}
        self._nodes: dict[str, str] = {}  # sub-job id -> the Ray node its worker is on
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        cluster = ray.cluster_resources()  # type: ignore[no-untyped-call]
        self.gpu = float(cluster.get("GPU", 0)) > 0
        self._alive: dict[str, str | None] = {}  # sub-job id -> why gone (None = alive)
        self._watch: asyncio.Task[None] | None = None

    async def place(
        self, sub: SubJob, spec: dict[str, Any], env: dict[str, str], timeout: float
    ) -> dict[str, Any]:
        """Create the sub-job's actor and start its worker; `sub_job_failed` when Ray cannot
        place it (no resources, or killed) within `timeout` seconds."""
        world = ranks_of(sub, spec)
        if world > 1:
            es = dict(spec["engine_spec"])
            es["dist"] = {"launch": "external", "authkey": spec["authkey"]}
            spec = dict(spec, engine_spec=es)

        def opts(rank: int) -> dict[str, Any]:
            o: dict[str, Any] = {
                "name": actor_name(sub, rank),
                "namespace": self.namespace,
                "lifetime": "detached",
                "runtime_env": {"env_vars": {"PYTHONPATH": env.get("PYTHONPATH", "")}},
                "num_cpus": 1,
            }
            if self.gpu:
                o["num_gpus"] = 1 if world > 1 else sub.n_gpus
            if sub.role in self.resources:  # custom resources: the nodes this role goes to
                o["resources"] = dict(self.resources[sub.role])
            return o

        actors = [WorkerActor.options(**opts(0)).remote()]  # type: ignore[attr-defined]
        try:
            placed: dict[str, Any] = await asyncio.wait_for(
                actors[0].start.remote(spec, env), timeout
            )
            if world > 1:
                from ..engines.deepspeed.ranks import follower_spec

                starts = []
                for r in range(1, world):
                    fspec = follower_spec(spec["engine_spec"], r, world, placed["dist"])
                    fspec["python"] = spec.get("python") or ""
                    actors.append(RankActor.options(**opts(r)).remote())  # type: ignore[attr-defined]
                    starts.append(actors[-1].start.remote(fspec, env, f"{spec['log']}.rank{r}"))
                placed["ranks"] = await asyncio.wait_for(asyncio.gather(*starts), timeout)
                placed.pop("dist", None)  # holds the control channel's authkey
        except Exception as exc:
            for a in actors:
                with contextlib.suppress(Exception):
                    ray.kill(a)
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
        self._nodes[sub.sub_job_id] = str(placed.get("node_id") or "")
        self._ensure_watch()
        return {"actor": actor_name(sub), "world_size": world, **placed}

    def _actor(self, sub: SubJob, rank: int = 0) -> Any:
        try:
            return ray.get_actor(actor_name(sub, rank), namespace=self.namespace)
        except ValueError:
            return None

    def _ensure_watch(self) -> None:
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        """Ping every placed actor: the answer feeds `gone` (which must not block). An actor
        Ray calls unavailable (its node not answering, not yet declared dead: Ray's health
        checks take ~15 s here) or that leaves a ping unanswered is given `UNREACHABLE_S`
        before it counts as gone, so that the reason can name a lost node once Ray has declared
        it dead; an actor Ray reports dead is gone at once."""
        unreachable: dict[str, float] = {}
        while True:
            await asyncio.sleep(1.0)
            for sid in list(self._alive):
                try:
                    actor = ray.get_actor(f"arctic-worker:{sid}", namespace=self.namespace)
                    ok: bool = await asyncio.wait_for(actor.ping.remote(), 10)
                    self._alive[sid] = None if ok else "its worker host on the Ray node exited"
                    unreachable.pop(sid, None)
                except (ray.exceptions.ActorUnavailableError, TimeoutError) as exc:
                    # a ping unanswered in 10 s is a busy or unreachable actor, not yet a dead
                    # one (a CPU host under load, an engine building its kernels)
                    since = unreachable.setdefault(sid, time.monotonic())
                    if time.monotonic() - since > UNREACHABLE_S:
                        self._alive[sid] = self._why_gone(sid, exc, UNREACHABLE_S)
                except (ValueError, ray.exceptions.RayError) as exc:
                    self._alive[sid] = self._why_gone(sid, exc)

    def _why_gone(self, sid: str, exc: BaseException, waited: float = 0.0) -> str:
        """Why an actor stopped answering: its node was lost, or the actor itself."""
        node = self._nodes.get(sid, "")
        alive = None
        if node:
            with contextlib.suppress(Exception):
                alive = node_alive(node)
        if alive is False:
            return f"its Ray node {node[:12]} was lost (the actor went with it)"
        if waited:
            return f"its Ray actor has been unreachable for {waited:.0f} s"
        return f"its Ray actor is gone ({type(exc).__name__})"

    def gone(self, sub: SubJob) -> str | None:
        if sub.sub_job_id not in self._alive:  # re-attached after a restart: watch it too
            self._nodes[sub.sub_job_id] = str((sub.worker or {}).get("node_id") or "")
            self._alive[sub.sub_job_id] = None if self._actor(sub) else "its Ray actor is gone"
            with contextlib.suppress(RuntimeError):
                self._ensure_watch()
        return self._alive.get(sub.sub_job_id)

    async def stop(self, sub: SubJob) -> None:
        self._alive.pop(sub.sub_job_id, None)
        self._nodes.pop(sub.sub_job_id, None)
        # rank 0 first (its followers end with it), then the rank actors of a multi-rank trainer
        for rank in range(max(1, sub.n_gpus)):
            actor = self._actor(sub, rank)
            if actor is None:
                continue
            with contextlib.suppress(Exception):
                await asyncio.wait_for(actor.stop.remote(), 15)
            with contextlib.suppress(Exception):
                ray.kill(actor)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        with contextlib.suppress(Exception):
            ray.shutdown()
