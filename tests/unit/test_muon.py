"""Muon as the inner optimizer (ALGORITHM.md §1, step 2): ``torch.optim.Muon`` on a model's hidden matrices
and AdamW on the rest, as one optimizer (:class:`adloco.library.optim.CombinedOptimizer`), through everything a
worker's optimizer goes through: the split, its steps, torch's state dict, the flat inner state of
checkpoints and resume (bit for bit), the round's snapshot and undo, a reset, the lr multiplier, the hooked
form, a user's own pair passed as a list, the gradient probe (which reads gradients, not the optimizer),
and a CUDA graph (the lr as a device tensor)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import nn

from adloco import AdaptiveBatch, AdLoCo, DiLoCo, Merging
from adloco.library.graphs import capturable
from adloco.library.optim import CombinedOptimizer, Muon, is_muon, muon_adamw, muon_split, newton_schulz
from tests.toy import hooked_rounds
from tests.toy_lm import TinyLM, diloco, lm_loss, muon_diloco, run, tiny, tokens


def own_pair(m: nn.Module) -> list[torch.optim.Optimizer]:
    """A user's own Muon and AdamW, built as torch's documentation shows (matrices / the rest)."""
    matrices = [m.up.weight, m.down.weight]
    rest = [p for p in m.parameters() if all(p is not q for q in matrices)]
    return [torch.optim.Muon(matrices, lr=0.02, momentum=0.95), torch.optim.AdamW(rest, lr=3e-3)]


@torch.no_grad()
def val(m: nn.Module) -> float:
    return float(sum(lm_loss(m, tokens(9, 9, h, 16)) for h in range(4)))


def test_the_split_gives_muon_the_hidden_matrices_and_adamw_the_rest() -> None:
    m = TinyLM()
    matrices, rest = muon_split(m)
    assert [id(p) for p in matrices] == [id(m.up.weight), id(m.down.weight)]
    assert {id(p) for p in rest} == {
        id(m.embed.weight),
        id(m.up.bias),
        id(m.norm.weight),
        id(m.norm.bias),
        id(m.head.weight),
    }
    assert len(muon_split(m, adamw=("down",))[0]) == 1
    with pytest.raises(ValueError, match="no parameter of the model"):
        muon_split(m, adamw=("nowhere",))


def test_the_split_leaves_a_hugging_face_classifiers_head_to_adamw() -> None:
    """A task head (the parameters outside ``base_model``: BERT's classifier) maps the last hidden state to
    the outputs, as an LM head does: AdamW's, not Muon's; the backbone's matrices (the pooler's too) Muon's."""
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    model = BertForSequenceClassification(cfg)
    matrices, rest = muon_split(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in rest} >= {"classifier.weight", "classifier.bias"}
    assert {names[id(p)] for p in matrices} == {
        n
        for n, p in model.named_parameters()
        if p.ndim == 2 and "embeddings" not in n and "classifier" not in n
    }
    assert "bert.pooler.dense.weight" in {names[id(p)] for p in matrices}


def test_the_split_of_a_hugging_face_llama() -> None:
    from adloco.config import ModelConfig
    from adloco.models.factory import ModelFactory

    model = ModelFactory(ModelConfig(name="llama-tiny"), 64, 16, 0, 0).build(0)
    matrices, rest = muon_split(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim == 2 and "embed" not in names[id(p)] for p in matrices)
    assert {names[id(p)] for p in rest if p.ndim == 2} == {"model.embed_tokens.weight"}  # tied with the head
    assert all(any(k in names[id(p)] for k in ("proj",)) for p in matrices) and len(matrices) == 4 * 7


def test_a_combined_step_is_each_optimizers_own_step_bit_for_bit() -> None:
    a, b = tiny(2)
    combined = CombinedOptimizer(*own_pair(a))
    apart = own_pair(b)
    for h in range(3):
        for m, opts in ((a, [combined]), (b, apart)):
            for o in opts:
                o.zero_grad()
            lm_loss(m, tokens(0, 0, h, 4)).backward()
            for o in opts:
                o.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert combined.param_groups[0] is combined.optimizers[0].param_groups[0]  # the very groups


def test_a_combined_state_dict_resumes_bit_for_bit_and_it_copies_deeply() -> None:
    def steps(m: nn.Module, o: torch.optim.Optimizer, hs: range) -> None:
        for h in hs:
            o.zero_grad()
            lm_loss(m, tokens(0, 1, h, 4)).backward()
            o.step()

    a, b = tiny(2)
    oa, ob = muon_adamw(a, 3e-3), muon_adamw(b, 3e-3)
    steps(a, oa, range(2))
    b.load_state_dict(a.state_dict())
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))
    assert (
        isinstance(ob.optimizers[1], torch.optim.Muon)
        and ob.optimizers[1].param_groups[0] is ob.param_groups[-1]
    )
    assert ob.optimizers[1].param_groups[0]["lr_ratio"] == 1.0
    steps(a, oa, range(2, 4))
    steps(b, ob, range(2, 4))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    twin = copy.deepcopy(oa)
    assert len(twin.state) == len(oa.state) and twin.optimizers[0].param_groups[0] is twin.param_groups[0]


def _muon_steps(make: Any, start: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    p = nn.Parameter(start.clone())
    opt = make([p])
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


@pytest.mark.parametrize(
    ("nesterov", "adjust", "shape"), [(True, "match_rms_adamw", (6, 10)), (False, "original", (12, 5))]
)
def test_muon_orthogonalizes_in_bfloat16_as_torch_and_in_float32_the_same_step(
    nesterov: bool, adjust: str, shape: tuple[int, int]
) -> None:
    """``Muon(ns_dtype="bfloat16")`` is torch's step bit for bit; ``float32`` is the same step written out
    (momentum, Nesterov or not, the lr adjustment, decoupled weight decay), the Newton–Schulz iterations in
    float32: within float32's rounding of it in float64, and apart from torch's by bfloat16's rounding."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(*shape, generator=gen)
    grads = [torch.randn(*shape, generator=gen) for _ in range(3)]
    kw: dict[str, Any] = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust)
    torchs = _muon_steps(lambda ps: torch.optim.Muon(ps, **kw), start, grads)
    assert torch.equal(_muon_steps(lambda ps: Muon(ps, ns_dtype="bfloat16", **kw), start, grads), torchs)
    f32 = _muon_steps(lambda ps: Muon(ps, ns_dtype="float32", **kw), start, grads)
    # the step written out in float64
    p, buf = start.double(), torch.zeros(shape, dtype=torch.float64)
    rows, cols = shape
    factor = (
        0.2 * math.sqrt(max(rows, cols)) if adjust == "match_rms_adamw" else math.sqrt(max(1, rows / cols))
    )
    for g in grads:
        g = g.double()
        buf = 0.9 * buf + 0.1 * g
        update = g + 0.9 * (buf - g) if nesterov else buf
        o = newton_schulz(update, (3.4445, -4.775, 2.0315), 5, 1e-7, torch.float64)
        p = p * (1 - 0.02 * 0.1) - 0.02 * factor * o
    assert torch.allclose(f32.double(), p, atol=1e-6, rtol=0)
    moved = (p - start.double()).abs().max().item()
    off = (torchs.double() - p).abs().max().item()
    assert 1e-5 < off < 0.05 * moved  # bfloat16's rounding, not another step
    with pytest.raises(ValueError, match="ns_dtype = 'float16'"):
        Muon([nn.Parameter(start.clone())], ns_dtype="float16")  # type: ignore[arg-type]


def test_inner_muon_ns_dtype_reaches_every_workers_muon_and_the_first_lines() -> None:
    from adloco.engine.describe import describe_run
    from adloco.library.optim import ns_dtype_for as optim_ns_dtype_for
    from tests.helpers import driver, run_round, tiny_config

    cfg = tiny_config(inner={"optimizer": "muon", "muon_ns_dtype": "float32"}, algorithm={"rounds": 1})
    c = driver(cfg)
    calls: list[str] = []
    for rep in c.algo.replicas.values():
        muon = rep.optimizer.optimizers[1]  # type: ignore[attr-defined]
        assert isinstance(muon, Muon) and muon.ns_dtype == "float32"
        muon.register_step_pre_hook(lambda opt, *_: calls.append("step"))
    run_round(c)
    assert len(calls) == cfg.algorithm.workers * cfg.algorithm.inner_steps  # the hooks run once a step
    assert "Muon lr ×1, Newton–Schulz in float32" in describe_run(cfg, 1, "data", "cpu")[1]
    default = driver(tiny_config(inner={"optimizer": "muon"}, algorithm={"rounds": 1}))
    chosen = optim_ns_dtype_for("auto", "cpu")  # auto, chosen once for the run by the engine
    assert all(r.optimizer.optimizers[1].ns_dtype == chosen for r in default.algo.replicas.values())  # type: ignore[attr-defined]
    assert default.inner.muon_ns_dtype == chosen


def test_the_runs_processes_agree_on_autos_dtype_float32_where_any_emulates_bfloat16() -> None:
    """``inner.muon_ns_dtype: auto`` is chosen once for a run, through a gather of every process's own
    choice: float32 where any process's CPU emulates bfloat16 (replicas that must agree never round apart),
    else bfloat16; a setting, or another optimizer, is left as it is and gathers nothing."""
    from adloco.config import resolve
    from adloco.engine.inner import agreed_inner

    class Gather:
        def __init__(self, others: list[str]) -> None:
            self.others, self.calls = others, 0

        def all_gather_json(self, mine: object) -> list[object]:
            self.calls += 1
            return [mine, *self.others]

    auto = resolve(None, ["inner.optimizer=muon"]).inner
    for others, device, want in (
        (["float32"], "cuda", "float32"),
        (["bfloat16"], "cuda", "bfloat16"),
        ([], "cuda", "bfloat16"),
    ):
        assert agreed_inner(auto, Gather(others), device).muon_ns_dtype == want  # type: ignore[arg-type]
    for inner in (
        resolve(None, ["inner.optimizer=muon", "inner.muon_ns_dtype=bfloat16"]).inner,
        resolve(None, ["inner.optimizer=adamw"]).inner,
    ):
        comm = Gather(["float32"])
        assert agreed_inner(inner, comm, "cpu") is inner and comm.calls == 0  # type: ignore[arg-type]


@pytest.mark.parametrize("emulates", [True, False])
def test_muon_auto_orthogonalizes_in_float32_on_a_cpu_that_emulates_bfloat16_else_in_bfloat16(
    monkeypatch: pytest.MonkeyPatch, emulates: bool
) -> None:
    """``ns_dtype="auto"`` (``inner.muon_ns_dtype``'s default) is the float32 step bit for bit on a CPU
    without native bfloat16 matmuls and torch's bfloat16 step elsewhere; a run's first lines say which."""
    from adloco.config import resolve
    from adloco.engine.describe import describe_run, muon_note
    from adloco.library import optim

    monkeypatch.setattr(optim, "emulates_bfloat16", lambda: emulates)
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(6, 10, generator=gen)
    grads = [torch.randn(6, 10, generator=gen) for _ in range(3)]
    kw: dict[str, Any] = dict(lr=0.02, weight_decay=0.1, momentum=0.9)
    auto = _muon_steps(lambda ps: Muon(ps, **kw), start, grads)
    same = "float32" if emulates else "bfloat16"
    other = "bfloat16" if emulates else "float32"
    assert torch.equal(auto, _muon_steps(lambda ps: Muon(ps, ns_dtype=same, **kw), start, grads))  # type: ignore[arg-type]
    assert not torch.equal(auto, _muon_steps(lambda ps: Muon(ps, ns_dtype=other, **kw), start, grads))  # type: ignore[arg-type]
    assert optim.ns_dtype_for("auto", "cuda") == "bfloat16"  # a GPU computes bfloat16 natively
    assert optim.ns_dtype_for("bfloat16", "cpu") == "bfloat16"  # a setting is itself
    cfg = resolve(None, ["inner.optimizer=muon"])
    said = "float32 (auto, a CPU without native bfloat16 matmuls)" if emulates else "bfloat16 (auto)"
    assert describe_run(cfg, 1, "data", "cpu", ns_dtype=same)[1].endswith(
        f"Newton–Schulz in {said}; outer average (θ ← the workers' mean)"
    )
    assert "Newton–Schulz in bfloat16 (auto);" in describe_run(cfg, 1, "data", "cuda", ns_dtype="bfloat16")[1]
    assert "Newton–Schulz in auto;" in describe_run(cfg, 1, "data", "cpu")[1]  # not chosen yet: said as set
    assert muon_note(cfg, "cpu") is None  # auto chose; nothing to warn of


def test_muon_in_bfloat16_on_a_cpu_that_emulates_it_is_said_at_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from adloco.engine.describe import muon_note
    from adloco.library import optim
    from tests.helpers import tiny_config

    muon, fast = (
        tiny_config(inner={"optimizer": "muon", "muon_ns_dtype": "bfloat16"}),
        tiny_config(inner={"optimizer": "muon", "muon_ns_dtype": "float32"}),
    )
    monkeypatch.setattr(optim, "emulates_bfloat16", lambda: True)
    note = muon_note(muon, "cpu")
    assert note is not None and note.startswith(
        "inner.muon_ns_dtype bfloat16 on a CPU without native bfloat16"
    )
    assert note.endswith("inner.muon_ns_dtype float32 runs them natively")
    assert muon_note(fast, "cpu") is None and muon_note(muon, "cuda") is None
    assert muon_note(tiny_config(), "cpu") is None
    monkeypatch.setattr(optim, "emulates_bfloat16", lambda: False)
    assert muon_note(muon, "cpu") is None


def test_a_parameter_in_two_optimizers_or_something_else_is_refused() -> None:
    m = TinyLM()
    with pytest.raises(ValueError, match="stepped by two"):
        CombinedOptimizer(torch.optim.Muon([m.up.weight]), torch.optim.AdamW(m.up.parameters()))
    with pytest.raises(ValueError, match="torch.optim.Optimizer"):
        CombinedOptimizer(torch.optim.AdamW(m.parameters()), "muon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no hidden 2-D matrices"):
        muon_adamw(nn.Sequential(nn.Embedding(4, 2), nn.LayerNorm(2)), 1e-3)


@pytest.mark.parametrize("form", ["list", "combined", "engine"])
def test_muon_trains_diloco_and_resumes_bit_for_bit(form: str) -> None:
    """A user's own Muon + AdamW (a list per worker, or combined) or the engine's pair: DiLoCo trains, its
    workers' inner state goes into a state dict (Muon's momentum beside AdamW's moments, each held where it
    lives) and a resumed run is the uninterrupted one, bit for bit."""

    def make(ms: list[TinyLM]) -> DiLoCo:
        if form == "engine":
            opts: Any = [muon_adamw(m, 3e-3) for m in ms]
        else:
            opts = [own_pair(m) if form == "list" else CombinedOptimizer(*own_pair(m)) for m in ms]
        return diloco(ms, opts)

    a = make(tiny(2))
    before = val(a.replicas[0].model)
    run(a, 2)
    state = copy.deepcopy(a.state_dict())
    inner = state["replicas"][0]["inner"]
    assert {"momentum_buffer", "exp_avg", "momentum_buffer.held", "exp_avg.held"} <= set(inner)
    assert is_muon(a.replicas[0].optimizer)
    b = make(tiny(2, seed=5))
    b.load_state_dict(state)
    for rep in b.replicas.values():  # each optimizer holds its own entries only: no buffer made up
        for o in rep.optimizer.optimizers:  # type: ignore[attr-defined]
            keys = {k for s in o.state.values() for k in s}
            assert keys == (
                {"momentum_buffer"} if isinstance(o, torch.optim.Muon) else {"exp_avg", "exp_avg_sq", "step"}
            )
    run(a, 2, first=2)
    run(b, 2, first=2)
    assert torch.equal(a.theta(0), b.theta(0))
    assert val(a.replicas[0].model) < before


def test_a_list_of_optimizers_is_the_combined_optimizer_bit_for_bit() -> None:
    ms_a, ms_b = tiny(2), tiny(2)
    a = diloco(ms_a, [own_pair(m) for m in ms_a])
    b = diloco(ms_b, [CombinedOptimizer(*own_pair(m)) for m in ms_b])
    run(a, 2)
    run(b, 2)
    assert torch.equal(a.theta(0), b.theta(0))
    one = tiny(1)[0]
    single = DiLoCo(one, own_pair(one), inner_steps=3, batch_size=4, loss_fn=lm_loss)  # one model: a pair
    assert isinstance(single.replicas[0].optimizer, CombinedOptimizer)


def test_the_snapshot_reset_and_lr_multiplier_reach_both_optimizers() -> None:
    algo = muon_diloco(tiny(2))
    run(algo, 1)
    rep = algo.replicas[0]
    held = {k: v.clone() for k, v in rep.inner_state().items()}
    snap = rep.snapshot()
    run(algo, 1, first=1)
    assert not torch.equal(rep.inner_state()["momentum_buffer"], held["momentum_buffer"])
    rep.restore(snap)
    assert rep.inner_state().keys() == held.keys()
    assert all(torch.equal(v, held[k]) for k, v in rep.inner_state().items())
    seen: list[list[float]] = []
    for o in rep.optimizer.optimizers:  # type: ignore[attr-defined]
        o.register_step_pre_hook(lambda opt, *_: seen.append([g["lr"] for g in opt.param_groups]))
    rep.lr_scale = 2.0
    run(algo, 1, first=2)
    assert seen and all(lr == 6e-3 for lrs in seen for lr in lrs)
    assert all(g["lr"] == 3e-3 for g in rep.optimizer.param_groups)  # taken back after each step
    rep.reset_optimizer()
    assert rep.inner_state() == {} and all(not o.state for o in rep.optimizer.optimizers)  # type: ignore[attr-defined]


def test_the_hooked_form_with_muon_gives_the_driven_run() -> None:
    driven = muon_diloco(tiny(2), clip=0.0)
    run(driven, 2)
    ms = tiny(2)
    hooked = muon_diloco(ms, clip=0.0)
    hooked_rounds(hooked, ms, 2, lambda m, w, r, h: lm_loss(m, tokens(w, r, h, 4)))
    assert torch.equal(hooked.theta(0), driven.theta(0))


def test_the_probe_reads_gradients_whatever_the_optimizer() -> None:
    """AdLoCo's norm test with Muon: round 1's statistics (taken at θ₀, before any inner step) are the
    AdamW run's, bit for bit; then both runs go on testing their batches."""

    def make(muon: bool) -> AdLoCo:
        ms = tiny(4)
        opts = [muon_adamw(m, 3e-3) if muon else torch.optim.AdamW(m.parameters(), lr=3e-3) for m in ms]
        return AdLoCo(
            ms,
            opts,
            inner_steps=3,
            trainers=2,
            loss_fn=lm_loss,
            batch=AdaptiveBatch(eta=0.3, initial=4),
            merge=Merging(every=2),
        )

    a, b = make(True), make(False)
    run(a, 1)
    run(b, 1)
    ta, tb = a.last_report.trainers, b.last_report.trainers  # type: ignore[union-attr]
    assert [(t.sigma2, t.gbar_sq, t.samples) for t in ta] == [(t.sigma2, t.gbar_sq, t.samples) for t in tb]
    assert all(t.sigma2 is not None and t.sigma2 > 0 for t in ta)
    assert not torch.equal(a.theta(0), b.theta(0))  # the optimizers did differ
    run(a, 2, first=1)
    assert a.last_report is not None and all(t.reason != "no-statistics" for t in a.last_report.trainers)


def test_muon_takes_its_lr_as_a_device_tensor_and_reads_nothing_on_the_host() -> None:
    """What lets a CUDA graph hold Muon's step (ALGORITHM.md §14): at a 0-dim tensor lr the step is the
    step at the same Python float, within float rounding, and reads no value on the host: it runs on
    meta tensors, which hold none (torch's Muon, ``float(lr)``, cannot). ``capturable`` says so of the
    pair built with ``capturable=True``, and names what stands in the way otherwise."""
    for ns in ("float32", "bfloat16"):
        a = TinyLM()
        b = copy.deepcopy(a)
        oa, ob = muon_adamw(a, 1e-2, ns_dtype=ns), muon_adamw(b, 1e-2, ns_dtype=ns)
        for h, lr in enumerate((1e-2, 3e-3, 2e-2)):
            for m, o in ((a, oa), (b, ob)):
                m.zero_grad()
                lm_loss(m, tokens(3, 9, h, 16)).backward()
                for g in o.optimizers[-1].param_groups:
                    g["lr"] = lr if m is a else torch.tensor(lr)
                o.step()
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)
    meta = [torch.empty(24, 16, device="meta", requires_grad=True) for _ in range(2)]
    for p in meta:
        p.grad = torch.empty_like(p)
    for cls, kw in ((Muon, {"ns_dtype": "float32"}), (torch.optim.Muon, {})):
        o = cls(meta, lr=1e-2, weight_decay=0.1, **kw)
        o.param_groups[0]["lr"] = torch.tensor(1e-2, device="meta")  # as Replica.device_lrs sets it
        if cls is Muon:
            o.step()
        else:
            with pytest.raises(RuntimeError, match="meta"):  # its float(lr): no value to read on meta
                o.step()
    m = TinyLM()
    assert capturable(muon_adamw(m, 1e-3, capturable=True)) is None
    from adloco.config import InnerConfig
    from adloco.engine.inner import make_optimizer
    from adloco.library.flat import flatten

    built = make_optimizer(flatten(TinyLM()), InnerConfig(optimizer="muon"), capturable=True)
    assert is_muon(built) and capturable(built) is None  # what runtime.cuda_graphs builds
    assert "AdamW needs capturable=True" in (capturable(muon_adamw(m, 1e-3)) or "")
    theirs = capturable(CombinedOptimizer(*own_pair(TinyLM())))
    assert theirs is not None and theirs.startswith("torch.optim.Muon reads its learning rate on the host")


def test_adloco_train_with_inner_optimizer_muon() -> None:
    """``inner.optimizer: muon`` through ``adloco train``'s driver (in process): every worker steps Muon on
    the model's hidden matrices at the schedule's lr × ``inner.muon_lr_ratio`` and AdamW on the rest at
    the schedule's lr; the norm test's probe gives statistics, trainers merge, and the loss falls."""
    from tests.helpers import driver, run_round, tiny_config

    c = driver(tiny_config(inner={"optimizer": "muon", "muon_lr_ratio": 0.5}, algorithm={"rounds": 3}))
    steps: list[str] = []
    for rep in c.algo.replicas.values():
        for o in rep.optimizer.optimizers:  # type: ignore[attr-defined]
            o.register_step_pre_hook(lambda opt, *_: steps.append(type(opt).__name__))
    summaries = [run_round(c)["summary"] for _ in range(3)]
    assert steps.count("Muon") == steps.count("AdamW") > 0
    for rep in c.algo.replicas.values():
        adamw, muon = rep.optimizer.optimizers  # type: ignore[attr-defined]
        assert isinstance(adamw, torch.optim.AdamW) and isinstance(muon, torch.optim.Muon)
        lr = adamw.param_groups[0]["lr"]
        assert lr > 0 and all(g["lr"] == 0.5 * lr for g in muon.param_groups)
        hidden = muon_split(rep.model)[0]
        assert hidden and {id(p) for g in muon.param_groups for p in g["params"]} == {id(p) for p in hidden}
    report = c.algo.last_report
    assert report is not None and any(t.sigma2 is not None and t.sigma2 > 0 for t in report.trainers)
    assert len(c.algo.trainers) < 4  # merged
    assert summaries[-1]["val_loss"] < summaries[0]["val_loss"]


def test_a_muon_alone_that_leaves_parameters_out_is_refused_naming_the_list() -> None:
    ms = tiny(2)
    muons = [torch.optim.Muon(muon_split(m)[0], lr=1e-3) for m in ms]
    with pytest.raises(
        ValueError,
        match=r"^inner_optimizer: updates [\d,]+ of the model's [\d,]+ parameter values; .*"
        r"a list per model: Muon on the matrices, AdamW on the rest\)$",
    ):
        diloco(ms, muons)


def test_the_newton_schulz_benchmark_times_the_three_steps_and_refuses_bad_input(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """benchmarks/muon_ns.py (RESULTS, "Muon's Newton–Schulz on a CPU") on the smallest model: a row of
    seconds a step for AdamW and Muon in both dtypes, in its table and its JSON; bad input in one line."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "muon_ns.py"
    spec = importlib.util.spec_from_file_location("muon_ns", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        out = tmp_path / "ns.json"
        args = [
            "--models",
            "llama-micro",
            "--batches",
            "2",
            "--blocks",
            "1",
            "--warmup",
            "0",
            "--json",
            str(out),
        ]
        assert bench.main(args) == 0
        (row,) = json.loads(out.read_text())["rows"]
        assert row["model"] == "llama-micro" and all(row[f"{k}_s"] > 0 for k in bench.OPTIMIZERS)
        assert "| `llama-micro` | 2 |" in capsys.readouterr().out
        for bad, said in (
            (["--models", "llama-huge"], "--models 'llama-huge': one of"),
            (["--batches", "0"], "--batches '0': whole numbers >= 1"),
            (["--blocks", "0"], "--blocks must be >= 1"),
        ):
            assert bench.main(bad) == 2
            assert said in capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)


def test_inner_optimizer_auto_is_muon_where_every_process_is_on_a_cpu_and_a_resume_keeps_its_choice() -> None:
    """``inner.optimizer: auto`` (the default) is chosen once for a run through a gather of every process's
    device: Muon for a language model where all are CPUs (where it was measured ahead per second), AdamW
    where any is a GPU (Muon inside the CUDA graphs is not yet timed) and for a classifier; a resumed run goes on with the optimizer its checkpoint
    says it chose, whatever its devices now, since that is the state it holds; Muon's dtype is then agreed
    as ever. A process alone (``adloco profile``, :func:`make_optimizer` given auto) chooses by its own device."""
    from adloco.config import InnerConfig, resolve
    from adloco.engine.inner import agreed_inner, auto_optimizer, local_inner, make_optimizer
    from adloco.library.flat import flatten

    class Gather:
        def __init__(self, others: list[object]) -> None:
            self.others = others

        def all_gather_json(self, mine: object) -> list[object]:
            return [mine, *self.others] if isinstance(mine, list) else [mine]

    auto = resolve(None, []).inner
    assert auto.optimizer == "auto"
    for others, device, resumed, want in (
        ([], "cpu", None, "muon"),
        ([["cpu", None], ["cpu", None]], "cpu", None, "muon"),
        ([["cuda", None]], "cpu", None, "adamw"),
        ([], "cuda", None, "adamw"),
        ([], "cuda", "muon", "muon"),  # a CPU run resumed on a GPU keeps Muon
        ([["cpu", None]], "cpu", "adamw", "adamw"),  # rank 0 found the checkpoint, the others did not
    ):
        chosen = agreed_inner(auto, Gather(others), device, resumed)  # type: ignore[arg-type]
        assert chosen.optimizer == want, (others, device, resumed)
        assert chosen.muon_ns_dtype in (("auto",) if want == "adamw" else ("float32", "bfloat16"))
    assert auto_optimizer([]) == "adamw" and auto_optimizer(["cpu", "cuda"]) == "adamw"
    # a classifier: AdamW on CPUs too (Muon is not measured there, and left a small BERT at chance)
    assert auto_optimizer(["cpu"], "classification") == "adamw"
    assert agreed_inner(auto, Gather([]), "cpu", None, "classification").optimizer == "adamw"  # type: ignore[arg-type]
    assert local_inner(auto, "cpu", "classification").optimizer == "adamw"
    assert local_inner(auto, "cpu").optimizer == "muon" and local_inner(auto, "cuda").optimizer == "adamw"
    assert is_muon(make_optimizer(flatten(TinyLM()), InnerConfig()))  # auto on this CPU
    assert isinstance(make_optimizer(flatten(TinyLM()), InnerConfig(optimizer="adamw")), torch.optim.AdamW)


def test_a_run_of_the_default_trains_muon_on_a_cpu_and_resumes_with_it_wherever_it_resumes(
    tmp_path: Any, text_corpus: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``adloco train`` with ``inner.optimizer`` left at auto: every worker steps Muon on this CPU, the
    first lines say so and why, the checkpoint records the choice; resumed where auto would now choose
    AdamW (a GPU; here a patched choice), the run goes on with Muon, says why, and ends with the
    uninterrupted run's model bit for bit."""
    import json
    import shutil

    from adloco.cli import main
    from adloco.engine import inner
    from tests.helpers import TINY_QUIET, S, only_run, weights

    ref = tmp_path / "ref"
    sets = S(*TINY_QUIET, f"data.source={text_corpus}", "logging.progress=plain", "logging.save_model=true")
    assert main(["train", *sets, *S("checkpoint.every=1", f"logging.out_dir={ref}")]) == 0
    assert "optimizers: inner muon (auto: every process on a CPU) lr" in capsys.readouterr().out
    ref = only_run(ref)
    state = json.loads((ref / "checkpoints" / "round-000001" / "state.json").read_text())
    assert state["driver"]["inner_optimizer"] == "muon"
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    monkeypatch.setattr(inner, "auto_optimizer", lambda devices, task: "adamw")  # as a GPU would choose
    assert main(["train", "--resume", str(run / "checkpoints" / "round-000001")]) == 0
    assert "optimizers: inner muon (auto: kept from the run's checkpoint) lr" in capsys.readouterr().out
    assert weights(run) == weights(ref)
