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
    zstd = {**H, "Content-Encoding": "zstd"}  # a frame that decodes to nothing
    r = _post(u, "/forward_backward", data=b"\x28\xb5\x2f\xfdjunk", headers=zstd)
    assert r.status_code == 400 and r.json()["field"] == "body"
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


def _zstd_bomb(decoded_bytes: int) -> bytes:
    """A small zstd frame that decodes to `decoded_bytes` zeros (made without holding them)."""
    import zstandard

    c = zstandard.ZstdCompressor(level=3).compressobj()
    zeros = bytes(1 << 20)
    out = [c.compress(zeros) for _ in range(decoded_bytes >> 20)]
    return b"".join(out) + c.flush()


def test_zstd_bodies_are_bounded_after_decoding(tinker_fake: TinkerServer) -> None:
    """PROTOCOL.md §13's body limit applies to the decoded size: a zstd bomb (1 GiB of zeros in
    ~32 KiB) answers 413 body_too_large with the Tinker error body, never a 500; a truncated or
    garbage frame answers 400."""
    import zstandard

    u = tinker_fake.url
    zstd = {**H, "Content-Encoding": "zstd", "Content-Type": "application/x-protobuf"}
    bomb = _zstd_bomb(1 << 30)
    assert len(bomb) < 1 << 20
    r = _post(u, "/forward_backward", data=bomb, headers=zstd)
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["code"] == "body_too_large" and body["limit_bytes"] == 60 << 20, body
    # the same limit on the JSON routes (their own is 16 MiB)
    r = _post(u, "/create_session", data=_zstd_bomb(64 << 20), headers={**zstd, **H})
    assert r.status_code == 413 and r.json()["code"] == "body_too_large"
    good = zstandard.ZstdCompressor().compress(
        b'{"tags": [], "user_metadata": {}, "sdk_version": "x"}'
    )
    # a truncated frame: aiohttp hands on what decoded, which is no complete body
    r = _post(u, "/create_session", data=good[:-6], headers=zstd)
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
    r = _post(u, "/forward_backward", data=b"\x28\xb5\x2f\xfd" + bytes(range(256)), headers=zstd)
    assert r.status_code == 400 and r.json()["field"] == "body", r.text
    r = _post(u, "/create_session", data=good, headers=zstd)  # and the server still serves
    assert r.status_code == 200 and r.json()["session_id"].startswith("sess-")


def test_another_tokens_ids_are_not_found(tinker_fake: TinkerServer) -> None:
    """Ids of another token's session / model / future answer 404 exactly as ids that never
    existed (nothing about them is revealed)."""
    from .conftest import OTHER_TOKEN

    u = tinker_fake.url
    other = {"X-API-Key": "tml-" + OTHER_TOKEN}
    base = {"tags": [], "user_metadata": {}, "sdk_version": "x"}
    sid = _post(u, "/create_session", json=base, headers=H).json()["session_id"]
    body = {"session_id": sid, "model_seq_id": 0, "base_model": "fake-tiny"}
    fut = _post(u, "/create_model", json=body, headers=H).json()["request_id"]
    r = _post(u, "/retrieve_future", json={"request_id": fut}, headers=H)
    model_id = r.json()["model_id"]
    for path, payload, field in [
        ("/session_heartbeat", {"session_id": sid}, "session_id"),
        ("/get_info", {"model_id": model_id}, "model_id"),
        ("/retrieve_future", {"request_id": fut}, "request_id"),
        ("/cancel_future", {"request_id": fut}, "request_id"),
        ("/create_model", {**body, "model_seq_id": 1}, "session_id"),
    ]:
        r = _post(u, path, json=payload, headers=other)
        assert r.status_code == 404 and r.json()["field"] == field, (path, r.text)
        assert "does not exist" in r.json()["detail"]
    r = requests.get(u + f"/api/v1/training_runs/{model_id}", headers=other, timeout=30)
    assert r.status_code == 404


def test_cancel_future_takes_own_sample_futures_only(tinker_fake: TinkerServer) -> None:
    """`/cancel_future` (the SDK abandoning a sample): an id of nobody or a traversal is 404, a
    body with another field or no id is refused naming it, and a training op's future is
    refused by name (it runs in its model's turn) and still answers its result."""
    u = tinker_fake.url
    for rid in ("../fut", "x" * 10_000, ""):
        r = _post(u, "/cancel_future", json={"request_id": rid}, headers=H)
        assert r.status_code == 404 and r.json()["field"] == "request_id", (rid[:20], r.text)
    r = _post(u, "/cancel_future", json={"request_id": "f", "all": True}, headers=H)
    assert r.status_code == 400 and "all" in r.json()["detail"], r.text
    r = _post(u, "/cancel_future", json={}, headers=H)
    assert r.status_code == 400 and "request_id" in r.json()["detail"], r.text
    base = {"tags": [], "user_metadata": {}, "sdk_version": "x"}
    sid = _post(u, "/create_session", json=base, headers=H).json()["session_id"]
    body = {"session_id": sid, "model_seq_id": 0, "base_model": "fake-tiny"}
    fut = _post(u, "/create_model", json=body, headers=H).json()["request_id"]
    r = _post(u, "/cancel_future", json={"request_id": fut}, headers=H)
    assert r.status_code == 400 and r.json()["code"] == "unsupported_option", r.text
    assert r.json()["field"] == "request_id" and "sample futures" in r.json()["detail"]
    r = _post(u, "/retrieve_future", json={"request_id": fut}, headers=H)
    assert r.status_code == 200 and "model_id" in r.json(), r.text


def test_ids_of_an_earlier_server_run(tinker_fake: TinkerServer) -> None:
    """An id made by an earlier run (another run tag; a real restart is in test_gateway.py)
    answers 404 saying the server restarted and what to do; a heartbeat answers 410 (the SDK
    stops its heartbeat loop on 410)."""
    u = tinker_fake.url
    old = "sess-0badc0de-0123456789ab"
    r = _post(u, "/get_info", json={"model_id": f"{old}:train:0"}, headers=H)
    assert r.status_code == 404 and r.json()["reason"] == "server_restarted"
    assert "restarted" in r.json()["detail"] and "ServiceClient" in r.json()["detail"]
    r = _post(u, "/retrieve_future", json={"request_id": "fut-0badc0de-ab"}, headers=H)
    assert r.status_code == 404 and r.json()["reason"] == "server_restarted"
    r = _post(u, "/session_heartbeat", json={"session_id": old}, headers=H)
    assert r.status_code == 410 and r.json()["reason"] == "server_restarted"
    r = _post(u, "/session_heartbeat", json={"session_id": "sess-nope"}, headers=H)
    assert r.status_code == 404 and "reason" not in r.json()


def test_hf_files_serve_tokenizer_files_only(tinker_embedded: TinkerServer) -> None:
    """/hf/: only the tokenizer and config files of a served model, only to a token of the
    server: never the weights, nothing outside the model directory, no other model."""
    u = tinker_embedded.url + "/hf"
    auth = {"Authorization": "Bearer " + API_KEY}
    r = requests.get(u + "/tiny-qwen2/resolve/main/tokenizer.json", headers=auth, timeout=30)
    assert r.status_code == 200 and r.headers["X-Repo-Commit"] and "model" in r.json()
    r = requests.head(u + "/tiny-qwen2/resolve/main/config.json", headers=H, timeout=30)
    assert r.status_code == 200 and int(r.headers["Content-Length"]) > 0
    for path in (
        "/tiny-qwen2/resolve/main/model.safetensors",  # weights: never
        "/tiny-qwen2/resolve/main/..%2F..%2F..%2Fetc%2Fpasswd",
        "/tiny-qwen2/resolve/main/.arctic_tiny_model.json",
        "/no-such-model/resolve/main/config.json",
        "/api/whoami-v2",
    ):
        r = requests.get(u + path, headers=auth, timeout=30)
        assert r.status_code == 404 and r.headers.get("X-Error-Code"), (path, r.status_code)
    for headers in ({}, {"Authorization": "Bearer tml-wrong"}, {"X-API-Key": "nope"}):
        r = requests.get(u + "/tiny-qwen2/resolve/main/config.json", headers=headers, timeout=30)
        assert r.status_code == 401, headers
    r = requests.get(u + "/api/models/tiny-qwen2", headers=auth, timeout=30)
    files = {s["rfilename"] for s in r.json()["siblings"]}
    assert "tokenizer.json" in files and "model.safetensors" not in files


def test_inflight_names_no_path_and_sequences_are_the_owners(tinker_fake: TinkerServer) -> None:
    from .conftest import OTHER_TOKEN

    u = tinker_fake.url
    base = {"tags": [], "user_metadata": {}, "sdk_version": "x"}
    sid = _post(u, "/create_session", json=base, headers=H).json()["session_id"]
    body = {"session_id": sid, "model_seq_id": 0, "base_model": "fake-tiny"}
    fut = _post(u, "/create_model", json=body, headers=H).json()["request_id"]
    model_id = _post(u, "/retrieve_future", json={"request_id": fut}, headers=H).json()["model_id"]
    save = {"model_id": model_id, "path": "x", "kind": "inflight", "seq_id": 1}
    r = _post(u, "/save_weights_for_sampler", json=save, headers=H)
    assert r.status_code == 400 and r.json()["field"] == "kind", r.text
    r = _post(u, "/save_weights_for_sampler", json={**save, "kind": "sometimes"}, headers=H)
    assert r.status_code == 400 and "kind" in r.json()["detail"], r.text
    other = {"X-API-Key": "tml-" + OTHER_TOKEN}
    for sequence_id in ("fut-0badc0de-00:0", "../../x", "x" * 5000):
        r = requests.get(f"{u}/api/v1/sequences/{sequence_id}", headers=other, timeout=30)
        assert r.status_code == 404, (sequence_id, r.text)
