"""One worker's replica: the user's model and inner optimizer, and how one inner step runs on it.

An inner step (ALGORITHM.md §1, step 2) is the gradient of the mean loss over ``effective`` rows, taken in
micro-batches (gradient accumulation, ALGORITHM.md §5), then one optimizer step: fp16 loss scaling undone (a step
with non-finite gradients is skipped), the gradient clipped to ``clip`` (global norm), and the user's
optimizer stepped. At the first step of a round the gradient may also be cut into the probe's chunks
(ALGORITHM.md §2.5), from which the worker keeps a few scalars and, when the batch test needs them, the chunk
gradients themselves.

Nothing here knows about other workers, trainers or the network: :mod:`adloco.library.method` drives it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from adloco.library import inner_state
from adloco.library.algorithms.batching import WorkerStats
from adloco.library.comm.base import Shards
from adloco.library.fields import check_clip, choice
from adloco.library.flat import FlatModule, flatten, like
from adloco.library.graphs import GraphedStep, capturable, state_pointers, to_device
from adloco.library.optim import CombinedOptimizer
from adloco.library.settings import Precision
from adloco.library.snapshot import InnerSnapshot

Batch = Any  # a tensor, or a dict / list / tuple of tensors, rows along dimension 0
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
AMP: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def hf_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The default loss: ``model(**batch).loss`` (Hugging Face models given their labels)."""
    return model(**batch).loss


def rows(batch: Batch, start: int, stop: int) -> Batch:
    """Rows [start, stop) of every tensor in the batch (anything else is passed through)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return {k: rows(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(rows(v, start, stop) for v in batch)
    return batch


def n_rows(batch: Batch) -> int:
    """Rows of the batch: dimension 0 of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    values: Sequence[Any] = list(batch.values()) if isinstance(batch, Mapping) else batch
    for v in values:
        try:
            return n_rows(v)
        except ValueError:
            continue
    raise ValueError("batch: holds no tensor (rows are counted along dimension 0 of its tensors)")


def pieces(batch: Batch, size: int) -> list[Batch]:
    """Consecutive slices of at most ``size`` rows (none for an empty batch)."""
    n = n_rows(batch)
    return [rows(batch, i, min(n, i + size)) for i in range(0, n, size)]


@dataclass(frozen=True)
class Probe:
    """The pooled estimator's chunking for one round (the same for every worker of a trainer)."""

    k: int  # chunks
    c: int  # examples per chunk
    extra: bool  # an extra probe batch of k·c rows follows the step's rows (the step has < 2)
    keep: str  # vectors kept for the shared mean: "none" | "sum" (Σ_j g_j) | "chunks" (every g_j)

    @property
    def extra_rows(self) -> int:
        return self.k * self.c if self.extra else 0


class Replica:
    """One worker: a model whose parameters live in a flat buffer, and an inner optimizer over them.

    ``optimizer`` must optimize the model's parameters (or the engine's flat groups of them); its state
    persists across rounds. Several optimizers of one model (Muon for its matrices, AdamW for the rest) are
    one :class:`adloco.library.optim.CombinedOptimizer` (a list of them is combined). ``loss_fn(model, batch)`` returns the mean loss over the batch's rows.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn | None = None,
        *,
        clip: float = 0.0,
        precision: str = "fp32",
        b_max: int = 8,
        shards: Shards | None = None,
        cuda_graphs: bool = False,
        name: str = "worker",
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        if isinstance(optimizer, (list, tuple)):  # several optimizers of one model (Muon and AdamW)
            optimizer = CombinedOptimizer(*optimizer)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(
                f"inner_optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        choice("precision", precision, Precision)
        check_clip(clip)
        self.model = model
        self.flat: FlatModule = flatten(model)
        # the ranks that hold this worker's replica between them (ALGORITHM.md §12; one: unsharded)
        self.shards = shards or Shards()
        if self.flat.aliased != (self.shards.size == 1):
            raise ValueError(
                "model: a model sharded with fully_shard needs a communicator over its mesh, and a "
                "communicator over a mesh a sharded model (TorchDistComm(mesh=...))"
            )
        self.optimizer = optimizer
        self.loss_fn: LossFn = loss_fn or hf_loss
        self.clip = clip
        self.b_max = b_max
        self.device = self.flat.param.device
        self._offsets = inner_state.offsets(self.optimizer, self.flat)
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
        # ALGORITHM.md §10: the trainer's lr multiplier, applied to the optimizer's lr for each step only
        self.lr_scale = 1.0
        self.wd_scale = 1.0  # batch.wd_scaling's multiplier of every group's weight decay, the same way
        self.last_lr = math.nan  # the lr of the last step, multiplier included
        self.sgd = isinstance(optimizer, torch.optim.SGD)  # the linear rule instead of the square root
        self._saved_lrs: list[Any] | None = None
        self._saved_wds: list[Any] | None = None
        # cuda_graphs (adloco.library.graphs): the step as a CUDA graph on the worker's own stream, its learning
        # rates as device tensors (filled before each step, so a replay reads the current values)
        self.graphed: GraphedStep | None = None
        self.stream: Any = None
        self._lr_tensors: list[torch.Tensor] = []
        if cuda_graphs:
            self._check_graphs(precision)
            self.graphed = GraphedStep(self._step_body, self._state_key, self.device, name=name)
            self.stream = self.graphed.stream

    def _check_graphs(self, precision: str) -> None:
        """What a captured step cannot do, refused in one line each."""
        if self.device.type != "cuda":
            raise ValueError(
                f"cuda_graphs: needs a model on a CUDA device (this one is on {self.device.type})"
            )
        if precision == "fp16":
            raise ValueError(
                "cuda_graphs: fp16's loss scaling decides on the host whether a step is skipped; use "
                "precision bf16 (no loss scaling) or turn cuda_graphs off"
            )
        if self.shards.size > 1:
            raise ValueError("cuda_graphs: a sharded worker's step runs collectives; turn cuda_graphs off")
        why = capturable(self.optimizer)
        if why is not None:
            raise ValueError(f"inner_optimizer: a step inside a CUDA graph (cuda_graphs): {why}")

    # -- state -------------------------------------------------------------------------------------
    @torch.no_grad()
    def load(self, theta: torch.Tensor) -> None:
        """θ_m ← θ_t (ALGORITHM.md §1, step 1)."""
        self.flat.param.copy_(theta)
        self.flat.push()

    def reset_optimizer(self) -> None:
        """Forget moments and step counts (a worker that moves to another trainer, or ``reset``)."""
        self.optimizer.state.clear()

    def inner_state(self) -> dict[str, torch.Tensor]:
        """The inner optimizer's state as flat tensors (:func:`adloco.library.inner_state.flat_state`)."""
        return inner_state.flat_state(self.optimizer, self._offsets, self.flat.numel, self.device)

    def load_inner_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """The inner optimizer's state from :meth:`inner_state`'s tensors (empty: reset)."""
        inner_state.load_flat_state(self.optimizer, self._offsets, self.flat.numel, self.device, state)

    def snapshot(self, into: InnerSnapshot | None = None) -> InnerSnapshot:
        """The inner state and scalars now, in host memory (on CUDA: copied behind the next step's forward
        and backward; :meth:`InnerSnapshot.before_write` orders the optimizer's step after it)."""
        snap = into or InnerSnapshot()
        snap.take(self.optimizer, [p for p, _, _ in self._offsets], self.scalars())
        return snap

    def restore(self, snap: InnerSnapshot) -> None:
        """Back to a :meth:`snapshot`: inner state and scalars (a graph captured since is recaptured)."""
        snap.restore(self.optimizer, [p for p, _, _ in self._offsets], like)
        self.load_scalars(snap.scalars)

    def scalars(self) -> list[float]:
        """The worker's scalar state: fp16 loss scale, good steps since the last change, skipped steps, b_max."""
        return [self.loss_scale, self._good_steps, self.skipped, self.b_max]

    def load_scalars(self, row: Sequence[float]) -> None:
        self.loss_scale, self._good_steps, self.skipped, self.b_max = (
            float(row[0]),
            int(row[1]),
            int(row[2]),
            int(row[3]),
        )

    # -- one inner step ----------------------------------------------------------------------------
    def gradient(
        self, batch: Batch, effective: int, micro: int, probe: Probe | None, scratch: torch.Tensor
    ) -> tuple[torch.Tensor, WorkerStats | None]:
        """flat.grad ← mean gradient over the first ``effective`` rows of ``batch`` (loss-scaled, unclipped),
        with the probe's statistics when ``probe`` is given (its extra rows follow the step's rows).

        A micro-batch that runs out of memory halves ``b_max`` and the step is repeated on the same rows,
        so the gradient (and the math) is unchanged. Returns the step's mean loss (0-dim tensor).
        """
        batch = to_device(batch, self.device)
        if probe is not None and probe.extra:
            step_rows, extra = rows(batch, 0, effective), rows(batch, effective, effective + probe.extra_rows)
        else:
            step_rows, extra = batch, None
        while True:
            micro = min(micro, self.b_max)
            try:
                if probe is None:
                    return self._accumulate(step_rows, micro), None
                if extra is not None:
                    stats, _ = self._probe(extra, probe, micro, scratch)
                    self._unscale_samples(probe, scratch)
                    return self._accumulate(step_rows, micro), stats
                return self._probe_step(step_rows, probe, micro, scratch)
            except torch.OutOfMemoryError:
                if micro <= 1:
                    raise
                self.flat.zero_grad()
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                self.b_max = micro // 2  # the round reports it from the gathered results

    def step(
        self,
        batch: Batch,
        effective: int,
        micro: int,
        probe: Probe | None,
        scratch: torch.Tensor,
        before_write: Callable[[], None] = lambda: None,
    ) -> tuple[torch.Tensor, WorkerStats | None]:
        """One whole inner step: :meth:`gradient`, then :meth:`optimizer_step` (``before_write()`` runs
        just before the optimizer writes its state: a round's snapshot orders itself there). With
        ``cuda_graphs``, a step without the probe is replayed as a CUDA graph (:mod:`adloco.library.graphs`), on
        this worker's stream: run it inside :meth:`on_stream`."""
        if self.graphed is None or probe is not None:
            with self.device_lrs() if self.graphed is not None else contextlib.nullcontext():
                loss, stats = self.gradient(batch, effective, micro, probe, scratch)
                before_write()
                self.optimizer_step()
            return loss, stats
        before_write()
        with self.device_lrs():
            while True:
                micro = min(micro, self.b_max)
                try:
                    return self.graphed.run(batch, micro), None
                except torch.OutOfMemoryError:
                    self.graphed.drop()
                    if micro <= 1:
                        raise
                    self.flat.zero_grad()
                    torch.cuda.empty_cache()
                    self.b_max = micro // 2

    def _step_body(self, batch: Batch, micro: int) -> torch.Tensor:
        """The part of a step a CUDA graph holds: the gradient over the batch (on the device) and the
        update, learning rates already in place (:meth:`device_lrs`); returns the step's mean loss."""
        loss = self._accumulate(batch, micro)
        with torch.no_grad():
            self._clip()
            self.flat.scatter_grads()
            self.optimizer.step()
            self.flat.after_step()
        return loss

    def _state_key(self) -> tuple[int, ...]:
        return state_pointers(self.optimizer, self.flat.param, self.flat.grad, *self._lr_tensors)

    @contextlib.contextmanager
    def device_lrs(self) -> Iterator[None]:
        """For the block, every param group's learning rate (times ``lr_scale``) as a tensor on the
        device, filled now (a CUDA graph reads it there at each replay); the groups' own values are put
        back after."""
        groups = self.optimizer.param_groups
        if len(self._lr_tensors) != len(groups):
            self._lr_tensors = [torch.zeros((), device=self.device) for _ in groups]
        saved = [g["lr"] for g in groups]
        self.last_lr = float(saved[0]) * self.lr_scale
        for g, t, lr in zip(groups, self._lr_tensors, saved, strict=True):
            t.fill_(float(lr) * self.lr_scale)
            g["lr"] = t
        try:
            yield
        finally:
            for g, lr in zip(groups, saved, strict=True):
                g["lr"] = lr

    def on_stream(self) -> contextlib.AbstractContextManager[Any]:
        """The block on this worker's CUDA stream (``cuda_graphs``), or where it is. Order it with
        :meth:`fork` before and :meth:`join` after, for every worker, so the workers run side by side."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def fork(self) -> None:
        """This worker's stream waits for what the current stream has queued (θ loaded, say)."""
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def join(self) -> None:
        """The current stream waits for this worker's queued steps."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    @torch.no_grad()
    def optimizer_step(self) -> None:
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
        self.flat.scatter_grads()
        self.scale_lr()
        try:
            self.optimizer.step()
        finally:
            self.restore_lr()
        self.flat.after_step()

    def _clip(self) -> None:
        """The gradient clipped to ``clip`` (global norm, computed on the device: no host wait)."""
        if self.clip > 0:
            g = self.flat.grad
            norm = (
                torch.linalg.vector_norm(g)
                if self.shards.size == 1
                else self.shards.sum_(torch.dot(g, g).reshape(1)).sqrt()[0]  # over every shard of the worker
            )
            self._clip_coef = torch.clamp(self.clip / (norm + 1e-6), max=1.0)
            self.flat.grad.mul_(self._clip_coef)

    def scale_lr(self) -> None:
        """Multiply every param group's lr by ``lr_scale`` and its weight decay by ``wd_scale`` for one
        step (exactly restored by :meth:`restore_lr`: the saved values are put back, nothing is divided)."""
        if self._saved_lrs is not None or self._saved_wds is not None:  # scaled already (a subclass's
            return  # step that calls its parent's runs torch's step hooks twice): once per step
        groups = self.optimizer.param_groups
        if self.wd_scale != 1.0:
            self._saved_wds = [g.get("weight_decay", 0.0) for g in groups]
            for g in groups:
                if g.get("weight_decay"):
                    g["weight_decay"] = g["weight_decay"] * self.wd_scale
        if any(isinstance(g["lr"], torch.Tensor) for g in groups):  # device_lrs filled them, scaled
            return
        self.last_lr = float(groups[0]["lr"]) * self.lr_scale
        if self.lr_scale == 1.0:
            return
        self._saved_lrs = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = g["lr"] * self.lr_scale

    def restore_lr(self) -> None:
        if self._saved_lrs is not None:
            for g, lr in zip(self.optimizer.param_groups, self._saved_lrs, strict=True):
                g["lr"] = lr
            self._saved_lrs = None
        if self._saved_wds is not None:
            for g, wd in zip(self.optimizer.param_groups, self._saved_wds, strict=True):
                if "weight_decay" in g:
                    g["weight_decay"] = wd
            self._saved_wds = None

    def finite(self) -> bool:
        """Whether every parameter is finite: NaN and ±inf all show in the extremes (one pass, no mask)."""
        lo, hi = torch.aminmax(self.flat.param)
        ok = math.isfinite(float(lo)) and math.isfinite(float(hi))
        if self.shards.size > 1:  # finite on every shard of the worker
            ok = not bool(self.shards.max_(torch.tensor([0.0 if ok else 1.0], device=self.device)).item())
        return ok

    # -- pieces ------------------------------------------------------------------------------------
    def forward_backward(self, batch: Batch, scale: float) -> torch.Tensor:
        """Backward of ``scale`` x the batch's mean loss (times the fp16 loss scale); returns the loss.

        Sharded (ALGORITHM.md §12): each of the worker's k ranks runs its share of the rows, its loss
        weighted k·n_j/n, so that FSDP's mean of the k gradients is the gradient of the whole batch's
        mean loss; a rank with no rows runs one with weight 0 (FSDP's collectives need every rank). The
        loss returned is this rank's weighted part: its mean over the worker's ranks is the batch's."""
        k = self.shards.size
        if k > 1:
            n = n_rows(batch)
            lo, hi = self.shards.split(n)
            weight = k * (hi - lo) / n
            batch = rows(batch, lo, hi) if hi > lo else rows(batch, 0, 1)
        with torch.autocast(
            self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None
        ):
            loss = self.loss_fn(self.model, batch)
        if k > 1:
            loss = loss * weight
        (loss.float() * (scale * self.loss_scale)).backward()
        self.flat.collect()
        return loss.detach().float()

    def _accumulate(self, batch: Batch, micro: int) -> torch.Tensor:
        """flat.grad ← mean gradient over the batch's rows, in micro-batches of at most ``micro``."""
        self.flat.zero_grad()
        n = n_rows(batch)
        loss = torch.zeros((), device=self.device)
        for piece in pieces(batch, micro):
            loss += self.forward_backward(piece, n_rows(piece) / n) * (n_rows(piece) / n)
        return loss

    def _probe(
        self, batch: Batch, probe: Probe, micro: int, scratch: torch.Tensor
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
        entries = torch.zeros((), device=self.device, dtype=torch.float64)
        loss = torch.zeros((), device=self.device)
        for j in range(k):
            self.flat.zero_grad()
            for piece in pieces(rows(batch, j * c, (j + 1) * c), micro):
                loss += self.forward_backward(piece, n_rows(piece) / c) * n_rows(piece)
            g = self.flat.grad  # S·g_j, (P,)
            sum_sq += torch.dot(g, g).double()
            entries += g.sum(dtype=torch.float64)
            acc.add_(g)
            if self.chunks is not None and probe.keep == "chunks":
                self.chunks[j].copy_(g)
        mean_sq = torch.dot(acc, acc).double() / (k * k)
        if self.shards.size > 1:  # sums over the parameters: over every shard of the worker
            sum_sq, entries, mean_sq = self.shards.sum_(torch.stack([sum_sq, entries, mean_sq]))
        s2 = self.loss_scale**2
        scale = self.loss_scale
        return WorkerStats(
            k, c, sum_sq.item() / s2, mean_sq.item() / s2, sum_entries=entries.item() / scale
        ), loss

    def _probe_step(
        self, batch: Batch, probe: Probe, micro: int, scratch: torch.Tensor
    ) -> tuple[torch.Tensor, WorkerStats]:
        """The first inner step, with its batch cut into the probe's chunks; the step's gradient is the
        same mean gradient as without probing."""
        e = n_rows(batch)
        k, c = probe.k, probe.c
        stats, loss = self._probe(batch, probe, micro, scratch)
        acc = self._accumulator(probe, scratch)
        self.flat.grad.copy_(acc).mul_(c / e)  # mean gradient of the chunked rows, weighted c·k/e
        for piece in pieces(rows(batch, k * c, e), micro):  # rows not in any chunk
            loss += self.forward_backward(piece, n_rows(piece) / e) * n_rows(piece)
        self._unscale_samples(probe, scratch)
        return loss / e, stats

    @torch.no_grad()
    def _unscale_samples(self, probe: Probe, scratch: torch.Tensor) -> None:
        """Kept gradient samples in true units (they were taken under the fp16 loss scale)."""
        if self.loss_scale == 1.0 or probe.keep == "none":
            return
        self._accumulator(probe, scratch).mul_(1.0 / self.loss_scale)
        if probe.keep == "chunks" and self.chunks is not None:
            self.chunks[: probe.k].mul_(1.0 / self.loss_scale)

    def _accumulator(self, probe: Probe, scratch: torch.Tensor) -> torch.Tensor:
        if probe.keep == "none":
            return scratch
        if self.sample_sum is None:
            self.sample_sum = torch.zeros_like(self.flat.param)
        if probe.keep == "chunks" and (self.chunks is None or self.chunks.shape[0] < probe.k):
            self.chunks = torch.zeros(probe.k, self.flat.numel, device=self.device)
        return self.sample_sum

    # -- gradient samples for the batch test (read after the round) ---------------------------------
    def _unclip(self) -> float:
        """1 / the last clip coefficient; nan when clipping zeroed a non-finite gradient."""
        coef = float(self._clip_coef)
        return 1.0 / coef if coef > 0 else math.nan

    def last_gradient(self) -> tuple[float, float]:
        """(‖g‖², Σ_i g_i) of the last inner step's gradient before clipping (the ``paper`` estimator's
        sample)."""
        g = self.flat.gather_grads()
        u = self._unclip()
        sq, entries = self.shards.sum_(torch.stack([torch.dot(g, g).double(), g.sum(dtype=torch.float64)]))
        return float(sq) * u * u, float(entries) * u

    @torch.no_grad()
    def add_sample_sum(self, out: torch.Tensor, paper: bool) -> None:
        """out += Σ_j g_j over this round's gradient samples: the probe's chunks, or (``paper``) the last
        gradient before clipping."""
        if paper:
            out.add_(self.flat.gather_grads(), alpha=self._unclip())
        else:
            assert self.sample_sum is not None, "the probe kept no vectors"
            out.add_(self.sample_sum)

    @torch.no_grad()
    def sample_dots(self, gbar: torch.Tensor, paper: bool) -> torch.Tensor:
        """(k,) float64: <g_j, ḡ> for this round's gradient samples."""
        if paper:
            dots = (torch.dot(self.flat.gather_grads(), gbar) * self._unclip()).reshape(1).double()
        else:
            assert self.chunks is not None, "the probe kept no chunk gradients"
            dots = (self.chunks[: self._probe_k] @ gbar).double()
        return self.shards.sum_(dots)  # over every shard of the worker


def _local(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's values on this rank (a sharded model's optimizer state); a tensor itself."""
    to_local = getattr(x, "to_local", None)
    return to_local() if to_local is not None else x
