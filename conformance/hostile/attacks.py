"""The attack classes of issue 14, re-run against any arctic.v1 server from outside.

Each attack sends one hostile input and records a `Finding`: it passes when the server refused
it with a 4xx (gRPC: a non-server status) carrying the spec's error body and a code of
errors.proto — never a 5xx, never an accepted call — and, for the checkpoint attacks, when the
victim (another token's checkpoint, a directory outside the data dir) is still there afterwards.
"""

from __future__ import annotations

import math
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import dssst1
from arctic_sdk.spec.tables import methods as M

from .ids import ids
from .run import Finding, Run, Target, finish, routes, start
from .wire import OCTET, http_answer, path_of, with_header_text

# ---------------------------------------------------------------------------- 1. checkpoints


def checkpoints(run: Run) -> None:
    """Token B reaches for token A's checkpoint and for a directory outside the data dir through
    every checkpoint route and both transports; both must survive."""
    if not {
        m.name for m in (M.SAVE_CHECKPOINT, M.DELETE_CHECKPOINT, M.EXPORT_CHECKPOINT)
    } <= routes(run):
        run.note("checkpoint/setup", "http", "")
        return
    saved = run.a.wait(
        run.job_a, run.a.call(M.SAVE_CHECKPOINT, {"checkpoint_id": "victim"}, job=run.job_a)
    )
    assert saved.body.get("status") == "completed", f"the victim was not saved: {saved.body}"
    sentinel = Path(tempfile.mkdtemp(prefix="arctic-hostile-"))
    (sentinel / "meta.json").write_text("{}")
    victim = f"../{run.job_a}/victim"
    ids = {
        "dotdot-job": victim,
        "dotdot-deep": "../" * 16 + str(sentinel).lstrip("/"),
        "absolute": str(sentinel),
        "backslash": victim.replace("/", "\\"),
        "dot": ".",
        "dotdot": "..",
        "nul": "victim\x00",
        "too-long": "a" * 129,
        "space": "vic tim",
        "non-ascii": "vîctim",
        "hidden": ".victim",
    }
    for name, bad in ids.items():
        _checkpoint_routes(run, f"checkpoint/{name}", bad)
    body = {"checkpoint_id": "victim", "source_job_id": run.job_a}
    run.check(
        "checkpoint/load-another-tokens-job",
        run.b.wait(run.job_b, run.b.call(M.LOAD_CHECKPOINT, body, job=run.job_b)),
    )
    for name, bad in {"dotdot": "../meta.json", "absolute": "/etc/passwd", "dot": "."}.items():
        run.check(
            f"checkpoint/filename-{name}",
            run.b.call(
                M.DOWNLOAD_CHECKPOINT_FILE, job=run.job_b, checkpoint_id="victim", filename=bad
            ),
        )
    if run.gb is not None:
        run.check(
            "checkpoint/load-another-tokens-job", run.gb.frames(M.LOAD_CHECKPOINT, run.job_b, body)
        )
    listed = run.a.wait(run.job_a, run.a.call(M.LIST_CHECKPOINTS, job=run.job_a))
    names = [
        c.get("checkpoint_id") for c in (listed.body.get("result") or {}).get("checkpoints", [])
    ]
    run.note("checkpoint/victim-survives", "both", "" if "victim" in names else f"gone: {names}")
    alive = (sentinel / "meta.json").is_file()
    run.note("checkpoint/outside-dir-survives", "both", "" if alive else f"{sentinel} was deleted")


def _checkpoint_routes(run: Run, attack: str, bad: str) -> None:
    b, job = run.b, run.job_b
    for method, extra in (
        (M.EXPORT_CHECKPOINT, {}),
        (M.DELETE_CHECKPOINT, {}),
        (M.DOWNLOAD_CHECKPOINT_FILE, {"filename": "config.json"}),
    ):
        ans = b.send(method.http_method, path_of(method, job_id=job, checkpoint_id=bad, **extra))
        run.check(f"{attack}/{method.name}", b.wait(job, ans))
    for method in (M.SAVE_CHECKPOINT, M.LOAD_CHECKPOINT):
        run.check(
            f"{attack}/{method.name}", b.wait(job, b.call(method, {"checkpoint_id": bad}, job=job))
        )
    if run.gb is not None:
        for method in (
            M.EXPORT_CHECKPOINT,
            M.DELETE_CHECKPOINT,
            M.DOWNLOAD_CHECKPOINT_FILE,
            M.SAVE_CHECKPOINT,
            M.LOAD_CHECKPOINT,
        ):
            body: dict[str, Any] = {"checkpoint_id": bad}
            if method is M.DOWNLOAD_CHECKPOINT_FILE:
                body["filename"] = "config.json"
            run.check(f"{attack}/{method.name}", run.gb.frames(method, job, body))


# ---------------------------------------------------------------------------- 2-3. inputs


def _config(**training: Any) -> dict[str, Any]:
    return {
        "sub_job_configs": [
            {"job_type": "training", "model_name": "m", "training_config": training}
        ]
    }


def json_bodies(run: Run) -> None:
    """JSON that parsed into something no field can hold: deep nesting, lone surrogates,
    non-finite and oversized numbers, too many sub-jobs."""
    a, b, jb = run.a, run.b, run.job_b
    deep = "[" * 100_000 + "]" * 100_000
    nan_lr = (
        '{"sub_job_configs": [{"job_type": "training", "model_name": "m", '
        '"training_config": {"optimizer": {"name": "adamw", "lr": NaN}}}]}'
    )
    create_raw: dict[str, str | bytes] = {
        "deep": '{"sub_job_configs": ' + deep + "}",
        "surrogate-key": '{"\\ud800": 1}',
        "surrogate-value": '{"experiment_name": "\\udfff"}',
        "nan-lr": nan_lr,
        "inf-lr": nan_lr.replace("NaN", "1e999"),
        "lr-400-digits": nan_lr.replace("NaN", "1" + "0" * 400),
        "gradient-clipping-nan": nan_lr.replace('"optimizer"', '"gradient_clipping": NaN, "o"'),
        "seed-2^63": '{"sub_job_configs": [{"job_type": "training", "model_name": "m", '
        '"seed": 9223372036854775808}]}',
        "not-utf8": b'{"comment": "\xff\xfe"}',
    }
    for name, text in create_raw.items():
        data = text if isinstance(text, bytes) else text.encode()
        run.check(
            f"json/create-job/{name}",
            a.send("POST", "/", data=data, headers={"Content-Type": "application/json"}),
        )
    many = {"sub_job_configs": [{"job_type": "sampling", "model_name": "m"}] * 1000}
    run.check("json/create-job/1000-sub-jobs", a.call(M.CREATE_JOB, many))
    step_raw = {
        "deep": '{"learning_rate": ' + deep + "}",
        "surrogate-key": '{"\\ud800": 1}',
        "lr-400-digits": '{"learning_rate": 1' + "0" * 400 + "}",
        "lr-nan": '{"learning_rate": NaN}',
        "lr-infinity": '{"learning_rate": Infinity}',
    }
    for name, text in step_raw.items():
        ans = b.send(
            "POST",
            path_of(M.STEP, job_id=jb),
            data=text.encode(),
            headers={"Content-Type": "application/json"},
        )
        run.check(f"json/step/{name}", b.wait(jb, ans))
    ans = b.send(
        "POST",
        path_of(M.STEP, job_id=jb),
        data=b"\x78\x9cgarbage-not-deflate",
        headers={"Content-Type": "application/json", "Content-Encoding": "deflate"},
    )
    run.check("body/garbage-deflate", ans)
    if run.target.openai_url:
        for name, text in (
            ("deep", '{"messages": ' + deep + "}"),
            ("surrogate-key", '{"\\ud800": 1}'),
        ):
            ans = a.send(
                "POST",
                "/v1/chat/completions",
                data=text.encode(),
                base=run.target.openai_url,
                headers={"Content-Type": "application/json"},
            )
            run.check(f"openai/chat/{name}", ans, openai=True)
        model = (a.send("GET", "/v1/models", base=run.target.openai_url).body.get("data") or [{}])[
            0
        ]
        body = {"model": model.get("id", ""), "tokens": [10**12, -5]}
        run.check(
            "openai/detokenize/out-of-range",
            a.send("POST", "/detokenize", json_body=body, base=run.target.openai_url),
            openai=True,
        )


def headers(run: Run) -> None:
    """Protocol headers outside printable ASCII, over their length, or out of range."""
    b, jb = run.b, run.job_b
    auth = {"Authorization": "Bearer \xe9\xe8".encode("latin-1")}
    run.check(
        "header/authorization-latin1", b.send("GET", path_of(M.GET_JOB, job_id=jb), headers=auth)
    )
    auth = {"Authorization": "Bearer éè".encode()}
    run.check(
        "header/authorization-utf8", b.send("GET", path_of(M.GET_JOB, job_id=jb), headers=auth)
    )
    bad: dict[str, dict[str, str | bytes]] = {
        "idempotency-key-non-ascii": {"Idempotency-Key": "é".encode()},
        "idempotency-key-256": {"Idempotency-Key": "k" * 256},
        "seq-2^63": {"X-Arctic-Seq": str(2**63)},
        "seq-plus": {"X-Arctic-Seq": "+1"},
        "seq-arabic-digit": {"X-Arctic-Seq": "١".encode()},
        "sub-job-non-ascii": {"X-Arctic-Sub-Job": "é".encode()},
    }
    for name, h in bad.items():
        run.check(f"header/{name}", b.call(M.STEP, {}, job=jb, headers=h))
    if run.gb is not None:
        for name, md in (
            ("idempotency-key-256", {"idempotency-key": "k" * 256}),
            ("seq-2^63", {"x-arctic-seq": str(2**63)}),
        ):
            run.check(f"header/{name}", run.gb.frames(M.STEP, jb, {}, md=md))


def dssst1_bodies(run: Run) -> None:
    """DSSST1 values no field can hold: a lone surrogate in a tree key, non-finite scalars."""
    b, jb = run.b, run.job_b
    ids = np.full((1, 4), 65, dtype=np.int64)
    frame = bytes(dssst1.dumps({"kwargs": {"input_ids": ids}, "zz": 1}))
    bad_key = with_header_text(frame, b'\\"zz\\"', b'\\"\\\\ud800\\"')
    run.check("dssst1/surrogate-tree-key", b.wait(jb, b.frame(M.FORWARD_BACKWARD, jb, bad_key)))
    gen = {"prompts": [[65, 66]], "sampling_params": {"max_tokens": 2}}
    for name, key, val in (
        ("temperature-nan", "temperature", math.nan),
        ("top-p-infinity", "top_p", math.inf),
    ):
        value = {**gen, "sampling_params": {"max_tokens": 2, key: val}}
        run.check(
            f"dssst1/generate-{name}",
            b.wait(jb, b.frame(M.GENERATE, jb, bytes(dssst1.dumps(value)))),
        )
        if run.gb is not None:
            run.check(f"dssst1/generate-{name}", run.gb.frames(M.GENERATE, jb, value))
    if run.gb is not None:
        run.check("dssst1/step-lr-nan", run.gb.frames(M.STEP, jb, {"learning_rate": math.nan}))
        step = bytes(dssst1.dumps({"zz": 1}))
        run.check(
            "dssst1/step-surrogate-key",
            run.gb.frames(
                M.STEP, jb, frame=with_header_text(step, b'\\"zz\\"', b'\\"\\\\ud800\\"')
            ),
        )


# ---------------------------------------------------------------------------- HTTP itself

_PARSER = {
    "duplicate-content-length": "POST {p}/ HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    "Content-Length: 3\r\n\r\n{{}}",
    "bad-content-length": "POST {p}/ HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n{{}}",
    "content-length-and-chunked": "POST {p}/ HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "bad-chunk-size": "POST {p}/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    "zz\r\n{{}}\r\n0\r\n\r\n",
    "control-character": "GET {p}/capabilities HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
    "oversized-header": "GET {p}/capabilities HTTP/1.1\r\nHost: x\r\nX-A: "
    + "a" * 20000
    + "\r\n\r\n",
    "too-many-headers": "GET {p}/capabilities HTTP/1.1\r\nHost: x\r\n"
    + "".join(f"X-{i}: 1\r\n" for i in range(300))
    + "\r\n",
    "bad-version": "GET {p}/capabilities HTTP/9.9\r\nHost: x\r\n\r\n",
}


def http_parser(run: Run) -> None:
    """Requests aiohttp's own parser refuses: still the spec's error body."""
    for name, text in _PARSER.items():
        raw, _ = run.a.raw(text.format(p=run.a.path).encode())
        run.check(f"http/{name}", http_answer(raw))


def slow_clients(run: Run, n: int = 20) -> None:
    """Half a request's headers on `n` connections, and half a body: closed / 408 in time."""
    lim = run.limits
    header_s = float(lim.get("header_read_timeout_seconds") or 0)
    body_s = float(lim.get("body_read_timeout_seconds") or 0)
    if not 0 < header_s <= 60 or not 0 < body_s <= 60:
        run.note(
            "slow/skipped", "http", "" if header_s and body_s else "read timeouts not advertised"
        )
        return
    import concurrent.futures as cf

    half = f"GET {run.a.path}/capabilities HTTP/1.1\r\nHost: x\r\n".encode()
    with cf.ThreadPoolExecutor(n) as pool:
        held = list(pool.map(lambda _: run.a.raw(half, wait=header_s + 10)[1], range(n)))
    late = [round(t, 1) for t in held if t > header_s + 5]
    run.note("slow/half-headers", "http", f"held open {late} s (limit {header_s})" if late else "")
    body = (
        f"POST {run.a.path}/{run.job_b}/step HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        f"{run.target.alt_token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
        "\r\n{"
    ).encode()
    raw, took = run.a.raw(body, wait=body_s + 10)
    ans = http_answer(raw)
    run.check("slow/half-body", ans)
    if ans.code != "request_timeout" or took > body_s + 5:
        run.note(
            "slow/half-body-timeout", "http", f"{ans.code} after {took:.1f} s (limit {body_s})"
        )


# ---------------------------------------------------------------------------- memory


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def chunk_memory(run: Run, groups: int = 8) -> None:
    """A burst of chunk 0s that each declare a 256 MiB frame (or the per-job budget, if smaller)
    of 64 KiB chunks but carry one:
    the server must hold what arrived (plus bookkeeping), not what was declared."""
    lim = run.limits
    size = min(256 << 20, int(lim.get("max_open_chunk_bytes_per_job") or 256 << 20))
    payload = bytes(64 << 10)
    before = _rss(run.target.server_pid) if run.target.server_pid else 0
    answers = []
    for _ in range(groups):
        chunk = _chunk0(payload, size, size // len(payload))
        answers.append(
            run.b.send(
                "POST",
                path_of(M.FORWARD_BACKWARD, job_id=run.job_b),
                data=chunk,
                headers={"Content-Type": OCTET},
            )
        )
    bad = [
        a
        for a in answers
        if not (a.status == 200 and isinstance(a.body, dict) and a.body.get("chunk_cached"))
        and a.code != "rate_limited"
    ]
    run.note("memory/burst-answers", "http", f"{len(bad)} unexpected: {bad[0]}" if bad else "")
    if run.target.server_pid:
        grew = _rss(run.target.server_pid) - before
        bound = groups * (len(payload) * 3 + (16 << 10)) + (48 << 20)
        run.note(
            "memory/burst-rss",
            "http",
            f"RSS grew {grew >> 20} MiB > bound {bound >> 20} MiB" if grew > bound else "",
        )
    budget = int(lim.get("max_open_chunk_bytes_per_job") or 0)
    if budget:
        run.check(
            "memory/declared-over-budget",
            run.b.send(
                "POST",
                path_of(M.FORWARD_BACKWARD, job_id=run.job_b),
                data=_chunk0(payload, budget + 1, 4096),
                headers={"Content-Type": OCTET},
            ),
        )


def _chunk0(payload: bytes, frame_size: int, total: int) -> bytes:
    desc = {
        "request_chunk": {
            "chunk_group_id": str(uuid.uuid4()),
            "chunk_idx": 0,
            "total_chunks": total,
            "frame_size_bytes": frame_size,
            "frame_sha256": "0" * 64,
            "operation": M.FORWARD_BACKWARD.name,
        }
    }
    value = {"payload": np.frombuffer(payload, dtype=np.uint8)}
    return bytes(dssst1.dumps(value, metadata=desc))


ATTACKS: dict[str, Callable[[Run], None]] = {
    "checkpoints": checkpoints,
    "ids": ids,
    "json": json_bodies,
    "headers": headers,
    "dssst1": dssst1_bodies,
    "http": http_parser,
    "slow": slow_clients,
    "memory": chunk_memory,
}


def run_all(target: Target, only: list[str] | None = None) -> Iterator[Finding]:
    """Every attack class (or `only` those), as they finish."""
    run = start(target)
    try:
        for name, attack in ATTACKS.items():
            if only and name not in only:
                continue
            n = len(run.findings)
            try:
                attack(run)
            except Exception as exc:  # an attack that could not run is a finding of its own
                run.note(f"{name}/crashed", "-", f"{type(exc).__name__}: {exc}")
            yield from run.findings[n:]
    finally:
        finish(run)


__all__ = ["ATTACKS", "Finding", "Target", "run_all"]
