"""Workers that share a GPU, training at once: each worker's inner step captured as a CUDA graph and
replayed on the worker's own stream (``cuda_graphs``; ALGORITHM.md §14).

Small models leave a GPU idle: a step is hundreds of kernel launches from one Python thread, and the
workers of a process run one after another. Measured on an H100 (benchmarks/RESULTS.md "On a GPU"),
streams and threads do not help (one thread still issues every launch), separate processes do (3.4x
with four llama-tiny workers), and a CUDA graph of each worker's step does most (12x). A graph replays
the whole step (forward and backward over its micro-batches, clipping, the optimizer's step) with one
launch, so the host queues every worker's step in microseconds and the GPU runs them side by side on
their streams.

What a graph needs, and how the step provides it:
- fixed input buffers: the batch is copied into buffers captured with the graph (one per layout of
  the batch: rows, micro-batches);
- no host decision inside the step: fp16's loss scaling (a skipped step) is refused, so is DDP (its
  gradients are averaged between backward and step); the learning rate is a device tensor filled
  before each replay (:meth:`adloco.library.replica.Replica.device_lrs`), the step counts of a capturable
  optimizer live on the device;
- state that stays where it was captured: a graph is recaptured when the batch's layout, the
  micro-batch size or the optimizer's state tensors change (a reset after a move, a resume).

The first step of every new layout runs eagerly, on the worker's stream (it warms up the kernels and
creates the optimizer's state; it is a real step, not a wasted one); the next is captured and replayed,
and every later one replayed. The gradient probe's step (the round's first, with the batch test) stays
eager. A step that cannot be captured (a model whose forward waits on the host) runs eagerly from then
on, with one warning. Replayed kernels are the captured ones, so a replayed step is bit for bit the
eager step of the same optimizer; against a run without graphs the difference is the optimizer's
implementation (capturable and fused), within float tolerance.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from adloco.library.optim import CombinedOptimizer, Muon

log = logging.getLogger("adloco")

Batch = Any


def layout(batch: Batch) -> Any:
    """The structure, shapes and dtypes of a batch (what a graph's input buffers fix)."""
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape), batch.dtype)
    if isinstance(batch, Mapping):
        return tuple((k, layout(v)) for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, tuple(layout(v) for v in batch))
    return repr(batch)


def to_device(batch: Batch, device: torch.device, memo: dict[int, torch.Tensor] | None = None) -> Batch:
    """The batch on ``device`` (non-blocking); a tensor that appears twice (a language model's inputs,
    which are also its labels) is copied once."""
    memo = {} if memo is None else memo
    if isinstance(batch, torch.Tensor):
        got = memo.get(id(batch))
        if got is None:
            got = memo[id(batch)] = batch.to(device, non_blocking=True)
        return got
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, memo) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, memo) for v in batch)
    return batch


def copy_into(static: Batch, batch: Batch) -> None:
    """Copy every tensor of ``batch`` into the same place of ``static`` (same layout)."""
    if isinstance(static, torch.Tensor):
        static.copy_(batch, non_blocking=True)
    elif isinstance(static, Mapping):
        for k, v in static.items():
            copy_into(v, batch[k])
    elif isinstance(static, (list, tuple)):
        for s, b in zip(static, batch, strict=True):
            copy_into(s, b)


class GraphedStep:
    """One worker's inner step as a CUDA graph (see the module docstring).

    ``body(batch, micro)`` runs the step on a batch already on the device and returns its mean loss
    (0-dim); ``state_key()`` names the tensors the step writes besides its own (the optimizer's state):
    a change recaptures. ``capture=False`` calls the body where a graph would be replayed, with the same
    input buffers and bookkeeping: what the CPU tests check.
    """

    def __init__(
        self,
        body: Callable[[Batch, int], torch.Tensor],
        state_key: Callable[[], tuple[int, ...]],
        device: torch.device,
        capture: bool = True,
        name: str = "worker",
    ) -> None:
        self.body, self.state_key, self.device, self.capture, self.name = (
            body,
            state_key,
            device,
            capture,
            name,
        )
        self.stream: Any = torch.cuda.Stream(device) if capture else None
        self.failed: str | None = None  # why capture failed: every later step runs eagerly
        self.captures = 0  # graphs captured so far (a test and the benchmark read it)
        self.replays = 0
        self._warm: Any = None  # the key of the last eager step: the next step with it is captured
        self._key: Any = None  # the key of the graph held
        self._graph: Any = None
        self._static: Batch = None
        self._loss: torch.Tensor | None = None

    def run(self, batch: Batch, micro: int) -> torch.Tensor:
        """One step on ``batch`` (host or device tensors) in micro-batches of ``micro`` rows; returns the
        step's mean loss, a tensor of its own (a replay overwrites the graph's output)."""
        key = (layout(batch), micro, self.state_key())
        if self._graph is not None and key == self._key:
            return self._replay(batch)
        if key == self._warm and self.failed is None and self._capture(batch, micro, key):
            return self._replay(batch)
        self.drop()
        loss = self.body(to_device(batch, self.device), micro)
        self._warm = (layout(batch), micro, self.state_key())  # the state the step may have created
        return loss

    def drop(self) -> None:
        """Forget the graph (its memory goes back to the allocator)."""
        self._graph = self._static = self._loss = self._key = None

    def _replay(self, batch: Batch) -> torch.Tensor:
        assert self._loss is not None
        copy_into(self._static, batch)
        if self.capture:
            self._graph.replay()
        else:
            self._loss.copy_(self.body(self._static, self._key[1]))
        self.replays += 1
        return self._loss.clone()

    def _capture(self, batch: Batch, micro: int, key: Any) -> bool:
        """Capture the step on the inputs' buffers (a capture runs nothing: the caller replays it)."""
        self.drop()
        static = to_device(batch, self.device)
        static = _fresh(static)  # buffers of the graph's own, not the caller's tensors
        if not self.capture:
            self._static, self._key, self._graph = static, key, "emulated"
            self._loss = torch.zeros((), device=self.device)
            self.captures += 1
            return True
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream):
                loss = self.body(static, micro)
        except BaseException as exc:  # noqa: BLE001 - any failure: the step runs eagerly from now on
            torch.cuda.synchronize(self.device)
            if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
                raise torch.OutOfMemoryError(str(exc)) from exc  # the caller halves b_max
            if isinstance(exc, KeyboardInterrupt):
                raise
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            self.failed = first
            log.warning(
                f"cuda_graphs: {self.name}'s step could not be captured as a CUDA graph ({first}); it runs "
                "eagerly from now on"
            )
            return False
        self._graph, self._static, self._loss, self._key = graph, static, loss, key
        self.captures += 1
        return True


def _fresh(batch: Batch) -> Batch:
    """Copies of a batch's tensors (a tensor that appears twice stays one copy)."""
    memo: dict[int, torch.Tensor] = {}

    def go(x: Batch) -> Batch:
        if isinstance(x, torch.Tensor):
            got = memo.get(id(x))
            if got is None:
                got = memo[id(x)] = x.clone()
            return got
        if isinstance(x, Mapping):
            return {k: go(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(go(v) for v in x)
        return x

    return go(batch)


def state_pointers(optimizer: torch.optim.Optimizer, *tensors: torch.Tensor) -> tuple[int, ...]:
    """Where the tensors a step writes live: ``tensors`` (the flat parameters and gradients) and every
    state tensor of ``optimizer`` (addresses only: no device work)."""
    out = [t.data_ptr() for t in tensors]
    for group in optimizer.param_groups:
        for p in group["params"]:
            out.append(p.data_ptr())
            for v in optimizer.state.get(p, {}).values():
                if isinstance(v, torch.Tensor):
                    out.append(v.data_ptr())
    return tuple(out)


def capturable(optimizer: torch.optim.Optimizer) -> str | None:
    """Why ``optimizer`` cannot be stepped inside a CUDA graph, or None when it can: an Adam-family
    optimizer needs ``capturable=True`` (its step counts on the device); a learning rate must reach the
    step as a tensor, which torch allows with ``capturable`` or ``fused``, and
    :class:`adloco.library.optim.Muon` always (``torch.optim.Muon`` reads it on the host)."""
    if isinstance(optimizer, CombinedOptimizer):  # torch's Muon's reason first: no setting of it helps
        parts = sorted(optimizer.optimizers, key=lambda o: type(o) is not torch.optim.Muon)
        return next((why for o in parts if (why := capturable(o)) is not None), None)
    if isinstance(optimizer, Muon):  # its lr read as a device tensor: nothing on the host
        return None
    if isinstance(optimizer, torch.optim.Muon):
        return (
            "torch.optim.Muon reads its learning rate on the host at every step; adloco.library.optim.Muon "
            "(the same step) takes it as a device tensor"
        )
    groups = optimizer.param_groups
    if all(g.get("capturable") for g in groups):
        return None
    if "capturable" in groups[0]:
        return (
            f"{type(optimizer).__name__} needs capturable=True (build it with capturable=True, and "
            "fused=True where the optimizer has it)"
        )
    if all(g.get("fused") for g in groups):
        return None
    return f"{type(optimizer).__name__} needs fused=True (its learning rate must be a tensor on the device)"
