"""The worker's gradient probe against brute force: explicit per-example gradients of a tiny model."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from adloco import models
from adloco.algorithms.switch import Plan
from adloco.config import InnerConfig, ModelConfig
from adloco.engine.flat import FlatModule
from adloco.engine.worker import ProbeSpec, Worker

VOCAB, T = 32, 6


class ListStream:
    """Stand-in for ShardStream: hands out 0, 1, 2, ... in order."""

    def __init__(self) -> None:
        self.pos = 0

    def take(self, k: int) -> np.ndarray:
        out = np.arange(self.pos, self.pos + k)
        self.pos += k
        return out


@pytest.fixture()
def setup():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    tokens = torch.randint(1, VOCAB, (64, T))

    def fetch(idx: np.ndarray) -> dict[str, torch.Tensor]:
        x = tokens[torch.as_tensor(idx)]
        return {"input_ids": x, "labels": x}

    model = models.ModelFactory(ModelConfig(name="llama-micro"), VOCAB, T, 0, 0).build(3)
    return tokens, fetch, model


def per_example_grads(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, P) float64: the gradient of each example's mean token loss, one backward each."""
    m = copy.deepcopy(model)
    flat = FlatModule(m)
    out = []
    for i in range(x.shape[0]):
        flat.zero_grad()
        m(input_ids=x[i : i + 1], labels=x[i : i + 1]).loss.backward()
        out.append(flat.grad.double().clone())
    return torch.stack(out)


def run(model, fetch, plan: Plan, probe: ProbeSpec | None):  # type: ignore[no-untyped-def]
    inner = InnerConfig(clip=0.0, lr=1e-3)
    worker = Worker(0, copy.deepcopy(model), inner, b_max=plan.micro)
    res = worker.run_round(
        ListStream(), fetch, plan, 1, lambda h: 1e-3, probe, torch.zeros(worker.flat.numel)
    )
    return worker, res


@pytest.mark.parametrize(
    ("plan", "k", "c"),
    [
        (Plan(2, 3, False), 3, 2),
        (Plan(7, 1, False), 3, 2),
        (Plan(4, 2, False), 4, 2),
        (Plan(3, 3, False), 2, 4),
    ],
)
def test_probe_statistics_match_brute_force(setup, plan: Plan, k: int, c: int) -> None:  # type: ignore[no-untyped-def]
    tokens, fetch, model = setup
    e = plan.effective
    G = per_example_grads(model, tokens[:e])  # (e, P)
    chunks = torch.stack([G[j * c : (j + 1) * c].mean(0) for j in range(k)])  # (k, P)
    worker, res = run(model, fetch, plan, ProbeSpec(k, c, False, "chunks"))
    st = res.stats
    assert st is not None and (st.n, st.c) == (k, c)
    assert st.sum_sq == pytest.approx(float((chunks**2).sum()), rel=1e-4)
    assert st.mean_sq == pytest.approx(float((chunks.mean(0) ** 2).sum()), rel=1e-4)
    # the kept vectors are the chunk gradients themselves
    torch.testing.assert_close(worker.chunks[:k].double(), chunks, rtol=1e-4, atol=1e-6)
    # the step's gradient is the plain mean over all e examples (chunked rows and the rest)
    torch.testing.assert_close(worker.flat.grad.double(), G.mean(0), rtol=1e-4, atol=1e-6)


def test_probe_without_kept_vectors_gives_same_scalars(setup) -> None:  # type: ignore[no-untyped-def]
    _, fetch, model = setup
    plan = Plan(2, 3, False)
    _, kept = run(model, fetch, plan, ProbeSpec(3, 2, False, "chunks"))
    w, scal = run(model, fetch, plan, ProbeSpec(3, 2, False, "none"))
    assert w.chunks is None and w.sample_sum is None
    assert scal.stats.sum_sq == pytest.approx(kept.stats.sum_sq, rel=1e-6)
    assert scal.stats.mean_sq == pytest.approx(kept.stats.mean_sq, rel=1e-6)


def test_extra_probe_batch_when_request_below_two(setup) -> None:  # type: ignore[no-untyped-def]
    tokens, fetch, model = setup
    plan = Plan(1, 1, False)
    worker, res = run(model, fetch, plan, ProbeSpec(4, 1, True, "sum"))
    # the step batch is row 0; the probe draws rows 1..4 and uses each as a chunk of one example
    G = per_example_grads(model, tokens[:5])
    probe = G[1:5]
    assert res.probe_examples == 4 and res.examples == 1
    assert res.stats.sum_sq == pytest.approx(float((probe**2).sum()), rel=1e-4)
    assert res.stats.mean_sq == pytest.approx(float((probe.mean(0) ** 2).sum()), rel=1e-4)
    torch.testing.assert_close(worker.sample_sum.double(), probe.sum(0), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(worker.flat.grad.double(), G[0], rtol=1e-4, atol=1e-6)


def test_accumulation_equals_one_big_batch(setup) -> None:  # type: ignore[no-untyped-def]
    tokens, fetch, model = setup
    w1, r1 = run(model, fetch, Plan(6, 1, False), None)
    w2, r2 = run(model, fetch, Plan(2, 3, False), None)
    torch.testing.assert_close(w1.flat.grad, w2.flat.grad, rtol=1e-5, atol=1e-7)
    assert r1.loss == pytest.approx(r2.loss, rel=1e-5)
    assert r1.examples == r2.examples == 6
