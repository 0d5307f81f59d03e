"""The public algorithm objects on a toy model (nn.Linear, a squared loss, tuple batches): collectives
and bytes against an autospecced communicator, every statistic against brute force, and the state that
moves (merges, moves, Δ weights) by value. No Hugging Face model is involved."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

from adloco import DDP, AdaptiveBatch, AdLoCo, DiLoCo, LocalSGD, Merging, Outer, Switch, Wire
from adloco.library.comm.base import Comm, wire_bytes
from adloco.library.comm.inprocess import InProcessComm
from tests.toy import D, Data, build, flat_like, loss_fn, merging, models, run_round, sgd

P = D + 1  # parameters of nn.Linear(D, 1)


def spied(n: int) -> tuple[Any, InProcessComm]:
    """An autospecced Comm whose collectives do what the in-process backend does, so calls can be counted."""
    real = InProcessComm(n)
    fake = mock.create_autospec(Comm, instance=True)
    fake.n_workers, fake.local_workers, fake.rank, fake.world = n, list(range(n)), 0, 1
    fake.shards, fake.mesh = real.shards, None
    for name in ("reduce", "broadcast", "all_gather_rows", "all_gather_json", "fetch", "drain", "owner"):
        getattr(fake, name).side_effect = getattr(real, name)
    return fake, real


def calls(fake: Any, name: str, kind: str) -> list[Any]:
    return [c for c in getattr(fake, name).call_args_list if c.args[2] == kind]


# -- collectives and bytes ------------------------------------------------------------------------


def test_a_round_issues_one_delta_all_reduce_per_trainer_and_counts_its_bytes() -> None:
    fake, real = spied(4)
    ms = models(4)
    algo = AdLoCo(ms, sgd(ms), inner_steps=3, trainers=2, comm=fake, loss_fn=loss_fn, merge=Merging("none"))
    rep = run_round(algo, Data())
    deltas = calls(fake, "reduce", "delta")
    assert [c.args[1] for c in deltas] == [[0, 1], [2, 3]]  # each trainer's workers
    assert [sorted(c.args[0]) for c in deltas] == [[0, 1], [2, 3]]  # every local worker a part
    assert all(c.args[3].numel() == P and c.args[4] == Wire() for c in deltas)
    gathers = calls(fake, "all_gather_rows", "stats")
    assert len(gathers) == 1 and gathers[0].args[3] == 4  # scalars only: k, c, Σ‖g‖², ‖ḡ_m‖²
    assert not calls(fake, "reduce", "probe")  # the norm test sends no gradient
    assert rep.bytes == 2 * wire_bytes("all_reduce", 2, 4 * P) + wire_bytes("all_gather", 4, 4 * 8)
    # construction broadcast each trainer's θ from its first worker to the other (sync_initial)
    assert [c.args[1:4] for c in fake.broadcast.call_args_list] == [(0, [0, 1], "init"), (2, [2, 3], "init")]
    assert algo.totals.by_kind == {"init": 2 * 4 * P, "delta": 2 * 2 * 4 * P, "stats": 4 * 3 * 32}
    assert rep.messages == 3 and rep.collectives == [  # in the order issued, each naming its workers
        ["stats", "all_gather", 4, 32, 1, [0, 1, 2, 3]],
        ["delta", "all_reduce", 2, 4 * P, 1, [0, 1]],
        ["delta", "all_reduce", 2, 4 * P, 1, [2, 3]],
    ]


def test_inner_product_tests_all_reduce_the_mean_probe_gradient_once() -> None:
    fake, _ = spied(2)
    algo = build(
        AdLoCo,
        optimizer=torch.optim.SGD,
        lr=0.05,
        inner_steps=2,
        trainers=1,
        comm=fake,
        batch=AdaptiveBatch("inner_product", initial=4),
        merge=Merging("none"),
    )
    rep = run_round(algo, Data())
    (probe,) = calls(fake, "reduce", "probe")
    assert probe.args[1] == [0, 1] and probe.args[3].numel() == P
    stats = calls(fake, "all_gather_rows", "stats")
    counted = [c.args[3] if len(c.args) > 3 else c.kwargs["counted"] for c in stats]
    assert counted == [4, 3]  # the worker scalars, then ‖ḡ‖², Σp, Σp²
    assert rep.trainers[0].target is not None


def test_ddp_all_reduces_the_gradient_every_step_and_workers_stay_equal() -> None:
    fake, _ = spied(3)
    ms = models(3)
    from adloco import DDP

    algo = DDP(ms, sgd(ms), inner_steps=4, comm=fake, loss_fn=loss_fn, batch_size=2)
    run_round(algo, Data())
    grads = calls(fake, "reduce", "grad")
    # the stop flag rides along as one control value, never counted
    assert len(grads) == 4 and all(c.args[3].numel() == P + 1 and c.args[6] == 1 for c in grads)
    assert algo.totals.by_kind["grad"] == 4 * 2 * 2 * 4 * P
    assert "delta" not in algo.totals.by_kind
    for m in ms[1:]:
        assert torch.equal(m.weight, ms[0].weight)


# -- by value -------------------------------------------------------------------------------------


def test_delta_weights_workers_by_examples() -> None:
    """Workers with unequal b_max (cap mode) process 4 and 2 examples a step: θ ← (4θ_0 + 2θ_1)/6."""
    ms = models(2)
    data = Data()
    algo = AdLoCo(
        ms,
        sgd(ms),
        inner_steps=2,
        trainers=1,
        loss_fn=loss_fn,
        batch=AdaptiveBatch("none", initial=4, statistics=False),
        merge=Merging("none"),
        switch=Switch("cap"),
        clip=0.0,
    )
    algo.set_b_max({0: 4, 1: 2})
    assert [algo.plans[w].effective for w in (0, 1)] == [4, 2]
    # the same steps by hand
    ref = models(2)
    opts = sgd(ref)
    for h in range(2):
        for w, rows in ((0, 4), (1, 2)):
            opts[w].zero_grad()
            loss_fn(ref[w], data.batch(w, 0, h, rows)).backward()
            opts[w].step()
    flat = [flat_like(m) for m in ref]
    run_round(algo, data)
    torch.testing.assert_close(algo.theta(0), (4 * flat[0] + 2 * flat[1]) / 6, rtol=1e-6, atol=1e-7)
    assert [e.examples for e in algo.last_report.workers] == [8, 4]


def test_nesterov_outer_step_by_value() -> None:
    ms = models(2)
    data = Data()
    algo = DiLoCo(
        ms, sgd(ms), inner_steps=2, outer=Outer.nesterov(0.7, 0.9), loss_fn=loss_fn, batch_size=3, clip=0.0
    )
    theta0 = algo.theta(0).clone()
    # one round by hand: Δ = θ0 − mean(θ_m); v = Δ; θ = θ0 − lr(Δ + μ v)
    ref = models(2)
    opts = sgd(ref)
    for h in range(2):
        for w in (0, 1):
            opts[w].zero_grad()
            loss_fn(ref[w], data.batch(w, 0, h, 3)).backward()
            opts[w].step()
    flat = torch.stack([flat_like(m) for m in ref])
    delta = theta0 - flat.mean(0)
    run_round(algo, data)
    torch.testing.assert_close(algo.theta(0), theta0 - 0.7 * (delta + 0.9 * delta), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(algo.trainers[0].outer.v, delta, rtol=1e-6, atol=1e-7)
    for w in (0, 1):  # every worker starts the next round at θ
        assert torch.equal(algo.replicas[w].flat.param, algo.theta(0))


def test_merge_averages_theta_and_momentum_by_requests() -> None:
    """The same round with and without the merge: the merged θ and momentum are b-weighted means."""
    data = Data()

    def make(policy: str) -> AdLoCo:
        a = build(
            AdLoCo,
            optimizer=torch.optim.SGD,
            lr=0.05,
            inner_steps=2,
            trainers=2,
            outer=Outer.nesterov(0.5, 0.8),
            batch=AdaptiveBatch("none", initial=2, statistics=False),
            merge=Merging(policy, every=1),
        )
        a.trainers[0].request, a.trainers[1].request = 2, 6
        a._plan()
        return a

    plain, merged = make("none"), make("smallest")
    run_round(plain, data)
    rep = run_round(merged, data)
    assert rep.merge is not None and rep.merge.merged == [0, 1] and rep.merge.weights == {0: 0.25, 1: 0.75}
    torch.testing.assert_close(merged.theta(0), 0.25 * plain.theta(0) + 0.75 * plain.theta(1))
    v = [plain.trainers[t].outer.v for t in (0, 1)]
    torch.testing.assert_close(merged.trainers[0].outer.v, 0.25 * v[0] + 0.75 * v[1])
    assert merged.requests == {0: 6}


def test_workers_that_change_trainer_get_its_theta_and_a_fresh_optimizer() -> None:
    """3 trainers over 5 workers; the two small ones merge and workers move to the big one. Checked
    against the allocation before and after, not against the round's own list of moved workers."""
    ms = models(5)
    opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in ms]
    algo = AdLoCo(
        ms,
        opts,
        inner_steps=2,
        trainers=3,
        loss_fn=loss_fn,
        batch=AdaptiveBatch("none", initial=2, statistics=False),
        merge=Merging("smallest", every=1),
    )
    for t, b in {0: 2, 1: 2, 2: 12}.items():
        algo.trainers[t].request = b
    algo._plan()
    before = dict(algo.allocation)
    run_round(algo, Data())
    after = algo.allocation
    assert sorted(set(after.values())) == [0, 2]
    changed = {w for w in before if (0 if before[w] == 1 else before[w]) != after[w]}
    assert changed  # somebody moved to trainer 2
    for w, rep in algo.replicas.items():
        fresh = len(rep.optimizer.state) == 0
        assert fresh == (before[w] != after[w]), w  # reset exactly when the worker's trainer changed
        assert torch.equal(rep.flat.param, algo.theta(after[w]))


# -- statistics against brute force ---------------------------------------------------------------


def chunk_grads(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], k: int, c: int) -> torch.Tensor:
    """(k, P) float64: the mean gradient of each chunk of c rows, in adloco's flat order."""
    out = []
    for j in range(k):
        m = copy.deepcopy(model)
        x, y = batch
        loss_fn(m, (x[j * c : (j + 1) * c], y[j * c : (j + 1) * c])).backward()
        out.append(torch.cat([m.weight.grad.reshape(-1), m.bias.grad]).double())
    return torch.stack(out)


@pytest.mark.parametrize("test", ["norm", "inner_product", "augmented_inner_product"])
def test_the_batch_test_matches_brute_force_at_the_common_point(test: str) -> None:
    """Two workers, one trainer, chunks of the first step's batch: σ², ‖ḡ‖², Σp, Σp² and the target."""
    data = Data()
    eta, vartheta, nu = 0.5, 0.2, 0.3
    algo = build(
        AdLoCo,
        optimizer=torch.optim.SGD,
        lr=0.05,
        inner_steps=2,
        trainers=1,
        batch=AdaptiveBatch(
            test, initial=8, max=10**6, eta=eta, vartheta=vartheta, nu=nu, probe_chunks=4, exact_mean=True
        ),
        merge=Merging("none"),
        switch=Switch(b_max=8),
    )
    probe = algo.plans[0].probe
    assert probe is not None and (probe.k, probe.c) == (4, 2)
    start = models(1)[0]
    g = torch.cat([chunk_grads(start, data.batch(w, 0, 0, 8), 4, 2) for w in (0, 1)])  # (n, P), n = 8
    n, c, M = 8, 2, 2
    gbar = g.mean(0)
    g2 = float(gbar @ gbar)
    sigma2 = c * float(((g - gbar) ** 2).sum()) / (n - 1)
    p = g @ gbar
    var_p = float(p.var(unbiased=True))
    orth = float(((g - (p / g2)[:, None] * gbar) ** 2).sum())
    expected = {
        "norm": sigma2 / (M * eta**2 * g2),
        "inner_product": c * var_p / (M * vartheta**2 * g2**2),
        "augmented_inner_product": max(
            c * var_p / (M * vartheta**2 * g2**2), c * orth / ((n - 1) * M * nu**2 * g2)
        ),
    }[test]
    ev = run_round(algo, data).trainers[0]
    assert ev.samples == n
    assert ev.sigma2 == pytest.approx(sigma2, rel=1e-4)
    assert ev.gbar_sq == pytest.approx(g2, rel=1e-4)
    assert ev.target == pytest.approx(expected, rel=1e-3)
    assert ev.request_next == max(8, math.ceil(expected))


def test_the_paper_estimator_uses_each_workers_last_gradient_before_clipping() -> None:
    """H = 1, so the last gradient is taken at θ_t on the worker's batch: samples g_m, c = e."""
    data = Data()
    ms = models(2)
    eta = 0.4
    algo = AdLoCo(
        ms,
        sgd(ms),
        inner_steps=1,
        trainers=1,
        loss_fn=loss_fn,
        batch=AdaptiveBatch("norm", initial=6, max=10**6, eta=eta, estimator="paper"),
        merge=Merging("none"),
        switch=Switch(b_max=8),
        clip=0.01,  # clipping is on and large: the statistics must still see the unclipped gradients
    )
    start = models(1)[0]
    g = torch.cat([chunk_grads(start, data.batch(w, 0, 0, 6), 1, 6) for w in (0, 1)])  # (2, P)
    gbar = g.mean(0)
    g2 = float(gbar @ gbar)
    sigma2 = 6 * float(((g - gbar) ** 2).sum()) / (2 - 1)
    ev = run_round(algo, data).trainers[0]
    assert ev.samples == 2 and ev.gbar_sq == pytest.approx(g2, rel=1e-4)
    assert ev.sigma2 == pytest.approx(sigma2, rel=1e-4)
    assert ev.target == pytest.approx(sigma2 / (2 * eta**2 * g2), rel=1e-3)


@pytest.mark.parametrize("noise_rows", ["probed", "requested"])
def test_the_norm_test_on_a_capped_step_reads_the_noise_of_the_rows_it_is_told(noise_rows: str) -> None:
    """A request of 10 on b_max 8 runs capped at 8 rows, all 8 probed: ``probed`` adds σ̂²/(n c) (32 rows of
    4 workers) to its estimate of ‖∇F‖², ``requested`` σ̂²/40, the rows the trainer asked for
    (ALGORITHM.md §2.5)."""
    data = Data()
    eta, M = 0.9, 4
    algo = build(
        AdLoCo,
        workers=M,
        optimizer=torch.optim.SGD,
        lr=0.05,
        inner_steps=2,
        trainers=1,
        batch=AdaptiveBatch("norm", initial=10, max=10**6, eta=eta, noise_rows=noise_rows),
        merge=Merging("none"),
        switch=Switch(b_max=8),
    )
    ev = run_round(algo, data).trainers[0]
    assert (ev.effective, ev.samples, ev.request) == (8, 32, 10)
    noise = {"probed": ev.sigma2 / 32, "requested": ev.sigma2 / 40}[noise_rows]
    grad = max(ev.gbar_sq - ev.sigma2 / 32, 0.0)  # the unbiased ‖∇F‖² under both
    assert ev.target == pytest.approx(ev.sigma2 / (M * eta**2 * (grad + noise)), rel=1e-9)
    assert ev.target <= {"probed": 8, "requested": 10}[noise_rows] / eta**2 + 1e-9


# -- the hooked mode and the user's own loop -------------------------------------------------------


def test_diloco_hooks_the_users_optimizer_and_syncs_every_h_steps() -> None:
    ms = models(2)
    opts = sgd(ms)
    data = Data()
    algo = LocalSGD(ms, opts, inner_steps=3, loss_fn=loss_fn)
    with algo:
        for h in range(7):
            for w, (m, opt) in enumerate(zip(ms, opts, strict=True)):
                opt.zero_grad()  # sets .grad to None: adloco must not care
                loss_fn(m, data.batch(w, 0, h, 4)).backward()
                opt.step()
            if h == 2:  # the third step ended a round: both replicas start again from the average
                assert algo.round == 1 and torch.equal(ms[0].weight, ms[1].weight)
    assert algo.round == 2 and algo.step_in_round == 0
    assert algo.last_report is not None and algo.last_report.workers[0].loss is None  # the loop owns losses
    assert not torch.equal(ms[0].weight, ms[1].weight)  # step 7 ran after the second sync, apart
    opts[0].step()  # hooks are gone after the block
    assert algo.round == 2


def test_the_hooked_mode_refuses_a_batch_test() -> None:
    ms = models(1)
    algo = AdLoCo(ms, sgd(ms), inner_steps=2, trainers=1, loss_fn=loss_fn)
    with pytest.raises(ValueError, match="batch: the batch test needs the gradient probe"), algo:
        pass


def test_inner_state_reset_in_the_hooked_mode_begins_before_the_round() -> None:
    H = 3
    ms = models(2)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in ms]
    algo = AdLoCo(
        ms,
        opts,
        inner_steps=H,
        trainers=1,
        loss_fn=loss_fn,
        inner_state="reset",
        batch=AdaptiveBatch("none", initial=2, statistics=False),
        merge=Merging("none"),
    )
    data = Data()
    with algo:
        for r in range(2):
            for h in range(H):
                for w, (m, o) in enumerate(zip(ms, opts, strict=True)):
                    o.zero_grad()
                    loss_fn(m, data.batch(w, r, h, 2)).backward()
                    o.step()
    assert algo.round == 2
    for o in opts:  # every round's H steps, from a fresh state
        assert {int(s["step"]) for s in o.state.values()} == {H}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inner_steps": 0}, "inner_steps = 0: must be an integer >= 1"),
        ({"trainers": 3}, r"trainers = 3: must be an integer in \[1, 2\]"),
        ({"wire": "int3"}, "wire: expected an Wire"),
        ({"balance": "fast"}, "balance = 'fast': must be one of 'equal', 'speed'"),
        ({"emulate_speed": [1, 2]}, r"emulate_speed = \[1, 2\]: must be empty or 2 numbers in \(0, 1\]"),
        ({"precision": "fp8"}, "precision = 'fp8': must be one of 'fp32', 'bf16', 'fp16'"),
        ({"clip": -1.0}, r"clip = -1.0: must be >= 0 \(0 turns clipping off\)"),
        ({"fixed_rows": -1.0}, r"fixed_rows = -1.0: must be a finite number >= 0 \(rows\)"),
        ({"fixed_rows": "2"}, r"fixed_rows = '2': must be a finite number >= 0 \(rows\)"),
        ({"batch": "norm"}, "batch: expected an AdaptiveBatch"),
        ({"outer": "nesterov"}, "outer: expected an Outer"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs: dict[str, Any], message: str) -> None:
    ms = models(2)
    kw: dict[str, Any] = {"inner_steps": 2, "trainers": 1, "loss_fn": loss_fn, **kwargs}
    with pytest.raises(ValueError, match=message):
        AdLoCo(ms, sgd(ms), **kw)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: AdaptiveBatch("normal"), "batch.test = 'normal': must be one of 'norm', 'inner_product'"),
        (lambda: AdaptiveBatch(initial=8, max=4), r"batch.max = 4: must be >= batch.initial \(8\)"),
        (lambda: AdaptiveBatch(initial="4"), "batch.initial = '4': must be an integer"),
        (lambda: Merging(every=0), "merge.every = 0: must be >= 1"),
        (lambda: Switch(kappa=0.5), "switch.kappa = 0.5: must be >= 1"),
        (lambda: Switch(b_max=0), r"switch.b_max = 0: must be >= 1 and <= 1048576, or null"),
        (lambda: Wire("int3"), "comm.dtype = 'int3': must be one of 'float32', 'bfloat16'"),
        (lambda: Wire(theta_dtype="int3"), "comm.theta_dtype = 'int3': must be one of 'float32', 'bfloat16'"),
        (lambda: Wire(theta_dtype="topk"), "comm.theta_dtype = 'topk': must be float32, .*: θ is not sparse"),
        (lambda: Wire("topk", topk_fraction=0.0), r"comm.topk_fraction = 0.0: must be in \(0, 1\]"),
        (lambda: Wire("topk", topk_bits=3.0), "comm.topk_bits = 3.0: must be an integer"),
        (
            lambda: Wire("int4", topk_bits=3),
            r"comm.topk_bits = 3: must be 2 \(its default\) unless comm.dtype is topk",
        ),
        (
            lambda: Outer("adam"),
            "outer.optimizer = 'adam': must be average, sgd or nesterov, or a factory named module:function",
        ),
        (lambda: Outer("nesterov", momentum=1.0), r"outer.momentum = 1.0: must be in \[0, 1\)"),
    ],
)
def test_bad_settings_name_the_field(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_launch_of_several_processes_without_a_process_group_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under torchrun (WORLD_SIZE 2) with no init_process_group, the default communicator would train
    each process alone and exit 0: refused in one line that says what to do. One process (WORLD_SIZE 1)
    is every worker in this process, as without a launcher."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ms = models(1)
    with pytest.raises(ValueError) as exc:
        DiLoCo(ms, sgd(ms), inner_steps=2, loss_fn=loss_fn)
    assert str(exc.value) == (
        "comm: WORLD_SIZE = '2' (a launcher such as torchrun started several processes) but "
        "torch.distributed's process group is not initialized: call torch.distributed.init_process_group() "
        "before building the algorithm, or pass comm= (adloco.InProcessComm(n) for workers in this process "
        "only)"
    )
    algo = DiLoCo(ms, sgd(ms), inner_steps=2, loss_fn=loss_fn, comm=InProcessComm(1))  # said explicitly
    assert algo.comm.n_workers == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert isinstance(DiLoCo(ms, sgd(ms), inner_steps=2, loss_fn=loss_fn).comm, InProcessComm)


@pytest.mark.parametrize("cls", [DiLoCo, LocalSGD, DDP])
def test_the_presets_show_every_argument_with_its_default(cls: type[AdLoCo]) -> None:
    """``help(DiLoCo)`` and the API reference show AdLoCo's arguments, keyword-only, with AdLoCo's
    defaults, except what the method's preset sets (its trainers; None dials: the preset); batch_size is
    the presets' own. Each dial is documented once, in RoundOptions; the rest in the class. A keyword
    that is none of them is Python's TypeError, before anything is built."""
    import inspect
    import pydoc

    from adloco.library.options import RoundOptions
    from adloco.library.presets import PRESETS

    dials = {f.name for f in dataclasses.fields(RoundOptions)}

    mine = inspect.signature(cls).parameters
    base = inspect.signature(AdLoCo).parameters
    assert [n for n in mine if n != "batch_size"] == list(base)
    for name, p in mine.items():
        if name in ("model", "inner_optimizer"):
            continue
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, name
        if name == "trainers":
            assert p.default == PRESETS[cls.METHOD]["algorithm"]["trainers"]
        elif name != "batch_size":
            assert p.default == base[name].default, name
        doc = RoundOptions.__doc__ if name in dials else DiLoCo.__doc__
        assert f"{name}:" in (doc or "") or f"{name}," in (doc or ""), name  # its line under Args
    shown = pydoc.render_doc(cls, renderer=pydoc.plaintext)  # what help() prints
    assert (
        "inner_steps: 'int' = 12" in shown and "wire: 'Wire | None' = None" in shown and "**kw" not in shown
    )
    ms = models(1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'inner_step'"):
        cls(ms, sgd(ms), inner_step=2, loss_fn=loss_fn)  # type: ignore[call-arg]


def test_a_preset_takes_batch_size_or_a_batch_not_both() -> None:
    ms = models(1)
    algo = DiLoCo(ms, sgd(ms), inner_steps=2, loss_fn=loss_fn, batch_size=3)
    assert (algo.batch.initial, algo.batch.test, algo.stated_batch) == (3, "none", 3)
    with pytest.raises(ValueError, match="batch_size: give batch_size or batch=AdaptiveBatch"):
        DiLoCo(ms, sgd(ms), batch_size=3, batch=AdaptiveBatch("norm"), loss_fn=loss_fn)
    with pytest.raises(ValueError, match="batch_size = 0: must be an integer >= 1"):
        DiLoCo(ms, sgd(ms), batch_size=0, loss_fn=loss_fn)


def test_an_optimizer_of_other_tensors_is_refused() -> None:
    (m,) = models(1)
    other = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="inner_optimizer: updates a tensor that is not one of the model"):
        AdLoCo([m], [torch.optim.SGD(other.parameters(), lr=0.1)], inner_steps=1, trainers=1)


def test_a_batch_of_the_wrong_size_is_refused() -> None:
    ms = models(1)
    algo = DiLoCo(ms, sgd(ms), inner_steps=2, loss_fn=loss_fn, batch_size=4)
    with pytest.raises(ValueError, match="batch of worker 0: 3 rows; step 0 of this round needs 4"):
        algo.step(Data().batch(0, 0, 0, 3))


def test_state_dict_round_trips_and_resumes_the_same_trajectory() -> None:
    data = Data()

    def make() -> AdLoCo:
        return merging(3)

    a = make()
    for _ in range(3):
        run_round(a, data)
    state = a.full_state_dict()
    b = make()
    run_round(b, data)  # some other state, overwritten by the load
    b.load_state_dict(state)
    for _ in range(2):
        run_round(a, data)
        run_round(b, data)
    assert a.requests == b.requests and a.allocation == b.allocation and a.round == b.round == 5
    for t in a.alive:
        assert torch.equal(a.theta(t), b.theta(t))


@pytest.mark.parametrize(("dtype", "bits"), [("int8", 8), ("int4", 4)])
def test_a_quantized_delta_is_counted_at_its_size_on_the_wire(dtype: str, bits: int) -> None:
    """Block-wise int8/int4 Δ: each of n = 3 workers' chunks, codes and a 4-byte scale per block."""
    from adloco.library.comm.compressed import chunk_sizes

    torch.manual_seed(0)
    ms = [nn.Linear(40, 1) for _ in range(3)]  # P = 41: chunks of 14, 14, 13 values
    algo = AdLoCo(
        ms,
        sgd(ms),
        inner_steps=2,
        trainers=1,
        loss_fn=lambda m, b: ((m(b[0]).squeeze(-1) - b[1]) ** 2).mean(),
        batch=AdaptiveBatch("none", initial=2, statistics=False),
        merge=Merging("none"),
        wire=Wire(dtype, block=8),
        sync_initial=False,
    )
    g = torch.Generator().manual_seed(3)
    for _h in range(2):
        algo.step_all({w: (torch.randn(2, 40, generator=g), torch.randn(2, generator=g)) for w in range(3)})
    piece = [(c * bits + 7) // 8 + 4 * -(-c // 8) for c in chunk_sizes(41, 3)]
    assert algo.totals.by_kind["delta"] == 2 * (3 - 1) * sum(piece)
    float32 = 2 * (3 - 1) * 4 * 41
    assert algo.totals.by_kind["delta"] < (0.45 if bits == 8 else 0.32) * float32


def test_error_feedback_is_kept_per_worker_saved_and_reset_when_the_worker_moves() -> None:
    algo = build(
        AdLoCo,
        3,
        optimizer=torch.optim.SGD,
        lr=0.05,
        inner_steps=2,
        trainers=2,
        batch=AdaptiveBatch("none", initial=2, statistics=False),
        merge=Merging("smallest", every=2),
        wire=Wire("int4", block=4, error_feedback=True),
    )
    data = Data()
    run_round(algo, data)
    assert algo.feedback is not None
    errs = {w: fb.error for w, fb in algo.feedback.items()}
    trainer_of = dict(algo.allocation)
    multi = [w for w, t in trainer_of.items() if list(trainer_of.values()).count(t) > 1]
    assert all(errs[w] is not None for w in multi)  # a one-worker trainer's Δ is not compressed
    state = algo.state_dict()
    assert all("feedback_error" in state["replicas"][w]["inner"] for w in multi)
    before = dict(algo.allocation)
    run_round(algo, data)  # round 2 merges; workers of the merged trainer change trainer
    for w, fb in algo.feedback.items():
        if before[w] != algo.allocation[w]:
            assert fb.error is None


class VirtualTime:
    """A clock that moves only when told: each row of a step costs 1 ms, and emulation's sleeps add
    theirs. The measured speeds, shares and idle times are then exact, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize("balance", ["speed", "equal"])
def test_work_follows_measured_speed_so_nobody_waits(balance: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers of one trainer, the second emulated at half speed: shared by speed, the fast one gets
    twice the examples per step and nobody waits; shared equally, the idle share is
    1 − (1 + 2)/2 / 2 = 25% (the definition's value for speeds 1 and 1/2)."""
    import adloco.library.round
    from adloco.library.replica import Replica, n_rows

    clock = VirtualTime()
    monkeypatch.setattr(adloco.library.round, "time", clock)
    gradient = Replica.gradient

    def timed(self, batch, *args, **kw):  # type: ignore[no-untyped-def]
        clock.now += 1e-3 * n_rows(batch)
        return gradient(self, batch, *args, **kw)

    monkeypatch.setattr(Replica, "gradient", timed)
    algo = build(
        AdLoCo,
        optimizer=torch.optim.SGD,
        lr=0.05,
        inner_steps=4,
        trainers=1,
        batch=AdaptiveBatch("none", initial=12, max=12, statistics=False),
        merge=Merging("none"),
        switch=Switch(b_max=64),
        balance=balance,
        emulate_speed=[1.0, 0.5],
    )
    reports = [run_round(algo, Data()) for _ in range(3)]
    first, last = reports[0], reports[-1]
    assert [e.examples for e in first.workers] == [48, 48]  # round 1 shares equally: nothing measured yet
    assert first.idle_share == pytest.approx(0.25)
    assert sum(e.examples for e in last.workers) == 2 * 12 * 4  # the trainer's M·b per step, whoever does it
    if balance == "speed":
        assert [e.examples for e in last.workers] == [64, 32]  # 16 and 8 rows a step
        assert last.idle_share == pytest.approx(0.0, abs=1e-9)
        assert last.workers[0].compute_s == pytest.approx(last.workers[1].compute_s)
    else:
        assert [e.examples for e in last.workers] == [48, 48]
        assert last.idle_share == pytest.approx(0.25)


def test_emulated_speed_really_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulation is real time: the slow worker sleeps after every step (three times the step, at speed
    1/4), and its reported compute time holds the sleeps; the full-speed worker never sleeps."""
    import time as real_time

    import adloco.library.round

    slept: list[float] = []

    class Recording:
        perf_counter = staticmethod(real_time.perf_counter)

        @staticmethod
        def sleep(seconds: float) -> None:
            slept.append(seconds)
            real_time.sleep(seconds)

    monkeypatch.setattr(adloco.library.round, "time", Recording)
    algo = build(
        AdLoCo,
        optimizer=torch.optim.SGD,
        lr=0.05,
        inner_steps=4,
        trainers=1,
        batch=AdaptiveBatch("none", initial=4, statistics=False),
        merge=Merging("none"),
        balance="equal",
        emulate_speed=[1.0, 0.25],
    )
    rep = run_round(algo, Data())
    assert len(slept) == 4 and all(x > 0 for x in slept)  # one sleep a step, the slow worker's alone
    assert rep.workers[1].compute_s >= sum(slept) > 0  # reported compute holds the sleeps (and any oversleep)


def test_speeds_within_20_percent_share_equally() -> None:
    """Timing noise on identical devices must not change a run: shares move only beyond 20%."""
    ms = models(2)
    algo = AdLoCo(
        ms, sgd(ms), inner_steps=1, trainers=1, loss_fn=loss_fn, merge=Merging("none"), balance="speed"
    )
    algo.speed = {0: 100.0, 1: 60.0}
    assert algo._relative_speeds([0, 1]) is None  # one device, nothing emulated: speeds are noise
    algo.comm.one_device = False  # as workers in processes of their own
    algo.speed = {0: 100.0, 1: 85.0}
    assert algo._relative_speeds([0, 1]) is None
    algo.speed = {0: 100.0, 1: 60.0}
    assert algo._relative_speeds([0, 1]) == {0: 1.0, 1: 0.625}
    algo.balance = "equal"
    assert algo._relative_speeds([0, 1]) is None
