"""The multi-rank (data-parallel) DeepSpeed trainer: a training sub-job with `n_gpus` = W > 1.

Rank 0 (`DataParallelTrainer`, in the sub-job's worker) takes the server's commands; ranks
1..W-1 (`RankTrainer` in `ranks.py` followers) take theirs from rank 0 (`ranks.RankGroup`).
Every rank is one `TrainingEngine` under torch.distributed: DeepSpeed all-reduces the gradients
in `step` (ZeRO 0/1) or in each backward (ZeRO 2/3). forward-backward, so that the result equals
one rank on the same batch for every loss:

1. rank 0 checks the call and assigns its rows to the W ranks (`row_balance`): W contiguous
   slices (sizes differ by at most one; with B < W some ranks get none), or, with
   `processing.balance_rows`, token-balanced (ZoRRO's load balancer); each rank runs its rows on
   the columns that hold their real tokens only;
2. each rank computes its slice's log-probs (and entropy), keeping the graph when the slice fits
   one micro-batch (else a no-grad pass per micro-batch), and sends them to rank 0;
3. rank 0 computes the whole call's loss on the gathered log-probs (normalised over the whole
   call, never per slice) and its gradient with respect to them, and sends each rank its slice;
4. each rank backpropagates `W * <log-probs, gradient>` of its slice (DeepSpeed averages over the
   W ranks, the factor W makes that average the sum, i.e. the single-rank gradient). Ranks with
   fewer (or no) rows add zero-loss passes where ZeRO 2/3 need every rank in every collective.

Loss, metrics, log-probs (caller's rows and columns): rank 0's, the same whichever assignment
(`rank_tokens_max` / `rank_tokens_min` say how balanced it was). step/save/load/sleep/wake:
every rank. forward and log-probs: every rank, steps 1-2 without a graph (the same rows, columns
and passes as forward-backward's, so their log-probs equal its bit for bit: the old log-probs of
an on-policy update are the ones the update computes). Weight export: rank 0 (with ZeRO-3 the
others join its parameter gathers)."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arctic_sdk.spec.tables import methods as M

from ..errors import WorkerError
from ..losses import torch_losses as losses
from ..weight_transfer.buckets import DEFAULT_BUCKET_BYTES
from ..worker.commands import Command
from ..worker.engine_base import EngineBase
from . import row_balance
from .batch import Batch
from .call_loss import _loss_processing, fb_targets, loss_and_gradients
from .ranks import RankGroup, RankLost, world_size
from .scoring import Scored
from .training import TrainingEngine

ENGINE_START_TIMEOUT_S = 600.0
DRAIN_TIMEOUT_S = 120.0  # followers finishing a command rank 0 failed


def _slice_body(body: Mapping[str, Any], rows: np.ndarray, cols: tuple[int, int]) -> dict[str, Any]:
    """The rows `rows` of a forward-backward body on the columns `cols` that hold their real
    tokens: the model inputs and processing only (the loss context stays with rank 0, which
    computes the loss)."""
    kw = body.get("kwargs") or {}
    lo, hi = cols
    out = {k: np.asarray(v)[rows, lo:hi] for k, v in kw.items() if v is not None}
    return {"kwargs": out, "processing": dict(body.get("processing") or {})}


def _scatter(
    shape: tuple[int, int], parts: list[np.ndarray | None], idx: list[np.ndarray], cols: list[Any]
) -> np.ndarray:
    """Each rank's [rows, window] result back at its rows and columns of the call's [B, S]."""
    out = np.zeros(shape, np.float32)
    for part, rows, (lo, hi) in zip(parts, idx, cols, strict=True):
        if part is not None and len(rows):
            out[rows, lo:hi] = part
    return out


def _numpy(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().float().cpu().numpy()


def _passes(rows: int, mbs: int) -> int:
    if rows == 0:
        return 0
    return 1 if not mbs or rows <= mbs else math.ceil(rows / mbs)


class RankTrainer(TrainingEngine):
    """One rank's engine: the rank-local halves of the data-parallel ops (`rank_<cmd>`)."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__(spec)
        self.world = int(os.environ.get("WORLD_SIZE") or 1)
        self.rank = int(os.environ.get("RANK") or 0)
        self._fb: dict[str, Any] | None = None

    def info(self) -> dict[str, Any]:
        return {**super().info(), "rank": self.rank, "pid": os.getpid()}

    def _grad_norm_local(self) -> float:
        """ZeRO-0: the norm of the gradient all ranks will average (computed before `step`)."""
        if self.world == 1:
            return super()._grad_norm_local()
        import torch.distributed as dist

        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        flat = torch.cat([g.detach().float().reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        # per-parameter norms first, as one rank computes them (same rounding)
        parts = torch.split(flat, [g.numel() for g in grads])
        return float(torch.stack([t.norm() for t in parts]).norm())

    # -- forward-backward, rank side ---------------------------------------------------------

    def rank_commands(self) -> dict[str, Command]:
        """The commands rank 0 sends its follower ranks (`follower.py`)."""
        return {
            "fb_forward": self.rank_fb_forward,
            "fb_backward": self.rank_fb_backward,
            "fb_abort": self.rank_fb_abort,
            "optimizer_step": self.rank_optimizer_step,
            "save_state": self.rank_save_state,
            "load_state": self.rank_load_state,
            "join_gather": self.rank_join_gather,
            "join_send": self.rank_join_send,
            "sleep_state": self.rank_sleep_state,
            "wake_state": self.rank_wake_state,
        }

    def rank_fb_forward(
        self, body: Mapping[str, Any], n_fwd: int = 0, two_phase: bool = False, keep: bool = True
    ) -> dict[str, Any]:
        """This rank's log-probs of its rows. `keep=False` (forward, log-probs): the same passes
        on the same rows and columns, in eval mode and without a graph; nothing is kept for a
        backward."""
        self._fb = None
        proc = _loss_processing(dict(body.get("processing") or {}))
        st = losses.parse_processing(proc)
        post = frozenset(str(p) for p in (body.get("processing") or {}).get("post") or [])
        want_ent = st.needs_entropy or "compute_entropy" in post
        rows = len((body.get("kwargs") or {}).get("input_ids", ()))
        state: dict[str, Any] = {"rows": rows, "st": st}
        lp = ent = None
        self.engine.train(keep)
        try:
            if rows:
                b = Batch(body, self.dev)
                targets = fb_targets(b, st)
                mbs = self.micro_batch_size or rows
                state.update(b=b, targets=targets, mbs=mbs)
                if keep and not two_phase and rows <= mbs:
                    lp, ent = self._logprobs_graph(b, targets, st, want_ent)
                    state.update(mode="graph", lp=lp, ent=ent)
                else:  # the graph's one pass is this one pass when rows <= mbs
                    lp, ent = self._logprobs_no_grad(b, targets, st.temperature, mbs, want_ent)
                    state.update(mode="micro")
            with torch.no_grad():
                for _ in range(n_fwd - _passes(rows, state.get("mbs", 0)) if two_phase else 0):
                    self._dummy_logits()
        finally:
            self.engine.train()
        if keep:
            self._fb = state
        return {"lp": _numpy(lp), "ent": _numpy(ent)}

    def rank_fb_backward(
        self, g_lp: np.ndarray | None, g_ent: np.ndarray | None, n_bwd: int, scale: float
    ) -> dict[str, Any]:
        state, self._fb = self._fb, None
        if state is None:
            raise WorkerError("internal", "fb_backward without fb_forward")
        done = 0
        if state["rows"]:
            gl = torch.as_tensor(g_lp, device=self.dev)
            ge = None if g_ent is None else torch.as_tensor(g_ent, device=self.dev)
            if state["mode"] == "graph":
                self._backward_surrogate(state["lp"], gl, state["ent"], ge, scale)
                done = 1
            else:
                done = self._backward_micro(
                    state["b"], state["targets"], state["st"], state["mbs"], gl, ge, scale
                )
        for _ in range(max(n_bwd, 1) - done):
            self._zero_backward()
        self.acc_calls += 1  # the same on every rank: `step` decides alike everywhere
        return {"backward_passes": max(n_bwd, 1, done)}

    def rank_fb_abort(self) -> None:  # rank 0 failed between the two halves
        self._fb = None

    # -- the other collective ops ------------------------------------------------------------

    def rank_optimizer_step(
        self, learning_rate: float | None = None, adam: Mapping[str, float] | None = None
    ) -> dict[str, Any]:
        return self.op_step(learning_rate, adam)

    def rank_save_state(
        self, directory: str, tag: str, checkpoint_type: str, client_state: dict[str, Any]
    ) -> dict[str, Any]:
        if checkpoint_type == "weights-only":
            if self.stage == 3:
                self.state_dict()  # join the gather; rank 0 writes the files
            return {}
        return self.op_save(directory, tag, checkpoint_type, client_state)

    def rank_load_state(self, directory: str, tag: str, checkpoint_type: str) -> dict[str, Any]:
        return self.op_load(directory, tag, checkpoint_type)

    def rank_join_gather(self) -> None:
        """ZeRO-3: join rank 0's full-weight gather (export, weight sync)."""
        if self.stage == 3:
            self.state_dict()

    def rank_sleep_state(self, mode: str = "all") -> dict[str, Any]:
        return self.op_sleep(mode)

    def rank_wake_state(self) -> dict[str, Any]:
        return self.op_wake()


class DataParallelTrainer(EngineBase):
    """Rank 0 of a W-rank training sub-job: the worker's engine (same `op_*` as TrainingEngine)."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.world = world_size(spec)
        self.group = RankGroup(spec, self.world)
        os.environ.update(self.group.env())
        if self.group.launch == "local":
            self.group.launch_local({k: v for k, v in spec.items() if k != "dist"})
        try:
            self.local = RankTrainer(spec)  # blocks in the rendezvous until every rank joined
            self.ranks = self.group.wait_ready(ENGINE_START_TIMEOUT_S)
        except BaseException:
            self.group.hold_if_lost()
            raise
        self.stage = self.local.stage

    # -- plumbing ------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        info = self.local.info()
        info.pop("rank", None)
        info.update(
            world_size=self.world,
            backend=str(torch.distributed.get_backend())
            if torch.distributed.is_initialized()
            else "",
            rank_pids=[os.getpid(), *(int(r.get("pid") or 0) for r in self.ranks)],
        )
        return info

    def _collective(
        self, cmd: str, own: Any, per_rank: Mapping[int, Mapping[str, Any]] | None = None
    ) -> tuple[Any, dict[int, Any]]:
        """Send `cmd` to every follower, run `own()` here, gather their answers."""
        try:
            self.group.call_all(cmd, per_rank)
        except RankLost:
            self.group.hold_if_lost()
            raise
        try:
            mine = own()
        except BaseException as exc:
            self.group.hold_if_lost()
            # the followers' answers must not be left for the next command to read: collect
            # them; ranks that cannot finish without rank 0 leave the group unusable
            try:
                self.group.gather(timeout=DRAIN_TIMEOUT_S)
            except WorkerError as err:
                if err.code == "deadline_exceeded":
                    self.group.fail(f"rank 0's {cmd} failed ({exc}); {err.message}")
            except RankLost:
                self.group.hold_if_lost()
            raise
        try:
            return mine, self.group.gather()
        except (RankLost, WorkerError):
            self.group.hold_if_lost()
            raise

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.group.close()
        self.local.close()

    # -- forward-backward ----------------------------------------------------------------------

    def commands(self) -> dict[str, Command]:
        """The worker commands this engine runs (`engines/worker/commands.py`)."""
        return {
            M.FORWARD_BACKWARD.python_name: self.op_forward_backward,
            M.FORWARD.python_name: self.op_forward,
            M.LOG_PROBS.python_name: self.op_log_probs,
            "export_weights": self.op_export_weights,
            M.STEP.python_name: self.op_step,
            "save": self.op_save,  # not-an-op
            "load": self.op_load,  # not-an-op
            "sleep": self.op_sleep,
            "wake": self.op_wake,
            "weight_group_open": self.op_weight_group_open,
            "weight_group_join": self.op_weight_group_join,
            "weight_group_close": self.op_weight_group_close,
            "send_weights": self.op_send_weights,
        }

    def _rank_logprobs(
        self, b: Batch, body: Mapping[str, Any], keep: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[np.ndarray], list[tuple[int, int]], int]:
        """Every rank's log-probs (and entropy) of its rows, gathered into the call's [B, S]; the
        rows and columns of each rank and the passes of the busiest one. `keep`: forward-backward
        (each rank keeps what its backward needs); else forward and log-probs, which run the
        same passes on the same rows and columns, so their log-probs equal forward-backward's
        bit for bit."""
        eng = self.local
        w = self.world
        # rows per rank (contiguous, or token-balanced: `processing.balance_rows`) and the
        # columns holding their real tokens
        idx = row_balance.assign(b.mask_np, w, bool(b.processing.get("balance_rows")))
        cols = [row_balance.window(b.mask_np, rows) for rows in idx]
        two_phase = self.stage == 3
        n = max(1, *(_passes(len(rows), eng.micro_batch_size) for rows in idx))
        n_fwd = n if two_phase else 0

        def args(r: int) -> dict[str, Any]:
            sliced = _slice_body(body, idx[r], cols[r])
            return {"body": sliced, "n_fwd": n_fwd, "two_phase": two_phase, "keep": keep}

        mine, theirs = self._collective(
            "fb_forward",
            lambda: eng.rank_fb_forward(**args(0)),
            {r: args(r) for r in range(1, w)},
        )
        parts = [mine, *(theirs[r] for r in range(1, w))]
        shape = (int(b.shape[0]), int(b.shape[1]))
        lp = torch.as_tensor(_scatter(shape, [p["lp"] for p in parts], idx, cols), device=eng.dev)
        ent = None
        if any(p["ent"] is not None for p in parts):
            ents = _scatter(shape, [p["ent"] for p in parts], idx, cols)
            ent = torch.as_tensor(ents, device=eng.dev)
        return lp, ent, idx, cols, n

    def op_forward_backward(self, body: Mapping[str, Any]) -> dict[str, Any]:
        eng = self.local
        b, proc, st = eng._fb_batch(body)
        w = self.world
        lp, ent, idx, cols, n = self._rank_logprobs(b, body, keep=True)
        n_bwd = n if self.stage >= 2 else 1
        try:
            res, g_lp_t, g_ent_t = loss_and_gradients(b, proc, st, lp, ent)
        except BaseException:
            with contextlib.suppress(Exception):
                self._collective("fb_abort", eng.rank_fb_abort)
            raise
        g_lp = g_lp_t.detach().cpu().numpy()
        g_ent = None if g_ent_t is None else g_ent_t.detach().cpu().numpy()

        def share(r: int) -> dict[str, Any]:
            rows, (lo, hi) = idx[r], cols[r]
            return {
                "g_lp": g_lp[rows, lo:hi],
                "g_ent": None if g_ent is None else g_ent[rows, lo:hi],
                "n_bwd": n_bwd,
                "scale": float(w),
            }

        self._collective(
            "fb_backward",
            lambda: eng.rank_fb_backward(**share(0)),
            {r: share(r) for r in range(1, w)},
        )
        # acc_calls: in rank_fb_backward, on every rank
        return eng._fb_result(b, res, lp, ent, row_balance.rank_tokens(b.mask_np, idx))

    # -- ops on rank 0 (others join the ZeRO-3 gathers) ----------------------------------------

    def _on_rank0(self, join: str, fn: Any) -> dict[str, Any]:
        if self.stage != 3:
            return dict(fn())
        return dict(self._collective(join, fn)[0])

    def _ranks_scored(self, body: Mapping[str, Any]) -> Scored:
        """`_Forward._scored` on the ranks: forward-backward's rows, columns and passes."""

        def scored(b: Batch, **_: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            lp, ent, *_rest = self._rank_logprobs(b, body, keep=False)
            return lp, ent

        return scored

    def op_forward(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.local.forward_result(body, scored=self._ranks_scored(body))

    def op_log_probs(self, body: Mapping[str, Any]) -> dict[str, Any]:
        # the ranks score a forward body: the inputs' own tokens at temperature 1 (cross_entropy
        # without labels), the entropy when asked
        kw = {k: body.get(k) for k in ("input_ids", "attention_mask", "position_ids")}
        post = ["compute_entropy"] if body.get("entropy") else []
        frame = {"kwargs": kw, "processing": {"loss_fn": "cross_entropy", "post": post}}
        return self.local.log_probs_result(body, scored=self._ranks_scored(frame))

    def op_export_weights(self, path: str | None = None, method: str = "shm") -> dict[str, Any]:
        return self._on_rank0("join_gather", lambda: self.local.op_export_weights(path, method))

    # The weight group is rank 0's (the trainer's one sender; followers join gathers): its
    # commands run on rank 0's RankTrainer (`weight_transfer/member.py`).
    def op_weight_group_open(self, group_id: str, host: str) -> dict[str, Any]:
        return self.local.op_weight_group_open(group_id, host)

    def op_weight_group_join(self, group_id: str, host: str, **kw: Any) -> dict[str, Any]:
        return self.local.op_weight_group_join(group_id, host, **kw)

    def op_weight_group_close(self, group_id: str = "") -> dict[str, Any]:
        return self.local.op_weight_group_close(group_id)

    def op_send_weights(self, group_id: str, version: int, **kw: Any) -> dict[str, Any]:
        """Rank 0 broadcasts; under ZeRO-3 the followers join its per-bucket gathers."""

        def own() -> dict[str, Any]:
            return self.local.op_send_weights(group_id, version, **kw)

        if self.stage != 3:
            return dict(own())
        args = {"bucket_bytes": kw.get("bucket_bytes", DEFAULT_BUCKET_BYTES)}
        return dict(
            self._collective("join_send", own, dict.fromkeys(range(1, self.world), args))[0]
        )

    # -- ops on every rank ---------------------------------------------------------------------

    def _everywhere(
        self, cmd: str, own: Any, args: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """`cmd` with the same `args` on every follower, `own()` here; rank 0's answer."""
        per_rank = None if args is None else dict.fromkeys(range(1, self.world), args)
        mine, _ = self._collective(cmd, own, per_rank)
        return dict(mine)

    def op_step(
        self, learning_rate: float | None = None, adam: Mapping[str, float] | None = None
    ) -> dict[str, Any]:
        return self._everywhere(
            "optimizer_step",
            lambda: self.local.op_step(learning_rate, adam),
            {"learning_rate": learning_rate, "adam": dict(adam or {})},
        )

    def op_save(
        self, directory: str, tag: str, checkpoint_type: str, client_state: dict[str, Any]
    ) -> dict[str, Any]:
        args: dict[str, Any] = {
            "directory": directory,
            "tag": tag,
            "checkpoint_type": checkpoint_type,
            "client_state": client_state,
        }
        mine = self._everywhere("save_state", lambda: self.local.op_save(**args), args)
        # every rank's optimizer partition is written now
        files = (Path(directory) / tag).rglob("*")
        return dict(mine, size_bytes=sum(f.stat().st_size for f in files if f.is_file()))

    def op_load(self, directory: str, tag: str, checkpoint_type: str) -> dict[str, Any]:
        args = {"directory": directory, "tag": tag, "checkpoint_type": checkpoint_type}
        return self._everywhere("load_state", lambda: self.local.op_load(**args), args)

    def op_sleep(self, mode: str = "all") -> dict[str, Any]:
        return self._everywhere("sleep_state", lambda: self.local.op_sleep(mode), {"mode": mode})

    def op_wake(self) -> dict[str, Any]:
        return self._everywhere("wake_state", self.local.op_wake)
