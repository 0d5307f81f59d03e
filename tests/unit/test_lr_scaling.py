"""The inner learning rate follows the batch (ALGORITHM.md §10): the formulas against hand-computed values,
the multiplier applied to exactly one step (in the step form and the hooked form), b₀ and B̂ kept in the
state, and the schedule indexed by examples (which leaves a constant batch's schedule as it was); the
weight decay that may follow it (batch.wd_scaling)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from adloco import AdaptiveBatch, AdLoCo, Merging, Switch
from adloco.config import InnerConfig
from adloco.engine.driver import Driver
from adloco.engine.inner import lr_at
from adloco.library.algorithms import lr_scaling
from tests.toy import Data, build, loss_fn, models, run_round


def test_the_ratios_by_hand() -> None:
    assert lr_scaling.ratio("none", 32, 4, 10.0) == 1.0
    assert lr_scaling.ratio("sqrt", 16, 4, None) == 4.0
    # AdaScale's gain: (1 + B/b0) / (1 + B/b) with B = 12, b0 = 4, b = 16: (1 + 3) / (1 + 0.75)
    assert lr_scaling.ratio("gain", 16, 4, 12.0) == pytest.approx(4 / 1.75)
    assert lr_scaling.ratio("gain", 16, 4, None) == 1.0  # not measured yet
    assert lr_scaling.ratio("gain", 16, 4, 0.0) == 1.0  # no noise: a bigger batch buys nothing
    assert lr_scaling.ratio("gain", 16, 4, 1e12) == pytest.approx(4.0)  # all noise: the linear limit
    for noise in (0.5, 3.0, 40.0):
        assert 1.0 <= lr_scaling.ratio("gain", 16, 4, noise) <= 4.0


def test_the_multiplier_is_the_square_root_or_linear_for_sgd_and_capped() -> None:
    assert lr_scaling.multiplier(4.0, linear=False, cap=8.0) == 2.0
    assert lr_scaling.multiplier(4.0, linear=True, cap=8.0) == 4.0
    assert lr_scaling.multiplier(100.0, linear=False, cap=3.0) == 3.0


def test_the_noise_ratio_is_a_moving_average_of_sigma2_over_gbar_sq() -> None:
    assert lr_scaling.update_noise(None, 8.0, 2.0) == 4.0
    assert lr_scaling.update_noise(4.0, 24.0, 2.0) == pytest.approx(0.5 * 12 + 0.5 * 4)
    assert lr_scaling.update_noise(4.0, math.nan, 2.0) == 4.0  # a round without statistics keeps it
    assert lr_scaling.update_noise(4.0, 8.0, 0.0) == 4.0


def test_gain_needs_the_statistics() -> None:
    with pytest.raises(ValueError, match="batch.lr_scaling = 'gain': must be none or sqrt when no gradient"):
        AdaptiveBatch("none", statistics=False, lr_scaling="gain")
    AdaptiveBatch("none", statistics=True, lr_scaling="gain")


class Recording(torch.optim.SGD):
    """SGD that remembers the lr of every step it took."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.seen: list[float] = []

    def step(self, closure: Any = None) -> Any:
        self.seen.append(float(self.param_groups[0]["lr"]))
        return super().step(closure)


def _algo(rule: str, optimizer: type = Recording, n: int = 2, **batch: Any) -> AdLoCo:
    ms = models(n)
    opts = [optimizer(m.parameters(), lr=0.05) for m in ms]
    kw = {"initial": 4, "statistics": False, "max": 64, **batch}
    return AdLoCo(
        ms,
        opts,
        inner_steps=2,
        trainers=1,
        loss_fn=loss_fn,
        batch=AdaptiveBatch("none", lr_scaling=rule, lr_scale_max=8.0, **kw),
        merge=Merging("none"),
        switch=Switch("accumulate", b_max=8),
    )


@pytest.mark.parametrize(
    ("rule", "optimizer", "expected"), [("none", Recording, 1.0), ("sqrt", Recording, 4.0)]
)
def test_a_grown_request_multiplies_the_lr_of_the_step_and_only_of_it(
    rule: str, optimizer: type, expected: float
) -> None:
    """SGD takes the linear rule: a request grown 4 -> 16 rows (accumulated in 2 micro-batches of 8)
    multiplies the lr by 16/4 for its steps; the optimizer's own lr is back after every step."""
    algo = _algo(rule, optimizer)
    data = Data()
    run_round(algo, data)
    algo.trainers[0].request = 16
    algo._plan()
    assert algo.plans[0].effective == 16 and algo.plans[0].accum == 2
    rep = run_round(algo, data)
    opt = algo.replicas[0].optimizer
    assert opt.seen == [0.05, 0.05, 0.05 * expected, 0.05 * expected]  # type: ignore[attr-defined]
    assert opt.param_groups[0]["lr"] == 0.05  # restored exactly
    assert rep.trainers[0].lr_scale == expected and rep.trainers[0].lr == pytest.approx(0.05 * expected)


def _step_against_adamw(algo: AdLoCo, lr: float, weight_decay: float) -> None:
    """One step of ``algo``'s only worker at 16 rows (2 micro-batches of 8) is, bit for bit, the step of
    an AdamW of this lr and weight decay on the same rows."""
    data = Data()
    ref = models(1)[0]
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=weight_decay)
    batch = data.batch(0, 0, 0, 16)
    algo.step(batch)
    loss_fn(ref, (batch[0][:8], batch[1][:8])).mul(0.5).backward()
    loss_fn(ref, (batch[0][8:], batch[1][8:])).mul(0.5).backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    ref_opt.step()
    torch.testing.assert_close(algo.replicas[0].model.weight, ref.weight, rtol=1e-6, atol=1e-7)


def test_adamw_takes_the_square_root_and_the_step_is_the_scaled_one() -> None:
    """One step at multiplier 2 is, bit for bit, the step of an optimizer whose lr is twice as large."""
    algo = _algo("sqrt", torch.optim.AdamW, n=1)
    algo.trainers[0].request = 16
    algo._plan()
    assert algo.replicas[0].lr_scale == 2.0
    _step_against_adamw(algo, lr=0.1, weight_decay=0.01)


def test_the_weight_decay_multiplier_by_hand() -> None:
    """batch.wd_scaling timescale: lr × weight decay grows as b_t/b₀, whatever the lr's own multiplier."""
    assert lr_scaling.wd_multiplier("none", 4.0, 2.0) == 1.0
    assert lr_scaling.wd_multiplier("timescale", 4.0, 2.0) == 2.0  # sqrt: the lr × 2, the decay × 2
    assert lr_scaling.wd_multiplier("timescale", 4.0, 1.0) == 4.0  # the lr fixed: the decay × 4
    assert lr_scaling.wd_multiplier("timescale", 1.0, 1.0) == 1.0  # the batch not grown
    for m in (1.0, 1.25, 2.0, 4.0):
        assert m * lr_scaling.wd_multiplier("timescale", 4.0, m) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="unknown weight decay scaling rule"):
        lr_scaling.wd_multiplier("linear", 4.0, 1.0)


@pytest.mark.parametrize(("rule", "lr", "wd"), [("sqrt", 0.1, 0.02), ("none", 0.05, 0.04)])
def test_the_weight_decay_follows_the_batch_for_the_step_and_only_of_it(
    rule: str, lr: float, wd: float
) -> None:
    """A request grown 4 -> 16 with batch.wd_scaling timescale: the step is, bit for bit, that of an AdamW
    whose lr × weight decay is 4 times the configured one (sqrt: lr × 2 and λ × 2; none: λ × 4), and the
    groups' own values are back after it."""
    algo = _algo(rule, torch.optim.AdamW, n=1, wd_scaling="timescale")
    algo.trainers[0].request = 16
    algo._plan()
    rep = algo.replicas[0]
    assert rep.wd_scale == pytest.approx(wd / 0.01) and rep.lr_scale == pytest.approx(lr / 0.05)
    _step_against_adamw(algo, lr=lr, weight_decay=wd)
    group = rep.optimizer.param_groups[0]
    assert group["lr"] == 0.05 and group["weight_decay"] == 0.01  # restored exactly


def test_a_weight_decay_scaling_that_would_do_nothing_is_refused_in_the_library() -> None:
    """The library's own check (the CLI's config check names the keys): an inner optimizer without a weight
    decay has nothing to scale."""
    with pytest.raises(ValueError, match="no weight decay to scale"):
        _algo("sqrt", torch.optim.SGD, n=1, wd_scaling="timescale")
    assert _algo("sqrt", torch.optim.SGD, n=1).batch.wd_scaling == "none"  # the default: nothing checked


def test_the_hooked_form_scales_the_users_step_and_restores_it() -> None:
    ms = models(2)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in ms]
    algo = AdLoCo(
        ms,
        opts,
        inner_steps=2,
        trainers=1,
        loss_fn=loss_fn,
        batch=AdaptiveBatch("none", initial=4, max=64, statistics=False, lr_scaling="sqrt", lr_scale_max=8),
        merge=Merging("none"),
        switch=Switch("accumulate", b_max=64),
    )
    algo.trainers[0].request = 9  # b_t / b0 = 9 / 4: the linear rule for SGD
    algo._plan()
    data = Data()
    seen: list[float] = []
    with algo:
        # a hook registered after adloco's runs after it: it sees the lr the step takes
        opts[0].register_step_pre_hook(
            lambda opt, args, kwargs: seen.append(float(opt.param_groups[0]["lr"]))
        )
        for h in range(2):
            for w, (m, opt) in enumerate(zip(ms, opts, strict=True)):
                opt.zero_grad()
                loss_fn(m, data.batch(w, 0, h, 9)).backward()
                opt.step()
    assert seen == [0.05 * 9 / 4] * 2 and opts[0].param_groups[0]["lr"] == 0.05
    assert algo.round == 1


def test_gain_follows_the_measured_noise_and_the_state_keeps_it() -> None:
    def make() -> AdLoCo:
        return build(
            AdLoCo,
            inner_steps=2,
            trainers=1,
            batch=AdaptiveBatch("norm", initial=4, max=64, eta=0.2, lr_scaling="gain"),
            merge=Merging("none"),
            switch=Switch(b_max=64),
        )

    algo = make()
    data = Data()
    first = run_round(algo, data).trainers[0]
    tr = algo.trainers[0]
    assert tr.b0 == 4 and tr.noise == pytest.approx(first.sigma2 / first.gbar_sq)
    for _ in range(2):
        run_round(algo, data)
    b_t = algo.plans[0].effective
    assert b_t > 4  # the norm test grew the request
    assert tr.lr_ratio == pytest.approx((1 + tr.noise / 4) / (1 + tr.noise / b_t))
    assert algo.replicas[0].lr_scale == pytest.approx(min(math.sqrt(tr.lr_ratio), 4.0))
    again = make()
    again.load_state_dict(algo.full_state_dict())
    assert (again.trainers[0].b0, again.trainers[0].noise) == (tr.b0, tr.noise)
    assert again.replicas[0].lr_scale == algo.replicas[0].lr_scale


def inner_lrs(d: Driver) -> list[float]:
    """The inner lr of every step the driver ``d`` takes from now on (its first local worker's), appended
    as it takes them."""
    seen: list[float] = []
    step_all = d.algo.step_all

    def spy(batches: Any, *, stop: bool = False) -> Any:
        seen.append(float(next(iter(d.algo.replicas.values())).optimizer.param_groups[0]["lr"]))
        return step_all(batches, stop=stop)

    d.algo.step_all = spy  # type: ignore[method-assign]
    return seen


def test_a_constant_batch_keeps_its_schedule_and_a_growing_one_advances_it() -> None:
    """The schedule counts examples in steps of the initial request: a constant batch's lr sequence is
    the step-indexed one exactly; a request grown to 4x reaches the end of warmup 4x sooner."""
    from tests.helpers import driver, tiny_config

    cfg = tiny_config(
        "algorithm.method=diloco",
        "inner.warmup_fraction=0.5",
        "algorithm.rounds=4",
        "algorithm.inner_steps=3",
    )
    d = driver(cfg)
    seen = inner_lrs(d)
    for _ in range(4):
        d.run_round()
    total = 4 * 3
    assert seen == [lr_at(s, total, cfg.inner) for s in range(total)]
    i = InnerConfig(warmup_fraction=0.5)
    assert lr_at(1.0, 12, i) == lr_at(1, 12, i) and lr_at(4.0, 12, i) > lr_at(1.0, 12, i)


def test_a_budget_run_schedules_by_the_examples_a_grown_request_trains_on() -> None:
    """With algorithm.budget the schedule's position is the examples trained on, in steps of the initial
    request; a request grown 4x moves it 4 steps a step (a run bounded by rounds follows its steps)."""
    from tests.helpers import driver, tiny_config

    cfg = tiny_config(
        "batch.test=none",
        "batch.statistics=false",
        "merge.policy=none",
        "switch.b_max=16",
        "algorithm.budget=100000",
        "inner.warmup_fraction=0.9",
    )
    d = driver(cfg)
    unit = cfg.algorithm.workers * cfg.batch.initial
    d.run_round()
    assert d.trained == cfg.algorithm.inner_steps * unit  # the initial request: one unit a step
    for tr in d.algo.trainers.values():
        tr.request = 4 * cfg.batch.initial
    d.algo._plan()
    seen = inner_lrs(d)
    d.run_round()
    assert d.trained == 5 * cfg.algorithm.inner_steps * unit  # then four units a step
    total = cfg.algorithm.rounds * cfg.algorithm.inner_steps
    h = cfg.algorithm.inner_steps
    assert seen == [lr_at(h + 4 * k, total, cfg.inner) for k in range(h)]


def test_the_lr_that_follows_the_batch_has_a_plot_of_its_own(tmp_path: Path) -> None:
    from adloco.report import plots, results
    from tests.recorded import recorded_run, rewrite

    def with_lr(e: dict[str, Any]) -> list[dict[str, Any]]:
        if e["event"] == "trainer":
            e = {**e, "lr": 0.004 * math.sqrt(e["request"] / 4), "lr_scale": math.sqrt(e["request"] / 4)}
        return [e]

    run = rewrite(recorded_run(tmp_path, "scaled", "adloco", [50.0, 30.0, 20.0], 1_000), with_lr)
    (loaded,) = results.load_all([run])
    figs = plots.make_figures([loaded])
    assert len(figs["requests.png"].axes) == 1  # the requests keep one axis
    (ax,) = figs["lr.png"].axes
    assert ax.get_ylabel() == "inner lr"
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == pytest.approx([0.004, 0.004 * math.sqrt(2), 0.004 * math.sqrt(3)])
    plain = recorded_run(tmp_path, "plain", "adloco", [50.0, 30.0], 1_000)  # no lr recorded: no lr plot
    (loaded,) = results.load_all([plain])
    assert "lr.png" not in plots.make_figures([loaded])
