"""Outer optimizers on the pseudo-gradient Δ = θ − mean_m θ_m (ALGORITHM.md §1, step 4)."""

from __future__ import annotations

import io

import pytest
import torch

from adloco.library.algorithms.outer import OuterOptimizer


def _workers(theta: torch.Tensor, seed: int, m: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return theta + 0.1 * torch.randn(m, theta.numel(), generator=g, dtype=theta.dtype)


def test_average_is_mean_of_workers() -> None:
    theta = torch.linspace(-1, 1, 6, dtype=torch.float64)
    thetas = _workers(theta, 0)
    delta = theta - thetas.mean(0)
    opt = OuterOptimizer("average", lr=0.5)  # lr is ignored by `average`
    opt.step(theta, delta)
    torch.testing.assert_close(theta, thetas.mean(0))
    assert not opt.has_state and opt.state_dict() == {}


def test_sgd() -> None:
    theta = torch.linspace(-1, 1, 6, dtype=torch.float64)
    before = theta.clone()
    delta = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -0.25], dtype=torch.float64)
    opt = OuterOptimizer("sgd", lr=0.5)
    opt.step(theta, delta)
    torch.testing.assert_close(theta, before - 0.5 * delta)
    assert not opt.has_state and opt.state_dict() == {}
    opt.step(theta, delta)
    torch.testing.assert_close(theta, before - delta)


def test_a_state_with_momentum_is_refused_by_a_preset_that_keeps_none() -> None:
    """A Nesterov state loaded into `sgd` (DiLoCo's preset under sync.overlap delayed) would lose its momentum
    without a word: refused, naming what to load it with."""
    theta = torch.linspace(-1, 1, 6)
    nesterov = OuterOptimizer("nesterov", lr=0.7, momentum=0.9)
    nesterov.step(theta, torch.ones(6))
    saved = nesterov.state_dict()
    assert saved
    for kind in ("sgd", "average"):
        with pytest.raises(ValueError, match="load it with the outer step it was saved with"):
            OuterOptimizer(kind, lr=0.7).load_state_dict(saved)
    OuterOptimizer("sgd", lr=0.7).load_state_dict({})  # an empty state is what sgd saves
    again = OuterOptimizer("nesterov", lr=0.7, momentum=0.9)
    again.step(theta.clone(), torch.zeros(6))
    again.load_state_dict(saved)


def test_sgd_lr_one_equals_average() -> None:
    theta = torch.linspace(-1, 1, 5)
    thetas = _workers(theta, 1)
    delta = theta - thetas.mean(0)
    a, b = theta.clone(), theta.clone()
    OuterOptimizer("sgd", lr=1.0).step(a, delta)
    OuterOptimizer("average").step(b, delta)
    torch.testing.assert_close(a, b)


def _deltas(n: int = 3, size: int = 8) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(42)
    return [torch.randn(size, generator=g) for _ in range(n)]


def test_nesterov_matches_torch_sgd() -> None:
    lr, mu = 0.7, 0.9
    theta0 = torch.randn(8, generator=torch.Generator().manual_seed(7))
    ours = theta0.clone()
    ref = torch.nn.Parameter(theta0.clone())
    opt = OuterOptimizer("nesterov", lr=lr, momentum=mu)
    sgd = torch.optim.SGD([ref], lr=lr, momentum=mu, nesterov=True)
    for delta in _deltas():
        opt.step(ours, delta)
        ref.grad = delta.clone()
        sgd.step()
        torch.testing.assert_close(ours, ref.detach())
    torch.testing.assert_close(opt.state_dict()["momentum"], sgd.state[ref]["momentum_buffer"])
    assert opt.has_state


def test_nesterov_by_hand() -> None:
    lr, mu = 0.5, 0.5
    theta = torch.zeros(2)
    opt = OuterOptimizer("nesterov", lr=lr, momentum=mu)
    opt.step(theta, torch.tensor([1.0, 2.0]))  # v = Δ; θ = −lr(Δ + μΔ) = −0.75 Δ
    torch.testing.assert_close(theta, torch.tensor([-0.75, -1.5]))
    opt.step(theta, torch.tensor([1.0, 0.0]))  # v = [1.5, 1]; θ −= 0.5([1, 0] + [0.75, 0.5])
    torch.testing.assert_close(opt.v, torch.tensor([1.5, 1.0]))
    torch.testing.assert_close(theta, torch.tensor([-1.625, -1.75]))


def test_nesterov_momentum_is_float32() -> None:
    theta = torch.zeros(4, dtype=torch.bfloat16)
    opt = OuterOptimizer("nesterov", lr=0.7, momentum=0.9)
    opt.step(theta, torch.ones(4, dtype=torch.bfloat16))
    assert opt.v is not None and opt.v.dtype == torch.float32


def test_state_dict_round_trip() -> None:
    lr, mu = 0.7, 0.9
    deltas = _deltas(5)
    a = OuterOptimizer("nesterov", lr=lr, momentum=mu)
    theta_a = torch.zeros(8)
    for d in deltas[:2]:
        a.step(theta_a, d)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = OuterOptimizer("nesterov", lr=lr, momentum=mu)
    b.load_state_dict(torch.load(buf))
    torch.testing.assert_close(b.state_dict()["momentum"], a.state_dict()["momentum"])
    theta_b = theta_a.clone()
    for d in deltas[2:]:
        a.step(theta_a, d)
        b.step(theta_b, d)
    torch.testing.assert_close(theta_a, theta_b)
    # a fresh optimizer (no state loaded) diverges: the loaded momentum matters
    c = OuterOptimizer("nesterov", lr=lr, momentum=mu)
    theta_c = theta_b.clone()
    c.step(theta_c, deltas[0])
    b.step(theta_b, deltas[0])
    assert not torch.allclose(theta_b, theta_c)


def test_empty_state_dict_before_first_step() -> None:
    opt = OuterOptimizer("nesterov", lr=0.7, momentum=0.9)
    assert opt.state_dict() == {}
    opt.load_state_dict({})
    assert opt.v is None


def test_unknown_kind() -> None:
    with pytest.raises(ValueError):
        OuterOptimizer("adam")
