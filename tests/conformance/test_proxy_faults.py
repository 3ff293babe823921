"""The suite proven from outside a server: a mutating HTTP proxy in front of a correct server
(the fake gateway, faults off) injects one bug at a time, and the suite must fail the cases that
bug breaks. Unlike conformance/faults.yaml (bugs seeded inside the fake), these faults are on the
wire, so they show that the cases look at what a server answers, not at the fake's internals.

Each fault runs only the areas it touches (the proxy re-frames HTTP, so raw-socket and
declared-length cases are left to the direct runs); without a fault the same selection passes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from conformance.runner import Case

from .mutating_proxy import Fault, Proxy, Request, Response, fails_its_cases


def _drop_query(name: str) -> Callable[[Request], None]:
    def fn(req: Request) -> None:
        query = req["query"]
        assert isinstance(query, list)
        req["query"] = [(k, v) for k, v in query if k != name]

    return fn


def _drop_header(name: str) -> Callable[[Request], None]:
    def fn(req: Request) -> None:
        headers = req["headers"]
        assert isinstance(headers, dict)
        for k in [k for k in headers if k.lower() == name]:
            del headers[k]

    return fn


def _plain_errors(req: Request, resp: Response) -> None:
    """A server whose refusals carry text, not the spec's error body."""
    status = resp["status"]
    assert isinstance(status, int)
    if status >= 400:
        resp["body"] = b"Bad Request"
        resp["headers"] = {"Content-Type": "text/plain"}


def _refusals_as_500(req: Request, resp: Response) -> None:
    """A server that crashes (500 internal) on the input it should refuse with a 400."""
    if resp["status"] == 400:
        resp["status"] = 500
        body = {"error": {"code": "internal", "message": "boom", "details": {}}}
        resp["body"] = json.dumps(body).encode()


_TRAVERSAL = re.compile(r"/checkpoints/[^/]*(%2F|%5C)")


def _accepts_traversal(req: Request, resp: Response) -> None:
    """A server that takes a checkpoint id as a path (what the gateway did): it answers the
    traversal attempts as if they had worked."""
    if _TRAVERSAL.search(str(req["path"])) and resp["status"] == 400:
        resp["status"] = 200
        resp["body"] = json.dumps({"deleted": True}).encode()
        resp["headers"] = {"Content-Type": "application/json"}


def _drop_response_header(name: str) -> Callable[[Request, Response], None]:
    def fn(req: Request, resp: Response) -> None:
        headers = resp["headers"]
        assert isinstance(headers, dict)
        for k in [k for k in headers if k.lower() == name]:
            del headers[k]

    return fn


FAULTS = {
    "ignores_cursor": Fault(
        ("polling/*",),
        ("polling/cursor-pages", "polling/bad-cursor", "polling/bad-cursor-paged"),
        on_request=_drop_query("cursor"),
    ),
    "plain_text_errors": Fault(
        ("errors/*", "hostile/json/*", "hostile/checkpoint-id/*"),
        (
            "errors/body/names-the-field",
            "hostile/json/deep-nesting",
            "hostile/checkpoint-id/traversal-delete",
        ),
        on_response=_plain_errors,
    ),
    "refusals_as_500": Fault(
        ("hostile/json/*", "hostile/create-job/*", "hostile/header/*"),
        (
            "hostile/json/deep-nesting",
            "hostile/json/huge-integer",
            "hostile/create-job/non-finite-config",
            "hostile/header/sequence-number",
        ),
        on_response=_refusals_as_500,
    ),
    "checkpoint_ids_are_paths": Fault(
        ("hostile/checkpoint-id/*", "hostile/checkpoint/*"),
        (
            "hostile/checkpoint-id/traversal-delete",
            "hostile/checkpoint-id/traversal-export",
            "hostile/checkpoint/another-tokens-checkpoint",
        ),
        on_response=_accepts_traversal,
    ),
    "drops_idempotency_key": Fault(
        ("idempotency/*",),
        ("idempotency/step-replay", "idempotency/key-conflict"),
        on_request=_drop_header("idempotency-key"),
    ),
    "drops_sequence_numbers": Fault(
        ("sequencing/*",),
        ("sequencing/out-of-order-arrival",),
        on_request=_drop_header("x-arctic-seq"),
    ),
    "no_request_id_header": Fault(
        ("polling/request-id-header",),
        ("polling/request-id-header",),
        on_response=_drop_response_header("x-arctic-request-id"),
    ),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_suite_fails_each_fault_from_outside(
    proxy: tuple[Proxy, str], cases: list[Case], name: str
) -> None:
    fails_its_cases(proxy, cases, name, FAULTS[name])
