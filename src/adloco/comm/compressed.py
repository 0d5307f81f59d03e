"""The compressed all-reduce: one arithmetic for every wire dtype, whichever backend moves the bytes.

ALGORITHM.md §9.4, for n participants each holding a float32 vector of P values:

1. split the vector into n chunks; participant m encodes chunk r and sends it to participant r
   (all-to-all; the piece it "sends" itself is encoded too);
2. participant r decodes the n pieces and sums them in float32 in rank order, ((d_0 + d_1) + d_2) + …;
3. it encodes the sum and all-gathers it; everyone decodes the n reduced chunks and concatenates them.

"Encode" is block-wise absmax quantization for ``int8`` / ``int4`` (:mod:`adloco.comm.quantize`) and a cast
for ``bfloat16`` / ``float16`` (round to nearest even; decoding casts back to float32, exactly). So a
low-precision float dtype has the same two roundings as the integer ones (each worker's chunk, then the
sum) and the sum itself is always taken in float32. ``float32`` is not encoded: it keeps the backend's
plain all-reduce (a ring; its summation order is the backend's, so it is not bitwise reproducible across
backends, only within rounding).

Chunks: chunk r has ⌊P/n⌋ + 1 values if r < P mod n, else ⌊P/n⌋, in order (``torch.tensor_split``'s
rule); some are empty when P < n. Chunk boundaries need not fall on block boundaries: quantization blocks
restart at each chunk's start, so chunk r has ⌈c_r / S⌉ scales and the vector Σ_r ⌈c_r / S⌉ ≥ ⌈P / S⌉ of
them (at most n − 1 more). The byte counts below are exact for that.

The algorithm is written once, against :class:`GroupOps`: two collectives on byte buffers (an all-to-all
exchange and an all-gather) plus the plain float32 all-reduce. :class:`TorchDistGroup` runs them on a
torch.distributed process group (one participant per process); :class:`InProcessGroup` holds all n
participants in one process and moves nothing. Both call the same encode, decode and sum functions on the
same values in the same order, so every participant of the distributed run gets, bitwise, the tensor the
in-process run returns. A participant is whatever contributes one vector: where a process hosts several
workers and passes their partial sum, the participant is the process, and the in-process computation
that matches it bit for bit takes the same partial sums (the encoding is not linear: encoding a sum
differs from summing encodings). Error feedback then belongs to the participant too.

Bytes: participant m sends Σ_{r≠m} b(c_r) in the exchange and (n − 1)·b(c_m) in the all-gather, where
b(c) is a chunk's encoded size: c·2 for bfloat16 / float16, c + 4⌈c/S⌉ for int8, ⌈c/2⌉ + 4⌈c/S⌉ for int4.
Summed over the participants that is 2(n − 1)·B with B = Σ_r b(c_r), the same form as the comm
accounting's ring all-reduce of a B-byte payload (``wire_bytes("all_reduce", n, B)``), so a caller can
record ``payload = B`` (:func:`payload_bytes`).
Per participant on average: 2(n − 1)/n·B, which is ALGORITHM.md §9.4's 2(n − 1)/n·(P·bits/8 + 4⌈P/S⌉) exactly when
every chunk is a whole number of blocks (and of bytes, for int4), and slightly more otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from adloco.comm.quantize import (
    DEFAULT_BLOCK,
    ErrorFeedback,
    Quantized,
    dequantize,
    encoded_bytes,
    quantize,
)
from adloco.settings import WIRE_DTYPES, WireDtype

_FLOATS = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_BITS = {"int8": 8, "int4": 4}


def wire_dtype(dtype: str | torch.dtype) -> str:
    """The name of a wire dtype, from its name or a torch dtype (float32, bfloat16, float16)."""
    if isinstance(dtype, torch.dtype):
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        if dtype not in names:
            raise ValueError(f"unsupported wire dtype {dtype}")
        return names[dtype]
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"wire dtype must be one of {', '.join(WIRE_DTYPES)}, not {dtype!r}")
    return dtype


# --------------------------------------------------------------------------------------------------
# Chunks and bytes
# --------------------------------------------------------------------------------------------------


def chunk_sizes(numel: int, n: int) -> list[int]:
    """c_r = ⌊P/n⌋ + [r < P mod n], r = 0..n−1 (torch.tensor_split's rule)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    q, rem = divmod(numel, n)
    return [q + (1 if r < rem else 0) for r in range(n)]


def piece_bytes(numel: int, dtype: str | torch.dtype, block: int = DEFAULT_BLOCK) -> int:
    """b(c): bytes of one encoded chunk of ``numel`` values (4c for float32, unencoded)."""
    d = wire_dtype(dtype)
    if d in _BITS:
        return encoded_bytes(numel, _BITS[d], block)
    return numel * (2 if d in _FLOATS else 4)


def payload_bytes(numel: int, n: int, dtype: str | torch.dtype, block: int = DEFAULT_BLOCK) -> int:
    """B = Σ_r b(c_r): the encoded vector, chunk by chunk (blocks restart at each chunk)."""
    return sum(piece_bytes(c, dtype, block) for c in chunk_sizes(numel, n))


def sent_bytes(
    numel: int, n: int, dtype: str | torch.dtype, block: int = DEFAULT_BLOCK, participant: int = 0
) -> int:
    """Bytes participant m sends: Σ_{r≠m} b(c_r) (exchange) + (n − 1)·b(c_m) (all-gather); 0 for n = 1.

    For float32 the backend's ring all-reduce chooses its own split among participants; this gives the
    same-chunk split, whose total over participants is the ring's exact 2(n − 1)·4P.
    """
    if n <= 1:
        return 0
    sizes = [piece_bytes(c, dtype, block) for c in chunk_sizes(numel, n)]
    return sum(sizes) - sizes[participant] + (n - 1) * sizes[participant]


def wire_bytes_all_reduce(numel: int, n: int, dtype: str | torch.dtype, block: int = DEFAULT_BLOCK) -> int:
    """Bytes on the wire summed over the n participants: 2(n − 1)·B (divide by n for the per-worker mean).

    int8 / int4: 2(n − 1)·Σ_r (code_bytes(c_r) + 4⌈c_r/S⌉), ALGORITHM.md §9.4's n·2(n − 1)/n·(P·bits/8 + 4⌈P/S⌉)
    when the chunks are whole blocks; bfloat16 / float16: 2(n − 1)·2P; float32 (ring): 2(n − 1)·4P.
    """
    if n <= 1:
        return 0
    return 2 * (n - 1) * payload_bytes(numel, n, dtype, block)


# --------------------------------------------------------------------------------------------------
# Encoding (what one participant puts on the wire for one chunk) and decoding
# --------------------------------------------------------------------------------------------------


def encode(x: torch.Tensor, dtype: str, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """A float32 chunk → its bytes on the wire (uint8)."""
    if dtype in _BITS:
        return quantize(x, _BITS[dtype], block).to_bytes()
    return x.to(_FLOATS[dtype]).view(torch.uint8)


def decode(
    buf: torch.Tensor, numel: int, dtype: str, block: int = DEFAULT_BLOCK, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Bytes of one encoded chunk of ``numel`` values → float32 (a new tensor, or ``out``)."""
    if dtype in _BITS:
        return dequantize(Quantized.from_bytes(buf, numel, _BITS[dtype], block), out)
    low = _FLOATS[dtype]
    if buf.storage_offset() % 2:
        buf = buf.clone()
    if out is None:
        return buf.view(low).to(torch.float32)
    return out.copy_(buf.view(low))


# --------------------------------------------------------------------------------------------------
# The two collectives
# --------------------------------------------------------------------------------------------------


class GroupOps(Protocol):
    """n participants, some of them held here (``local``, participant indices, ascending).

    ``exchange(send, sizes)``: ``send[i][r]`` is what local participant ``local[i]`` sends participant r,
    ``sizes[r]`` bytes (every sender's piece for r has the same size). Returns, for each local
    participant r, the n pieces it received, in sender order.

    ``all_gather(mine, sizes)``: ``mine[i]`` is local participant ``local[i]``'s piece of ``sizes[local[i]]``
    bytes. Returns every participant's piece, in order (the same on every participant).

    ``all_reduce(tensors)``: Σ over participants of their float32 vectors (the backend's own reduction).
    """

    n: int
    local: Sequence[int]

    def exchange(
        self, send: Sequence[Sequence[torch.Tensor]], sizes: Sequence[int]
    ) -> list[list[torch.Tensor]]: ...

    def all_gather(self, mine: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]: ...

    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor: ...


class InProcessGroup:
    """All n participants in this process: the collectives move nothing."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.local: Sequence[int] = range(n)

    def exchange(
        self, send: Sequence[Sequence[torch.Tensor]], sizes: Sequence[int]
    ) -> list[list[torch.Tensor]]:
        return [[send[m][r] for m in range(self.n)] for r in range(self.n)]

    def all_gather(self, mine: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]:
        return list(mine)

    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        out = tensors[0].to(torch.float32, copy=True)
        for t in tensors[1:]:
            out.add_(t)
        return out


class TorchDistGroup:
    """One participant per process of a torch.distributed group (None: the world), in group-rank order.

    Both collectives are ``all_to_all_single`` on uint8 buffers with uneven splits, the one collective that
    gloo and NCCL both run for pieces of different sizes. Measured with gloo in torch 2.13 on CPU:
    ``all_to_all_single`` works, with equal and uneven splits, for uint8, int8, float32, bfloat16 and
    float16; ``all_to_all`` (a list of tensors) and ``all_gather`` (a list) reject pieces of different sizes
    ("invalid tensor size"); ``all_gather_into_tensor`` works for equal sizes only. Chunks of P values differ
    by one value (and one scale) when n does not divide P, so the all-gather is an all-to-all in which each
    participant sends its piece to every participant: no padding, and the bytes counted are the bytes sent.
    """

    def __init__(self, group: Any = None, ranks: Sequence[int] | None = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.n = dist.get_world_size(group)
        self.me = dist.get_rank(group)
        if ranks is not None and (
            list(ranks) != sorted(ranks) or len(ranks) != self.n or dist.get_rank() != ranks[self.me]
        ):
            raise ValueError(f"ranks {list(ranks)} are not this group's, in order")
        self.local: Sequence[int] = [self.me]

    def exchange(
        self, send: Sequence[Sequence[torch.Tensor]], sizes: Sequence[int]
    ) -> list[list[torch.Tensor]]:
        (pieces,) = send
        inp = torch.cat(list(pieces))
        out = inp.new_empty(self.n * sizes[self.me])
        self._dist.all_to_all_single(out, inp, [sizes[self.me]] * self.n, list(sizes), group=self.group)
        return [list(out.split([sizes[self.me]] * self.n))]

    def all_gather(self, mine: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]:
        (piece,) = mine
        out = piece.new_empty(sum(sizes))
        self._dist.all_to_all_single(
            out, piece.repeat(self.n), list(sizes), [sizes[self.me]] * self.n, group=self.group
        )
        return list(out.split(list(sizes)))

    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        (t,) = tensors
        out = t.to(torch.float32, copy=True)
        self._dist.all_reduce(out, group=self.group)
        return out


class TorchDistParticipants:
    """n participants spread over the processes of a torch.distributed group, several per process
    (the workers a process hosts): ``owner[i]`` is participant i's rank in ``group``, ascending in i.

    Both collectives are one ``all_to_all_single`` among the processes on uint8 buffers: a process sends
    another, in one piece, what its local participants send that process's participants (in participant
    order), so the arithmetic is the per-participant one whatever the layout.
    """

    def __init__(self, group: Any, owner: Sequence[int], me: int) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.owner = list(owner)
        self.n = len(owner)
        self.me = me  # this process's rank in ``group``
        self.world = max(self.owner) + 1
        self.local: Sequence[int] = [i for i, q in enumerate(self.owner) if q == me]
        self._of = [[i for i, q in enumerate(self.owner) if q == p] for p in range(self.world)]

    def exchange(
        self, send: Sequence[Sequence[torch.Tensor]], sizes: Sequence[int]
    ) -> list[list[torch.Tensor]]:
        inp = torch.cat(
            [send[j][r] for p in range(self.world) for j in range(len(self.local)) for r in self._of[p]]
        )
        in_splits = [len(self.local) * sum(sizes[r] for r in self._of[p]) for p in range(self.world)]
        mine = sum(sizes[r] for r in self.local)
        out_splits = [len(self._of[p]) * mine for p in range(self.world)]
        out = inp.new_empty(sum(out_splits))
        self._dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)
        got: list[list[torch.Tensor]] = [[] for _ in self.local]
        pos = 0
        for p in range(self.world):
            for _m in self._of[p]:  # senders of process p, in participant order
                for k, r in enumerate(self.local):
                    got[k].append(out[pos : pos + sizes[r]])
                    pos += sizes[r]
        return got

    def all_gather(self, mine: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]:
        piece = torch.cat(list(mine))
        out_splits = [sum(sizes[r] for r in self._of[p]) for p in range(self.world)]
        out = piece.new_empty(sum(out_splits))
        self._dist.all_to_all_single(
            out, piece.repeat(self.world), out_splits, [piece.numel()] * self.world, group=self.group
        )
        parts: dict[int, torch.Tensor] = {}
        pos = 0
        for p in range(self.world):
            for r in self._of[p]:
                parts[r] = out[pos : pos + sizes[r]]
                pos += sizes[r]
        return [parts[r] for r in range(self.n)]

    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        out = tensors[0].to(torch.float32, copy=True)
        for t in tensors[1:]:
            out.add_(t)
        self._dist.all_reduce(out, group=self.group)
        return out


# --------------------------------------------------------------------------------------------------
# The all-reduce
# --------------------------------------------------------------------------------------------------


def compressed_all_reduce(
    tensors: Sequence[torch.Tensor],
    dtype: str | torch.dtype,
    block: int = DEFAULT_BLOCK,
    group_ops: GroupOps | None = None,
    feedback: Sequence[ErrorFeedback] | None = None,
) -> torch.Tensor:
    """Σ over the n participants of their float32 vectors, through ``dtype`` on the wire.

    ``tensors``: the vectors of the local participants (``group_ops.local``): one in a torch.distributed
    group, all n in process. ``group_ops`` None: in process, n = len(tensors). Returns a new flat float32
    tensor, the same (bitwise, for every dtype but float32) on every participant and in both backends.

    ``feedback``: one :class:`ErrorFeedback` per local participant, or None. Participant m then sends
    Q(Δ_m + e_m) and keeps e_m ← Δ_m + e_m − Q(Δ_m + e_m), where Q is its own encoding of its chunks (the
    reduced sum's encoding is not fed back). Ignored for float32 and for n = 1 (nothing is lost).

    With n = 1 nothing travels and nothing is encoded: the vector comes back as it is.
    """
    ops: GroupOps = group_ops if group_ops is not None else InProcessGroup(len(tensors))
    d = wire_dtype(dtype)
    n, local = ops.n, list(ops.local)
    if len(tensors) != len(local):
        raise ValueError(f"{len(tensors)} tensors for {len(local)} local participants")
    if feedback is not None and len(feedback) != len(local):
        raise ValueError(f"{len(feedback)} error-feedback states for {len(local)} local participants")
    flat = [t.reshape(-1) for t in tensors]
    numel = flat[0].numel()
    if any(t.numel() != numel for t in flat):
        raise ValueError("all-reduce of vectors of different lengths")
    if any(t.dtype != torch.float32 for t in flat):
        raise TypeError("compressed_all_reduce expects float32 vectors")
    if n == 1:
        return flat[0].clone()
    if d == "float32":
        return ops.all_reduce(flat)

    counts = chunk_sizes(numel, n)
    sizes = [piece_bytes(c, d, block) for c in counts]

    # 1. every local participant encodes its n chunks (its own included)
    send: list[list[torch.Tensor]] = []
    for i, v in enumerate(flat):
        if feedback is not None:
            v = feedback[i].compensate(v)  # Δ_m + e_m
        pieces = [encode(c, d, block) for c in v.split(counts)]
        if feedback is not None:
            feedback[i].remember(v, _decode_all(pieces, counts, d, block, v))
        send.append(pieces)
    received = ops.exchange(send, sizes)

    # 2. each local participant r sums its chunk in float32, in rank order, and encodes the sum
    reduced = []
    for r, pieces in zip(local, received, strict=True):
        acc = decode(pieces[0], counts[r], d, block)
        scratch = torch.empty_like(acc)
        for m in range(1, n):
            acc.add_(decode(pieces[m], counts[r], d, block, out=scratch))
        reduced.append(encode(acc, d, block))

    # 3. all-gather the encoded sums; everyone decodes them
    return _decode_all(ops.all_gather(reduced, sizes), counts, d, block, flat[0])


def _decode_all(
    pieces: Sequence[torch.Tensor], counts: Sequence[int], dtype: str, block: int, like: torch.Tensor
) -> torch.Tensor:
    """The n decoded chunks, concatenated (decoded in place into one new vector)."""
    out = torch.empty(sum(counts), dtype=torch.float32, device=like.device)
    for p, part in zip(pieces, out.split(list(counts)), strict=True):
        decode(p, part.numel(), dtype, block, out=part)
    return out


def all_reduce_inprocess(
    tensors: Sequence[torch.Tensor],
    dtype: str | torch.dtype,
    block: int = DEFAULT_BLOCK,
    feedback: Sequence[ErrorFeedback] | None = None,
) -> torch.Tensor:
    """The in-process form: all n workers' vectors here; the result every participant of the distributed
    all-reduce gets (bitwise for bfloat16, float16, int8, int4; float32 sums in rank order)."""
    return compressed_all_reduce(tensors, dtype, block, InProcessGroup(len(tensors)), feedback)


__all__ = [
    "WIRE_DTYPES",
    "GroupOps",
    "InProcessGroup",
    "TorchDistGroup",
    "TorchDistParticipants",
    "WireDtype",
    "all_reduce_inprocess",
    "chunk_sizes",
    "compressed_all_reduce",
    "decode",
    "encode",
    "payload_bytes",
    "piece_bytes",
    "sent_bytes",
    "wire_bytes_all_reduce",
]
