"""Block-wise absmax quantization, the compressed all-reduce in process, its bytes, and error feedback.

References are written here independently (numpy, loops over blocks and chunks), not with the
functions under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from adloco.library.comm.compressed import (
    WIRE_DTYPES,
    InProcessGroup,
    all_reduce_inprocess,
    chunk_sizes,
    compressed_all_reduce,
    payload_bytes,
    piece_bytes,
    sent_bytes,
    wire_bytes_all_reduce,
)
from adloco.library.comm.quantize import (
    ErrorFeedback,
    Quantized,
    dequantize,
    encoded_bytes,
    quantize,
    quantize_roundtrip,
)

L = {8: 127, 4: 7}
F32 = np.float32


def awkward(P: int, block: int, seed: int) -> torch.Tensor:
    """Random values of mixed magnitudes, negative ones, a zero block, a block whose max is negative."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(P, generator=g) * torch.exp(torch.randn(P, generator=g) * 2)
    if 3 * block <= P:
        x[block : 2 * block] = 0.0  # a whole zero block
        x[2 * block : 3 * block] = -x[2 * block : 3 * block].abs()  # all negative: max |x| from a negative
    return x


def ref_quantize(x: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes and scales block by block in numpy float32 (np.rint: round half to even)."""
    codes, scales = [], []
    for j in range(0, len(x), block):
        b = x[j : j + block].astype(F32)
        s = F32(np.abs(b).max()) if len(b) else F32(0)
        scales.append(s)
        codes.append(np.zeros(len(b), np.int8) if s == 0 else np.rint((b / s) * F32(L[bits])).astype(np.int8))
    return (np.concatenate(codes) if codes else np.zeros(0, np.int8)), np.array(scales, F32)


def ref_dequantize(codes: np.ndarray, scales: np.ndarray, bits: int, block: int) -> np.ndarray:
    out = codes.astype(F32) / F32(L[bits])
    for j, s in enumerate(scales):
        out[j * block : (j + 1) * block] *= s
    return out


# --------------------------------------------------------------------------------------------------
# quantize / dequantize
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(
    ("P", "block"), [(1, 256), (255, 256), (1001, 64), (777, 7), (2 * 256 + 3, 256), (64, 1)]
)
def test_round_trip_error_bound_and_reference(bits: int, P: int, block: int) -> None:
    x = awkward(P, block, seed=P + bits)
    q = quantize(x, bits, block)
    codes, scales = ref_quantize(x.numpy(), bits, block)
    assert q.scales.dtype == torch.float32 and len(scales) == math.ceil(P / block)
    assert np.array_equal(q.scales.numpy(), scales)  # the last block is shorter and has its own scale
    y = dequantize(q)
    assert np.array_equal(y.numpy(), ref_dequantize(codes, scales, bits, block))
    per_elem = np.repeat(scales, block)[:P]
    err = np.abs(x.numpy().astype(np.float64) - y.numpy().astype(np.float64))
    # |x − x̂| ≤ s/(2L), up to float32 rounding of the two products (a few ulps of s)
    assert np.all(err <= per_elem / (2 * L[bits]) + 4 * np.finfo(F32).eps * per_elem)
    # the largest magnitude of each block (positive or negative) comes back exactly
    for j in range(len(scales)):
        b = x[j * block : (j + 1) * block]
        i = int(b.abs().argmax()) + j * block
        assert y[i] == x[i]
    if 3 * block <= P:
        assert q.scales[1] == 0 and torch.all(y[block : 2 * block] == 0)


@pytest.mark.parametrize("bits", [8, 4])
def test_zero_vector_and_empty(bits: int) -> None:
    q = quantize(torch.zeros(300), bits, 64)
    assert torch.all(q.scales == 0) and torch.equal(dequantize(q), torch.zeros(300))
    e = quantize(torch.zeros(0), bits, 64)
    assert dequantize(e).numel() == 0 and e.to_bytes().numel() == 0


def test_rounding_is_half_to_even() -> None:
    """A value whose (x / s)·L is exactly 2.5 in float32 gets code 2, not 3 (torch.round is half-even)."""
    target = F32(2.5)
    x0 = F32(2.5) / F32(127)
    found = None
    for k in range(-50, 51):  # neighbouring float32 values of 2.5/127: one has x·127 == 2.5 exactly
        cand = F32(x0 + F32(k) * np.spacing(x0))
        if cand * F32(127) == target:
            found = cand
            break
    assert found is not None
    x = torch.tensor([1.0, float(found), -float(found)])  # scale 1: the division is exact
    q = quantize(x, 8, 4)
    assert q.codes.tolist() == [127, 2, -2]
    assert torch.round(torch.tensor([0.5, 1.5, 2.5, -2.5])).tolist() == [0.0, 2.0, 2.0, -2.0]


def test_int4_packing_layout_and_round_trip() -> None:
    # codes −7..7 in every position, odd length: one scale of 7 makes x = q exact
    vals = torch.tensor([7.0] + [float(v) for v in range(-7, 8)] + [-3.0, 5.0])  # 18 values
    x = torch.cat([vals, torch.tensor([1.0])])  # 19: odd
    q = quantize(x, 4, 64)
    assert q.codes.dtype == torch.uint8 and q.codes.numel() == 10
    # value 2i in the low nibble, 2i+1 in the high nibble, each as q + 8
    assert int(q.codes[0]) == (7 + 8) | ((-7 + 8) << 4)
    assert int(q.codes[-1]) >> 4 == 0  # the odd length's last high nibble is left 0
    assert torch.equal(dequantize(q), x)
    buf = q.to_bytes()
    assert buf.numel() == encoded_bytes(19, 4, 64) == 10 + 4
    # from a misaligned slice of a bigger buffer, as received
    big = torch.cat([torch.zeros(3, dtype=torch.uint8), buf])
    assert torch.equal(dequantize(Quantized.from_bytes(big[3:], 19, 4, 64)), x)


def test_non_finite_block_stays_non_finite() -> None:
    x = torch.ones(12)
    x[1], x[9] = float("nan"), float("inf")
    for bits in (8, 4):
        y = dequantize(quantize(x, bits, 4))
        assert not torch.isfinite(y[:4]).any() and not torch.isfinite(y[8:]).any()
        assert torch.equal(y[4:8], torch.ones(4))


def test_wire_bytes_formula() -> None:
    for P, S in [(1_400_000, 256), (10_000_000, 256), (1000, 64), (1001, 64), (7, 256)]:
        assert encoded_bytes(P, 8, S) == P + 4 * math.ceil(P / S)
        assert encoded_bytes(P, 4, S) == math.ceil(P * 4 / 8) + 4 * math.ceil(P / S)
        for bits in (8, 4):
            assert quantize(torch.randn(min(P, 5000)), bits, S).to_bytes().numel() == encoded_bytes(
                min(P, 5000), bits, S
            )
    with pytest.raises(ValueError):
        quantize(torch.randn(4), 2, 4)
    with pytest.raises(TypeError):
        quantize(torch.randn(4, dtype=torch.float64), 8, 4)


# --------------------------------------------------------------------------------------------------
# The compressed all-reduce, in process, against a brute-force reference
# --------------------------------------------------------------------------------------------------


def ref_all_reduce(xs: list[torch.Tensor], dtype: str, block: int) -> np.ndarray:
    """n chunks (the first P mod n one longer); quantize/cast every worker's chunk; float32 sums in rank
    order at the owner; quantize/cast the sum; dequantize/cast back; concatenate."""
    n, P = len(xs), xs[0].numel()
    base, rem = divmod(P, n)
    bounds, start = [], 0
    for r in range(n):
        c = base + (1 if r < rem else 0)
        bounds.append((start, start + c))
        start += c

    def through(v: np.ndarray) -> np.ndarray:
        if dtype in ("int8", "int4"):
            bits = 8 if dtype == "int8" else 4
            return ref_dequantize(*ref_quantize(v, bits, block), bits, block)
        low = torch.bfloat16 if dtype == "bfloat16" else torch.float16
        return torch.from_numpy(v.copy()).to(low).to(torch.float32).numpy()

    out = []
    for a, b in bounds:
        acc = through(xs[0].numpy()[a:b])
        for m in range(1, n):
            acc = (acc + through(xs[m].numpy()[a:b])).astype(F32)
        out.append(through(acc))
    return np.concatenate(out)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8", "int4"])
@pytest.mark.parametrize(("P", "block"), [(1001, 64), (3, 256), (4 * 256, 256)])
def test_in_process_all_reduce_matches_reference(n: int, dtype: str, P: int, block: int) -> None:
    xs = [awkward(P, block, seed=10 * m + n) for m in range(n)]
    got = all_reduce_inprocess(xs, dtype, block)
    assert got.dtype == torch.float32 and got.shape == (P,)
    assert np.array_equal(got.numpy(), ref_all_reduce(xs, dtype, block))


def test_float32_all_reduce_is_the_sum_and_n1_moves_nothing() -> None:
    xs = [torch.randn(100) for _ in range(3)]
    assert torch.equal(all_reduce_inprocess(xs, "float32"), (xs[0] + xs[1]) + xs[2])
    assert torch.equal(all_reduce_inprocess(xs[:1], "int4"), xs[0])  # one participant: nothing encoded
    assert torch.equal(all_reduce_inprocess(xs, torch.bfloat16), all_reduce_inprocess(xs, "bfloat16"))
    with pytest.raises(ValueError):
        all_reduce_inprocess(xs, "int2")


class CountingGroup(InProcessGroup):
    """In process, counting the bytes that go from one participant to another (not to itself)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.sent = [0] * n

    def exchange(self, send, sizes):  # type: ignore[no-untyped-def]
        for m in range(self.n):
            for r in range(self.n):
                assert send[m][r].numel() == sizes[r]
                if r != m:
                    self.sent[m] += send[m][r].numel()
        return super().exchange(send, sizes)

    def all_gather(self, mine, sizes):  # type: ignore[no-untyped-def]
        for r in range(self.n):
            assert mine[r].numel() == sizes[r]
            self.sent[r] += (self.n - 1) * mine[r].numel()
        return super().all_gather(mine, sizes)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8", "int4"])
@pytest.mark.parametrize(("P", "n", "block"), [(1001, 4, 64), (4096, 4, 256), (10, 3, 4), (2, 4, 256)])
def test_bytes_are_what_travels(dtype: str, P: int, n: int, block: int) -> None:
    g = CountingGroup(n)
    compressed_all_reduce([torch.randn(P) for _ in range(n)], dtype, block, g)
    assert g.sent == [sent_bytes(P, n, dtype, block, m) for m in range(n)]
    assert (
        sum(g.sent)
        == wire_bytes_all_reduce(P, n, dtype, block)
        == 2 * (n - 1) * payload_bytes(P, n, dtype, block)
    )


def test_bytes_formulas() -> None:
    # chunks made of whole blocks (and whole bytes): exactly ALGORITHM.md §9.4's n · 2(n−1)/n · (P·bits/8 + 4⌈P/S⌉)
    for P, n, S in [(4096, 4, 256), (1_400_000 // 1024 * 1024, 4, 256), (2 * 64 * 10, 2, 64)]:
        for dtype, bits in (("int8", 8), ("int4", 4)):
            assert wire_bytes_all_reduce(P, n, dtype, S) == 2 * (n - 1) * (
                P * bits // 8 + 4 * math.ceil(P / S)
            )
        for dtype, size in (("bfloat16", 2), ("float16", 2), ("float32", 4)):
            assert wire_bytes_all_reduce(P, n, dtype, S) == 2 * (n - 1) * P * size
    # otherwise a little more: blocks restart at each chunk (≤ n − 1 extra scales, ≤ n half bytes)
    for P, n, S in [(1001, 4, 64), (1_400_001, 4, 256), (10_000_000, 3, 256)]:
        for dtype, bits in (("int8", 8), ("int4", 4)):
            spec = 2 * (n - 1) * (P * bits / 8 + 4 * math.ceil(P / S))
            got = wire_bytes_all_reduce(P, n, dtype, S)
            assert spec <= got <= spec + 2 * (n - 1) * (4 * (n - 1) + n / 2)
    assert chunk_sizes(10, 4) == [3, 3, 2, 2] and chunk_sizes(2, 4) == [1, 1, 0, 0]
    assert [len(t) for t in torch.arange(10).tensor_split(4)] == chunk_sizes(10, 4)
    assert piece_bytes(0, "int4", 256) == 0 and wire_bytes_all_reduce(100, 1, "int8") == 0
    assert set(WIRE_DTYPES) == {"float32", "bfloat16", "float16", "int8", "int4", "topk"}


# --------------------------------------------------------------------------------------------------
# Error feedback
# --------------------------------------------------------------------------------------------------


def biased_update(P: int = 512, block: int = 64) -> torch.Tensor:
    """Each block: one value 1 (its scale) and the others 0.314 or −0.173 of int8's step 1/127 (less still
    of int4's 1/7): rounding sends them as 0 every round, always missing the same amount."""
    d = torch.full((P,), 0.3141593 / 127)
    d[::block] = 1.0
    d[1::block] = -0.1732051 / 127
    return d


@pytest.mark.parametrize("bits", [8, 4])
def test_error_feedback_converges_like_one_over_rounds(bits: int) -> None:
    block, checks = 64, (10, 100, 1000, 10000)
    delta = biased_update(block=block)
    ef = ErrorFeedback()
    sent_sum = torch.zeros_like(delta, dtype=torch.float64)
    plain = quantize_roundtrip(delta, bits, block).double()  # without feedback: the same every round
    rel, rel_plain = {}, {}
    for k in range(1, checks[-1] + 1):
        sent_sum += ef.step(delta, lambda v: quantize_roundtrip(v, bits, block)).double()
        if k in checks:
            true = k * delta.double()
            rel[k] = float((sent_sum - true).norm() / true.norm())
            rel_plain[k] = float((k * plain - true).norm() / true.norm())
    # with feedback Σ sent = k·Δ − e_k and |e_k| ≤ s/(2L) per value (s = 1 here): relative error ≤ C / k
    C = math.sqrt(delta.numel()) / (2 * L[bits]) / float(delta.double().norm())
    for k in checks:
        assert rel[k] <= C / k * (1 + 1e-3)
    assert rel[10000] < rel[1000] < rel[100]
    # without: the small values are never sent, and the relative error stays where it was
    assert rel_plain[10000] == pytest.approx(rel_plain[10], rel=1e-6)
    assert rel_plain[10000] > 1000 * rel[10000]


def test_error_feedback_state_reset_and_resume() -> None:
    delta = biased_update()
    a, b = ErrorFeedback(), ErrorFeedback()
    q = lambda v: quantize_roundtrip(v, 4, 64)  # noqa: E731
    for _ in range(3):
        a.step(delta, q)
    b.load_state_dict(st_load(st_save(a.state_dict())))  # through a checkpoint's safetensors
    for _ in range(3):
        assert torch.equal(a.step(delta, q), b.step(delta, q))
    assert a.state_dict()["error"] is not a.error  # a copy, not the live tensor
    a.reset()
    assert a.error is None and a.state_dict() == {}
    assert torch.equal(a.step(delta, q), quantize_roundtrip(delta, 4, 64))
    with pytest.raises(ValueError):
        a.step(torch.zeros(3), q)  # a different shape than the error kept
    with pytest.raises(ValueError):
        b.load_state_dict({"error": [1.0]})


@pytest.mark.parametrize("dtype", ["int8", "int4", "bfloat16"])
def test_error_feedback_inside_the_all_reduce(dtype: str) -> None:
    """Each worker's e_m is its own Δ + e − (what it put on the wire, decoded), chunk by chunk."""
    n, P, block = 3, 301, 32
    deltas = [awkward(P, block, seed=m) for m in range(n)]
    fb = [ErrorFeedback() for _ in range(n)]
    all_reduce_inprocess(deltas, dtype, block, feedback=fb)

    def through(c: torch.Tensor) -> torch.Tensor:  # what the chunk's owner decodes
        if dtype == "bfloat16":
            return c.to(torch.bfloat16).to(torch.float32)
        return quantize_roundtrip(c, 8 if dtype == "int8" else 4, block)  # blocks restart at the chunk

    for m in range(n):
        sent = torch.cat([through(c) for c in deltas[m].tensor_split(n)])
        assert torch.equal(fb[m].error, deltas[m] - sent)
    # the next round sends Δ + e
    before = [f.error.clone() for f in fb if f.error is not None]
    out = all_reduce_inprocess(deltas, dtype, block, feedback=fb)
    ref = all_reduce_inprocess([d + e for d, e in zip(deltas, before, strict=True)], dtype, block)
    assert torch.equal(out, ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8", "int4"])
def test_cuda_gives_the_cpu_bits(dtype: str) -> None:
    xs = [awkward(1_200_007, 256, seed=m) for m in range(4)]  # CPU: several slabs and a tail
    if dtype in ("int8", "int4"):
        bits = 8 if dtype == "int8" else 4
        qc, qg = quantize(xs[0], bits, 256), quantize(xs[0].cuda(), bits, 256)
        assert torch.equal(qc.scales, qg.scales.cpu()) and torch.equal(qc.codes, qg.codes.cpu())
        assert torch.equal(dequantize(qc), dequantize(qg).cpu())
    cpu = all_reduce_inprocess(xs, dtype, 256)
    gpu = all_reduce_inprocess([x.cuda() for x in xs], dtype, 256)
    assert torch.equal(cpu, gpu.cpu())
