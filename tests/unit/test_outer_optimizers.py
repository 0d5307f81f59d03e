"""Any torch optimizer as the outer step (``Outer(optimizer=...)``, ALGORITHM.md §1 step 4): the presets
against torch's SGD, a user's optimizer in its own file (examples/outer_optimizer.py), and its state through
everything that carries it: merges weighted by requests, moves between threads, checkpoints and resume bit
for bit, resize, eager overlap's trial step, streaming fragments and an aborted round's undo. Also: a state
dict is refused in the middle of a round."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from adloco import AdaptiveBatch, AdLoCo, DiLoCo, Merging, Outer, Sync
from adloco.library.algorithms.outer import OuterParams
from tests.toy import Data, build, loss_fn, models, rounds_in_threads, run_round, sgd

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def adam(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.05)


def torch_nesterov(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


def _adloco(
    outer: Outer, n: int = 4, comm: Any = None, ms: list[nn.Module] | None = None, **kw: Any
) -> AdLoCo:
    return build(
        AdLoCo,
        n,
        ms=ms,
        inner_steps=2,
        trainers=kw.pop("trainers", 2),
        outer=outer,
        batch=AdaptiveBatch(eta=0.3, initial=2),
        merge=kw.pop("merge", Merging(every=2)),
        comm=comm,
        **kw,
    )


def _diloco(outer: Outer, sync: Sync | None = None, **kw: Any) -> DiLoCo:
    ms = models(2)
    return DiLoCo(
        ms,
        sgd(ms),
        inner_steps=4,
        batch_size=2,
        loss_fn=loss_fn,
        outer=outer,
        sync=sync,
        sync_initial=False,
        **kw,
    )


def test_nesterov_is_torchs_sgd_with_nesterov_within_float32_rounding() -> None:
    """The preset keeps adloco's arithmetic (bit for bit what it was); torch.optim.SGD(nesterov=True), as
    torchft's DiLoCo uses it, takes the same steps up to float32 rounding."""
    data = Data()
    ours, theirs = _diloco(Outer.nesterov(0.7, 0.9)), _diloco(Outer(optimizer=torch_nesterov))
    for _ in range(4):
        run_round(ours, data)
        run_round(theirs, data)
        torch.testing.assert_close(ours.theta(0), theirs.theta(0), rtol=1e-5, atol=1e-6)
    mine = ours.trainers[0].outer.state_dict()
    torch.testing.assert_close(mine["momentum"], theirs.trainers[0].outer.state_dict()["momentum_buffer"])
    assert not torch.equal(ours.theta(0), theirs.theta(0))  # the roundings differ: two arithmetics


def test_any_optimizer_checkpoints_and_resumes_bit_for_bit() -> None:
    data = Data()
    a = _adloco(Outer(optimizer=adam))
    for _ in range(2):
        run_round(a, data)  # the second round merges the two trainers: Adam's state merged too
    state = copy.deepcopy(a.full_state_dict())
    assert state is not None and set(state["trainers"][0]) == {"theta", "exp_avg", "exp_avg_sq", "step.0"}
    assert state["trainers"][0]["step.0"].item() == 2.0  # two outer steps, weighted alike
    b = _adloco(Outer(optimizer=adam))
    b.load_state_dict(state)
    for _ in range(3):
        run_round(a, data)
        run_round(b, data)
    assert torch.equal(a.theta(0), b.theta(0))
    got, want = b.trainers[0].outer.state_dict(), a.trainers[0].outer.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    # another number of workers: the state resized (trainers merged by policy, state weighted alike)
    c = _adloco(Outer(optimizer=adam), n=3)
    c.load_state_dict(copy.deepcopy(a.full_state_dict()))
    run_round(c, data)
    assert c.membership is not None and "exp_avg" in c.trainers[c.alive[0]].outer.state_dict()


def test_a_merge_weighs_any_optimizers_state_by_requests() -> None:
    data = Data()
    algo = _adloco(Outer(optimizer=adam))
    seen: dict[int, dict[str, torch.Tensor]] = {}
    merge = algo._maybe_merge

    def spy(members: dict[int, list[int]]) -> Any:
        seen.update({t: copy.deepcopy(tr.outer.state_dict()) for t, tr in algo.trainers.items()})
        seen[-1] = {str(t): torch.tensor(float(b)) for t, b in algo.requests.items()}
        return merge(members)

    algo._maybe_merge = spy  # type: ignore[method-assign]
    run_round(algo, data)
    report = run_round(algo, data)
    assert report.merge is not None and report.merge.merged == [0, 1]
    b0, b1 = float(seen[-1]["0"]), float(seen[-1]["1"])
    got = algo.trainers[0].outer.state_dict()
    for key in ("exp_avg", "exp_avg_sq", "step.0"):
        want = (b0 * seen[0][key] + b1 * seen[1][key]) / (b0 + b1)
        torch.testing.assert_close(got[key], want.to(got[key].dtype))


def test_moves_carry_any_optimizers_state_between_threads() -> None:
    """Four trainers on four threads merge every round: θ and Adam's state cross threads on merges and
    moves (every thread learns the state's layout), and every thread ends with the one process's run."""
    data = Data()
    make = lambda comm, ms: _adloco(  # noqa: E731
        Outer(optimizer=adam), comm=comm, ms=ms, trainers=4, merge=Merging(every=1)
    )
    ref = make(None, models(4))
    for _ in range(3):
        run_round(ref, data)
    assert len(ref.alive) == 1 and ref.totals.by_kind["move"] > 0
    algos = rounds_in_threads(make, 4, 3, data)
    want = ref.trainers[0].outer.state_dict()
    for algo in algos:  # float32 sums in another order: equal within rounding
        torch.testing.assert_close(algo.theta(0), ref.theta(0), rtol=1e-5, atol=1e-6)
        outer = algo.trainers[0].outer.state_dict()
        assert outer.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(outer[k], want[k], rtol=1e-5, atol=1e-6)


def test_eager_takes_any_optimizers_step_on_a_copy_of_its_state() -> None:
    data = Data()
    ours, theirs = (
        _diloco(Outer.nesterov(0.7, 0.9), Sync(overlap="eager")),
        _diloco(Outer(optimizer=torch_nesterov), Sync(overlap="eager")),
    )
    for _ in range(3):
        run_round(ours, data)
        run_round(theirs, data)
        for w in (0, 1):  # each worker starts from the outer step of its own Δ
            torch.testing.assert_close(
                ours.replicas[w].flat.param, theirs.replicas[w].flat.param, rtol=1e-5, atol=1e-6
            )
    outer, theta = theirs.trainers[0].outer, theirs.theta(0)
    before = copy.deepcopy(outer.state_dict())
    delta = torch.full_like(theta, 0.01)
    first, second = (
        outer.trial(theta, delta, torch.empty_like(theta)),
        outer.trial(theta, delta, torch.empty_like(theta)),
    )
    assert torch.equal(first, second) and not torch.equal(first, theta)
    assert all(torch.equal(outer.state_dict()[k], v) for k, v in before.items())  # the state untouched
    stepped = theta.clone()
    copy.deepcopy(outer).step(stepped, delta)
    assert torch.equal(first, stepped)


@pytest.mark.parametrize(
    "outer", [Outer.nesterov(0.7, 0.9), Outer(optimizer=torch_nesterov)], ids=["preset", "torch"]
)
def test_streaming_steps_any_optimizer_fragment_by_fragment_and_undoes_an_aborted_round(outer: Outer) -> None:
    from adloco import RoundAborted

    data = Data()
    sync = Sync(fragments=2, fragment_delay=1, fragment_alpha=0.5)
    a, b = _diloco(outer, sync, snapshot=True), _diloco(Outer.nesterov(0.7, 0.9), sync, snapshot=True)
    for _ in range(2):
        run_round(a, data)
        run_round(b, data)
    torch.testing.assert_close(a.theta(0), b.theta(0), rtol=1e-5, atol=1e-6)
    state = copy.deepcopy(a.full_state_dict())
    theta, held = a.theta(0).clone(), copy.deepcopy(a.trainers[0].outer.state_dict())
    with pytest.raises(RoundAborted):  # fragment 1 lands at step 2: the abort at step 3 undoes its step
        for h in range(3):
            a.step_all({w: data.batch(w, a.round, h, 2) for w in a.local_workers}, stop=h == 2)
    assert torch.equal(a.theta(0), theta)
    assert all(torch.equal(a.trainers[0].outer.state_dict()[k], v) for k, v in held.items())
    c = _diloco(outer, sync, snapshot=True)
    c.load_state_dict(state)
    for _ in range(2):
        run_round(a, data)
        run_round(c, data)
    assert torch.equal(a.theta(0), c.theta(0))


def _example() -> Any:
    """examples/outer_optimizer.py, imported as a user's own module."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location("outer_optimizer", EXAMPLES / "outer_optimizer.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXAMPLES))


def test_a_users_own_optimizer_from_its_own_file_takes_the_outer_step() -> None:
    """The example's Muon-style optimizer, on the shaped views of θ: the outer step is its step on Δ, the
    weight matrix's update orthogonalized; its state is the model's shapes laid out flat."""
    example = _example()
    data = Data()
    mean = _diloco(Outer("average"))  # the same round, averaged: mean_m θ_m
    run_round(mean, data)
    algo = _diloco(Outer(optimizer=example.make_outer))
    theta0 = algo.theta(0).clone()
    run_round(algo, data)
    by_hand = theta0.clone()
    params = OuterParams(by_hand, [("weight", torch.Size([1, 6])), ("bias", torch.Size([1]))])
    opt = example.make_outer(params)
    grads = OuterParams(theta0 - mean.theta(0), params._shapes).shaped()  # Δ, shaped alike
    for p, g in zip(opt.param_groups[0]["params"], grads, strict=True):
        p.grad = g
    opt.step()
    torch.testing.assert_close(algo.theta(0), by_hand, rtol=1e-6, atol=1e-7)
    assert set(algo.trainers[0].outer.state_dict()) == {"momentum_buffer"}
    assert algo.trainers[0].outer.state_dict()["momentum_buffer"].shape == theta0.shape


def test_a_factorys_fragments_end_between_tensors_so_shaped_views_serve_them() -> None:
    """Streaming with a factory that asks for the shapes: each fragment holds whole tensors (nn.Linear(6, 1):
    the weight, then the bias), so ``params.shaped()`` works per fragment; where the tensors are too few for
    the fragments, it is refused naming why. A flat factory keeps the presets' even fragments (the streaming
    test above holds it to the preset). An optimizer must step what it was given."""
    shaped = Outer(optimizer=lambda p: torch.optim.SGD(p.shaped(), lr=1.0))
    flat = Outer(optimizer=lambda p: torch.optim.SGD(p, lr=1.0))
    flat_asking = Outer(optimizer=lambda p: torch.optim.SGD(p, lr=1.0) if p.names else None)
    data = Data()
    a, b = _diloco(shaped, Sync(fragments=2)), _diloco(flat_asking, Sync(fragments=2))
    assert a._parts == b._parts == [slice(0, 6), slice(6, 7)]  # even halves, 0:4 and 4:7, cut the weight
    assert _diloco(flat, Sync(fragments=2))._parts == [slice(0, 4), slice(4, 7)]  # as the presets'
    for _ in range(2):
        run_round(a, data)
        run_round(b, data)
    assert torch.equal(a.theta(0), b.theta(0))
    with pytest.raises(
        ValueError, match=r"^outer.optimizer: params.shaped\(\) has no shapes here: the streaming"
    ):
        run_round(_diloco(shaped, Sync(fragments=4)), data)  # 4 fragments of 2 tensors
    copies = Outer(optimizer=lambda p: torch.optim.SGD([p[0].clone()], lr=1.0))
    with pytest.raises(
        ValueError, match="^outer.optimizer: the optimizer must step the tensors its callable"
    ):
        run_round(_diloco(copies), Data())
    with pytest.raises(ValueError, match="^outer.optimizer: the factory returned a dict, not a torch.optim"):
        run_round(_diloco(Outer(optimizer=lambda p: {})), Data())
    with pytest.raises(
        ValueError, match=r"^outer.optimizer = 3: must be one of 'average', 'sgd', 'nesterov' or a"
    ):
        Outer(optimizer=3)  # type: ignore[arg-type]


def test_tensor_fragments_cut_at_the_tensor_ends_nearest_the_even_split() -> None:
    from adloco.library.streaming import tensor_fragments

    assert tensor_fragments([6, 1], 2) == [slice(0, 6), slice(6, 7)]
    assert tensor_fragments([10, 1, 1, 1], 2) == [slice(0, 10), slice(10, 13)]
    assert tensor_fragments([4, 4, 4, 4], 3) == [slice(0, 4), slice(4, 12), slice(12, 16)]
    assert tensor_fragments([100, 1, 1], 3) == [slice(0, 100), slice(100, 101), slice(101, 102)]
    assert tensor_fragments([1, 1], 3) is None
    assert tensor_fragments([5], 1) == [slice(0, 5)]


FACTORIES = """
import torch


def make(params):
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def needs_the_model(params):
    params.names.index("model.embed_tokens.weight")  # only the real model has it
"""


@pytest.fixture
def my_outer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A user's module of outer factories in the current folder, which is not on the import path (the
    ``adloco`` command's case): naming it imports it from there."""
    (tmp_path / "my_outer.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_outer", raising=False)
    yield tmp_path
    sys.modules.pop("my_outer", None)


def test_a_factory_named_module_function_in_a_config_is_the_outer_step(my_outer: Path) -> None:
    from adloco.config import dump_yaml, resolve

    cfg = resolve(overrides=["algorithm.method=diloco", "outer.optimizer=my_outer:make"])
    assert cfg.outer.optimizer == "my_outer:make" and "optimizer: my_outer:make" in dump_yaml(cfg)
    make = sys.modules["my_outer"].make
    assert cfg.outer.factory is make
    data = Data()
    named, given = _diloco(cfg.outer), _diloco(Outer(optimizer=make))
    for _ in range(2):
        run_round(named, data)
        run_round(given, data)
    assert torch.equal(named.theta(0), given.theta(0))
    assert set(named.trainers[0].outer.state_dict()) == {"momentum_buffer"}


def test_the_memory_estimate_counts_the_outer_state(my_outer: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each trainer's outer state is in the estimate: a preset's as known (nesterov's momentum, one float32
    P-vector), a factory's as a probe of it reports (Adam: two), or 0 with the refusal saying why."""
    from adloco.config import resolve
    from adloco.config.checks import outer_state
    from adloco.errors import UserError
    from adloco.library.algorithms.outer import OuterOptimizer, state_bytes
    from adloco.models import sizing

    def state(*overrides: str) -> tuple[float, str]:
        return outer_state(resolve(overrides=["model.name=llama-micro", *overrides]))

    for preset in ("average", "sgd", "nesterov"):  # the table is the presets' real state
        assert sizing.outer_buffers(preset) * 4 == state_bytes(OuterOptimizer(preset, 0.7, 0.9).make)
    assert state("outer.optimizer=nesterov") == (4, "") and state("outer.optimizer=my_outer:make") == (4, "")
    assert state("outer.optimizer=torch.optim:Adam") == (8, "")  # exp_avg, exp_avg_sq; step not counted
    assert state("outer.optimizer=torch.optim:Adam", "algorithm.method=ddp") == (0, "")  # no outer step
    zero, why = state("outer.optimizer=my_outer:needs_the_model")
    assert zero == 0 and why.startswith(
        "outer.optimizer my_outer:needs_the_model's state not counted: its probe"
    )

    seen: dict[str, int] = {}
    for step in ("average", "nesterov", "torch.optim:Adam"):
        monkeypatch.setattr(sizing, "refuse_if_over", lambda est, *a, s=step: seen.setdefault(s, est.state))
        resolve(overrides=["model.name=llama-tiny", "algorithm.trainers=2", f"outer.optimizer={step}"])
    n = sizing.llama_parameters(sizing.SHAPES["llama-tiny"], 4096)
    assert seen["nesterov"] - seen["average"] == 2 * 4 * n  # two trainers, a float32 momentum each
    assert seen["torch.optim:Adam"] - seen["average"] == 2 * 8 * n
    monkeypatch.undo()
    monkeypatch.chdir(my_outer)
    monkeypatch.setattr(sizing, "physical_memory", lambda: 2**20)
    with pytest.raises(
        UserError, match=r"of memory \(outer.optimizer my_outer:needs_the_model's state not counted"
    ):
        resolve(overrides=["model.name=llama-tiny", "outer.optimizer=my_outer:needs_the_model"])


def test_a_state_dict_in_the_middle_of_a_round_is_refused() -> None:
    """Trap: a state taken after some inner steps would resume from the round's start, dropping them."""
    data = Data()
    algo = _diloco(Outer.nesterov())
    algo.step_all({w: data.batch(w, 0, 0, 2) for w in algo.local_workers})
    for call in (algo.state_dict, algo.full_state_dict, lambda: algo.load_state_dict({})):
        with pytest.raises(
            ValueError, match=r"in the middle of a round \(1 of its 4 inner steps taken\).*H-th step"
        ):
            call()
    for h in range(1, 4):
        algo.step_all({w: data.batch(w, 0, h, 2) for w in algo.local_workers})
    assert algo.step_in_round == 0 and algo.state_dict()["round"] == 1  # between rounds: whole rounds
    ms = models(2)
    hooked = DiLoCo(ms, sgd(ms), inner_steps=4, batch_size=2, loss_fn=loss_fn)
    with hooked:  # the hooked form too, though its loop owns the steps
        for w, m in enumerate(ms):
            hooked.replicas[w].optimizer.zero_grad()
            loss_fn(m, data.batch(w, 0, 0, 2)).backward()
            hooked.replicas[w].optimizer.step()
        with pytest.raises(ValueError, match="in the middle of a round"):
            hooked.state_dict()
