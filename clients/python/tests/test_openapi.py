"""The client's models and paths against the OpenAPI document a real arbiter serves, so that
neither can change without the other: same fields, the server's required fields always sent
or always read, nullable exactly where the server may send null, and every path the client
calls served with its method."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any

import httpx
import pytest

from agora_client import _api, models

from conftest import Server

MODELS = [
    models.Tenant,
    models.App,
    models.LeasedGpu,
    models.Lease,
    models.ProgressAck,
    models.ThroughputAck,
    models.SpeedChange,
    models.JobPhase,
    models.SpeedChangeAck,
    models.BidAck,
    models.DrainAck,
    models.RoundSummary,
    models.ClusterGpu,
    models.Event,
    models.RegisterApp,
    models.ProgressReport,
    models.ThroughputReport,
    models.SpeedChangeReport,
    models.BidEntry,
    models.Bid,
]
REQUESTS = {
    models.RegisterApp,
    models.ProgressReport,
    models.ThroughputReport,
    models.SpeedChangeReport,
    models.BidEntry,
    models.Bid,
}
DIFFERENT_ON_PURPOSE = {
    # Events read from the SSE stream carry no time (only the long poll's rows do).
    ("Event", "at"),
}


@pytest.fixture(scope="module")
def document(server: Server) -> dict[str, Any]:
    return httpx.get(f"{server.url}/openapi.json").raise_for_status().json()


def nullable(schema: dict[str, Any]) -> bool:
    kinds = schema.get("type")
    alternatives = schema.get("oneOf", []) + schema.get("anyOf", [])
    return (
        schema.get("nullable") is True
        or (isinstance(kinds, list) and "null" in kinds)
        or any(alternative.get("type") == "null" for alternative in alternatives)
    )


def json_fields(model: type) -> dict[str, dataclasses.Field]:
    return {item.metadata.get("json", item.name): item for item in dataclasses.fields(model)}


def optional(model: type, item: dataclasses.Field) -> bool:
    hint = typing.get_type_hints(model)[item.name]
    return type(None) in typing.get_args(hint)


def has_default(item: dataclasses.Field) -> bool:
    return item.default is not dataclasses.MISSING or item.default_factory is not dataclasses.MISSING


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_the_model_matches_its_schema(document: dict[str, Any], model: type) -> None:
    schema = document["components"]["schemas"][model.SCHEMA]
    properties: dict[str, Any] = schema["properties"]
    required = set(schema.get("required", []))
    fields = json_fields(model)
    assert set(fields) == set(properties), f"{model.__name__} vs {model.SCHEMA}"
    for name, item in fields.items():
        if (model.__name__, name) in DIFFERENT_ON_PURPOSE:
            continue
        if model in REQUESTS:
            check_request_field(model, name, item, properties[name], name in required)
        else:
            check_answer_field(model, name, item, properties[name], name in required)


def check_request_field(
    model: type, name: str, item: dataclasses.Field, schema: dict, required: bool
) -> None:
    """What the server requires is always sent; a field sent as null must be nullable; one left
    out when unset (an optional field defaulting to None) must not be required."""
    if required:
        assert not has_default(item), f"{model.__name__}.{name} is required by the server"
    sends_null = optional(model, item) and not item.metadata.get("omit_none", True)
    if sends_null:
        assert nullable(schema), f"{model.__name__}.{name} is sent as null"
    elif optional(model, item):
        assert not required, f"{model.__name__}.{name} is left out when unset"


def check_answer_field(model: type, name: str, item: dataclasses.Field, schema: dict, required: bool) -> None:
    """What the server always sends (required, or nullable: sent as null) is read without a
    default, and may be None exactly when the server may send null."""
    assert (required or nullable(schema)) == (not has_default(item)), f"{model.__name__}.{name} presence"
    assert nullable(schema) == optional(model, item), f"{model.__name__}.{name} nullability"


def calls() -> list[_api.Call[Any]]:
    return [
        _api.create_tenant("t"),
        _api.register_app(models.RegisterApp("a", models.SingleJob(models.Job("j", 1, 1.0)))),
        _api.list_apps(),
        _api.get_app(1),
        _api.report_progress(1, []),
        _api.report_throughput(1, "h100", 1.0),
        _api.report_speed_change(1, "j", 1, 1.0),
        _api.finish_app(1),
        _api.app_leases(1),
        _api.why(1),
        _api.poll_events(1, 0, 1),
        _api.Call("GET", _api.events_path(1), dict),
        _api.submit_bid(1, models.Bid(1, None, []), None),
        _api.list_rounds(None, None),
        _api.get_round(1),
        _api.release_lease(1),
        _api.cluster(),
        _api.drain_gpu("m0-g0"),
        _api.restore_gpu("m0-g0"),
    ]


@pytest.mark.parametrize("call", calls(), ids=lambda call: f"{call.method} {call.path}")
def test_every_call_of_the_client_is_served(document: dict[str, Any], call: _api.Call[Any]) -> None:
    served = [
        path
        for path, methods in document["paths"].items()
        if call.method.lower() in methods and re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", path), call.path)
    ]
    assert served, f"{call.method} {call.path} is not in /openapi.json"
    operation = document["paths"][served[0]][call.method.lower()]
    for name in call.params:
        assert name in {parameter["name"] for parameter in operation.get("parameters", [])}, name
