"""Codecs as objects (ALGORITHM.md §9.4): the registered ones keep their bytes, and a codec registered from
outside the round (here: one whose encodings are gathered rather than summed, as a sparse one's would be)
travels Δ, merges and moves through the one reducer, with error feedback, the same bits in threads as in
one process, counted as the collective it is. Then topk, the sparse codec: its encoding against a block
computed by hand, its exact bytes, its error feedback, the same bits in threads, in the library and
through `adloco train` (gloo processes: tests/integration/test_quantize_dist.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adloco.library.comm import codecs, compressed
from adloco.library.comm.base import wire_bytes
from adloco.library.comm.codecs import Codec
from adloco.library.comm.compressed import collective, compressed_all_reduce, payload_bytes
from adloco.library.comm.quantize import ErrorFeedback
from tests.helpers import assert_copies_agree, reference_and_threaded, tiny_config


class GatheredHalf(Codec):
    """bfloat16 values whose encodings are all-gathered whole (``sums`` False), like a sparse codec's."""

    sums = False

    def __init__(self, block: int) -> None:
        self.name = "bfloat16"

    @classmethod
    def build(cls, wire: object) -> Codec:
        return cls(0)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).view(torch.uint8)

    def decode(
        self, buf: torch.Tensor, numel: int, out: torch.Tensor | None = None, support: object = None
    ) -> torch.Tensor:
        values = buf.clone().view(torch.bfloat16)
        return values.to(torch.float32) if out is None else out.copy_(values)

    def nbytes(self, numel: int) -> int:
        return 2 * numel


@pytest.mark.parametrize("name", ["bfloat16", "float16", "int8", "int4"])
def test_every_registered_codec_encodes_to_the_bytes_it_counts(name: str) -> None:
    c = compressed.codec(name, 64)
    assert c is not None and c.name == name and c.sums
    for n in (0, 1, 63, 64, 65, 1001):
        x = torch.randn(n)
        buf = c.encode(x)
        assert buf.dtype == torch.uint8 and buf.numel() == c.nbytes(n)
        assert torch.equal(c.decode(buf, n), c.roundtrip(x))
    assert compressed.codec("float32") is None
    with pytest.raises(ValueError, match="wire dtype must be one of"):
        compressed.codec("int2")


def test_a_gathered_codec_sums_every_participants_decoded_vector_in_order() -> None:
    c = GatheredHalf(0)
    xs = [torch.randn(11) for _ in range(3)]
    fb = [ErrorFeedback() for _ in xs]
    got = compressed_all_reduce(xs, c, feedback=fb)
    want = c.roundtrip(xs[0]) + c.roundtrip(xs[1]) + c.roundtrip(xs[2])
    assert got is not None and torch.equal(got, want)
    for x, f in zip(xs, fb, strict=True):  # each participant keeps what its own encoding dropped
        assert f.error is not None and torch.equal(f.error, x - c.roundtrip(x))
    assert collective(11, 3, c) == ("all_gather", 22) and payload_bytes(11, 3, c) == 22


def test_a_codec_registered_outside_the_round_carries_delta_merges_and_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(codecs.CODECS, "bfloat16", GatheredHalf)
    cfg = tiny_config(
        **{
            "algorithm": {"workers": 4, "trainers": 3, "rounds": 2},
            "merge": {"every": 2},
            "outer": {"optimizer": "nesterov"},
            "comm": {"dtype": "bfloat16", "theta_dtype": "bfloat16", "error_feedback": True},
        }
    )
    ref, threads = reference_and_threaded(cfg, {0: 0, 1: 1, 2: 0, 3: 1}, 2)
    P = ref.n_params
    sent = ref.totals.by_kind  # Δ of a 2-worker trainer each round, θ and momentum merged and moved
    assert sent["delta"] == 2 * wire_bytes("all_gather", 2, 2 * P)
    assert sent["merge"] == 2 * wire_bytes("all_gather", 3, 2 * P)  # a 2-worker and a 1-worker trainer
    assert sent["move"] == 2 * wire_bytes("broadcast", 2, 2 * P)
    assert ref.feedback is not None
    assert_copies_agree(ref, threads)


# --------------------------------------------------------------------------------------------------
# topk: the sparse codec (ALGORITHM.md §9.4)
# --------------------------------------------------------------------------------------------------


def _pack_by_hand(entries: list[int], width: int) -> list[int]:
    """Little-endian bits: bit t of entry i is bit (i·W + t) mod 8 of byte ⌊(i·W + t) / 8⌋."""
    bits = [(e >> t) & 1 for e in entries for t in range(width)]
    bits += [0] * (-len(bits) % 8)
    return [sum(b << j for j, b in enumerate(bits[i : i + 8])) for i in range(0, len(bits), 8)]


def test_topk_encodes_a_hand_computed_block() -> None:
    """Blocks of 8 (index 3 bits), 1/2 kept, 2 bits (4 bins): block 0 keeps, by index, −0.8, 0.3, 0.5,
    0.4: μ 0.1, centred −0.9, 0.2, 0.4, 0.3, σ = √(1.1/3), bin width 6σ/4 = 0.9083, bins round(c/width + 2)
    = 1, 2, 2, 2: bin 1 holds −0.8, bin 2 the mean of 0.3, 0.5, 0.4 = 0.4 (bfloat16: 0.400390625), bins 0
    and 3 none (0). The short last block [1, −2, −3] keeps ⌈3/2⌉ = 2, −2 and −3: centred ±0.5, both in bin
    2, decoded as their mean −2.5 (a block of 2 kept values lands in one bin: SparseLoCo's quantization
    needs many values a block). Entries index | bin << 3, 5 bits each."""
    c = codecs.TopK(0.5, 8, 2)
    x = torch.tensor([0.1, -0.8, 0.3, 0.0, 0.5, -0.2, 0.05, 0.4, 1.0, -2.0, -3.0])
    buf = c.encode(x)
    tables = torch.tensor([0.0, -0.8, 0.4, 0.0, 0.0, 0.0, -2.5, 0.0], dtype=torch.bfloat16).view(torch.uint8)
    entries = [1 | 1 << 3, 2 | 2 << 3, 4 | 2 << 3, 7 | 2 << 3, 1 | 2 << 3, 2 | 2 << 3]
    assert torch.equal(buf, torch.cat([tables, torch.tensor(_pack_by_hand(entries, 5), dtype=torch.uint8)]))
    assert c.nbytes(11) == 2 * 4 * 2 + 4 == buf.numel()
    want = torch.zeros(11)
    want[1] = torch.tensor(-0.8, dtype=torch.bfloat16).float()
    want[[2, 4, 7]] = torch.tensor(0.4, dtype=torch.bfloat16).float()
    want[[9, 10]] = -2.5
    assert torch.equal(c.decode(buf, 11), want)
    sent = torch.zeros(11, dtype=torch.bool)
    c.decode(buf, 11, support=sent)
    assert sent.nonzero().flatten().tolist() == [1, 2, 4, 7, 9, 10]
    assert not c.sums and compressed.codec("topk", 8).nbytes(11) == codecs.TopK(1 / 64, 8, 2).nbytes(11)


def test_topk_ties_zeros_and_faults() -> None:
    c = codecs.TopK(0.5, 4, 2)
    # equal magnitudes: the lower index first (both in one bin: their mean, 0)
    assert c.roundtrip(torch.tensor([0.5, -0.5, 0.5, 0.25])).nonzero().flatten().tolist() == []
    sent = torch.zeros(4, dtype=torch.bool)
    c.decode(c.encode(torch.tensor([0.5, -0.5, 0.5, 0.25])), 4, support=sent)
    assert sent.tolist() == [True, True, False, False]
    # fewer values than k that are not 0: the largest is repeated, never a 0 sent as a value
    got = c.roundtrip(torch.tensor([0.0, 0.0, -0.3, 0.0, 0.0, 0.0, 0.0, 0.0]))
    assert torch.equal(got, torch.tensor([0.0, 0.0, -0.3, 0.0, 0.0, 0.0, 0.0, 0.0]).bfloat16().float())
    # a NaN or an infinity is kept and leaves its block's values non-finite, the other block finite
    for bad in (float("nan"), float("-inf")):
        got = c.roundtrip(torch.tensor([1.0, bad, 2.0, 0.5, 1.0, 2.0, 3.0, 4.0]))
        assert not torch.isfinite(got[:4]).all() and torch.isfinite(got[4:]).all()


@pytest.mark.parametrize(
    ("fraction", "block", "bits"), [(1 / 64, 4096, 2), (0.03, 100, 3), (1.0, 2, 8), (0.5, 7, 1)]
)
def test_topk_sends_exactly_the_bytes_it_counts(fraction: float, block: int, bits: int) -> None:
    """2·2^b bytes of table a block, then K entries of ⌈log2 S⌉ + b bits, K = Σ max(1, ⌈f·L_j⌉); k of a
    decimal fraction is exact (0.03 of 100 keeps 3)."""
    c = codecs.TopK(fraction, block, bits)
    w = (block - 1).bit_length()
    for n in (0, 1, block - 1, block, block + 1, 3 * block + 5, 10_001):
        full, rem = divmod(n, block)
        k = [max(1, min(L, round(fraction * L + 0.4999999))) for L in [block] * full + ([rem] if rem else [])]
        assert c.nbytes(n) == 2 * 2**bits * len(k) + -(-sum(k) * (w + bits) // 8)
        x = torch.randn(n)
        buf = c.encode(x)
        assert buf.dtype == torch.uint8 and buf.numel() == c.nbytes(n)
        got = c.decode(buf, n)
        assert int((got != 0).sum()) <= sum(k)
    assert codecs.TopK(0.03, 100, 2).kept(100) == 3
    with pytest.raises(ValueError, match="topk fraction"):
        codecs.TopK(0.0, 8, 2)
    with pytest.raises(ValueError, match="topk mean"):
        codecs.TopK(0.5, 8, 2, mean="most")


def test_topk_keeps_the_largest_and_decodes_each_bin_as_its_mean() -> None:
    """The kept set is each block's top k; each bin's decoded values sum to what its values sum to (the
    bin's mean, in bfloat16), so a block's kept values are sent unbiased; more bits, smaller error."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096 * 3 + 17, generator=g)
    errors = []
    for bits in (1, 2, 4, 8):
        c = codecs.TopK(1 / 64, 4096, bits)
        got = c.roundtrip(x)
        for j, (xb, gb) in enumerate(zip(x.split(4096), got.split(4096), strict=True)):
            k = c.kept(xb.numel())
            top = xb.abs().topk(k).indices
            sent = torch.zeros(xb.numel(), dtype=torch.bool)
            sent[top] = True
            assert set(gb.nonzero().flatten().tolist()) <= set(top.tolist()), j
            for value in gb[sent].unique():  # the members of one bin decode to one value: their mean
                members = sent & (gb == value)
                torch.testing.assert_close(float(xb[members].mean()), float(value), rtol=2**-8, atol=1e-6)
        errors.append(float((got - x)[got != 0].abs().mean()))
    assert errors == sorted(errors, reverse=True) and errors[-1] < 0.05 * errors[0]


def test_topk_error_feedback_keeps_what_was_not_sent() -> None:
    """e_m = v − dec(enc(v)): exactly v where nothing was sent, the rounding where something was; over
    rounds what was sent is Σ Δ − e (ALGORITHM.md §9.4). Averaged over all participants (``mean`` all) the
    reduced vector is the sum of what each sent."""
    c = codecs.TopK(1 / 16, 64, 2, mean="all")
    g = torch.Generator().manual_seed(1)
    deltas = [[torch.randn(1000, generator=g) for _ in range(3)] for _ in range(4)]
    fb = [ErrorFeedback() for _ in range(3)]
    total = torch.zeros(1000)
    for r, xs in enumerate(deltas):
        v = [fb[m].compensate(x) for m, x in enumerate(xs)]
        got = compressed_all_reduce(xs, c, feedback=fb)
        sent = [c.roundtrip(vm) for vm in v]
        assert got is not None and torch.equal(got, sent[0] + sent[1] + sent[2]), r
        for m in range(3):
            e = fb[m].error
            assert e is not None and torch.equal(e, v[m] - sent[m])
            assert torch.equal(e[sent[m] == 0], v[m][sent[m] == 0])
        total += got
    meant = sum(sum(xs) for xs in deltas)
    left = sum(f.error for f in fb if f.error is not None)
    torch.testing.assert_close(total, meant - left, rtol=0, atol=1e-5)
    assert collective(1000, 3, c) == ("all_gather", c.nbytes(1000))


def test_topk_averages_each_value_over_the_participants_that_sent_it() -> None:
    """SparseLoCo's aggregation: value i is Σ_{m∈S_i} x_{m,i} · W / Σ_{m∈S_i} w_m. Three participants
    weighted 1/2, 1/4, 1/4 (their vectors already weighted), blocks of 4 keeping 1 value each: where two
    sent a value, their sum over their weight; where one sent it, its value over its own weight; where all
    three sent it, the plain sum; where none, 0."""
    c = codecs.TopK(0.25, 4, 2)
    xs = [
        torch.tensor([4.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
        torch.tensor([2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 1.0]),
        torch.tensor([0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 7.0, 0.0, 0.0, 0.0, 0.0, 2.0]),
    ]
    w = [0.5, 0.25, 0.25]
    got = compressed_all_reduce(xs, c, weights=w)
    assert got is not None
    want = torch.tensor([(4 + 2) / 0.75, 5 / 0.25, 0, 0, 0, 2 / 0.5, (3 + 7) / 0.5, 0, 0, 0, 0, 1 + 1 + 2])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # unweighted: the mean over the senders times n; mean "all": the plain sum
    got = compressed_all_reduce(xs, c)
    assert got is not None and float(got[0]) == 3 * (4 + 2) / 2 and float(got[1]) == 3 * 5
    flat = compressed_all_reduce(xs, codecs.TopK(0.25, 4, 2, mean="all"))
    assert flat is not None and torch.equal(flat, xs[0] + xs[1] + xs[2])
    with pytest.raises(ValueError, match="2 weights for 3 participants"):
        compressed_all_reduce(xs, c, weights=[0.5, 0.5])


def test_error_feedback_decays_by_beta_each_round() -> None:
    """e ← β·e + Δ, then what was sent subtracted (SparseLoCo's accumulator): against a hand-computed
    sequence, with a codec that sends nothing, then one that sends half."""
    fb = ErrorFeedback(0.5)
    d = [torch.tensor([1.0, 2.0]), torch.tensor([4.0, 0.0]), torch.tensor([0.0, 8.0])]
    fb.step(d[0], torch.zeros_like)
    assert torch.equal(fb.error, torch.tensor([1.0, 2.0]))
    fb.step(d[1], torch.zeros_like)
    assert torch.equal(fb.error, torch.tensor([4.5, 1.0]))
    sent = fb.step(d[2], lambda v: v / 2)  # v = Δ + β·e = [2.25, 8.5]
    assert torch.equal(sent, torch.tensor([1.125, 4.25])) and torch.equal(fb.error, sent)
    assert ErrorFeedback().decay == 1.0
    with pytest.raises(ValueError, match="decay must be in"):
        ErrorFeedback(1.5)


def test_topk_through_adloco_train_in_threads_bitwise(tmp_path: Path) -> None:
    """AdLoCo with merges and moves (θ in int4), Δ in topk with its error feedback on by default: the
    threads backend gives the in-process run bit for bit, its Δ counted as an all-gather of the exact
    encoded size."""
    cfg = tiny_config(
        **{
            "algorithm": {"workers": 4, "trainers": 3, "rounds": 2},
            "merge": {"every": 2},
            "outer": {"optimizer": "nesterov"},
            "comm": {"dtype": "topk", "topk_block": 64, "topk_fraction": 0.1, "theta_dtype": "int4"},
        }
    )
    assert cfg.comm.error_feedback is None and cfg.comm.feedback
    ref, threads = reference_and_threaded(cfg, {0: 0, 1: 1, 2: 0, 3: 1}, 2)
    P = ref.n_params
    B = codecs.TopK(0.1, 64, 2).nbytes(P)
    assert ref.totals.by_kind["delta"] == 2 * wire_bytes("all_gather", 2, B)  # a 2-worker trainer, 2 rounds
    assert ref.feedback is not None and any(f.error is not None for f in ref.feedback.values())
    assert_copies_agree(ref, threads)


def test_topk_in_the_library_counts_its_exact_bytes_and_is_refused_where_it_cannot_work() -> None:
    """DiLoCo(wire=Wire('topk', ...)): error feedback on without asking, Δ counted as an all-gather of
    the encoded size; DDP and a shared probe mean are refused in one line."""
    from torch import nn

    from adloco import DDP, AdaptiveBatch, AdLoCo, DiLoCo, Wire

    torch.manual_seed(0)
    ms = [nn.Linear(40, 1) for _ in range(3)]  # P = 41: blocks of 8, the last 1 value

    def loss(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return ((m(b[0]).squeeze(-1) - b[1]) ** 2).mean()

    sgd = [torch.optim.SGD(m.parameters(), lr=0.05) for m in ms]
    wire = Wire("topk", topk_block=8, topk_fraction=0.25, topk_bits=2)
    algo = DiLoCo(ms, sgd, inner_steps=2, loss_fn=loss, batch_size=2, wire=wire, sync_initial=False)
    g = torch.Generator().manual_seed(3)
    for _ in range(2 * 2):
        algo.step_all({w: (torch.randn(2, 40, generator=g), torch.randn(2, generator=g)) for w in range(3)})
    B = 2 * 4 * 6 + -(-(5 * 2 + 1) * (3 + 2) // 8)  # 6 tables of 4 bins; 5 blocks of 8 keep 2, the last 1
    assert codecs.TopK(0.25, 8, 2).nbytes(41) == B
    assert algo.totals.by_kind["delta"] == 2 * wire_bytes("all_gather", 3, B)
    assert algo.feedback is not None and all(f.error is not None for f in algo.feedback.values())
    with pytest.raises(ValueError, match="comm.dtype = 'topk': must be float32, .* with DDP"):
        DDP(ms, sgd, loss_fn=loss, batch_size=2, wire=wire)
    with pytest.raises(ValueError, match="comm.dtype = 'topk': .* mean probe gradient"):
        AdLoCo(
            ms, sgd, inner_steps=2, trainers=1, loss_fn=loss, wire=wire, batch=AdaptiveBatch(exact_mean=True)
        )


def test_topk_through_adloco_train(tmp_path: Path, text_corpus: Path) -> None:
    """`adloco train --set comm.dtype=topk`: the run's Δ is counted at the codec's exact bytes (an
    all-gather among the 3 workers, 2 rounds), and its config keeps error_feedback null (on, for topk)."""
    import json

    import yaml

    from adloco.cli import main

    sets = [
        "model.name=llama-micro",
        "data.tokenizer=bpe:300",
        "data.seq_len=16",
        f"data.source={text_corpus}",
        "algorithm.method=diloco",
        "algorithm.workers=3",
        "algorithm.rounds=2",
        "algorithm.inner_steps=2",
        "batch.initial=2",
        "eval.max_examples=4",
        "outer.momentum=0",
        "comm.dtype=topk",
        "comm.topk_block=256",
        "logging.progress=off",
        "logging.plots=false",
        "logging.save_model=false",
        f"logging.out_dir={tmp_path}",
    ]
    assert main(["train", *[a for s in sets for a in ("--set", s)]]) == 0
    (run,) = list(tmp_path.iterdir())
    start = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    summary = json.loads((run / "summary.json").read_text())
    B = codecs.TopK(1 / 64, 256, 2).nbytes(start["parameters"])
    assert summary["bytes_by_kind"]["delta"] == 2 * wire_bytes("all_gather", 3, B)
    comm = yaml.safe_load((run / "config.yaml").read_text())["comm"]
    assert comm["dtype"] == "topk" and comm["error_feedback"] is None and comm["topk_bits"] == 2


def test_topk_brings_its_own_outer_step_and_warns_of_a_momentum_asked_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DiLoCo's preset with topk takes SparseLoCo's outer step (SGD, lr 1, no momentum), said in one line;
    a Nesterov momentum asked for is kept, with a warning; int4 keeps the preset (SGD at lr 0.5)."""
    from torch import nn

    from adloco import DiLoCo, Outer, Wire

    ms = [nn.Linear(4, 1) for _ in range(2)]
    sgd = [torch.optim.SGD(m.parameters(), lr=0.05) for m in ms]
    with caplog.at_level("INFO", logger="adloco"):
        algo = DiLoCo(ms, sgd, inner_steps=2, batch_size=2, wire=Wire("topk"))
    assert algo.outer_spec == Outer("sgd", 1.0, Outer().momentum)
    assert (
        "outer step: sgd at lr 1, no momentum, in place of diloco's sgd at lr 0.5: comm.dtype topk"
        in caplog.text
    )
    assert "WARNING" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="adloco"):
        algo = DiLoCo(ms, sgd, inner_steps=2, batch_size=2, wire=Wire("topk"), outer=Outer.nesterov(0.7, 0.9))
    assert algo.outer_spec.optimizer == "nesterov"
    assert "comm.dtype = 'topk' with outer.momentum = 0.9" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="adloco"):
        DiLoCo(ms, sgd, inner_steps=2, batch_size=2, wire=Wire("topk"), outer=Outer.nesterov(0.5, 0.0))
        algo = DiLoCo(ms, sgd, inner_steps=2, batch_size=2, wire=Wire("int4"))
    assert "topk" not in caplog.text and algo.outer_spec == Outer("sgd", 0.5, Outer().momentum)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_topk_on_cuda_sends_the_cpu_bytes() -> None:
    """The selection's keys leave no tie, so CUDA's topk keeps what the CPU's keeps: the same bytes."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1_200_007, generator=g)
    x[1000:1100] = 0.5  # ties
    x[5000:9096] = 0.0  # a zero block
    for c in (codecs.TopK(1 / 64, 4096, 2), codecs.TopK(0.1, 256, 4)):
        cpu, gpu = c.encode(x), c.encode(x.cuda())
        assert torch.equal(cpu, gpu.cpu())
        assert torch.equal(c.decode(cpu, x.numel()), c.decode(gpu, x.numel()).cpu())


@pytest.mark.parametrize("overlap", ["none", "delayed"])
def test_topk_resumes_its_error_feedback_bit_for_bit(overlap: str) -> None:
    """A state dict holds each worker's topk error (most of its Δ, unsent): the resumed run sends what
    the uninterrupted one sends, round after round, with Δ in flight or not."""
    import copy

    from adloco import DiLoCo, Outer, Sync, Wire
    from tests.toy import Data, build, run_round

    def make() -> DiLoCo:
        return build(
            DiLoCo,
            lr=0.02,
            inner_steps=3,
            batch_size=2,
            outer=Outer.sgd(0.7),
            wire=Wire("topk", topk_block=8, topk_fraction=0.25),
            sync=Sync(overlap=overlap),
            sync_initial=False,
        )

    data = Data()
    a = make()
    for _ in range(2):
        run_round(a, data)
    state = copy.deepcopy(a.full_state_dict())
    assert state is not None
    errors = [r["inner"]["feedback_error"] for r in state["replicas"].values()]
    assert len(errors) == 2 and all(e.abs().sum() > 0 for e in errors)
    b = make()
    b.load_state_dict(state)
    for _ in range(3):
        run_round(a, data)
        run_round(b, data)
        assert torch.equal(a.theta(0), b.theta(0))
    a.settle()  # delayed: the last Δ (and its error) is in flight until now
    b.settle()
    assert torch.equal(a.theta(0), b.theta(0)) and a.totals == b.totals
    assert a.feedback is not None and b.feedback is not None
    for w in (0, 1):
        assert torch.equal(a.feedback[w].error, b.feedback[w].error)


# --------------------------------------------------------------------------------------------------
# The codec's rules drive the configuration (ALGORITHM.md §9.4)
# --------------------------------------------------------------------------------------------------


class RuledHalf(GatheredHalf):
    """A codec with every rule unlike bfloat16's, registered in its place: the checks must follow it."""

    feedback = True
    error_decay = 0.5
    carries_theta = False
    theta = "int8"
    keys = ("topk_mean",)
    outer = {"optimizer": "sgd", "lr": 0.3}
    outer_why = "a test's own step"


def test_the_codecs_rules_not_its_name_drive_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    from adloco.library.presets import outer_note, preset, preset_values
    from adloco.library.settings import AdaptiveBatch, Wire
    from adloco.library.settings import Outer as OuterDial

    monkeypatch.setitem(codecs.CODECS, "bfloat16", RuledHalf)
    w = Wire("bfloat16")
    assert w.feedback and w.decay == 0.5 and w.theta_wire == "int8"
    assert Wire("bfloat16", error_decay=0.9).decay == 0.9
    assert Wire("bfloat16", topk_mean="all").topk_mean == "all"  # its own key now
    with pytest.raises(
        ValueError, match="comm.topk_mean = 'all': must be 'senders' .* unless comm.dtype is bfloat16"
    ):
        Wire("int4", topk_mean="all")  # named as the first codec that owns it
    with pytest.raises(
        ValueError, match="comm.theta_dtype = 'bfloat16': must be float32, float16, int8, int4 or null"
    ):
        Wire("int4", theta_dtype="bfloat16")
    with pytest.raises(
        ValueError, match="comm.dtype = 'bfloat16': must be float32, float16, int8 or int4 with DDP"
    ):
        w.check_codec(AdaptiveBatch(), ddp=True)
    assert preset_values("diloco", "outer", dtype="bfloat16") == {"optimizer": "sgd", "lr": 0.3}
    step = preset("diloco", OuterDial, dtype="bfloat16")
    assert "brings a test's own step" in (outer_note("diloco", step, w) or "")
    # the registered codecs as they are
    monkeypatch.undo()
    assert [Wire(d).theta_wire for d in ("float32", "bfloat16", "float16", "int8", "int4", "topk")] == [
        "float32",
        "bfloat16",
        "float16",
        "int8",
        "int4",
        "int4",
    ]
    assert Wire("int4", theta_dtype="float32").theta.dtype == "float32"  # an explicit θ wire is honoured
    assert [Wire(d).feedback for d in ("float32", "int4", "topk")] == [False, False, True]
    assert [Wire(d).decay for d in ("int4", "topk")] == [1.0, 0.95]
    assert preset_values("diloco", "outer", dtype="topk") == {"optimizer": "sgd", "lr": 1.0}
    assert preset_values("diloco", "outer", dtype="int4") == {"optimizer": "sgd", "lr": 0.5}  # the preset
    assert preset_values("adloco", "outer", dtype="topk") == {}  # averaging is the codec's step already


def test_int4_on_the_default_adloco_run_compresses_merges_and_moves() -> None:
    """With comm.theta_dtype null θ follows Δ: AdLoCo's default shape (4 workers, 4 trainers merging)
    with comm.dtype int4 sends at most 0.2× the bytes of the float32 run, most of them θ."""

    def sent(dtype: str) -> dict[str, int]:
        cfg = tiny_config(
            **{
                "algorithm": {"workers": 4, "trainers": 4, "rounds": 4},
                "merge": {"every": 1},
                "comm": {"dtype": dtype},
            }
        )
        ref, _ = reference_and_threaded(cfg, {w: 0 for w in range(4)}, 1)
        return dict(ref.totals.by_kind)

    f32, int4 = sent("float32"), sent("int4")
    assert f32.get("merge", 0) + f32.get("move", 0) > 0
    assert sum(int4.values()) <= 0.2 * sum(f32.values())
    assert int4["merge"] <= 0.2 * f32["merge"]
