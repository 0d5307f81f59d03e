"""Block-wise absmax quantization of a float32 vector to int8 or int4, and error feedback. Pure functions.

ALGORITHM.md §9.4: for blocks of ``S`` values (the last one shorter when S does not divide P)

    scale_j = max_{i ∈ block j} |x_i|                 (float32; a zero block has scale 0)
    q_i     = round(x_i / scale_j · L)                L = 127 (int8) or 7 (int4, two codes per byte)
    x̂_i     = q_i · scale_j / L                       |x_i − x̂_i| ≤ scale_j / (2L)

Arithmetic, fixed so that every caller (the chunk owner of a torch.distributed all-reduce, or the
in-process computation of the same all-reduce) gets the same bits:

- ``q = round((x / s) · L)``: one division, one multiplication, each rounded to float32. ``|x| ≤ s``, so
  ``|x / s| ≤ 1`` and ``|q| ≤ L`` without a clamp; ``x = ±s`` gives ``q = ±L`` exactly.
- ``round`` is :func:`torch.round`: round half to even (IEEE ``nearbyint``) on CPU and CUDA alike, so a
  tie such as 2.5 gives 2 and −2.5 gives −2 (not away from zero).
- ``x̂ = (q / L) · s``: ``q = ±L`` gives ``±s`` exactly, ``q = 0`` gives 0, so the largest magnitude of
  every block and zeros come back exact. The bound above holds up to float32 rounding (a few ulps of s).
- A zero block (s = 0) is divided by 1 instead: its codes are 0 and it dequantizes to 0.
- Nothing is checked for finiteness (no host synchronisation): a block holding a NaN or an infinity gets a
  non-finite scale and dequantizes to non-finite values only, so the fault stays visible downstream, as it
  would after a float all-reduce. Its codes are meaningless.

Every operation is element-wise, correctly rounded, or a max (exact), so the result does not depend on
the device, the memory alignment, the vectorisation of a kernel or the slabs the CPU works in. One trap,
avoided in :func:`dequantize`: CUDA divides by a Python number as a multiplication by its reciprocal,
which is not q / L in the last bit for some codes; every division here is tensor by tensor.

Why S = 256 by default: a scale per block rather than per tensor means one outlier costs the precision
of its own S values only, and a block stays a small slice of one parameter tensor (the flat vector
concatenates the model's tensors, whose magnitudes differ). Each block adds a 4-byte scale, 4 / S bytes a
value: at 256 that is 1.6% over int8's byte and 3.1% over int4's half byte (at 64: 6.3% and 12.5%).

Why plain torch operations and no quantization library: torchao (0.18) installs beside torch 2.13 without
touching it, but its affine primitives compute other points. Its symmetric scale is absmax / 127.5 for
int8 (7.5 for int4) with codes clamped to [−128, 127]; with quant_min = −L the scale is absmax / L, but the
codes are round(x · (1 / scale)), a reciprocal multiplication that rounds differently from x / s · L.
It needs the length to be a multiple of the block, clamps a zero block's scale to the smallest normal
float, keeps a general int4 packing only in its prototype namespace (its packed int4 layouts belong to
particular matrix-multiplication kernels), and on a CPU-only torch its import reports extensions it
cannot load. torch's own ``quantize_per_channel`` warns that it is deprecated (torch 2.13) and has no
per-channel int4 (``quint4x2``: not implemented). The scheme is a handful of element-wise operations
that run on CPU and CUDA without a custom kernel, so it is written here, to the arithmetic of
ALGORITHM.md §9.4.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

LEVELS = {8: 127, 4: 7}  # L: the largest code magnitude; codes lie in [−L, L]
DEFAULT_BLOCK = 256


def _check(bits: int, block: int) -> int:
    if bits not in LEVELS:
        raise ValueError(f"bits must be 8 or 4, not {bits}")
    if block < 1:
        raise ValueError(f"block must be at least 1, not {block}")
    return LEVELS[bits]


def n_blocks(numel: int, block: int) -> int:
    """⌈P / S⌉: how many scales a vector of ``numel`` values has."""
    return -(-numel // block)


def code_bytes(numel: int, bits: int) -> int:
    """Bytes of the codes: P for int8, ⌈P / 2⌉ for int4 (two per byte; an odd length pads half a byte)."""
    return numel if bits == 8 else (numel + 1) // 2


def encoded_bytes(numel: int, bits: int, block: int) -> int:
    """Exact bytes of one quantized vector of P values: codes + 4·⌈P / S⌉ (float32 scales).

    ALGORITHM.md §9.4's P·bits/8 + 4·⌈P/S⌉, with P·bits/8 rounded up to whole bytes for an odd int4 length.
    """
    _check(bits, block)
    return code_bytes(numel, bits) + 4 * n_blocks(numel, block)


@dataclass(frozen=True)
class Quantized:
    """A quantized vector.

    ``codes``: int8 (bits 8), one code per value; or uint8 (bits 4), two codes per byte, the code of value
    2i in the low nibble of byte i and that of value 2i+1 in the high nibble, each stored as q + 8 ∈ [1, 15]
    (an odd length leaves the last high nibble 0). ``scales``: float32, one per block.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    numel: int
    bits: int
    block: int

    @property
    def nbytes(self) -> int:
        return encoded_bytes(self.numel, self.bits, self.block)

    def to_bytes(self) -> torch.Tensor:
        """One uint8 buffer for the wire: the scales' bytes first (so they stay 4-byte aligned), then codes."""
        return torch.cat([self.scales.contiguous().view(torch.uint8), self.codes.view(torch.uint8)])

    @classmethod
    def from_bytes(cls, buf: torch.Tensor, numel: int, bits: int, block: int) -> Quantized:
        """The inverse of :meth:`to_bytes`, given the vector's length, bits and block."""
        _check(bits, block)
        nb = n_blocks(numel, block)
        if buf.dtype != torch.uint8 or buf.numel() != encoded_bytes(numel, bits, block):
            raise ValueError(
                f"expected {encoded_bytes(numel, bits, block)} uint8 bytes, got {buf.numel()} {buf.dtype}"
            )
        head = buf[: 4 * nb]
        if head.storage_offset() % 4:  # a slice of a received buffer: viewing as float32 needs alignment
            head = head.clone()
        codes = buf[4 * nb :]
        return cls(
            codes.view(torch.int8) if bits == 8 else codes, head.view(torch.float32), numel, bits, block
        )


# CPU: work through the vector in slabs of whole blocks, about 2^18 values (1 MiB of float32), so the
# temporaries stay in cache and are allocated once; page-faulting a fresh P-sized temporary per
# operation costs several times the arithmetic. CUDA: the whole vector at once (fewer launches). The
# operations are element-wise or per block, so the slab size does not change a bit of the result.
_SLAB = 1 << 18


def _segments(numel: int, block: int, device: torch.device) -> list[tuple[int, int, int]]:
    """(start, rows, width): slabs of whole blocks (width S), then the shorter last block (rows 1)."""
    full = numel // block
    rows = max(1, full if device.type != "cpu" else _SLAB // block)
    out = [(i * block, min(rows, full - i), block) for i in range(0, full, rows)]
    if numel % block:
        out.append((full * block, 1, numel % block))
    return out


def quantize(x: torch.Tensor, bits: int, block: int = DEFAULT_BLOCK) -> Quantized:
    """Block-wise absmax quantization of a float32 vector (any shape, read flat) to ``bits`` = 8 or 4.

    scale_j = max_{i∈j} |x_i|, q_i = round(x_i / scale_j · L) with L = 127 or 7 (module docstring).
    """
    L = _check(bits, block)
    if x.dtype != torch.float32:
        raise TypeError(f"quantize expects float32, got {x.dtype}")
    x = x.reshape(-1)
    P = x.numel()
    scales = torch.empty(n_blocks(P, block), dtype=torch.float32, device=x.device)
    codes = torch.empty(P, dtype=torch.int8, device=x.device)
    segments = _segments(P, block, x.device)
    scratch = torch.empty(max((r * w for _, r, w in segments), default=0), device=x.device)
    for start, rows, width in segments:
        n, j = rows * width, start // block
        xs, buf, s = (
            x[start : start + n].view(rows, width),
            scratch[:n].view(rows, width),
            scales[j : j + rows],
        )
        torch.amax(torch.abs(xs, out=buf), dim=1, out=s)
        divisor = torch.where(s == 0, 1.0, s)  # a zero block: 0 / 1 = 0
        torch.div(xs, divisor[:, None], out=buf)
        codes[start : start + n].view(rows, width).copy_(buf.mul_(L).round_())
    return Quantized(codes if bits == 8 else _pack4(codes), scales, P, bits, block)


def dequantize(q: Quantized, out: torch.Tensor | None = None) -> torch.Tensor:
    """x̂_i = q_i · scale_j / L, computed as (q_i / L) · scale_j: flat float32, into ``out`` if given."""
    L = _check(q.bits, q.block)
    P = q.numel
    if out is None:
        out = torch.empty(P, dtype=torch.float32, device=q.scales.device)
    elif out.shape != (P,) or out.dtype != torch.float32:
        raise ValueError(f"dequantize: out must be a float32 vector of {P} values")
    # L as a tensor on the device, not a Python number: CUDA divides by a Python (CPU) scalar as a
    # multiplication by its reciprocal, which can differ from q / L in the last bit; tensor by tensor it
    # divides, correctly rounded, as the CPU does.
    levels = torch.full((1,), float(L), device=out.device)
    for start, rows, width in _segments(P, q.block, out.device):
        n, j = rows * width, start // q.block
        codes = q.codes[start : start + n] if q.bits == 8 else _unpack4(q.codes, start, start + n)
        seg = out[start : start + n].view(rows, width)
        seg.copy_(codes.view(rows, width)).div_(levels).mul_(q.scales[j : j + rows, None])
    return out


def _pack4(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes in [−7, 7] → uint8, two per byte (value 2i low nibble, 2i+1 high), stored as q + 8."""
    P = codes.numel()
    out = torch.empty((P + 1) // 2, dtype=torch.uint8, device=codes.device)
    u = codes.view(torch.uint8)  # q + 8 in uint8 arithmetic (mod 256) is the nibble, for q in [−7, 7]
    even = P - P % 2
    step = _SLAB if codes.device.type == "cpu" else max(even, 2)
    for i in range(0, even, step):
        pairs = u[i : min(i + step, even)].view(-1, 2)
        torch.bitwise_or(pairs[:, 0] + 8, (pairs[:, 1] + 8) << 4, out=out[i // 2 : i // 2 + pairs.shape[0]])
    if P % 2:
        out[-1:] = u[-1:] + 8  # the last high nibble stays 0
    return out


def _unpack4(packed: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """int8 codes of values ``start`` .. ``end`` − 1 from :func:`_pack4`'s bytes."""
    b = packed[start // 2 : (end + 1) // 2]
    both = torch.stack([b & 15, b >> 4], dim=1).view(-1)
    return both[start % 2 : start % 2 + end - start].view(torch.int8) - 8


def quantize_roundtrip(x: torch.Tensor, bits: int, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """dequantize(quantize(x)): what the receiver sees (flat float32)."""
    return dequantize(quantize(x, bits, block))


class ErrorFeedback:
    """Error feedback of one worker: e_m, the part of its updates its own encoding has not sent yet.

    ALGORITHM.md §9.4: worker m sends Q(Δ_m + β·e_m) and keeps e_m ← Δ_m + β·e_m − Q(Δ_m + β·e_m). Only the
    worker's own encoding (what it sends) is fed back, not that of the reduced sum. e_m starts at zero;
    reset it when the worker moves (its Δ no longer continues the one the error was left by), and save it
    in checkpoints (:meth:`state_dict`), so a resumed run sends the same bits.

    ``decay`` β = 1 (the default): over k rounds the worker has sent Σ Δ − e_m exactly (the sum telescopes),
    so what it sent differs from what it meant to send by one round's encoding error, not k of them.
    β < 1 (SparseLoCo's accumulator, β 0.95 for topk): what was not sent fades by β each round, so e_m is a
    decaying sum of the recent Δ not yet sent, the role DiLoCo's outer momentum plays (arXiv 2508.15706).
    """

    def __init__(self, decay: float = 1.0) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"error feedback decay must be in [0, 1], not {decay}")
        self.decay = decay
        self.error: torch.Tensor | None = None

    def compensate(self, delta: torch.Tensor) -> torch.Tensor:
        """v = Δ_m + β·e_m (a new float32 tensor), the vector to encode and send."""
        if self.error is None:
            return delta.to(torch.float32, copy=True)
        if self.error.shape != delta.shape:
            raise ValueError(f"error feedback: Δ has shape {tuple(delta.shape)}, e {tuple(self.error.shape)}")
        if self.decay == 1.0:
            return torch.add(delta, self.error.to(delta.device))
        return torch.add(delta, self.error.to(delta.device), alpha=self.decay)

    def remember(self, target: torch.Tensor, sent: torch.Tensor) -> None:
        """e_m ← v − Q(v), with ``target`` = v = Δ_m + β·e_m and ``sent`` = Q(v) decoded."""
        self.error = torch.sub(target, sent.reshape(target.shape))

    def step(self, delta: torch.Tensor, compress: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Q(Δ_m + β·e_m) with ``compress`` = Q (decoded output), e_m updated."""
        v = self.compensate(delta)
        sent = compress(v)
        self.remember(v, sent)
        return sent

    def reset(self) -> None:
        self.error = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{"error": e_m}``, or ``{}`` while e_m is zero: tensors only, as a safetensors file holds."""
        return {} if self.error is None else {"error": self.error.detach().clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        err = state.get("error")
        if err is not None and not (isinstance(err, torch.Tensor) and err.dtype == torch.float32):
            raise ValueError("error feedback state: 'error' must be a float32 tensor or None")
        self.error = None if err is None else err.detach().clone()


__all__ = [
    "DEFAULT_BLOCK",
    "LEVELS",
    "ErrorFeedback",
    "Quantized",
    "code_bytes",
    "dequantize",
    "n_blocks",
    "quantize",
    "quantize_roundtrip",
    "encoded_bytes",
]
