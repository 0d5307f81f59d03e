"""Codecs: what a float32 vector travels as on a compressed wire (ALGORITHM.md §9.4).

A codec turns a chunk of float32 values into bytes and back, and says how many bytes that is, exactly.
Whichever backend moves the bytes, the reducer (:meth:`adloco.comm.Comm.reduce`, through
:func:`adloco.comm.compressed.compressed_all_reduce`) runs one arithmetic against this protocol, and so do
merges and moves of θ (:meth:`adloco.comm.Comm.send`). How the pieces are combined is the codec's one
structural choice, :attr:`Codec.sums`:

- ``sums = True``: a sum of decoded pieces can be encoded again. Every participant cuts its vector in n
  chunks, chunk r goes to participant r, which decodes the n pieces, sums them in float32 in participant
  order and encodes the sum; the encoded sums are all-gathered (a reduce-scatter, then an all-gather:
  counted as a ring all-reduce of the encoded vector). The casts and the block-wise quantizations.
- ``sums = False``: a sum of encodings is not an encoding (the sparse :class:`TopK`: the sum of n top-k sets
  is not a top-k set). Every participant's whole encoding is all-gathered, and every participant decodes the n of
  them and sums them in participant order (counted as an all-gather of the encoded vector).

Error feedback (``comm.error_feedback``) is the codec's too, whichever it is: a participant keeps what its
own encoding dropped (:class:`adloco.comm.quantize.ErrorFeedback`, v − decode(encode(v))).

A codec is registered under its wire name (:data:`CODECS`); ``comm.dtype`` and ``comm.theta_dtype`` name
it (the names are the ``WireDtype`` choices of :mod:`adloco.settings`). Adding one is a class here and its
name there: nothing in the round changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch

from adloco.comm.quantize import DEFAULT_BLOCK, Quantized, dequantize, encoded_bytes, quantize
from adloco.settings import WIRE_DTYPES, Wire, WireDtype


class Codec:
    """How a float32 vector travels: :meth:`encode`, :meth:`decode`, :meth:`nbytes` and :attr:`sums`.

    Contract: ``encode(x)`` of a flat float32 tensor is a flat uint8 tensor of exactly ``nbytes(x.numel())``
    bytes, a pure function of x's values (the same bits on every device and process); ``decode(buf, n)``
    returns n float32 values (into ``out`` when given); decoding what was encoded is deterministic, so
    every process that decodes the same bytes holds the same bits."""

    name: str = ""  # the wire name it is registered under
    sums: bool = True  # see the module docstring

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, buf: torch.Tensor, numel: int, out: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def nbytes(self, numel: int) -> int:
        raise NotImplementedError

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        """decode(encode(x)): what a receiver sees (flat float32)."""
        return self.decode(self.encode(x.reshape(-1)), x.numel())


class Cast(Codec):
    """bfloat16 / float16: a cast, rounding to nearest even; decoding casts back to float32, exactly."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.dtype = name, dtype

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype).view(torch.uint8)

    def decode(self, buf: torch.Tensor, numel: int, out: torch.Tensor | None = None) -> torch.Tensor:
        if buf.storage_offset() % 2:  # a slice of a received buffer: viewing as 2-byte values needs alignment
            buf = buf.clone()
        if out is None:
            return buf.view(self.dtype).to(torch.float32)
        return out.copy_(buf.view(self.dtype))

    def nbytes(self, numel: int) -> int:
        return 2 * numel


class Absmax(Codec):
    """int8 / int4: block-wise absmax quantization in blocks of ``block`` values, a float32 scale per block
    (:mod:`adloco.comm.quantize`, which fixes the arithmetic bit for bit)."""

    def __init__(self, name: str, bits: int, block: int = DEFAULT_BLOCK) -> None:
        self.name, self.bits, self.block = name, bits, block

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return quantize(x, self.bits, self.block).to_bytes()

    def decode(self, buf: torch.Tensor, numel: int, out: torch.Tensor | None = None) -> torch.Tensor:
        return dequantize(Quantized.from_bytes(buf, numel, self.bits, self.block), out)

    def nbytes(self, numel: int) -> int:
        return encoded_bytes(numel, self.bits, self.block)


class TopK(Codec):
    """topk: the largest ``fraction`` of each block of ``block`` values, each kept value in ``bits`` bits
    with one float32 scale per block (ALGORITHM.md §9.4, SparseLoCo's scheme in its own arithmetic).

    Encoding, block by block (the last block shorter when S = ``block`` does not divide P; blocks run over
    the flat vector, across tensors, as the block-wise quantizations' do):

    - keep k_j = max(1, ⌈f·L_j⌉) of the block's L_j values, the largest magnitudes; equal magnitudes are
      ordered by position (the lower index first), so the choice is a pure function of the values on any
      device (:func:`_select`);
    - a kept value that is 0 (a block with fewer than k_j values that are not) is replaced by a copy of the
      block's largest one, same index and code: a zero never travels as a value, and decoding writes
      (duplicates write the same value) rather than adds;
    - scale s_j = max |kept| = max_{i∈j} |x_i| (float32);
    - code: a sign bit and b − 1 bits of magnitude q − 1, with M = 2^(b−1) levels,
      q = clamp(round((|v| / s_j)·M), 1, M) (round half to even; a zero block divides by 1), decoded as
      ±(q / M)·s_j: the block's largest magnitude comes back exact, and every kept value within s_j/(2M)
      of itself (a value under s_j/(2M) comes back as s_j/M); b = 1 sends the sign alone (±s_j);
    - a NaN or an infinity is kept first (it is the largest) and makes its block's sent values decode
      non-finite (the fault stays visible).

    Bytes: 4·J scales, then the K = Σ_j k_j entries of W = w + b bits each, packed little-endian into
    ⌈K·W / 8⌉ bytes, w = ⌈log₂ S⌉ the bits an index into a block needs; entry = index | code << w, in block
    order and, within a block, by ascending index. Exactly :meth:`nbytes`, whatever the values.

    It does not sum (``sums`` False): the sum of n top-k sets is not a top-k set, so every participant's
    encoding is all-gathered and decoded by everyone (:mod:`adloco.comm.compressed`)."""

    sums = False

    def __init__(self, fraction: float, block: int, bits: int) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"topk fraction must be in (0, 1], not {fraction}")
        if not 2 <= block <= 1 << 24:
            raise ValueError(f"topk block must be between 2 and 16777216 values, not {block}")
        if not 1 <= bits <= 8:
            raise ValueError(f"topk bits must be between 1 and 8, not {bits}")
        self.name, self.fraction, self.block, self.bits = "topk", fraction, block, bits
        self.index_bits = (block - 1).bit_length()  # w: an index into a block, 0 .. S − 1
        self.width = self.index_bits + bits  # W: one entry

    def kept(self, length: int) -> int:
        """k of a block of ``length`` values: max(1, ⌈f·L⌉) (the product taken to 6 decimals first, so a
        fraction written in decimal such as 0.03 of 100 keeps 3, not 4)."""
        return max(1, min(length, math.ceil(round(self.fraction * length, 6))))

    def _segments(self, numel: int) -> list[tuple[int, int, int, int]]:
        """(start, rows, width, k): the whole blocks, then the shorter last one."""
        full, rem = divmod(numel, self.block)
        out = [(0, full, self.block, self.kept(self.block))] if full else []
        if rem:
            out.append((full * self.block, 1, rem, self.kept(rem)))
        return out

    def nbytes(self, numel: int) -> int:
        segs = self._segments(numel)
        entries = sum(rows * k for _, rows, _, k in segs)
        return 4 * sum(rows for _, rows, _, _ in segs) + -(-entries * self.width // 8)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"topk expects float32, got {x.dtype}")
        x = x.reshape(-1)
        levels = 1 << (self.bits - 1)
        scales, entries = [], []
        for start, rows, width, k in self._segments(x.numel()):
            for r0 in range(0, rows, _slab_rows(width, x.device)):
                r1 = min(rows, r0 + _slab_rows(width, x.device))
                xs = x[start + r0 * width : start + r1 * width].view(r1 - r0, width)
                idx = _select(xs, k)  # (rows, k), ascending within each row
                v = torch.gather(xs, 1, idx)
                mag = v.abs()
                s = mag.amax(dim=1)  # NaN propagates: the block's values decode non-finite
                divisor = torch.where(s == 0, 1.0, s)
                q = torch.div(mag, divisor[:, None]).mul_(levels).round_().clamp_(1, levels)
                q = torch.nan_to_num(q, nan=float(levels))  # codes of a non-finite block: any, never NaN
                code = (q.to(torch.int64) - 1) | (torch.signbit(v).to(torch.int64) << (self.bits - 1))
                scales.append(s)
                entries.append((idx | (code << self.index_bits)).reshape(-1))
        if not scales:
            return torch.empty(0, dtype=torch.uint8, device=x.device)
        head = torch.cat(scales).view(torch.uint8)
        return torch.cat([head, _pack(torch.cat(entries), self.width)])

    def decode(self, buf: torch.Tensor, numel: int, out: torch.Tensor | None = None) -> torch.Tensor:
        if buf.dtype != torch.uint8 or buf.numel() != self.nbytes(numel):
            raise ValueError(f"expected {self.nbytes(numel)} uint8 bytes, got {buf.numel()} {buf.dtype}")
        if out is None:
            out = torch.empty(numel, dtype=torch.float32, device=buf.device)
        elif out.shape != (numel,) or out.dtype != torch.float32:
            raise ValueError(f"topk decode: out must be a float32 vector of {numel} values")
        out.zero_()
        segs = self._segments(numel)
        n_scales = sum(rows for _, rows, _, _ in segs)
        head = buf[: 4 * n_scales]
        if head.storage_offset() % 4:  # a slice of a received buffer: viewing as float32 needs alignment
            head = head.clone()
        scales = head.view(torch.float32)
        entries = _unpack(buf[4 * n_scales :], sum(rows * k for _, rows, _, k in segs), self.width)
        idx = entries & ((1 << self.index_bits) - 1)
        code = entries >> self.index_bits
        levels = 1 << (self.bits - 1)
        # (q / M)·s with q and M as tensors (as :func:`adloco.comm.quantize.dequantize` divides): M is a
        # power of two, so q / M is exact and the product rounds once
        m = torch.full((1,), float(levels), device=out.device)
        q = ((code & (levels - 1)) + 1).to(torch.float32).div_(m)
        negative = (code >> (self.bits - 1)).bool()
        j = e = 0
        for start, rows, width, k in segs:
            s = scales[j : j + rows]
            vals = q[e : e + rows * k].view(rows, k).mul_(s[:, None])
            vals = torch.where(negative[e : e + rows * k].view(rows, k), -vals, vals)
            seg = out[start : start + rows * width].view(rows, width)
            seg.scatter_(1, idx[e : e + rows * k].view(rows, k), vals)
            j, e = j + rows, e + rows * k
        return out


def _slab_rows(width: int, device: torch.device) -> int:
    """Rows of a block-wise pass at once: about 2^18 values on CPU (as :mod:`adloco.comm.quantize`), all on
    CUDA. The work is per row, so the slab does not change a bit."""
    return max(1, (1 << 18) // width) if device.type == "cpu" else 1 << 62


def _select(xs: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of each row's k largest magnitudes, ascending; ties by position (the lower index
    first), then kept zeros replaced by the row's largest (see :class:`TopK`).

    Each value's key is its magnitude's bits (a non-negative float32 orders as its bit pattern does, a
    NaN above infinity) above its reversed position, one int64 per value, so no two keys tie and
    ``torch.topk`` has one answer on every device."""
    rows, width = xs.shape
    mag = xs.abs().view(torch.int32).to(torch.int64) & 0x7FFFFFFF  # the sign bit of a NaN too
    pos = torch.arange(width - 1, -1, -1, device=xs.device)
    top = torch.topk(mag.mul_(1 << 32).add_(pos), k, dim=1, sorted=True).values  # largest first
    idx = (width - 1) - (top & 0xFFFFFFFF)
    zero = (top >> 32) == 0
    idx = torch.where(zero, idx[:, :1], idx)  # the first is the row's largest
    return torch.sort(idx, dim=1).values


def _pack(entries: torch.Tensor, width: int) -> torch.Tensor:
    """Non-negative int64 entries of ``width`` bits → bytes, little-endian: bit t of entry i is bit
    (i·W + t) mod 8 of byte ⌊(i·W + t) / 8⌋; the last byte's high bits 0. Eight entries fill W whole
    bytes, so the entries are packed 8·m at a time."""
    n = entries.numel()
    out = torch.empty(-(-n * width // 8), dtype=torch.uint8, device=entries.device)
    shifts = torch.arange(width, device=entries.device)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=entries.device)
    step = 1 << 15
    for i in range(0, n, step):
        e = entries[i : i + step]
        bits = ((e[:, None] >> shifts) & 1).to(torch.uint8).reshape(-1)
        pad = -bits.numel() % 8
        if pad:
            bits = torch.cat([bits, bits.new_zeros(pad)])
        b0 = i * width // 8
        out[b0 : b0 + bits.numel() // 8] = (bits.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)
    return out


def _unpack(buf: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """The n int64 entries of ``width`` bits :func:`_pack` wrote."""
    out = torch.empty(n, dtype=torch.int64, device=buf.device)
    shifts = torch.arange(8, device=buf.device)
    weights = torch.ones(width, dtype=torch.int64, device=buf.device) << torch.arange(
        width, device=buf.device
    )
    step = 1 << 15
    for i in range(0, n, step):
        m = min(step, n - i)
        b0 = i * width // 8
        raw = buf[b0 : b0 + -(-m * width // 8)]
        bits = ((raw[:, None] >> shifts) & 1).reshape(-1)[: m * width].to(torch.int64)
        out[i : i + m] = (bits.view(m, width) * weights).sum(dim=1)
    return out


# wire name -> the codec, given the wire (its comm.block, and topk's comm.topk_* keys)
CODECS: dict[str, Callable[[Wire], Codec]] = {
    "bfloat16": lambda wire: Cast("bfloat16", torch.bfloat16),
    "float16": lambda wire: Cast("float16", torch.float16),
    "int8": lambda wire: Absmax("int8", 8, wire.block),
    "int4": lambda wire: Absmax("int4", 4, wire.block),
    "topk": lambda wire: TopK(wire.topk_fraction, wire.topk_block, wire.topk_bits),
}


def codec(dtype: str | torch.dtype, block: int = DEFAULT_BLOCK) -> Codec | None:
    """The codec of a wire dtype (its name, or torch's bfloat16 / float16), in blocks of ``block`` values
    where it has blocks (the values per scale of int8 / int4, per top-k block of topk, whose fraction and
    bits are then :class:`~adloco.settings.Wire`'s defaults); None for float32 (the backend's plain
    all-reduce)."""
    if isinstance(dtype, torch.dtype):
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        if dtype not in names:
            raise ValueError(f"unsupported wire dtype {dtype}")
        dtype = names[dtype]
    if dtype == "float32":
        return None
    if dtype not in CODECS:
        raise ValueError(f"wire dtype must be one of {', '.join(WIRE_DTYPES)}, not {dtype!r}")
    name = cast(WireDtype, dtype)
    wire = Wire(name, block=block, topk_block=block) if name == "topk" else Wire(name, block=block)
    return CODECS[dtype](wire)


def of(wire: Wire) -> Codec | None:
    """The codec a :class:`~adloco.settings.Wire` names (None: float32)."""
    return None if wire.dtype == "float32" else CODECS[wire.dtype](wire)


__all__ = ["CODECS", "Absmax", "Cast", "Codec", "TopK", "codec", "of"]
