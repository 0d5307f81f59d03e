"""The worker's gradient probe against brute force: explicit per-example gradients of a tiny model."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from adloco import models
from adloco.config import InnerConfig, ModelConfig
from adloco.engine.inner import make_optimizer
from adloco.library.algorithms.switch import Plan
from adloco.library.flat import FlatModule, flatten
from adloco.library.replica import Probe, Replica

VOCAB, T = 32, 6


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


def run(model, fetch, plan: Plan, probe: Probe | None):  # type: ignore[no-untyped-def]
    """One inner step's gradient on rows 0, 1, 2, ... (the step's rows, then the probe's extra rows)."""
    m = copy.deepcopy(model)
    rep = Replica(m, make_optimizer(flatten(m), InnerConfig(clip=0.0, lr=1e-3)), b_max=plan.micro)
    e = plan.effective
    batch = fetch(np.arange(e + (probe.extra_rows if probe else 0)))
    loss, stats = rep.gradient(batch, e, plan.micro, probe, torch.zeros(rep.flat.numel))
    return rep, loss, stats


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
    worker, _, st = run(model, fetch, plan, Probe(k, c, False, "chunks"))
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
    _, _, kept = run(model, fetch, plan, Probe(3, 2, False, "chunks"))
    w, _, scal = run(model, fetch, plan, Probe(3, 2, False, "none"))
    assert w.chunks is None and w.sample_sum is None
    assert scal.sum_sq == pytest.approx(kept.sum_sq, rel=1e-6)
    assert scal.mean_sq == pytest.approx(kept.mean_sq, rel=1e-6)


def test_extra_probe_batch_when_request_below_two(setup) -> None:  # type: ignore[no-untyped-def]
    tokens, fetch, model = setup
    plan = Plan(1, 1, False)
    worker, _, st = run(model, fetch, plan, Probe(4, 1, True, "sum"))
    # the step batch is row 0; the probe draws rows 1..4 and uses each as a chunk of one example
    G = per_example_grads(model, tokens[:5])
    probe = G[1:5]
    assert Probe(4, 1, True, "sum").extra_rows == 4
    assert st.sum_sq == pytest.approx(float((probe**2).sum()), rel=1e-4)
    assert st.mean_sq == pytest.approx(float((probe.mean(0) ** 2).sum()), rel=1e-4)
    torch.testing.assert_close(worker.sample_sum.double(), probe.sum(0), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(worker.flat.grad.double(), G[0], rtol=1e-4, atol=1e-6)


def test_accumulation_equals_one_big_batch(setup) -> None:  # type: ignore[no-untyped-def]
    tokens, fetch, model = setup
    w1, l1, _ = run(model, fetch, Plan(6, 1, False), None)
    w2, l2, _ = run(model, fetch, Plan(2, 3, False), None)
    torch.testing.assert_close(w1.flat.grad, w2.flat.grad, rtol=1e-5, atol=1e-7)
    assert float(l1) == pytest.approx(float(l2), rel=1e-5)
