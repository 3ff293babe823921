"""Server addresses that can never work fail at once, naming the URL and the mistake (issue 37).

A URL without a scheme, `grpc://` given to the HTTP transport, `https://` against a plain HTTP
server and HTTP against a gRPC port used to be retried for 60-70 s; a prefix URL was doubled
(`no route GET /api/v2/.../api/v2/...`); `Client(token=...)` raised a plain `ValueError`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from arctic_sdk import AsyncClient, Client
from arctic_sdk.errors import ArcticConnectionError, InvalidArgumentError
from conformance.fake import BackgroundFake

from .conftest import TOKEN

# The default retry budget (what a new user gets); the deadline only bounds a regression.
SLOW = {"timeout": 20.0, "progress": False}


def _hostport(fake: BackgroundFake) -> str:
    return fake.base_url.split("://", 1)[1]


def _no_retries(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.getMessage().startswith("retrying")]


def test_url_without_scheme_is_refused_with_the_http_form(fake: BackgroundFake) -> None:
    url = _hostport(fake)
    with pytest.raises(InvalidArgumentError, match=f"use 'http://{url}'") as err:
        Client(url, token=TOKEN)
    assert err.value.details["field"] == "base_url" and err.value.details["value"] == url


def test_grpc_url_given_to_http_is_refused_naming_the_transport(fake: BackgroundFake) -> None:
    url = "grpc://" + fake.grpc_target
    with pytest.raises(InvalidArgumentError, match="transport='grpc'") as err:
        Client(url, token=TOKEN)
    assert url in str(err.value)
    with pytest.raises(InvalidArgumentError, match="scheme 'ftp'"):
        AsyncClient("ftp://" + _hostport(fake), token=TOKEN)


@pytest.mark.parametrize("url", ["{t}", "grpc://{t}"])
def test_grpc_transport_takes_host_port(fake: BackgroundFake, url: str) -> None:
    with Client(url.format(t=fake.grpc_target), token=TOKEN, transport="grpc", **SLOW) as c:
        assert c.config.grpc.target == fake.grpc_target
        assert c.get_capabilities()["server"]


def test_no_url_is_the_sdks_error() -> None:
    with pytest.raises(InvalidArgumentError, match="no server configured") as err:
        Client(token=TOKEN)
    assert err.value.details["field"] == "base_url"
    with pytest.raises(InvalidArgumentError, match="grpc_target="):
        Client(token=TOKEN, transport="grpc")


def test_prefix_url_is_accepted(fake: BackgroundFake) -> None:
    with Client(fake.prefix_url, token=TOKEN, **SLOW) as c:
        assert c.config.cortex.base_url == fake.base_url
        assert c.config.cortex.prefix_url() == fake.prefix_url
        assert c.get_capabilities()["server"]
    with Client(fake.prefix_url + "/", token=TOKEN, transport="grpc", **SLOW) as c:
        assert c.get_capabilities()["server"]  # its gRPC port read from the prefix's server


def test_prefix_url_conflicts_and_operation_urls_are_refused(fake: BackgroundFake) -> None:
    with pytest.raises(InvalidArgumentError, match="names database 'fake_db'"):
        Client(fake.prefix_url, token=TOKEN, database="other")
    with pytest.raises(InvalidArgumentError, match=f"the base URL '{fake.base_url}'"):
        Client(fake.prefix_url + "/capabilities", token=TOKEN)


def _sync(kw: dict[str, Any]) -> None:
    with Client(token=TOKEN, **kw, **SLOW) as c:
        c.get_capabilities()


def _async(kw: dict[str, Any]) -> None:
    async def go() -> None:
        async with AsyncClient(token=TOKEN, **kw, **SLOW) as c:
            await c.get_capabilities()

    asyncio.run(go())


@pytest.mark.parametrize("call", [_sync, _async], ids=["sync", "async"])
def test_https_against_plain_http_fails_at_once(
    fake: BackgroundFake, call: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url = "https://" + _hostport(fake)
    caplog.set_level(logging.WARNING, logger="arctic_sdk")
    with pytest.raises(ArcticConnectionError, match="does not speak TLS") as err:
        call({"base_url": url})
    assert url in str(err.value) and "use http://" in str(err.value)
    _no_retries(caplog)


@pytest.mark.parametrize("call", [_sync, _async], ids=["sync", "async"])
def test_http_against_the_grpc_port_fails_at_once(
    fake: BackgroundFake, call: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url = "http://" + fake.grpc_target
    caplog.set_level(logging.WARNING, logger="arctic_sdk")
    with pytest.raises(ArcticConnectionError, match="answered HTTP/2") as err:
        call({"base_url": url})
    assert url in str(err.value) and "transport='grpc'" in str(err.value)
    _no_retries(caplog)


def test_other_protocol_mismatches_are_named() -> None:
    """An untrusted certificate, and a port that answers something other than HTTP; a server
    closing an idle connection (`RemoteDisconnected`) is an ordinary, retried failure."""
    import http.client
    import ssl

    import requests

    from arctic_sdk.transports.http import protocol_mismatch

    cert = ssl.SSLCertVerificationError(1, "certificate verify failed")
    cert.verify_message = "self-signed certificate"
    wrapped = requests.exceptions.SSLError(cert)
    assert "verify_ssl=False" in str(protocol_mismatch(wrapped))
    assert "self-signed certificate" in str(protocol_mismatch(wrapped))
    junk = requests.exceptions.ConnectionError(http.client.BadStatusLine("SSH-2.0-OpenSSH_9.6"))
    assert "did not answer HTTP" in str(protocol_mismatch(junk))
    idle = requests.exceptions.ConnectionError(http.client.RemoteDisconnected("closed"))
    assert protocol_mismatch(idle) is None
