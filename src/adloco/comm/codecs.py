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
- ``sums = False``: a sum of encodings is not an encoding (a sparse top-k: the sum of n top-k sets is not
  a top-k set). Every participant's whole encoding is all-gathered, and every participant decodes the n of
  them and sums them in participant order (counted as an all-gather of the encoded vector).

Error feedback (``comm.error_feedback``) is the codec's too, whichever it is: a participant keeps what its
own encoding dropped (:class:`adloco.comm.quantize.ErrorFeedback`, v − decode(encode(v))).

A codec is registered under its wire name (:data:`CODECS`); ``comm.dtype`` and ``comm.theta_dtype`` name
it (the names are the ``WireDtype`` choices of :mod:`adloco.settings`). Adding one is a class here and its
name there: nothing in the round changes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from adloco.comm.quantize import DEFAULT_BLOCK, Quantized, dequantize, encoded_bytes, quantize
from adloco.settings import WIRE_DTYPES, Wire


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


# wire name -> the codec, given comm.block (the values per scale of the block-wise codecs)
CODECS: dict[str, Callable[[int], Codec]] = {
    "bfloat16": lambda block: Cast("bfloat16", torch.bfloat16),
    "float16": lambda block: Cast("float16", torch.float16),
    "int8": lambda block: Absmax("int8", 8, block),
    "int4": lambda block: Absmax("int4", 4, block),
}


def codec(dtype: str | torch.dtype, block: int = DEFAULT_BLOCK) -> Codec | None:
    """The codec of a wire dtype (its name, or torch's bfloat16 / float16), in blocks of ``block`` values
    where it has blocks; None for float32 (the backend's plain all-reduce)."""
    if isinstance(dtype, torch.dtype):
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        if dtype not in names:
            raise ValueError(f"unsupported wire dtype {dtype}")
        dtype = names[dtype]
    if dtype == "float32":
        return None
    if dtype not in CODECS:
        raise ValueError(f"wire dtype must be one of {', '.join(WIRE_DTYPES)}, not {dtype!r}")
    return CODECS[dtype](block)


def of(wire: Wire) -> Codec | None:
    """The codec a :class:`~adloco.settings.Wire` names (None: float32)."""
    return codec(wire.dtype, wire.block)


__all__ = ["CODECS", "Absmax", "Cast", "Codec", "codec", "of"]
