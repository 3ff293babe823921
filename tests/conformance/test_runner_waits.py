"""The runner's quiet waits (issue 37): a job pending for capacity shows the server's reason,
and a missing or wrong token stops the run at once with one message naming `--token` (it used
to print one `HTTP 401` per case, 364 of them)."""

from __future__ import annotations

import io

import pytest
import requests

from conformance.fake import BackgroundFake
from conformance.runner import cli

from .conftest import TOKEN

ONE_CASE = ["--only", "ops/generate/max-tokens"]


@pytest.mark.parametrize("token", [None, "not-a-token"], ids=["none", "wrong"])
def test_a_missing_or_wrong_token_stops_the_run_naming_token(
    fake: BackgroundFake, token: str | None
) -> None:
    out, err = io.StringIO(), io.StringIO()
    args = ["--target", fake.prefix_url, *(["--token", token] if token else [])]
    code = cli.main(args, out=out, err=err)
    text = out.getvalue()
    assert code != 0
    assert "SETUP ERROR" in text and "--token" in text and "HTTP 401" in text, text
    assert text.count("HTTP 401") == 1 and not err.getvalue().strip(), text + err.getvalue()


def test_a_server_without_auth_needs_no_token() -> None:
    with BackgroundFake() as open_fake:
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["--target", open_fake.prefix_url, *ONE_CASE], out=out, err=err)
        assert code == 0, out.getvalue() + err.getvalue()


def test_a_pending_job_shows_the_servers_reason() -> None:
    with BackgroundFake(token=TOKEN, max_total_gpus=1) as small:
        # another job holds the only GPU: the run's job waits in pending, with a reason
        busy = requests.post(
            small.prefix_url + "/",
            json={"sub_job_configs": [{"job_type": "training", "model_name": "tiny"}]},
            headers={"authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert busy.status_code == 200, busy.text
        out, err = io.StringIO(), io.StringIO()
        args = ["--target", small.prefix_url, "--token", TOKEN, "--job-timeout", "1.5"]
        cli.main([*args, *ONE_CASE], out=out, err=err)
        reason = "waiting for capacity: needs 2 GPUs, 0 of 1"
        lines = [line for line in err.getvalue().splitlines() if "pending (" in line]
        assert len(lines) == 1, err.getvalue()  # said once while the reason stays the same
        assert reason in lines[0] and "job-2" in lines[0]
        assert f"still pending after 1.5 s ({reason}" in out.getvalue()  # and in the error
