"""The commands waiting for a worker's engine, served fairly across tenants.

A worker usually serves one sub-job: its waiting commands run in arrival order. A LoRA pool's
worker (`engines/deepspeed/lora_pool_trainer.py`, `engines/vllm/lora_pool_sampler.py`) serves
the adapters of many jobs over one base model, and a command names its tenant (`args["tenant"]`,
added by the server's tenant handle). Arrival order there would let one busy tenant starve the
others: forty queued forward-backwards of tenant A would all run before B's one.

`TenantQueue` keeps one first-in-first-out queue per tenant and takes from them in turn (round
robin over the tenants that have something waiting): a tenant's own commands keep their order
(per-job sequencing is unchanged), and a command of a tenant that has nothing else queued waits
for at most one command of every other busy tenant, plus the one running. With one tenant (every
command of a non-pool engine has tenant "") it is exactly the arrival-order queue it replaces.

The on-prem worker loop (`worker.serve`) and the gateway's worker host (`worker_host.run`) both
drain what has arrived into it before they pick the next command, so a burst that arrived while
the engine was busy is ordered by tenant, not by arrival.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
# the argument that names a pool command's tenant (`protocol.lora_pools.TENANT_ARG`: this module
# stays free of the protocol layer, as the worker process is)
TENANT_ARG = "tenant"


def tenant_of(args: Any) -> str:
    """The tenant a command's arguments name ("" for a command of a one-tenant engine)."""
    if isinstance(args, dict):
        return str(args.get(TENANT_ARG) or "")
    return ""


class TenantQueue(Generic[T]):
    """Per-tenant FIFO queues, served in turn."""

    def __init__(self) -> None:
        self._queues: collections.OrderedDict[str, collections.deque[T]] = collections.OrderedDict()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[T]:
        for q in self._queues.values():
            yield from q

    def push(self, tenant: str, item: T) -> None:
        """Queue `item` behind the tenant's earlier ones (a tenant new to the queue takes its
        turn after the tenants already waiting)."""
        q = self._queues.get(tenant)
        if q is None:
            q = self._queues[tenant] = collections.deque()
        q.append(item)
        self._len += 1

    def peek(self) -> T:
        """The item whose turn it is (the queue must not be empty)."""
        return next(iter(self._queues.values()))[0]

    def pop(self) -> T:
        """Take the item whose turn it is; its tenant goes to the back of the turn order."""
        tenant, q = next(iter(self._queues.items()))
        item = q.popleft()
        self._len -= 1
        del self._queues[tenant]
        if q:
            self._queues[tenant] = q  # re-inserted last: the others go first
        return item

    def remove_if(self, pred: Callable[[T], bool]) -> list[T]:
        """Drop every waiting item `pred` holds for (an aborted command); the dropped items."""
        dropped: list[T] = []
        for tenant in list(self._queues):
            q = self._queues[tenant]
            keep = collections.deque(x for x in q if not pred(x))
            dropped += [x for x in q if pred(x)]
            if keep:
                self._queues[tenant] = keep
            else:
                del self._queues[tenant]
        self._len -= len(dropped)
        return dropped

    def waiting(self) -> dict[str, int]:
        """Items waiting per tenant (stats)."""
        return {t: len(q) for t, q in self._queues.items()}
