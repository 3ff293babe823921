"""Tinker's protobuf bodies, decoded and encoded with the `tinker` package's own generated
module (`tinker.proto.tinker_public_pb2`, the schema the SDK itself uses; nothing re-typed).

`forward_backward` arrives as a `ForwardBackwardRequest` (zstd-compressed when the server's
`/client/config` asks for it; aiohttp decodes it); the
results of `forward_backward`/`forward` and `asample` must be protobuf (`ForwardBackwardOutput`,
`SampleResponse`): the 0.38 SDK refuses JSON for them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from .errors import TinkerError

__all__ = [
    "Datum",
    "FwdBwd",
    "decode_forward_backward",
    "encode_output",
    "encode_sample",
    "sequenced",
]

_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass
class Datum:
    tokens: np.ndarray  # int64 [N]: the model input
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # loss_fn_inputs, each [N]


@dataclass
class FwdBwd:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def _tensor(name: str, t: Any) -> np.ndarray:
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise TinkerError(400, f"loss_fn_inputs[{name!r}] has dtype {t.dtype}", "invalid_argument")
    if t.HasField("sparse_csr"):
        raise TinkerError(
            400,
            f"loss_fn_inputs[{name!r}] is a sparse CSR tensor; this server takes dense tensors "
            "(pass 1-D lists or arrays)",
            "unsupported_option",
        )
    raw = t.dense
    if len(raw) % np.dtype(dtype).itemsize:
        raise TinkerError(400, f"loss_fn_inputs[{name!r}] has a ragged byte length", "bad_tensor")
    arr = np.frombuffer(raw, dtype=dtype)
    shape = [int(s) for s in t.shape] or [arr.size]
    if len(shape) != 1 or shape[0] != arr.size:
        raise TinkerError(
            400,
            f"loss_fn_inputs[{name!r}] has shape {shape} ({arr.size} values); expected one "
            "value per model-input token, shape [N]",
            "shape_mismatch",
        )
    return arr


def _tokens(msg: Any, i: int) -> np.ndarray:
    parts = []
    for c in msg.model_input:
        kind = c.WhichOneof("chunk") or "empty"
        if kind != "encoded_text":
            raise TinkerError(
                400,
                f"data[{i}].model_input holds a {kind} chunk; this server takes encoded_text "
                "chunks only (text models)",
                "unsupported_option",
            )
        if len(c.encoded_text.tokens) % 4:
            raise TinkerError(400, f"data[{i}] tokens have a ragged byte length", "bad_tensor")
        parts.append(np.frombuffer(c.encoded_text.tokens, dtype=np.int32))
    if not parts:
        raise TinkerError(400, f"data[{i}].model_input is empty", "invalid_argument")
    return np.concatenate(parts).astype(np.int64)


def _check_spans(d: Any, i: int, n: int) -> None:
    """Provenance spans (which tokens came from which prompt / sample; the cookbook's RL sends
    them with every loss): bounds-checked; only stable_reinforce reads them, and that loss is
    refused (`losses.py`), so the served losses compute the same with or without them."""
    for name in ("model_input_spans", "loss_fn_input_spans"):
        for j, span in enumerate(getattr(d, name)):
            kind = span.WhichOneof("span")
            inner = getattr(span, kind) if kind else None
            if (
                inner is None
                or inner.offset < 0
                or inner.length < 0
                or (inner.offset + inner.length > n)
            ):
                where = f"data[{i}].{name}[{j}]"
                raise TinkerError(
                    400,
                    f"{where} = {kind} offset {getattr(inner, 'offset', '?')} length "
                    f"{getattr(inner, 'length', '?')}: expected a span inside the datum's "
                    f"{n} tokens",
                    "invalid_argument",
                    field=where,
                )


def decode_forward_backward(body: bytes) -> FwdBwd:
    """`body` as read by `RouteBase.body`: already decoded from its Content-Encoding (zstd when
    `/client/config` turned `proto_compress_fwdbwd` on) and bounded."""
    if not body:
        raise TinkerError(400, "the ForwardBackwardRequest body is empty", "bad_body", field="body")
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # google.protobuf.message.DecodeError
        raise TinkerError(400, f"not a ForwardBackwardRequest: {exc}", "bad_body") from None
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = []
    for i, d in enumerate(msg.data):
        inputs = {str(k): _tensor(str(k), t) for k, t in d.loss_fn_inputs.items()}
        datum = Datum(_tokens(d, i), inputs)
        _check_spans(d, i, datum.tokens.size)
        data.append(datum)
    return FwdBwd(
        msg.model_id,
        int(msg.seq_id),
        msg.loss_fn or "cross_entropy",
        config,
        bool(msg.forward_only),
        data,
    )


def encode_output(logprobs: Sequence[np.ndarray], metrics: Mapping[str, float]) -> bytes:
    """A `ForwardBackwardOutput`: one ArrayRecord with each datum's `logprobs` [N]."""
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    rec = out.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(logprobs))
    bt = rec.fields["logprobs"]
    arrays = [np.asarray(a, dtype=np.float32) for a in logprobs]
    bt.data = b"".join(a.tobytes() for a in arrays)
    offs = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
    bt.offsets = offs.tobytes()
    bt.dtype = pb.DTYPE_FLOAT32
    for k, v in metrics.items():
        out.metrics[k] = float(v)
    return bytes(out.SerializeToString())


MASK_LOGPROB = -99999.0  # Tinker's empty top-k cell (token id 0)


def _topk(rows: Sequence[Mapping[str, Any] | None], k: int) -> Any:
    """A `TopkLogprobs`: one row per position of up to k (token id, log-prob), most likely
    first; a missing row or cell is the sentinel (0, -99999.0)."""
    ids = np.zeros((len(rows), k), np.int32)
    lps = np.full((len(rows), k), MASK_LOGPROB, np.float32)
    for i, row in enumerate(rows):
        if not row:
            continue
        t, lp = list(row.get("token_ids") or [])[:k], list(row.get("logprobs") or [])[:k]
        ids[i, : len(t)] = t
        lps[i, : len(lp)] = lp
    return pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k, length=len(rows))


def encode_sample(
    sequences: Sequence[tuple[Sequence[int], Sequence[float] | None, str, Any]],
    prompt_logprobs: Sequence[float | None] | None,
    *,
    topk: int = 0,
    topk_prompt: Sequence[Mapping[str, Any] | None] | None = None,
    topk_prompt_k: int = 0,
) -> bytes:
    """A `SampleResponse`: (tokens, logprobs, "stop"|"length", top-k rows) per sample; prompt
    log-probs with NaN where none was computed (the first token, Tinker's None)."""
    out = pb.SampleResponse()
    for tokens, lps, reason, top in sequences:
        s = out.sequences.add()
        s.stop_reason = pb.STOP_REASON_LENGTH if reason == "length" else pb.STOP_REASON_STOP
        s.tokens = np.asarray(tokens, dtype=np.int32).tobytes()
        if lps is not None:
            s.logprobs = np.asarray(lps, dtype=np.float32).tobytes()
        if topk:
            s.topk_sampled_logprobs.CopyFrom(_topk(list(top or [None] * len(tokens)), topk))
    if prompt_logprobs is not None:
        vals = [math.nan if v is None else float(v) for v in prompt_logprobs]
        out.prompt_logprobs = np.asarray(vals, dtype=np.float32).tobytes()
    if topk_prompt is not None:
        out.topk_prompt_logprobs.CopyFrom(_topk(topk_prompt, topk_prompt_k))
    return bytes(out.SerializeToString())


def sequenced(raw: bytes, content_type: str) -> tuple[str, int]:
    """The `(model_id, seq_id)` a request body names ("", 0 when none or it does not parse):
    a JSON body's, or a protobuf `ForwardBackwardRequest`'s."""
    model_id: Any = ""
    seq_id: Any = 0
    if "protobuf" in content_type:
        msg = pb.ForwardBackwardRequest()
        try:
            msg.ParseFromString(raw)
        except Exception:  # google.protobuf.message.DecodeError
            return "", 0
        model_id, seq_id = msg.model_id, msg.seq_id
    else:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return "", 0
        if isinstance(body, dict):
            model_id, seq_id = body.get("model_id"), body.get("seq_id")
    if not isinstance(model_id, str) or not isinstance(seq_id, int) or isinstance(seq_id, bool):
        return "", 0
    return model_id, max(seq_id, 0)
