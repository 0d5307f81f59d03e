"""What an application reads of an algorithm object: a narrow, read-only view (``algo.view``).

``adloco train``'s driver, its checkpoints and the Hugging Face and Lightning callbacks run an
:class:`~adloco.library.method.AdLoCo` through its methods (``step_all``, ``sync``, ``state_dict``,
``settle`` ...) and read the rest through :class:`View`: this process's workers and what each one holds
(its replica: model, inner optimizer, flat parameters; its plan for the round), and the few facts about
the run that a log line, a memory estimate or a checkpoint needs. The parts an algorithm is made of (its
trainers, its workers' error feedback, its communicator) stay its own: the view hands out copies and
counts, never them, so the application cannot come to depend on how a round is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adloco.library.replica import Replica
    from adloco.library.round import WorkerPlan


class View:
    """A read-only window on ``algo``, an :class:`~adloco.library.method.AdLoCo` (its ``view``; typed ``Any``
    here so that this module, which the algorithm imports, does not import it back)."""

    def __init__(self, algo: Any) -> None:
        self._algo = algo

    @property
    def workers(self) -> tuple[int, ...]:
        """This process's workers, by id (in the order they were built)."""
        return tuple(self._algo.replicas)

    def replica(self, w: int) -> Replica:
        """Worker ``w``'s replica (one of :attr:`workers`): its model, inner optimizer and flat parameters."""
        return self._algo.replicas[w]

    @property
    def first(self) -> Replica:
        """This process's first worker's replica (every worker of a process holds the same model shape)."""
        return next(iter(self._algo.replicas.values()))

    @property
    def parameters(self) -> int:
        """P, the whole model's parameters (a sharded worker's whole model, not this rank's share)."""
        return self.first.flat.full_numel

    @property
    def plans(self) -> Mapping[int, WorkerPlan]:
        """This process's workers' plans for the round: trainer, shard, micro-batches, probe."""
        return MappingProxyType(self._algo.plans)

    @property
    def keeps_feedback(self) -> bool:
        """Whether every worker keeps the error feedback of its Δ (P float32 values each)."""
        return self._algo.feedback is not None

    @property
    def trainers_alive(self) -> int:
        """How many trainers are alive."""
        return len(self._algo.trainers)

    @property
    def allocation(self) -> dict[int, int]:
        """Worker -> its trainer, every worker's (a copy)."""
        return dict(self._algo.allocation)

    @property
    def emulate(self) -> tuple[float, ...] | None:
        """Every worker's emulated speed, by id (``emulate_speed``), None when none is emulated."""
        got = self._algo.emulate
        return None if got is None else tuple(got)

    @property
    def membership(self) -> dict[str, Any] | None:
        """The change of workers the last ``load_state_dict`` made (joined, left, merged), None if none."""
        got = self._algo.membership
        return None if got is None else dict(got)

    @property
    def rank(self) -> int:
        """This process's rank among the processes of the run."""
        return self._algo.comm.rank

    @property
    def cuda_graphs(self) -> bool:
        """Whether every worker's inner step is a CUDA graph (the workers of a process step at once)."""
        return self._algo.cuda_graphs

    @property
    def ddp(self) -> bool:
        """Whether gradients are averaged every step (DDP), with no rounds of their own."""
        return self._algo.ddp

    @property
    def device(self) -> Any:
        """The device this process's workers train on."""
        return self._algo.device
