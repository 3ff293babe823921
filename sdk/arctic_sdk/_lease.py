"""Background lease renewal (PROTOCOL.md §10): while the client lives, its job stays leased.

A daemon thread renews the lease every third of its length through a private sync transport, so
it works the same for the sync and the async client, whatever event loops they run in. When the
driver process dies, renewals stop and the server frees the job's GPUs.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .config import ArcticConfig

log = logging.getLogger("arctic_sdk")


class LeaseRenewer:
    def __init__(self, config: ArcticConfig, job_id: str, lease_seconds: float) -> None:
        self._config = config
        self._job_id = job_id
        self._interval = max(0.05, lease_seconds / 3.0)
        self._lease = int(lease_seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"arctic-lease-{job_id}"
        )

    def start(self) -> LeaseRenewer:
        self._thread.start()
        return self

    def _run(self) -> None:
        from ._client_base import CallOptions
        from .spec.tables import methods as M
        from .transports import make_sync_transport

        transport = make_sync_transport(
            self._config.model_copy(update={"job_id": self._job_id, "progress": False})
        )
        try:
            while not self._stop.wait(self._interval):
                body: dict[str, Any] = {"job_id": self._job_id, "lease_seconds": self._lease}
                try:
                    transport.call(
                        M.RENEW_JOB_LEASE, body, CallOptions(timeout=max(5.0, self._interval))
                    )
                except Exception as exc:  # keep renewing: a blip must not drop the lease
                    log.warning("renewing the lease of job %s failed: %s", self._job_id, exc)
        finally:
            transport.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
