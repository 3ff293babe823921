"""The weight-sync process group: one trainer (rank 0) and the processes that take its weights.

A torch.distributed group of its own, outside any default group the engines already have
(DeepSpeed's ranks, vLLM's tensor-parallel world): a `TCPStore` on the trainer's node, a
`PrefixStore` per group, and c10d's backend object (`ProcessGroupGloo` on CPU, `ProcessGroupNCCL`
on CUDA) built on it directly, as vLLM's `stateless_init_torch_distributed_process_group` does
— written against torch alone so that the trainer need not import vLLM (15 s here). The backend
follows the device; every collective goes through `broadcast`, with a timeout, so a peer that
never comes fails the call (`GroupError`) instead of hanging it. The same code runs on gloo and
on NCCL.

Rank 0 binds its rendezvous socket first (`Rendezvous`: the port goes to the other ranks through
the server) and then joins with it, so no port is picked and released before use.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

BACKENDS = ("gloo", "nccl")


class GroupError(RuntimeError):
    """A collective of the weight group failed or timed out: the group is unusable (closed)."""


def device_backend() -> str:
    """The backend this process's weights travel on: NCCL with CUDA, gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def local_address(peer: str) -> str:
    """This host's address on the route to `peer` (what the other ranks reach it by)."""
    if peer in ("127.0.0.1", "localhost", "::1"):
        return peer
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))  # no packet is sent: the kernel only picks the route
        return str(s.getsockname()[0])


@dataclass
class Rendezvous:
    """Rank 0's bound (listening) rendezvous socket, held until it joins its group."""

    host: str
    sock: socket.socket = field(repr=False)

    @classmethod
    def bind(cls, host: str) -> Rendezvous:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(128)
        return cls(host, sock)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class WeightGroup:
    """One built group. `broadcast` is the only collective; `close` releases it (idempotent)."""

    def __init__(
        self, group_id: str, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> None:
        self.group_id = group_id
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.timeout = dt.timedelta(seconds=timeout_s)
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else (torch.device("cpu"))
        )
        self.store: Any = None
        self.pg: Any = None
        self.setup_s = 0.0

    @classmethod
    def join(
        cls,
        group_id: str,
        *,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        rendezvous: Rendezvous | None = None,
    ) -> WeightGroup:
        """Build the group (blocks until every rank has joined, at most `timeout_s`)."""
        from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r}: one of {list(BACKENDS)}")
        if backend == "nccl" and not torch.cuda.is_available():
            raise GroupError("the weight group runs on NCCL, and this process has no CUDA device")
        g = cls(group_id, rank, world_size, backend, timeout_s)
        t0 = time.perf_counter()
        try:
            if rank == 0:
                if rendezvous is None or rendezvous.port != port:
                    raise GroupError(f"rank 0 of {group_id} has no rendezvous bound on {port}")
                fd = rendezvous.sock.detach()
                g.store = TCPStore(
                    host, port, world_size, True, g.timeout, wait_for_workers=True,
                    master_listen_fd=fd, use_libuv=False,
                )  # fmt: skip
            else:
                g.store = TCPStore(host, port, world_size, False, g.timeout)
            store = PrefixStore(f"arctic-weights/{group_id}/", g.store)
            g.pg = g._backend(store, local_address(host))
            # one tiny collective: every rank is connected before anyone calls this built
            g.broadcast(torch.zeros(1, device=g.device))
        except Exception as exc:
            g.close()
            if isinstance(exc, GroupError):
                raise
            raise GroupError(
                f"weight group {group_id}: rank {rank} of {world_size} could not join at "
                f"{host}:{port} within {timeout_s:.0f} s: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            if rendezvous is not None:
                rendezvous.close()
        g.setup_s = time.perf_counter() - t0
        return g

    def _backend(self, store: Any, address: str) -> Any:
        from torch.distributed.distributed_c10d import ProcessGroupGloo

        if self.backend == "gloo":
            opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            opts._timeout = self.timeout
            opts._devices = [ProcessGroupGloo.create_device(hostname=address)]
            return ProcessGroupGloo(store, self.rank, self.world_size, opts)
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        nopts = ProcessGroupNCCL.Options()
        nopts._timeout = self.timeout
        return ProcessGroupNCCL(store, self.rank, self.world_size, nopts)

    # -- collectives -------------------------------------------------------------------------

    def broadcast(self, tensor: torch.Tensor, timeout_s: float | None = None) -> None:
        """Rank 0's `tensor` into every rank's (in place); raises `GroupError` (and closes the
        group) when it fails or does not finish within the timeout."""
        self.wait(self.post(tensor, timeout_s), timeout_s)

    def post(self, tensor: torch.Tensor, timeout_s: float | None = None) -> Any:
        """Start a broadcast into `tensor` (the caller `wait`s for it): a receiver posts the
        next bucket before it loads the one it has, so the wire and the load overlap."""
        from torch.distributed.distributed_c10d import BroadcastOptions

        if self.pg is None:
            raise GroupError(f"weight group {self.group_id} is closed")
        opts = BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = self.timeout if timeout_s is None else dt.timedelta(seconds=timeout_s)
        try:
            return self.pg.broadcast([tensor], opts)
        except Exception as exc:
            self._fail(exc)

    def wait(self, work: Any, timeout_s: float | None = None) -> None:
        limit = self.timeout if timeout_s is None else dt.timedelta(seconds=timeout_s)
        try:
            if not work.wait(limit):
                raise TimeoutError(f"not done within {limit.total_seconds():.0f} s")
            if self.backend == "nccl":
                torch.cuda.current_stream().synchronize()
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> NoReturn:
        self.close()
        raise GroupError(
            f"weight group {self.group_id}: a broadcast failed on rank {self.rank} of "
            f"{self.world_size} ({type(exc).__name__}: {exc})"
        ) from None

    def send_header(self, header: dict[str, Any], timeout_s: float | None = None) -> None:
        """Rank 0: a small JSON document to every rank (its length, then its bytes)."""
        data = json.dumps(header).encode()
        self.broadcast(torch.tensor([len(data)], dtype=torch.int64, device=self.device), timeout_s)
        self.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device))

    def recv_header(self, timeout_s: float | None = None) -> dict[str, Any]:
        n = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.broadcast(n, timeout_s)
        buf = torch.empty(int(n.item()), dtype=torch.uint8, device=self.device)
        self.broadcast(buf)
        out: dict[str, Any] = json.loads(bytes(buf.cpu().numpy()))
        return out

    def close(self) -> None:
        pg, self.pg = self.pg, None
        if pg is not None:
            with contextlib.suppress(Exception):
                abort = getattr(pg, "abort", None)
                (abort or pg.shutdown)()
        self.store = None

    @property
    def closed(self) -> bool:
        return self.pg is None

    def describe(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "rank": self.rank,
            "world_size": self.world_size,
            "backend": self.backend,
            "setup_seconds": self.setup_s,
        }
