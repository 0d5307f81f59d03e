"""The hooked form of an algorithm object (``with algo:``): your loop keeps its forward, backward and
``optimizer.step()``; the object hooks each replica's step and synchronizes every H steps, as torchft's
DiLoCo does. There is no gradient probe in this form, so it suits DiLoCo, LocalSGD, DDP and AdLoCo
without a batch test.

:class:`Hooks` makes the hooks from what the algorithm hands it (:meth:`adloco.library.method.AdLoCo.__enter__`):
how a round begins, how many rows a step counts, what to do once every local worker has taken a number of
steps (the schedule's launches and landings, the round's end), and, for DDP, how a worker's gradients are
averaged before the user's optimizer steps on them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from adloco.library.replica import Replica
from adloco.library.round import WorkerProgress
from adloco.library.settings import AdaptiveBatch


def check(batch: AdaptiveBatch, ddp: bool, local_workers: int, cuda_graphs: bool = False) -> None:
    """What the hooked form cannot do, refused in one line each."""
    if batch.test != "none" or batch.statistics:
        raise ValueError(
            "batch: the batch test needs the gradient probe at the round's first step, which only "
            "step()/step_all() can take; use them, or AdaptiveBatch(test='none', statistics=False)"
        )
    if cuda_graphs:
        raise ValueError(
            "cuda_graphs: in the hooked form your loop runs the step, so there is none to capture; "
            "use step()/step_all(), or capture your own step"
        )
    if batch.schedule != "none":
        raise ValueError(
            f"batch.schedule = {batch.schedule!r}: your loader decides the rows of a step in the "
            "hooked form; a batch schedule needs step()/step_all(), which feed the planned rows"
        )
    if ddp and local_workers > 1:
        raise ValueError("ddp: hooked optimizers need one worker per process (or per thread: ThreadComm)")


def average_grads(rep: Replica, workers: list[int], reduce: Callable[..., bool], buf: torch.Tensor) -> None:
    """DDP: the replica's gradients averaged with its trainer's ``workers``' (through ``buf``), before the
    user's optimizer steps on them."""
    g = rep.flat.gather_grads()

    def add(_: int, out: torch.Tensor) -> None:
        out.add_(g, alpha=1.0 / len(workers))

    reduce(workers, "grad", buf, add)
    g.copy_(buf)
    rep.flat.scatter_grads()


class Hooks:
    """Step pre- and post-hooks for every local replica's optimizer, for rounds of H steps.

    ``begin()``: the round's bookkeeping (begun before its first step); ``before_write(w)``: called before
    worker w's optimizer writes its state (the round's snapshot orders itself there); ``rows(w)``: the
    examples one step of worker w counts; ``synchronize(h)``: what is due once every local worker took h < H steps of the round
    (streaming fragments); ``end()``: the round's end, once every one took H; ``average(w)``: DDP, worker w's
    gradients averaged with its trainer's (None: rounds of local steps)."""

    def __init__(
        self,
        H: int,
        begin: Callable[[], dict[int, WorkerProgress]],
        rows: Callable[[int], int],
        synchronize: Callable[[int], None],
        end: Callable[[], object],
        average: Callable[[int], None] | None,
        before_write: Callable[[int], None] = lambda w: None,
    ) -> None:
        self.H, self.begin, self.rows, self.average = H, begin, rows, average
        self.before_write = before_write
        self.synchronize, self.end = synchronize, end
        self._round: object = None  # the round's progress, to tell a new round
        self._done = 0  # steps of the round whose due synchronizations were run

    def install(self, replicas: Mapping[int, Replica]) -> list[Any]:
        """Register the hooks on every replica's optimizer; returns their handles."""
        handles = []
        for w, rep in replicas.items():
            # the round begins (inner_state reset, snapshot) before its first step, not after it; the
            # trainer's lr multiplier (ALGORITHM.md §10) applies to the user's step and is taken back after it
            handles.append(rep.optimizer.register_step_pre_hook(self._pre(w, rep)))
            handles.append(rep.optimizer.register_step_post_hook(self._post(w, rep)))
        return handles

    def _pre(self, w: int, rep: Replica) -> Callable[[Any, Any, Any], None]:
        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            self.begin()
            self.before_write(w)
            rep.scale_lr()
            if self.average is not None:
                self.average(w)

        return hook

    def _post(self, w: int, rep: Replica) -> Callable[[Any, Any, Any], None]:
        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            rep.restore_lr()
            rep.flat.after_step()  # a sharded model's buffer follows the shards stepped on
            progress = self.begin()
            if progress is not self._round:
                self._round, self._done = progress, 0
            pr = progress[w]
            pr.steps += 1
            pr.examples += self.rows(w)
            done = min(p.steps for p in progress.values())  # steps every local worker has taken
            if done >= self.H:
                self.end()
            elif done > self._done:
                self._done = done
                self.synchronize(done)

        return hook
