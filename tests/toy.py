"""The toy problem the library's tests share: a linear regression (nn.Linear, a squared loss, tuple batches)
whose batches are reproducible for any worker, round and step. No Hugging Face model is involved."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from adloco import AdLoCo

D = 6  # input features
A = TypeVar("A", bound=AdLoCo)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).mean()


def models(n: int, seed: int = 0) -> list[nn.Linear]:
    torch.manual_seed(seed)
    first = nn.Linear(D, 1)
    return [copy.deepcopy(first) for _ in range(n)]


def sgd(ms: list[nn.Linear], lr: float = 0.05) -> list[torch.optim.Optimizer]:
    return [torch.optim.SGD(m.parameters(), lr=lr) for m in ms]


def build(
    cls: Callable[..., A],
    workers: int = 2,
    *,
    optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW,
    lr: float = 0.01,
    seed: int = 0,
    ms: list[nn.Module] | None = None,
    loss: Callable[..., torch.Tensor] = loss_fn,
    **dials: Any,
) -> A:
    """``cls`` (AdLoCo or a preset) over ``workers`` toy models (or ``ms``), each with its own ``optimizer``
    at ``lr``, on the toy ``loss``: the set-up the library's tests share; ``dials``: the round's, as
    keywords."""
    ms = list(models(workers, seed)) if ms is None else ms
    return cls(ms, [optimizer(m.parameters(), lr=lr) for m in ms], loss_fn=loss, **dials)


def merging(workers: int = 3, **dials: Any) -> AdLoCo:
    """AdLoCo over ``workers`` toy models in 2 trainers that merge at round 2, its batch test on (η 0.3, b₀
    2), H 2, a Nesterov outer step: the run the state and overlap tests follow; ``dials`` on top."""
    from adloco import AdaptiveBatch, Merging, Outer

    kw: dict[str, Any] = dict(
        inner_steps=2,
        trainers=2,
        outer=Outer.nesterov(),
        batch=AdaptiveBatch(eta=0.3, initial=2),
        merge=Merging(every=2),
    )
    return build(AdLoCo, workers, **{**kw, **dials})


def hooked_rounds(
    hooked: AdLoCo, ms: list[nn.Module], rounds: int, loss: Callable[[nn.Module, int, int, int], torch.Tensor]
) -> None:
    """``rounds`` rounds of the hooked form (``with hooked:``), as a user's own loop runs them: each worker's
    optimizer stepped on ``loss(model, worker, round, step)``."""
    opts = [rep.optimizer for rep in hooked.replicas.values()]
    with hooked:
        for r in range(rounds):
            for h in range(hooked.H):
                for w, (m, o) in enumerate(zip(ms, opts, strict=True)):
                    o.zero_grad()
                    loss(m, w, r, h).backward()
                    o.step()


class Data:
    """y = x·w* + noise; ``batch(w, round, step, rows)`` is reproducible for any worker and step."""

    def __init__(self, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(D, generator=g)
        self.seed = seed

    def batch(self, w: int, r: int, h: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(hash((self.seed, w, r, h)) % 2**31)
        x = torch.randn(rows, D, generator=g)
        return x, x @ self.w + 0.5 * torch.randn(rows, generator=g)


def run_round(algo: AdLoCo, data: Data) -> Any:
    """One round of every local worker's steps; returns the round's report."""
    r = algo.round
    for h in range(algo.H):
        algo.step_all({w: data.batch(w, r, h, algo.batch_size(w)) for w in algo.local_workers})
    assert algo.round == r + 1
    return algo.last_report


def flat_like(m: nn.Module) -> torch.Tensor:
    """m's parameters in the flat order adloco uses (matrices first, then the rest)."""
    params = list(m.parameters())
    mats = [p.detach().reshape(-1) for p in params if p.ndim >= 2]
    return torch.cat(mats + [p.detach().reshape(-1) for p in params if p.ndim < 2])


def rounds_in_threads(
    make: Callable[[Any, list[nn.Linear]], Any], n: int, rounds: int, data: Data
) -> list[Any]:
    """``make(comm, [model])`` for each of ``n`` workers, one a thread (a
    :class:`adloco.library.comm.threads.ThreadComm` each), run for ``rounds`` rounds of ``data``'s batches; the
    algorithms in rank order. The models are built here, before the threads, which share torch's
    generator."""
    from adloco.library.comm.threads import Hub, ThreadComm
    from tests.helpers import on_threads

    hub, ms = Hub(n, timeout=60), models(n)
    algos: list[Any] = [None] * n

    def work(rank: int) -> None:
        algos[rank] = algo = make(ThreadComm(hub, rank), [ms[rank]])
        for r in range(rounds):
            for h in range(algo.H):
                algo.step_all({rank: data.batch(rank, r, h, algo.batch_size(rank))})

    on_threads(hub, work)
    return algos
