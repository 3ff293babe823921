"""Hostile input on the Tinker routes (raw HTTP): a 4xx with a JSON body and a stable code."""

from __future__ import annotations

import requests

from .conftest import API_KEY, TinkerServer

H = {"X-API-Key": API_KEY}


def _post(url: str, path: str, **kw: object) -> requests.Response:
    return requests.post(url + "/api/v1" + path, timeout=30, **kw)  # type: ignore[arg-type]


def test_auth_and_unknown_routes(tinker_fake: TinkerServer) -> None:
    r = _post(tinker_fake.url, "/create_session", json={})
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    r = _post(tinker_fake.url, "/create_session", json={}, headers={"X-API-Key": "tml-x"})
    assert r.status_code == 401
    r = _post(tinker_fake.url, "/copy_weights", json={}, headers=H)
    assert r.status_code == 404 and r.json()["route"] == "/api/v1/copy_weights"


def test_bad_bodies(tinker_fake: TinkerServer) -> None:
    u = tinker_fake.url
    r = _post(u, "/forward_backward", data=b"\xff\x00garbage", headers=H)
    assert r.status_code == 400 and r.json()["code"] == "bad_body"
    # aiohttp itself refuses a zstd body it cannot decode (400, text): never a 500
    zstd = {**H, "Content-Encoding": "zstd"}
    r = _post(u, "/forward_backward", data=b"\x28\xb5\x2f\xfdjunk", headers=zstd)
    assert r.status_code == 400
    r = _post(u, "/create_session", data=b"{" * 100_000, headers=H)
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    r = _post(u, "/create_session", json={"tags": [], "surprise": 1}, headers=H)
    assert r.status_code == 400 and "surprise" in r.json()["detail"]


def test_ids_of_nobody_and_traversal(tinker_fake: TinkerServer) -> None:
    u = tinker_fake.url
    sid = _post(
        u, "/create_session", json={"tags": [], "user_metadata": {}, "sdk_version": "x"}, headers=H
    ).json()["session_id"]
    for model_id in ("../../etc/passwd", "x" * 10_000, f"{sid}:train:99"):
        r = _post(u, "/get_info", json={"model_id": model_id}, headers=H)
        assert r.status_code == 404 and r.json()["field"] == "model_id"
    r = _post(u, "/retrieve_future", json={"request_id": "../fut"}, headers=H)
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = requests.get(u + "/api/v1/training_runs/..%2F..%2Fx", headers=H, timeout=30)
    assert r.status_code == 404


def test_session_fields_not_kept_are_named(tinker_refusing: TinkerServer) -> None:
    """CreateSession's tags / metadata / project / display name are not stored: the reply's
    warning (logged by the SDK) names the ones given, never silently dropped."""
    u = tinker_refusing.url
    base = {"tags": [], "user_metadata": {}, "sdk_version": "x"}
    r = _post(u, "/create_session", json=base, headers=H)
    assert r.status_code == 200 and "warning_message" not in r.json()
    r = _post(u, "/create_session", json={**base, "tags": ["a"], "display_name": "d"}, headers=H)
    warning = r.json()["warning_message"]
    assert "tags" in warning and "display_name" in warning and "project_id" not in warning
