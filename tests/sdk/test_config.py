"""Configuration: nested sections, environment fallback, explicit arguments win, secrets."""

from __future__ import annotations

import pickle

import pytest

from arctic_sdk import ArcticConfig, AsyncClient, Client, InvalidArgumentError
from arctic_sdk.config import build_config, reconnect_kwargs

ENV = (
    "ARCTIC_CORTEX_HOST",
    "ARCTIC_CORTEX_BASE_URL",
    "ARCTIC_CORTEX_DATABASE",
    "ARCTIC_CORTEX_SCHEMA",
    "ARCTIC_CORTEX_ENDPOINT",
    "ARCTIC_CORTEX_PAT",
    "CORTEX_PAT",
    "ARCTIC_CORTEX_PAT_ENV_VAR",
    "MY_PAT",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def test_environment_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARCTIC_CORTEX_HOST", "acct.snowflakecomputing.com")
    monkeypatch.setenv("ARCTIC_CORTEX_DATABASE", "DB")
    monkeypatch.setenv("ARCTIC_CORTEX_SCHEMA", "SC")
    monkeypatch.setenv("ARCTIC_CORTEX_ENDPOINT", "cortex-post-training")
    monkeypatch.setenv("CORTEX_PAT", "pat-from-cortex-pat")
    cfg = ArcticConfig()
    assert cfg.cortex.prefix_url() == (
        "https://acct.snowflakecomputing.com/api/v2/databases/DB/schemas/SC/cortex-post-training"
    )
    assert cfg.token() == "pat-from-cortex-pat"
    monkeypatch.setenv("ARCTIC_CORTEX_PAT", "pat-from-arctic")
    assert ArcticConfig().token() == "pat-from-arctic"
    monkeypatch.setenv("MY_PAT", "pat-from-named")
    assert build_config(None, pat_env_var="MY_PAT").token() == "pat-from-named"
    monkeypatch.setenv("ARCTIC_CORTEX_PAT_ENV_VAR", "MY_PAT")
    assert ArcticConfig().token() == "pat-from-named"


def test_explicit_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARCTIC_CORTEX_BASE_URL", "http://env:1")
    monkeypatch.setenv("ARCTIC_CORTEX_PAT", "pat-env")
    monkeypatch.setenv("ARCTIC_CORTEX_DATABASE", "ENVDB")
    cfg = build_config(None, base_url="http://explicit:2", token="pat-arg", database="ARGDB")
    assert cfg.cortex.base() == "http://explicit:2" and cfg.token() == "pat-arg"
    assert cfg.cortex.database == "ARGDB"
    # base_url wins over host; a host from the environment does not override it
    monkeypatch.setenv("ARCTIC_CORTEX_HOST", "envhost")
    assert build_config(None, base_url="http://x:3").cortex.base() == "http://x:3"
    # a config object plus keywords: keywords win
    again = build_config(cfg, job_id="job-9", max_retries=3, transport="grpc")
    assert (again.job_id, again.retry.max_retries, again.transport) == ("job-9", 3, "grpc")
    assert again.token() == "pat-arg"


def test_validation_and_unknown_arguments() -> None:
    # misuse raises the SDK's errors, naming the argument and the closest known one
    with pytest.raises(InvalidArgumentError, match="unknown argument 'bse_url'") as err:
        build_config(None, bse_url="x")
    assert "did you mean 'base_url'" in str(err.value) and err.value.details["field"] == "bse_url"
    with pytest.raises(InvalidArgumentError, match="transport='carrier-pigeon'"):
        build_config(None, transport="carrier-pigeon")
    with pytest.raises(InvalidArgumentError, match="did you mean 'http'") as err:
        Client("http://127.0.0.1:9", transport="htp")
    assert err.value.details["expected"] == {"transport": ["http", "grpc", "inproc"]}
    with pytest.raises(ValueError):
        ArcticConfig(retry={"max_retries": -1})
    assert build_config(None, transport="cortex").transport == "http"
    with pytest.raises(InvalidArgumentError, match="no server configured"):
        ArcticConfig().cortex.prefix_url()


def test_secret_is_hidden_everywhere_but_the_header() -> None:
    secret = "pat-VERY-SECRET-42"
    client = Client("http://127.0.0.1:9", token=secret, job_id="job-1")
    aclient = AsyncClient("http://127.0.0.1:9", token=secret, job_id="job-1")
    cfg = client.config
    for text in (
        repr(client),
        repr(aclient),
        repr(cfg),
        str(cfg),
        repr(cfg.model_dump()),
        cfg.model_dump_json(),
        repr(reconnect_kwargs(cfg)),
    ):
        assert secret not in text
    assert cfg.token() == secret
    assert pickle.loads(pickle.dumps(cfg)).token() == secret
    client.close()


def test_reconnect_kwargs_round_trip() -> None:
    cfg = build_config(
        None,
        base_url="http://h:1",
        token="p" * 8,
        job_id="j",
        database="D",
        schema="S",
        endpoint="E",
        transport="grpc",
        grpc_target="h:2",
    )
    back = build_config(None, **reconnect_kwargs(cfg))
    assert back.cortex.prefix_url() == cfg.cortex.prefix_url()
    assert (back.job_id, back.transport, back.grpc.target, back.token()) == (
        "j",
        "grpc",
        "h:2",
        "p" * 8,
    )
