"""Each check runs once per call (issue 32): a forward-backward's loss settings are parsed and
its context checked once on the fake gateway, whose engine runs in process; the per-op table
(`engines/op_checks.py`) hands what it parsed to the engine. Before the table, one call parsed
`processing` 4 times and checked its context twice (the servicer's check, then the engine's)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from arctic_sdk.spec.tables import methods as M
from arctic_servers.engines import op_checks
from arctic_servers.engines.fake.state import Job
from arctic_servers.engines.losses import table
from arctic_servers.rules.errors import ProtocolError

from .raw import Http, batch

ROWS = [[10, 11, 12, 13], [20, 21, 22]]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of the loss table's parse and context check, wherever they are made from."""
    calls = {"parse_processing": 0, "check_context": 0}
    for name in calls:
        real = getattr(table, name)

        def counting(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(table, name, counting)
    return calls


def _body(loss_fn: str, **processing: Any) -> dict[str, Any]:
    """A body of `loss_fn` with the context it reads (an advantage loss: advantages, mask)."""
    ids, mask = batch(ROWS)
    context = {}
    if loss_fn != "cross_entropy":
        context = {
            "advantages": np.ones(ids.shape, np.float32),
            "loss_mask": mask.astype(np.float32),
        }
    return {
        "args": [],
        "kwargs": {"input_ids": ids, "attention_mask": mask},
        "context": context,
        "processing": {"post": ["compute_logprobs"], "loss_fn": loss_fn, **processing},
    }


@pytest.mark.parametrize("method", [M.FORWARD_BACKWARD, M.FORWARD])
@pytest.mark.parametrize("loss", ["cross_entropy", "importance_sampling"])
async def test_a_training_call_parses_its_loss_once(
    http: Http, job: str, counted: dict[str, int], method: Any, loss: str
) -> None:
    res = await http.run(method, job, _body(loss))
    assert np.isfinite(res["loss"])
    assert counted == {"parse_processing": 1, "check_context": 1}


async def test_a_refused_call_is_checked_once_and_never_runs(
    http: Http, job: str, counted: dict[str, int]
) -> None:
    body = _body("importance_sampling")
    del body["context"]["advantages"]  # an advantage loss needs them
    resp = await http.dss(M.FORWARD_BACKWARD, job, body)
    assert resp.status == 400 and resp.code == "missing_field", resp.data
    assert counted == {"parse_processing": 1, "check_context": 1}


def _job() -> Job:
    return Job(
        job_id="j",
        owner=None,
        sub_jobs=[],
        labels={},
        comment="",
        experiment_name="",
        lease_seconds=0,
    )


def test_the_table_answers_the_loss_it_parsed(counted: dict[str, int]) -> None:
    facts = op_checks.CallFacts(job=_job())
    body = _body("importance_sampling", config={"temperature": 0.5})
    got = op_checks.check(M.FORWARD_BACKWARD, facts, body)
    assert got == table.parse_processing(
        {"loss_fn": "importance_sampling", "config": {"temperature": 0.5}}
    )
    assert counted["parse_processing"] == 2 and counted["check_context"] == 1  # one is ours
    assert op_checks.check(M.STEP, facts, {}) is None  # no row: the spec's rules only
    with pytest.raises(ProtocolError) as err:
        op_checks.check(M.LOAD_CHECKPOINT, facts, {})
    assert (err.value.code, err.value.details["field"]) == ("missing_field", "checkpoint_id")
