"""Codecs: what a float32 vector travels as on a compressed wire (ALGORITHM.md §9.4).

A codec turns a chunk of float32 values into bytes and back, and says how many bytes that is, exactly.
Whichever backend moves the bytes, the reducer (:meth:`adloco.library.comm.Comm.reduce`, through
:func:`adloco.library.comm.compressed.compressed_all_reduce`) runs one arithmetic against this protocol, and so do
merges and moves of θ (:meth:`adloco.library.comm.Comm.send`). How the pieces are combined is the codec's one
structural choice, :attr:`Codec.sums`:

- ``sums = True``: a sum of decoded pieces can be encoded again. Every participant cuts its vector in n
  chunks, chunk r goes to participant r, which decodes the n pieces, sums them in float32 in participant
  order and encodes the sum; the encoded sums are all-gathered (a reduce-scatter, then an all-gather:
  counted as a ring all-reduce of the encoded vector). The casts and the block-wise quantizations.
- ``sums = False``: a sum of encodings is not an encoding (the sparse :class:`TopK`: the sum of n top-k sets
  is not a top-k set). Every participant's whole encoding is all-gathered, and every participant decodes the n of
  them and combines them in participant order (counted as an all-gather of the encoded vector): summed, or,
  where :attr:`Codec.averages_senders`, each value averaged over the participants that sent it.

A codec also owns the rules the configuration reads (:class:`adloco.library.settings.Wire` asks the class, never its
name): whether its values are summed (:attr:`Codec.sums`), whether error feedback is on by default
(:attr:`Codec.feedback`) and how it decays (:attr:`Codec.error_decay`), whether θ may travel as it and what θ
travels as by default (:attr:`Codec.carries_theta`, :attr:`Codec.theta`), its own ``comm.*`` keys
(:attr:`Codec.keys`), and the outer step it brings in place of a preset's momentum (:attr:`Codec.outer`).

A codec is registered under its wire name (:data:`CODECS`); ``comm.dtype`` and ``comm.theta_dtype`` name
it (the names are the ``WireDtype`` choices of :mod:`adloco.library.settings`, which a test holds to this registry).
Adding one is a class here, its registration, and its name among those choices: nothing in the round and
nothing in the configuration's checks changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor

from adloco.library.comm.quantize import DEFAULT_BLOCK, Quantized, dequantize, encoded_bytes, quantize


class Codec:
    """How a float32 vector travels: :meth:`encode`, :meth:`decode`, :meth:`nbytes` and :attr:`sums`.

    Contract: ``encode(x)`` of a flat float32 tensor is a flat uint8 tensor of exactly ``nbytes(x.numel())``
    bytes, a pure function of x's values; ``decode(buf, n)`` returns n float32 values (into ``out`` when
    given); decoding what was encoded is deterministic, so every process that decodes the same bytes holds
    the same bits.

    The class attributes are the codec's rules, read by the configuration's checks
    (:class:`adloco.library.settings.Wire`) and by the reducer."""

    name: str = ""  # the wire name it is registered under
    sums: ClassVar[bool] = True  # see the module docstring
    # each value averaged over the participants that sent it, not summed over all (a gathered codec)
    averages_senders: bool = False
    feedback: ClassVar[bool] = False  # error feedback on unless comm.error_feedback says otherwise
    error_decay: ClassVar[float] = 1.0  # β of e ← β·e + Δ where comm.error_decay is null
    carries_theta: ClassVar[bool] = True  # θ (merges, moves) may travel as this codec
    theta: ClassVar[str | None] = None  # θ's wire where comm.theta_dtype is null (None: this codec's own)
    keys: ClassVar[tuple[str, ...]] = ()  # the comm.* keys that are this codec's alone
    # the outer step this codec brings in place of a preset's momentum step ({} : none), and why
    outer: ClassVar[Mapping[str, Any]] = {}
    outer_why: ClassVar[str] = ""

    @classmethod
    def build(cls, wire: Any) -> Codec:
        """The codec as ``wire`` configures it (its block, its own keys): a
        :class:`adloco.library.settings.Wire`, typed ``Any`` so that this module does not import back the
        dial that asks it for its rules."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decode(
        self, buf: Tensor, numel: int, out: Tensor | None = None, support: Tensor | None = None
    ) -> Tensor:
        """``buf`` decoded to ``numel`` float32 values (into ``out`` when given). ``support``: a bool vector of
        ``numel`` a codec that :attr:`averages_senders` sets True where a value was sent (and False
        elsewhere)."""
        raise NotImplementedError

    def nbytes(self, numel: int) -> int:
        raise NotImplementedError

    def roundtrip(self, x: torch.Tensor) -> torch.Tensor:
        """decode(encode(x)): what a receiver sees (flat float32)."""
        return self.decode(self.encode(x.reshape(-1)), x.numel())


class Cast(Codec):
    """bfloat16 / float16: a cast, rounding to nearest even; decoding casts back to float32, exactly."""

    DTYPES: ClassVar[Mapping[str, torch.dtype]] = {"bfloat16": torch.bfloat16, "float16": torch.float16}

    def __init__(self, name: str, dtype: torch.dtype | None = None) -> None:
        self.name, self.dtype = name, dtype if dtype is not None else self.DTYPES[name]

    @classmethod
    def build(cls, wire: Any) -> Codec:
        return cls(wire.dtype)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype).view(torch.uint8)

    def decode(
        self, buf: Tensor, numel: int, out: Tensor | None = None, support: Tensor | None = None
    ) -> Tensor:
        if buf.storage_offset() % 2:  # a slice of a received buffer: viewing as 2-byte values needs alignment
            buf = buf.clone()
        if out is None:
            return buf.view(self.dtype).to(torch.float32)
        return out.copy_(buf.view(self.dtype))

    def nbytes(self, numel: int) -> int:
        return 2 * numel


class Absmax(Codec):
    """int8 / int4: block-wise absmax quantization in blocks of ``block`` values, a float32 scale per block
    (:mod:`adloco.library.comm.quantize`, which fixes the arithmetic bit for bit)."""

    BITS: ClassVar[Mapping[str, int]] = {"int8": 8, "int4": 4}

    def __init__(self, name: str, bits: int | None = None, block: int = DEFAULT_BLOCK) -> None:
        self.name, self.bits, self.block = name, bits if bits is not None else self.BITS[name], block

    @classmethod
    def build(cls, wire: Any) -> Codec:
        return cls(wire.dtype, block=wire.block)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return quantize(x, self.bits, self.block).to_bytes()

    def decode(
        self, buf: Tensor, numel: int, out: Tensor | None = None, support: Tensor | None = None
    ) -> Tensor:
        return dequantize(Quantized.from_bytes(buf, numel, self.bits, self.block), out)

    def nbytes(self, numel: int) -> int:
        return encoded_bytes(numel, self.bits, self.block)


class TopK(Codec):
    """topk: SparseLoCo's sparse codec (arXiv 2508.15706; ALGORITHM.md §9.4): the largest ``fraction`` of
    each block of ``block`` values, each kept value one of 2^``bits`` bins whose decoded value is the mean
    of the block's kept values in it.

    Encoding, block by block (the last block shorter when S = ``block`` does not divide P; blocks run over
    the flat vector, across tensors, as the block-wise quantizations' do; the reference cuts each matrix in
    64×64 tiles, the same 4096 values to a block):

    - keep k_j = max(1, ⌈f·L_j⌉) of the block's L_j values, the largest magnitudes; equal magnitudes are
      ordered by position (the lower index first), so the choice is a pure function of the values on any
      device (:func:`_select`);
    - a kept value that is 0 (a block with fewer than k_j values that are not) is replaced by a copy of the
      block's largest one, same index and code: a zero never travels as a value, and decoding writes
      (duplicates write the same value) rather than adds;
    - the reference's statistical quantization, over the block's k kept values v (in float64): shift
      μ = mean v, σ = ‖v − μ‖ / √(k − 1) (0 for k = 1), bin width s = 6σ / L with L = 2^b bins (1 where
      that is 0 or not finite), bin q = clamp(round((v − μ)/s + ⌊L/2⌋), 0, L − 1) (round half to even);
      the block's table holds each bin's mean of the v in it (0 for an empty bin), rounded to bfloat16:
      a value decodes as its bin's mean, so each bin is unbiased over the values in it;
    - a NaN or an infinity is kept first (it is the largest) and makes its block's table NaN (the fault
      stays visible).

    Bytes: 2·L·J table entries (bfloat16, block by block), then the K = Σ_j k_j entries of W = w + b bits
    each, packed little-endian into ⌈K·W / 8⌉ bytes, w = ⌈log₂ S⌉ the bits an index into a block needs;
    entry = index | q << w, in block order and, within a block, by ascending index. Exactly
    :meth:`nbytes`, whatever the values.

    It does not sum (``sums`` False): the sum of n top-k sets is not a top-k set, so every participant's
    encoding is all-gathered and decoded by everyone (:mod:`adloco.library.comm.compressed`); with ``mean``
    ``senders`` (the reference's) each value is averaged over the participants that sent it, weighted as
    the round weighs them, not over all of them."""

    sums = False
    feedback = True
    error_decay = 0.95
    carries_theta = False
    theta = "int4"
    keys = ("topk_fraction", "topk_block", "topk_bits", "topk_mean")
    outer = {"optimizer": "sgd", "lr": 1.0}
    outer_why = (
        "SparseLoCo's: plain descent on the averaged sparse Δ, its error feedback (decaying at comm.error_decay) "
        "in the momentum's place"
    )
    RANGE: ClassVar[float] = (
        6.0  # the bins span RANGE standard deviations (the reference's quantization_range)
    )

    def __init__(self, fraction: float, block: int, bits: int, mean: str = "senders") -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"topk fraction must be in (0, 1], not {fraction}")
        if not 2 <= block <= 1 << 24:
            raise ValueError(f"topk block must be between 2 and 16777216 values, not {block}")
        if not 1 <= bits <= 8:
            raise ValueError(f"topk bits must be between 1 and 8, not {bits}")
        if mean not in ("senders", "all"):
            raise ValueError(f"topk mean must be 'senders' or 'all', not {mean!r}")
        self.name, self.fraction, self.block, self.bits = "topk", fraction, block, bits
        self.averages_senders = mean == "senders"
        self.bins = 1 << bits  # L
        self.index_bits = (block - 1).bit_length()  # w: an index into a block, 0 .. S − 1
        self.width = self.index_bits + bits  # W: one entry

    @classmethod
    def build(cls, wire: Any) -> Codec:
        return cls(wire.topk_fraction, wire.topk_block, wire.topk_bits, wire.topk_mean)

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
        return 2 * self.bins * sum(rows for _, rows, _, _ in segs) + -(-entries * self.width // 8)

    def bin(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The bins of each row's kept values ``v`` (rows × k float32) and each row's table (rows × L
        bfloat16): the statistical quantization of the class docstring."""
        rows, k = v.shape
        big = self.bins
        v64 = v.to(torch.float64)
        shift = v64.mean(dim=1, keepdim=True)
        centred = v64 - shift
        if k > 1:
            sigma = torch.linalg.vector_norm(centred, dim=1, keepdim=True).div_(math.sqrt(k - 1))
        else:
            sigma = torch.zeros_like(shift)
        width = sigma.mul_(self.RANGE / big)
        width = torch.where((width > 0) & torch.isfinite(width), width, 1.0)
        q = centred.div_(width).add_(big // 2).round_().clamp_(0, big - 1)
        code = torch.nan_to_num(q, nan=0.0).to(torch.int64)
        # each bin's mean, bin by bin (no scatter: the same sums in the same order on every device)
        table = torch.empty(rows, big, dtype=torch.float64, device=v.device)
        for b in range(big):
            hit = code == b
            n = hit.sum(dim=1)
            table[:, b] = torch.where(hit, v64, 0.0).sum(dim=1) / n.clamp(min=1)
        finite = torch.isfinite(v64).all(dim=1, keepdim=True)
        table = torch.where(finite, table, math.nan)
        return code, table.to(torch.bfloat16)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"topk expects float32, got {x.dtype}")
        x = x.reshape(-1)
        tables, entries = [], []
        for start, rows, width, k in self._segments(x.numel()):
            slab = _slab_rows(width, x.device)
            for r0 in range(0, rows, slab):
                r1 = min(rows, r0 + slab)
                xs = x[start + r0 * width : start + r1 * width].view(r1 - r0, width)
                idx = _select(xs, k)  # (rows, k), ascending within each row
                code, table = self.bin(torch.gather(xs, 1, idx))
                tables.append(table.reshape(-1))
                entries.append((idx | (code << self.index_bits)).reshape(-1))
        if not tables:
            return torch.empty(0, dtype=torch.uint8, device=x.device)
        head = torch.cat(tables).view(torch.uint8)
        return torch.cat([head, _pack(torch.cat(entries), self.width)])

    def decode(
        self, buf: Tensor, numel: int, out: Tensor | None = None, support: Tensor | None = None
    ) -> Tensor:
        if buf.dtype != torch.uint8 or buf.numel() != self.nbytes(numel):
            raise ValueError(f"expected {self.nbytes(numel)} uint8 bytes, got {buf.numel()} {buf.dtype}")
        if out is None:
            out = torch.empty(numel, dtype=torch.float32, device=buf.device)
        elif out.shape != (numel,) or out.dtype != torch.float32:
            raise ValueError(f"topk decode: out must be a float32 vector of {numel} values")
        out.zero_()
        if support is not None:
            if support.shape != (numel,) or support.dtype != torch.bool:
                raise ValueError(f"topk decode: support must be a bool vector of {numel} values")
            support.zero_()
        segs = self._segments(numel)
        n_tables = sum(rows for _, rows, _, _ in segs)
        head = buf[: 2 * self.bins * n_tables]
        if head.storage_offset() % 2:  # a slice of a received buffer: viewing as bfloat16 needs alignment
            head = head.clone()
        tables = head.view(torch.bfloat16).to(torch.float32).view(n_tables, self.bins)
        entries = _unpack(
            buf[2 * self.bins * n_tables :], sum(rows * k for _, rows, _, k in segs), self.width
        )
        idx = entries & ((1 << self.index_bits) - 1)
        code = entries >> self.index_bits
        j = e = 0
        for start, rows, width, k in segs:
            at = idx[e : e + rows * k].view(rows, k)
            vals = torch.gather(tables[j : j + rows], 1, code[e : e + rows * k].view(rows, k))
            out[start : start + rows * width].view(rows, width).scatter_(1, at, vals)
            if support is not None:
                support[start : start + rows * width].view(rows, width).scatter_(1, at, True)
            j, e = j + rows, e + rows * k
        return out


def _slab_rows(width: int, device: torch.device) -> int:
    """Rows of a block-wise pass at once: about 2^18 values on CPU (as :mod:`adloco.library.comm.quantize`), all on
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


# wire name -> the codec's class (its rules are class attributes; ``build`` reads its keys from the wire)
CODECS: dict[str, type[Codec]] = {
    "bfloat16": Cast,
    "float16": Cast,
    "int8": Absmax,
    "int4": Absmax,
    "topk": TopK,
}


def rules(dtype: str) -> type[Codec] | None:
    """The class (the rules) of the codec registered as ``dtype``; None for float32 (nothing encoded)."""
    return None if dtype == "float32" else CODECS[dtype]


def of(wire: Any) -> Codec | None:
    """The codec a :class:`~adloco.library.settings.Wire` names (None: float32)."""
    return None if wire.dtype == "float32" else CODECS[wire.dtype].build(wire)


__all__ = ["CODECS", "Absmax", "Cast", "Codec", "TopK", "of", "rules"]
