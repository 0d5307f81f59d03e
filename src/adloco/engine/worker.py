"""One worker: H inner optimizer steps on its shard, with the gradient probe at the round's common point.

The worker owns a model replica whose parameters live in one flat buffer (:mod:`adloco.engine.flat`)
and an inner optimizer whose state persists across rounds. It never re-creates its model, and no
gradient leaves its device during the inner loop: the probe reduces gradients to scalars on the spot
and keeps at most the vectors the batch test needs (spec §2.5).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from adloco.algorithms.batching import WorkerStats
from adloco.algorithms.switch import Plan
from adloco.config import InnerConfig
from adloco.data.sampling import ShardStream
from adloco.engine import faults
from adloco.engine.flat import FlatModule
from adloco.engine.inner import make_optimizer, reset_state

Batch = dict[str, torch.Tensor]  # model inputs, rows along dimension 0: input_ids, labels[, attention_mask]
AMP = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def rows(batch: Batch, start: int, stop: int) -> Batch:
    return {k: v[start:stop] for k, v in batch.items()}


def n_rows(batch: Batch) -> int:
    return int(batch["input_ids"].shape[0])


def pieces(batch: Batch, size: int) -> list[Batch]:
    """Consecutive slices of at most ``size`` rows (none for an empty batch)."""
    n = n_rows(batch)
    return [rows(batch, i, min(n, i + size)) for i in range(0, n, size)]


@dataclass(frozen=True)
class ProbeSpec:
    """The pooled estimator's chunking for this round (the same for every worker of a trainer)."""

    k: int  # chunks
    c: int  # examples per chunk
    extra: bool  # draw an extra probe batch (the step batch holds fewer than two examples)
    keep: str  # vectors kept for the shared mean: "none" | "sum" (Σ_j g_j) | "chunks" (every g_j)


@dataclass
class RoundResult:
    """What one worker reports after a round (all scalars)."""

    loss: float  # mean training loss over the round's steps
    steps: int
    examples: int  # examples in optimizer steps
    probe_examples: int  # extra examples drawn only to probe gradient statistics
    finite: bool
    compute_s: float
    micro: int
    accum: int
    capped: bool
    stats: WorkerStats | None
    skipped: int = 0  # steps skipped by fp16 loss scaling (non-finite gradients)
    stopped: bool = False  # a signal stopped the round early: the round is rolled back
    b_max: int = 0  # the worker's b_max after the round (halved on out-of-memory)

    FIELDS = 17
    STATS_FIELDS = 4  # the leading values the batch test needs: k, c, Σ‖g_j‖², ‖ḡ_m‖²

    def to_row(self) -> list[float]:
        s = self.stats
        stats = [s.n, s.c, s.sum_sq, s.mean_sq] if s else [0, 0, math.nan, math.nan]
        return [
            *stats,
            float(s is not None),
            self.loss,
            self.steps,
            self.examples,
            self.probe_examples,
            float(self.finite),
            self.compute_s,
            self.micro,
            self.accum,
            float(self.capped),
            self.skipped,
            float(self.stopped),
            self.b_max,
        ]

    @classmethod
    def from_row(cls, row: list[float]) -> RoundResult:
        stats = WorkerStats(int(row[0]), int(row[1]), row[2], row[3]) if row[4] else None
        return cls(
            row[5],
            int(row[6]),
            int(row[7]),
            int(row[8]),
            bool(row[9]),
            row[10],
            int(row[11]),
            int(row[12]),
            bool(row[13]),
            stats,
            int(row[14]),
            bool(row[15]),
            int(row[16]),
        )


class Worker:
    def __init__(
        self, wid: int, model: nn.Module, inner: InnerConfig, b_max: int, precision: str = "fp32"
    ) -> None:
        self.id = wid
        self.model = model
        self.model.train()
        self.flat = FlatModule(model)
        self.inner = inner
        self.optimizer = make_optimizer(self.flat, inner)
        self.b_max = b_max
        self.device = self.flat.param.device
        self.sample_sum: torch.Tensor | None = None  # Σ_j g_j of the last probe, when kept
        self.chunks: torch.Tensor | None = None  # (k, P) chunk gradients of the last probe, when kept
        self._clip_coef: torch.Tensor = torch.ones((), device=self.device)
        self._probe_k = 0
        # Mixed precision: autocast the forward; fp16 scales the loss so small gradients survive, with
        # the dynamic schedule of torch.amp.GradScaler (start 2^16, halve on overflow, double after 2000).
        self.amp_dtype = AMP[precision]
        self.loss_scale = 2.0**16 if precision == "fp16" else 1.0
        self._good_steps = 0
        self.skipped = 0
        self._oom_rows = faults.oom_rows(wid)
        self._snap: tuple[dict[str, torch.Tensor], list[float]] = ({}, self.scalars())

    # -- state -------------------------------------------------------------------------------------
    @torch.no_grad()
    def load(self, theta: torch.Tensor) -> None:
        """θ_m ← θ_t (spec §1, step 1)."""
        self.flat.param.copy_(theta)

    def reset_optimizer(self) -> None:
        reset_state(self.optimizer)

    # -- one round ---------------------------------------------------------------------------------
    def run_round(
        self,
        stream: ShardStream,
        fetch: Callable[[np.ndarray], Batch],
        plan: Plan,
        steps: int,
        lr_for_step: Callable[[int], float],
        probe: ProbeSpec | None,
        scratch: torch.Tensor,
        on_step: Callable[[], None] = lambda: None,
        should_stop: Callable[[], bool] = lambda: False,
        poison: bool = False,
    ) -> RoundResult:
        """Run H = ``steps`` optimizer steps of ``plan.effective`` examples each.

        ``should_stop`` is asked before every step: once it says yes the round ends early (the coordinator
        rolls it back). ``poison`` (test-only fault injection) makes the worker's parameters non-finite.
        """
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        stats: WorkerStats | None = None
        probe_examples = 0
        skipped_before = self.skipped
        e = plan.effective
        done = 0
        for h in range(steps):
            if should_stop():
                break
            for group in self.optimizer.param_groups:
                group["lr"] = lr_for_step(h)
            batch = self._to_device(fetch(stream.take(e)))  # e rows
            extra = None
            if h == 0 and probe is not None and probe.extra:
                extra = self._to_device(fetch(stream.take(probe.k * probe.c)))
            while True:  # an out-of-memory micro-batch halves b_max and repeats the step on the same rows
                micro = min(plan.micro, self.b_max)
                try:
                    if h == 0 and probe is not None:
                        if extra is not None:
                            stats, _ = self._probe(extra, probe, micro, scratch)
                            self._unscale_samples(probe, scratch)
                            loss = self._accumulate(batch, micro)
                        else:
                            stats, loss = self._probe_step(batch, probe, micro, scratch)
                    else:
                        loss = self._accumulate(batch, micro)
                    break
                except torch.OutOfMemoryError:
                    if micro <= 1:
                        raise
                    self.flat.zero_grad()
                    if self.device.type == "cuda":
                        torch.cuda.empty_cache()
                    self.b_max = micro // 2  # the coordinator logs it from the round's results
            if extra is not None:
                probe_examples += probe.k * probe.c if probe is not None else 0
            self._step()
            loss_sum += loss
            done += 1
            on_step()
        if poison:
            self.flat.param.fill_(math.nan)
        mean_loss = (loss_sum / done).item() if done else math.nan
        finite = done > 0 and math.isfinite(mean_loss) and bool(torch.isfinite(self.flat.param).all())
        sync()
        return RoundResult(
            mean_loss,
            done,
            done * e,
            probe_examples,
            finite,
            time.perf_counter() - t0,
            min(plan.micro, self.b_max),
            plan.accum,
            plan.capped,
            stats,
            self.skipped - skipped_before,
            done < steps,
            self.b_max,
        )

    # -- state for rollback and checkpoints --------------------------------------------------------
    def inner_state(self) -> dict[str, torch.Tensor]:
        """The inner optimizer's state as flat tensors: every per-parameter buffer as one (P,) tensor in
        the flat layout, ``step`` as (groups,); empty before the first step or after a reset."""
        states = [self.optimizer.state.get(g, {}) for g in self.flat.groups]
        if not all(states):
            return {}
        out: dict[str, torch.Tensor] = {}
        for k, v in states[0].items():
            if not isinstance(v, torch.Tensor):
                continue
            if k == "step":
                out[k] = torch.stack([s[k].detach().to("cpu", torch.float32).reshape(()) for s in states])
            else:
                out[k] = torch.cat([s[k].detach().reshape(-1) for s in states])
        return out

    def load_inner_state(self, state: dict[str, torch.Tensor]) -> None:
        reset_state(self.optimizer)
        lo = 0
        for i, g in enumerate(self.flat.groups):
            n = g.numel()
            if state:
                self.optimizer.state[g] = {
                    k: (v[i].clone() if k == "step" else v[lo : lo + n].to(self.device, copy=True).view_as(g))
                    for k, v in state.items()
                }
            lo += n

    def scalars(self) -> list[float]:
        """The worker's scalar state: fp16 loss scale, good steps since the last change, skipped steps, b_max."""
        return [self.loss_scale, self._good_steps, self.skipped, self.b_max]

    def load_scalars(self, row: list[float]) -> None:
        self.loss_scale, self._good_steps, self.skipped, self.b_max = (
            float(row[0]),
            int(row[1]),
            int(row[2]),
            int(row[3]),
        )

    def snapshot(self) -> None:
        """Remember the state at the start of a round (host memory), so a stopped round can be undone."""
        self._snap = ({k: v.to("cpu", copy=True) for k, v in self.inner_state().items()}, self.scalars())

    def rollback(self) -> None:
        state, scalars = self._snap
        self.load_inner_state(state)
        self.load_scalars(scalars)

    # -- pieces ------------------------------------------------------------------------------------
    def _to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _forward_backward(self, batch: Batch, scale: float) -> torch.Tensor:
        """Backward of ``scale`` x the batch's mean loss (times the fp16 loss scale); returns the loss."""
        if self._oom_rows is not None and n_rows(batch) > self._oom_rows:  # test-only fault injection
            raise torch.OutOfMemoryError(f"test fault: more than {self._oom_rows} rows")
        with torch.autocast(
            self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None
        ):
            loss = self.model(**batch).loss
        (loss.float() * (scale * self.loss_scale)).backward()
        return loss.detach().float()

    def _accumulate(self, batch: Batch, micro: int) -> torch.Tensor:
        """flat.grad ← mean gradient over the batch's rows, in micro-batches of at most ``micro``."""
        self.flat.zero_grad()
        n = n_rows(batch)
        loss = torch.zeros((), device=self.device)
        for piece in pieces(batch, micro):
            loss += self._forward_backward(piece, n_rows(piece) / n) * (n_rows(piece) / n)
        return loss

    def _probe(
        self, batch: Batch, probe: ProbeSpec, micro: int, scratch: torch.Tensor
    ) -> tuple[WorkerStats, torch.Tensor]:
        """Chunk gradients g_j (mean over c examples each) of the first k·c rows of ``batch``.

        Returns the worker's statistics and Σ_j c·loss_j; leaves Σ_j g_j (in loss-scaled units) in the
        accumulator, and each g_j in ``chunks`` when kept.
        """
        k, c = probe.k, probe.c
        self._probe_k = k
        acc = self._accumulator(probe, scratch)
        acc.zero_()
        sum_sq = torch.zeros((), device=self.device, dtype=torch.float64)
        loss = torch.zeros((), device=self.device)
        for j in range(k):
            self.flat.zero_grad()
            for piece in pieces(rows(batch, j * c, (j + 1) * c), micro):
                loss += self._forward_backward(piece, n_rows(piece) / c) * n_rows(piece)
            g = self.flat.grad  # S·g_j, (P,)
            sum_sq += torch.dot(g, g).double()
            acc.add_(g)
            if self.chunks is not None and probe.keep == "chunks":
                self.chunks[j].copy_(g)
        mean_sq = torch.dot(acc, acc).double() / (k * k)
        s2 = self.loss_scale**2
        return WorkerStats(k, c, sum_sq.item() / s2, mean_sq.item() / s2), loss

    def _probe_step(
        self, batch: Batch, probe: ProbeSpec, micro: int, scratch: torch.Tensor
    ) -> tuple[WorkerStats, torch.Tensor]:
        """The first inner step, with its batch cut into the probe's chunks; the step's gradient is the
        same mean gradient as without probing."""
        e = n_rows(batch)
        k, c = probe.k, probe.c
        stats, loss = self._probe(batch, probe, micro, scratch)
        acc = self._accumulator(probe, scratch)
        self.flat.grad.copy_(acc).mul_(c / e)  # mean gradient of the chunked rows, weighted c·k/e
        for piece in pieces(rows(batch, k * c, e), micro):  # rows not in any chunk
            loss += self._forward_backward(piece, n_rows(piece) / e) * n_rows(piece)
        self._unscale_samples(probe, scratch)
        return stats, loss / e

    @torch.no_grad()
    def _unscale_samples(self, probe: ProbeSpec, scratch: torch.Tensor) -> None:
        """Kept gradient samples in true units (they were taken under the fp16 loss scale)."""
        if self.loss_scale == 1.0 or probe.keep == "none":
            return
        self._accumulator(probe, scratch).mul_(1.0 / self.loss_scale)
        if probe.keep == "chunks" and self.chunks is not None:
            self.chunks[: probe.k].mul_(1.0 / self.loss_scale)

    def _accumulator(self, probe: ProbeSpec, scratch: torch.Tensor) -> torch.Tensor:
        if probe.keep == "none":
            return scratch
        if self.sample_sum is None:
            self.sample_sum = torch.zeros_like(self.flat.param)
        if probe.keep == "chunks" and (self.chunks is None or self.chunks.shape[0] < probe.k):
            self.chunks = torch.zeros(probe.k, self.flat.numel, device=self.device)
        return self.sample_sum

    @torch.no_grad()
    def _step(self) -> None:
        """Unscale (fp16), skip a non-finite step, clip, and step the inner optimizer."""
        if self.loss_scale != 1.0:
            self.flat.grad.mul_(1.0 / self.loss_scale)
            if not bool(torch.isfinite(self.flat.grad).all()):
                self.loss_scale /= 2.0
                self._good_steps = 0
                self.skipped += 1
                self.flat.zero_grad()
                return
            self._good_steps += 1
            if self._good_steps % 2000 == 0:
                self.loss_scale *= 2.0
        self._clip()
        self.optimizer.step()

    def _clip(self) -> None:
        if self.inner.clip <= 0:
            return
        norm = torch.linalg.vector_norm(self.flat.grad)
        self._clip_coef = torch.clamp(self.inner.clip / (norm + 1e-6), max=1.0)
        self.flat.grad.mul_(self._clip_coef)

    # -- gradient samples for the batch test (read after the round) ---------------------------------
    def _unclip(self) -> float:
        """1 / the last clip coefficient; nan when clipping zeroed a non-finite gradient."""
        coef = float(self._clip_coef)
        return 1.0 / coef if coef > 0 else math.nan

    def last_gradient_sq(self) -> float:
        """‖g‖² of the last inner step's gradient before clipping (the ``paper`` estimator's sample)."""
        g = self.flat.grad
        return float(torch.dot(g, g)) * self._unclip() ** 2

    @torch.no_grad()
    def add_sample_sum(self, out: torch.Tensor, paper: bool) -> None:
        """out += Σ_j g_j over this round's gradient samples: the probe's chunks, or (``paper``) the last
        gradient before clipping."""
        if paper:
            out.add_(self.flat.grad, alpha=self._unclip())
        else:
            assert self.sample_sum is not None, "the probe kept no vectors"
            out.add_(self.sample_sum)

    @torch.no_grad()
    def sample_dots(self, gbar: torch.Tensor, paper: bool) -> torch.Tensor:
        """(k,) float64: <g_j, ḡ> for this round's gradient samples."""
        if paper:
            return (torch.dot(self.flat.grad, gbar) * self._unclip()).reshape(1).double()
        assert self.chunks is not None, "the probe kept no chunk gradients"
        return (self.chunks[: self._probe_k] @ gbar).double()
