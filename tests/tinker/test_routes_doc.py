"""ROUTES.md against the code and the SDK: every route it says is served is in the route
table and every route of the table is in it; every route the `tinker` 0.38 SDK can call is in
it; every field of the SDK's request bodies has its row; a route it says is not served
answers 404 naming it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests
import tinker
import tinker.types as T
from tinker.proto import tinker_public_pb2 as pb

from arctic_servers.tinker.route_table import ROUTES

from .conftest import API_KEY, TinkerServer

DOC = Path(__file__).resolve().parents[2] / "servers/arctic_servers/tinker/ROUTES.md"
STATUSES = {"served", "refused", "n/a", "not served"}
ROW = re.compile(r"^\| (GET|POST|PUT|DELETE) (/\S*) \| ([^|]*) \| ([^|]*) \|")


def _norm(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def rows() -> list[tuple[str, str, list[str], str]]:
    """(method, path, fields, status) of each row of the table."""
    out = []
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            method, path, fields, status = m.groups()
            names = [f.strip() for f in fields.split(",") if f.strip() not in ("", "—")]
            out.append((method, path, names, status.strip()))
    return out


def test_every_row_has_a_status() -> None:
    table = rows()
    assert len(table) > 80
    bad = [(m, p, s) for m, p, _, s in table if s not in STATUSES]
    assert not bad, bad


def test_served_routes_are_the_route_table() -> None:
    doc = {(m, _norm(p)) for m, p, _, s in rows() if s != "not served"}
    code = {(m, _norm(p)) for m, p, _ in ROUTES if m != "*"}
    assert doc == code, {"in ROUTES.md only": doc - code, "in route_table.py only": code - doc}


def test_every_sdk_route_is_listed() -> None:
    root = Path(tinker.__file__).parent
    sdk = set()
    for f in [*root.glob("resources/*.py"), *root.glob("lib/**/*.py")]:
        for p in re.findall(r'f?"/api/v1(/[^"]*)"', f.read_text()):
            if "test-session" not in p:
                sdk.add(_norm(p))
    assert len(sdk) > 30
    doc = {_norm(p) for _, p, _, _ in rows()}
    assert sdk <= doc, sorted(sdk - doc)


def _covered(route: str, field: str) -> bool:
    names = {n for m, p, fields, _ in rows() if f"{m} {p}" == route for n in fields}
    return field in names or any(n.startswith(field + ".") for n in names)


BODIES = {
    "POST /client/config": (T.ClientConfigRequest, ""),
    "POST /create_session": (T.CreateSessionRequest, ""),
    "POST /session_heartbeat": (T.SessionHeartbeatRequest, ""),
    "POST /telemetry": (T.TelemetrySendRequest, ""),
    "POST /create_model": (T.CreateModelRequest, ""),
    "POST /get_info": (T.GetInfoRequest, ""),
    "POST /optim_step": (T.OptimStepRequest, ""),
    "POST /save_weights": (T.SaveWeightsRequest, ""),
    "POST /save_weights_for_sampler": (T.SaveWeightsForSamplerRequest, ""),
    "POST /load_weights": (T.LoadWeightsRequest, ""),
    "POST /create_sampling_session": (T.CreateSamplingSessionRequest, ""),
    "POST /asample": (T.SampleRequest, ""),
    "POST /retrieve_future": (T.FutureRetrieveRequest, ""),
}
NESTED = {
    "POST /optim_step": (T.AdamParams, "optim_params."),
    "POST /create_model": (T.LoraConfig, "lora_config."),
    "POST /asample": (T.SamplingParams, "sampling_params."),
}


@pytest.mark.parametrize("route", sorted(BODIES))
def test_every_field_of_the_sdks_bodies_has_its_row(route: str) -> None:
    model, _ = BODIES[route]
    fields = [f for f in model.model_fields if f != "type"]
    if route in NESTED:
        nested, prefix = NESTED[route]
        fields += [prefix + f for f in nested.model_fields if f != "type"]
    missing = [f for f in fields if not _covered(route, f)]
    assert not missing, (route, missing)


def test_every_field_of_forward_backward_has_its_row() -> None:
    fields = [f.name for f in pb.ForwardBackwardRequest.DESCRIPTOR.fields]
    fields += ["data." + f.name for f in pb.Datum.DESCRIPTOR.fields]
    missing = [f for f in fields if not _covered("POST /forward_backward", f)]
    assert not missing, missing


def test_routes_not_served_answer_404_naming_them(tinker_fake: TinkerServer) -> None:
    for method, path, _, status in rows():
        if status != "not served":
            continue
        url = tinker_fake.url + "/api/v1" + re.sub(r"\{[^}]*\}", "x", path)
        r = requests.request(method, url, json={}, headers={"X-API-Key": API_KEY}, timeout=30)
        assert r.status_code == 404 and r.json()["code"] == "not_found", (method, path, r.text)
        assert r.json()["route"].startswith("/api/v1/"), r.text
