"""Codecs as objects (ALGORITHM.md §9.4): the registered ones keep their bytes, and a codec registered from
outside the round (here: one whose encodings are gathered rather than summed, as a sparse one's would be)
travels Δ, merges and moves through the one reducer, with error feedback, the same bits in threads as in
one process, counted as the collective it is."""

from __future__ import annotations

import pytest
import torch

from adloco.comm import codecs
from adloco.comm.base import wire_bytes
from adloco.comm.codecs import Codec
from adloco.comm.compressed import collective, compressed_all_reduce, payload_bytes
from adloco.comm.quantize import ErrorFeedback
from tests.helpers import tiny_config
from tests.unit.test_several_processes import reference_and_threaded


class GatheredHalf(Codec):
    """bfloat16 values whose encodings are all-gathered whole (``sums`` False), like a sparse codec's."""

    sums = False

    def __init__(self, block: int) -> None:
        self.name = "bfloat16"

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).view(torch.uint8)

    def decode(self, buf: torch.Tensor, numel: int, out: torch.Tensor | None = None) -> torch.Tensor:
        values = buf.clone().view(torch.bfloat16)
        return values.to(torch.float32) if out is None else out.copy_(values)

    def nbytes(self, numel: int) -> int:
        return 2 * numel


@pytest.mark.parametrize("name", ["bfloat16", "float16", "int8", "int4"])
def test_every_registered_codec_encodes_to_the_bytes_it_counts(name: str) -> None:
    c = codecs.codec(name, 64)
    assert c is not None and c.name == name and c.sums
    for n in (0, 1, 63, 64, 65, 1001):
        x = torch.randn(n)
        buf = c.encode(x)
        assert buf.dtype == torch.uint8 and buf.numel() == c.nbytes(n)
        assert torch.equal(c.decode(buf, n), c.roundtrip(x))
    assert codecs.codec("float32") is None
    with pytest.raises(ValueError, match="wire dtype must be one of"):
        codecs.codec("int2")


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
    for c in threads:
        assert c.feedback is not None
        for w, fb in c.feedback.items():  # kept where each thread's own workers encoded
            mine, theirs = fb.error, ref.feedback[w].error
            assert (mine is None and theirs is None) or (mine is not None and torch.equal(mine, theirs))
        assert c.totals.by_kind == ref.totals.by_kind and c.allocation == ref.allocation
        for t, tr in c.trainers.items():
            if tr.hosted:
                assert torch.equal(tr.theta, ref.theta(t))
        for w, rep in c.replicas.items():
            assert torch.equal(rep.flat.param, ref.replicas[w].flat.param)
