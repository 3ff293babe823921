"""Per-job sequence numbers (PROTOCOL.md §7.2), handed out in submission order.

A call reserves a `SeqSlot` when it is submitted, before the client may know the server's
capabilities; how many numbers it needs (0, 1, or 2 for the sync-weights fallback) depends on
them. `SeqAllocator.resolve` numbers every pending slot, oldest first, once capabilities are
known, so numbers follow submission order whatever order the calls reach the wire in. Thread-safe;
independent of event loops.

A client numbers the calls of the jobs it *owns* the numbering of: jobs it created, jobs whose
numbering it inherited (a pickled copy carries on from where the original was), or every job when
the configuration says so. A client that merely attaches to an existing job by id cannot know
how far that job's numbering went, so its calls go unsequenced (PROTOCOL.md §7.2: requests
without a number are not ordered against each other) instead of colliding with executed numbers.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..spec.model import MethodInfo


@dataclass(slots=True)
class SeqSlot:
    job_id: str
    method: MethodInfo
    numbers: list[int] | None = None  # set by resolve


class SeqAllocator:
    def __init__(self, start: dict[str, int] | None = None, *, every_job: bool = False) -> None:
        self._next: dict[str, int] = dict(start or {})
        self.every_job = every_job
        self._pending: deque[SeqSlot] = deque()
        self._lock = threading.Lock()

    def own(self, job_id: str) -> None:
        """Number the calls of `job_id` from 1 (a job this client created)."""
        with self._lock:
            self._next.setdefault(job_id, 1)

    def owns(self, job_id: str) -> bool:
        return self.every_job or job_id in self._next

    def reserve(self, job_id: str, method: MethodInfo) -> SeqSlot:
        slot = SeqSlot(job_id, method)
        with self._lock:
            self._pending.append(slot)
        return slot

    def resolve(self, count: Callable[[MethodInfo], int]) -> None:
        """Number every pending slot in reservation order; `count` says how many each needs."""
        if not self._pending:
            return
        with self._lock:
            while self._pending:
                slot = self._pending.popleft()
                n = count(slot.method)
                first = self._next.get(slot.job_id, 1)
                slot.numbers = list(range(first, first + n))
                self._next[slot.job_id] = first + n

    def release(self, slot: SeqSlot) -> None:
        """Give back the numbers of a call the server refused (it did not run), when no later
        call has been numbered yet; otherwise the server's gap timeout settles it. A slot not
        numbered yet (a call abandoned before capabilities arrived) just leaves the queue."""
        with self._lock:
            if slot.numbers is None:
                if slot in self._pending:
                    self._pending.remove(slot)
                slot.numbers = []
                return
        nums = slot.numbers
        if not nums:
            return
        with self._lock:
            if self._next.get(slot.job_id) == nums[-1] + 1:
                self._next[slot.job_id] = nums[0]
                slot.numbers = []

    def snapshot(self) -> dict[str, int]:
        """The next number per job (what a pickled client carries on)."""
        with self._lock:
            return dict(self._next)
