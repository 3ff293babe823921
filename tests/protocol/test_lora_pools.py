"""LoRA pool rules (serving/lora_pools.py) and the per-tenant queue of a pool's worker
(engines/worker/tenant_queue.py), without engines."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import pytest

from arctic_servers.engines.config import canonical_model_name
from arctic_servers.engines.worker.engine_base import WEIGHT_GROUP_CMDS, no_weight_group
from arctic_servers.engines.worker.tenant_queue import TenantQueue, tenant_of
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.serving.collective_sync import Placement, pick_method
from arctic_servers.serving.lora_pools import (
    PoolBook,
    PoolPolicy,
    PoolRecord,
    add_pool_arguments,
    key_id,
    lora_support_json,
    policy_from_args,
    pool_key,
    syncs_adapter,
)
from arctic_servers.serving.lora_sync import check_lora_sync, lora_method

LORA = {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj"], "train_lm_head": False}


@dataclass
class Sub:
    role: str
    model_name: str = ""
    dtype: str = "float32"
    seed: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    n_gpus: int = 1


def job(train: dict[str, Any] | None = None, *rest: Sub, model: str = "") -> list[Sub]:
    conf = {"optimizer": {"name": "adamw", "lr": 1e-3}, "lora": dict(LORA), **(train or {})}
    return [Sub("training", model, config=conf), *rest]


POLICY = PoolPolicy(models={"*": 2})


def key(subs: list[Sub], policy: PoolPolicy = POLICY) -> dict[str, Any] | None:
    return pool_key(subs, policy, canonical_model_name)[0]


def test_poolable_jobs_share_a_key_whatever_their_own_settings() -> None:
    a = key(job({"optimizer": {"name": "sgd", "lr": 1.0}, "micro_batch_size": 2}, Sub("sampling")))
    b = key(
        job(
            {"lr_scheduler": {"type": "cosine"}, "lora": {**LORA, "rank": 32, "dropout": 0.1}},
            Sub("sampling", "tiny"),
            model="tiny-qwen2",
        )
    )
    c = key(job())  # training only: the same pool (its sampler slot stays unused)
    assert a is not None and a == b == c and key_id(a) == key_id(c)


@pytest.mark.parametrize(
    ("subs", "why"),
    [
        ([Sub("training", config={"optimizer": {}})], "not a LoRA job"),
        (job({"deepspeed": {"zero_optimization": {"stage": 1}}}), "deepspeed"),
        (job({"zero_stage": 3}), "ZeRO-3"),
        (job({"checkpoint_path": "/x"}), "checkpoint_path"),
        (job({"lora": {**LORA, "rank": 128}}), "rank"),
        (job(None, Sub("log_prob")), "log-prob"),
        (job(None, Sub("sampling"), Sub("sampling")), "one sampler"),
        (job(None, Sub("sampling", config={"vllm_config": {}})), "vllm_config"),
        (job(None, Sub("sampling", model_name="/other")), "differ"),
    ],
)
def test_jobs_a_shared_engine_cannot_serve_get_their_own(subs: list[Sub], why: str) -> None:
    got, reason = pool_key(subs, POLICY, canonical_model_name)
    assert got is None and why in reason, reason


def test_shared_settings_split_pools() -> None:
    base = key(job())
    assert key(job({"attn_implementation": "sdpa"})) != base
    assert key(job(None, Sub("sampling", config={"max_seq_len": 256}))) != base
    assert key(job(None, Sub("sampling", seed=5))) != base
    assert key(job(), PoolPolicy(models={"other": 4})) is None  # its model is not pooled
    assert key(job(model="tiny"), PoolPolicy(models={"tiny-qwen2": 4})) is not None


def test_the_book_reserves_up_to_the_limit_and_refuses_retryably() -> None:
    book: PoolBook[PoolRecord] = PoolBook(
        POLICY, lambda pid, k, n: PoolRecord(pid, k, n, 64), canonical_model_name
    )
    k = key(job())
    assert k is not None
    p = book.reserve("j1", k)
    assert book.reserve("j2", k) is p and book.reserve("j1", k) is p  # idempotent
    with pytest.raises(ProtocolError) as e:
        book.reserve("j3", k)
    assert e.value.code == "rate_limited" and e.value.http_status == 429
    assert e.value.details["limit"] == 2 and e.value.details["pool"] == p.pool_id
    assert e.value.details["retry_after_s"] > 0
    assert book.release("j1") is p and p.tenants == ["j2"] and not p.idle_since
    assert book.reserve("j3", k) is p
    book.release("j2")
    book.release("j3")
    assert p.idle_since > 0 and book.idle(p.idle_since + 1e9) == [p]
    caps = lora_support_json({"training": True}, book)
    assert caps["shared_sampler"] is True
    assert {r["base_model"]: r["adapters"] for r in caps["pools"]} == {"*": 0, "": 0}


def test_a_pooled_lm_head_job_syncs_its_adapter() -> None:
    lm = {**LORA, "train_lm_head": True}
    assert syncs_adapter(lm, pooled=True) and not syncs_adapter(lm, pooled=False)
    assert syncs_adapter(LORA, pooled=False) and not syncs_adapter(None, pooled=True)
    no_embeddings = PoolPolicy(models={"*": 2}, embeddings=False)
    assert key(job({"lora": lm}), no_embeddings) is None


def test_a_pooled_job_syncs_by_file_or_blob_never_a_weight_group() -> None:
    """Where `auto` picks the weight group for a job with its own engines (one CPU host, or
    across hosts), a pooled job's sync is the /dev/shm file on one host and the blob across
    hosts; `collective` / `nccl` asked by name are refused naming the field and the pool; a
    job with its own engines keeps every method (issue 33's collective sync)."""
    one_host = Placement(cuda=False, same_host=True, shm=True)
    two_hosts = Placement(cuda=False, same_host=False, shm=True)
    assert pick_method(None, one_host) == pick_method(None, two_hosts) == "collective"
    assert lora_method("collective", True, pooled=True, same_host=True) == "shm"
    assert lora_method("collective", True, pooled=True, same_host=False) == "safetensors"
    assert lora_method("collective", False, pooled=True, same_host=True) == "safetensors"
    assert lora_method("cuda_ipc", True, pooled=True) == "shm"
    assert lora_method("safetensors", True, pooled=True) == "safetensors"
    assert lora_method("collective", True) == "collective"  # its own engines: as issue 33
    assert lora_method("cuda_ipc", False) == "collective"
    for m in ("auto", "shm", "safetensors", None):
        check_lora_sync(None, {"method": m}, "payload.", "pool-abc")
    for m in ("collective", "NCCL"):
        check_lora_sync(None, {"method": m}, "payload.", "")  # its own engines: accepted
        with pytest.raises(ProtocolError) as e:
            check_lora_sync(None, {"method": m}, "payload.", "pool-abc")
        assert e.value.code == "unsupported_option"
        assert e.value.details["field"] == "payload.method" and "pool-abc" in e.value.message
    # the pool engines refuse the weight-group commands by name too
    assert "send_weights" in WEIGHT_GROUP_CMDS and "weight_group_join" in WEIGHT_GROUP_CMDS
    with pytest.raises(Exception) as w:
        no_weight_group("sampler")(group_id="g", tenant="t")
    assert getattr(w.value, "code", "") == "unsupported_option"


def test_pool_flags() -> None:
    ap = argparse.ArgumentParser()
    add_pool_arguments(ap)
    policy = policy_from_args(ap.parse_args(["--lora-pool", "tiny", "--lora-pool", "*=3"]))
    assert dict(policy.models) == {"tiny": 16, "*": 3} and policy.enabled
    assert not policy_from_args(ap.parse_args([])).enabled
    with pytest.raises(SystemExit):
        policy_from_args(ap.parse_args(["--lora-pool", "tiny=x"]))


def test_tenants_are_served_in_turn_each_in_its_own_order() -> None:
    q: TenantQueue[str] = TenantQueue()
    for i in range(5):
        q.push("busy", f"b{i}")
    q.push("occasional", "o0")
    q.push("busy", "b5")
    q.push("third", "t0")
    order = [q.pop() for _ in range(len(q))]
    assert order == ["b0", "o0", "t0", "b1", "b2", "b3", "b4", "b5"]
    # one tenant: arrival order, as before pools
    q.push("", "x")
    q.push("", "y")
    assert [q.pop(), q.pop()] == ["x", "y"] and not q
    q.push("a", "1")
    q.push("b", "2")
    assert q.remove_if(lambda x: x == "1") == ["1"] and q.waiting() == {"b": 1}
    assert tenant_of({"tenant": "a"}) == "a" and tenant_of({}) == "" and tenant_of(None) == ""
