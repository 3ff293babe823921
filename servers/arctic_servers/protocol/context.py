"""What a servicer method receives besides its body."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arctic_sdk.spec.model import MethodInfo


@dataclass
class CallContext:
    """One call as the servicer sees it, whatever the transport."""

    method: MethodInfo
    job_id: str | None = None
    sub_job_id: str | None = None
    token: str | None = None
    request_id: str | None = None
    idempotency_key: str | None = None
    seq: int | None = None
    transport: str = "http"  # "http", "grpc" or "inproc"
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, Any] = field(default_factory=dict)
    # Set by `ProtocolCore.restore` for a request a durable server takes up after a restart
    # (its token was checked when it arrived; it is not kept): `resumed` for every such request,
    # `recovered` for one that was running, whose outcome the servicer must then collect from
    # its engine, never run again.
    resumed: bool = False
    recovered: bool = False
    # An in-process caller's box (`inproc.py`): the request's result value is put in it as the
    # servicer answered it, so the caller reads it without decoding the recorded frame.
    result_box: dict[str, Any] | None = field(default=None, repr=False)
    # What the servicer's `check_request` derived from the body (a training op's parsed loss
    # settings), for its op to use instead of deriving it again; None where no check ran in
    # this process (a request taken up after a restart).
    checked: Any = field(default=None, repr=False)
