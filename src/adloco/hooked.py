"""The hooked form of an algorithm object (``with algo:``): your loop keeps its forward, backward and
``optimizer.step()``; the object hooks each replica's step and synchronizes every H steps, as torchft's
DiLoCo does. There is no gradient probe in this form, so it suits DiLoCo, LocalSGD, DDP and AdLoCo
without a batch test. A mixin of :class:`adloco.method.AdLoCo`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from adloco.replica import Replica
    from adloco.round import RoundReport, WorkerPlan, WorkerProgress
    from adloco.settings import AdaptiveBatch
    from adloco.snapshot import InnerSnapshot


class HookedMode:
    """``__enter__`` / ``__exit__`` of :class:`adloco.method.AdLoCo`."""

    stated_batch: int | None = None  # rows per step the user stated (DiLoCo's batch_size); None: unknown

    if TYPE_CHECKING:  # what the algorithm object provides
        batch: AdaptiveBatch
        ddp: bool
        cuda_graphs: bool
        replicas: dict[int, Replica]
        _snap: dict[int, InnerSnapshot]
        plans: dict[int, WorkerPlan]
        allocation: dict[int, int]
        scratch: torch.Tensor
        counts_rows: bool
        H: int
        _h: int
        _hooks: list[Any]
        _streamed: int

        def members(self) -> dict[int, list[int]]: ...
        def _streaming(self, h: int) -> None: ...
        def _round_progress(self) -> dict[int, WorkerProgress]: ...
        def sync(self, abort: bool = False) -> RoundReport: ...
        def _reduce(
            self, workers: list[int], kind: str, out: torch.Tensor, add: Callable[[int, torch.Tensor], None]
        ) -> bool: ...

    def __enter__(self) -> Any:
        """Hook every local replica's ``optimizer.step``: your loop runs forward, backward and step; every
        H steps the round synchronizes. Examples are counted only when the rows of a step were stated
        (``batch_size`` of DiLoCo, LocalSGD and DDP); otherwise ``totals.examples`` is None (unknown)."""
        if self.batch.test != "none" or self.batch.statistics:
            raise ValueError(
                "batch: the batch test needs the gradient probe at the round's first step, which only "
                "step()/step_all() can take; use them, or AdaptiveBatch(test='none', statistics=False)"
            )
        if self.cuda_graphs:
            raise ValueError(
                "cuda_graphs: in the hooked form your loop runs the step, so there is none to capture; "
                "use step()/step_all(), or capture your own step"
            )
        if self.batch.schedule != "none":
            raise ValueError(
                f"batch.schedule = {self.batch.schedule!r}: your loader decides the rows of a step in the "
                "hooked form; a batch schedule needs step()/step_all(), which feed the planned rows"
            )
        if self.ddp and len(self.replicas) > 1:
            raise ValueError("ddp: hooked optimizers need one worker per process (or per thread: ThreadComm)")
        self.counts_rows = self.stated_batch is not None
        for w, rep in self.replicas.items():
            # the round begins (inner_state reset, snapshot) before its first step, not after it; the
            # trainer's lr multiplier (ALGORITHM.md §10) applies to the user's step and is taken back after it
            pre = self._hooked_pre(w) if self.ddp else self._begin(w)
            self._hooks.append(rep.optimizer.register_step_pre_hook(pre))
            self._hooks.append(rep.optimizer.register_step_post_hook(self._hooked_post(w)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.counts_rows = True

    def _begin(self, w: int) -> Callable[[Any, Any, Any], None]:
        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            self._round_progress()
            if w in self._snap:  # the round's snapshot is taken before the state is written
                self._snap[w].before_write()
            self.replicas[w].scale_lr()

        return hook

    def _hooked_pre(self, w: int) -> Callable[[Any, Any, Any], None]:
        """DDP: average the trainer's gradients before the user's optimizer steps on them."""

        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            self._round_progress()
            if w in self._snap:
                self._snap[w].before_write()
            rep = self.replicas[w]
            rep.scale_lr()
            g = rep.flat.gather_grads()
            ws = self.members()[self.allocation[w]]

            def add(_: int, out: torch.Tensor) -> None:
                out.add_(g, alpha=1.0 / len(ws))

            self._reduce(ws, "grad", self.scratch, add)
            g.copy_(self.scratch)
            rep.flat.scatter_grads()

        return hook

    def _hooked_post(self, w: int) -> Callable[[Any, Any, Any], None]:
        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            self.replicas[w].restore_lr()
            self.replicas[w].flat.after_step()  # a sharded model's buffer follows the shards stepped on
            progress = self._round_progress()
            pr = progress[w]
            pr.steps += 1
            pr.examples += self.stated_batch or self.plans[w].effective  # weights Δ by steps when unknown
            done = min(p.steps for p in progress.values())  # steps every local worker has taken
            if done >= self.H:
                self._h = self.H
                self.sync()
            elif done > self._streamed:  # streaming fragments due after this step
                self._streamed = done
                self._streaming(done)

        return hook
