"""Readers of body fields whose meaning the servers share beyond their proto type.

Their bounds are the spec's (`(arctic.v1.field)` `ge`/`le`, checked on arrival by the protocol
layer from `arctic_sdk.spec.tables.request_rules`), so these only read a checked body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def learning_rate(body: Mapping[str, Any]) -> float | None:
    """`StepRequest.learning_rate`: None when absent (the schedule's), else the number (>= 0;
    0 steps without changing the weights: an lr = 0 control run)."""
    v = body.get("learning_rate")
    return None if v is None else float(v)


ADAM_KEYS = ("beta1", "beta2", "eps", "weight_decay", "gradient_clipping")


def step_args(body: Mapping[str, Any]) -> dict[str, Any]:
    """A StepRequest's engine arguments: `learning_rate` (None = the schedule's) and, when the
    body sets any, `adam` {key: number} with only the keys it sets (`AdamParams`; the bounds
    were checked on arrival)."""
    out: dict[str, Any] = {"learning_rate": learning_rate(body)}
    adam = body.get("adam") or {}
    given = {k: float(adam[k]) for k in ADAM_KEYS if adam.get(k) is not None}
    if given:
        out["adam"] = given
    return out


def min_p(sampling_params: Mapping[str, Any]) -> float | None:
    """`SamplingParams.min_p`: None when absent, else the number (in [0, 1]; 0 = off)."""
    v = sampling_params.get("min_p")
    return None if v is None else float(v)
