"""The compressed all-reduce: one arithmetic for every codec, whichever backend moves the bytes.

ALGORITHM.md §9.4, for n participants each holding a float32 vector of P values, through a codec that sums
(:attr:`adloco.library.comm.codecs.Codec.sums`: the casts and the block-wise quantizations):

1. split the vector into n chunks; participant m encodes chunk r and sends it to participant r
   (all-to-all; the piece it "sends" itself is encoded too);
2. participant r decodes the n pieces and sums them in float32 in rank order, ((d_0 + d_1) + d_2) + …;
3. it encodes the sum and all-gathers it; everyone decodes the n reduced chunks and concatenates them.

Through a codec that does not sum (a sparse one), step 1 encodes the whole vector, the encodings are
all-gathered, and everyone decodes the n of them and sums them in participant order. Either way the sum
itself is always taken in float32. ``float32`` is not encoded: it keeps the backend's plain all-reduce (a
ring; its summation order is the backend's, so it is not bitwise reproducible across backends, only within
rounding).

Chunks: chunk r has ⌊P/n⌋ + 1 values if r < P mod n, else ⌊P/n⌋, in order (``torch.tensor_split``'s
rule); some are empty when P < n. Chunk boundaries need not fall on block boundaries: quantization blocks
restart at each chunk's start, so chunk r has ⌈c_r / S⌉ scales and the vector Σ_r ⌈c_r / S⌉ ≥ ⌈P / S⌉ of
them (at most n − 1 more). The byte counts below are exact for that.

The algorithm is written once, against :class:`GroupOps`: two collectives on byte buffers (an all-to-all
exchange and an all-gather) plus the plain float32 all-reduce. :class:`TorchDistGroup` and
:class:`TorchDistParticipants` run them on a torch.distributed process group, :class:`InProcessGroup`
holds all n participants in one process and moves nothing, the threads backend meets at its hub, and a
:class:`Bystander` (a process hosting none of them) calls what it must. Every participant runs the same
encode, decode and sum functions on the same values in the same order, so every participant of the
distributed run gets, bitwise, the tensor the in-process run returns. A participant is whatever
contributes one vector: where a process hosts several workers and passes their partial sum, the
participant is the process, and the in-process computation that matches it bit for bit takes the same
partial sums (the encoding is not linear: encoding a sum differs from summing encodings). Error feedback
then belongs to the participant too.

Bytes: participant m sends Σ_{r≠m} b(c_r) in the exchange and (n − 1)·b(c_m) in the all-gather, where
b(c) is a chunk's encoded size (:meth:`Codec.nbytes <adloco.library.comm.codecs.Codec.nbytes>`: c·2 for bfloat16 /
float16, c + 4⌈c/S⌉ for int8, ⌈c/2⌉ + 4⌈c/S⌉ for int4). Summed over the participants that is 2(n − 1)·B
with B = Σ_r b(c_r), the same form as the comm accounting's ring all-reduce of a B-byte payload
(``wire_bytes("all_reduce", n, B)``), so a caller can record ``payload = B`` (:func:`payload_bytes`).
Per participant on average: 2(n − 1)/n·B, which is ALGORITHM.md §9.4's 2(n − 1)/n·(P·bits/8 + 4⌈P/S⌉) exactly when
every chunk is a whole number of blocks (and of bytes, for int4), and slightly more otherwise. A codec
that does not sum is counted as an all-gather of its encoded vector, n(n − 1)·b(P) (:func:`collective`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from adloco.library.comm.codecs import CODECS, Codec
from adloco.library.comm.quantize import DEFAULT_BLOCK, ErrorFeedback
from adloco.library.settings import WIRE_DTYPES, Wire, WireDtype


def codec(dtype: str | torch.dtype, block: int = DEFAULT_BLOCK) -> Codec | None:
    """The codec of a wire dtype (its name, or torch's bfloat16 / float16), in blocks of ``block`` values
    where it has blocks (the values per scale of int8 / int4, per top-k block of topk, whose other keys are
    then :class:`~adloco.library.settings.Wire`'s defaults); None for float32 (the backend's plain all-reduce)."""
    if isinstance(dtype, torch.dtype):
        names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
        if dtype not in names:
            raise ValueError(f"unsupported wire dtype {dtype}")
        dtype = names[dtype]
    if dtype == "float32":
        return None
    if dtype not in CODECS:
        raise ValueError(f"wire dtype must be one of {', '.join(WIRE_DTYPES)}, not {dtype!r}")
    wire = Wire(dtype, block=block, topk_block=block) if dtype == "topk" else Wire(dtype, block=block)  # type: ignore[arg-type]
    return CODECS[dtype].build(wire)


def wire_dtype(dtype: str | torch.dtype) -> str:
    """The name of a wire dtype, from its name or a torch dtype (float32, bfloat16, float16)."""
    got = codec(dtype)
    return "float32" if got is None else got.name


def _codec(dtype: str | torch.dtype | Codec, block: int = DEFAULT_BLOCK) -> Codec | None:
    return dtype if isinstance(dtype, Codec) else codec(dtype, block)


# --------------------------------------------------------------------------------------------------
# Chunks and bytes
# --------------------------------------------------------------------------------------------------


def chunk_sizes(numel: int, n: int) -> list[int]:
    """c_r = ⌊P/n⌋ + [r < P mod n], r = 0..n−1 (torch.tensor_split's rule)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    q, rem = divmod(numel, n)
    return [q + (1 if r < rem else 0) for r in range(n)]


def piece_bytes(numel: int, dtype: str | torch.dtype | Codec, block: int = DEFAULT_BLOCK) -> int:
    """b(c): bytes of one encoded chunk of ``numel`` values (4c for float32, unencoded)."""
    c = _codec(dtype, block)
    return 4 * numel if c is None else c.nbytes(numel)


def payload_bytes(numel: int, n: int, dtype: str | torch.dtype | Codec, block: int = DEFAULT_BLOCK) -> int:
    """B: what each participant contributes, as counted. A codec that sums: Σ_r b(c_r), the encoded vector
    chunk by chunk (blocks restart at each chunk); one that is gathered: its whole encoding, b(P)."""
    c = _codec(dtype, block)
    if c is not None and not c.sums:
        return c.nbytes(numel)
    return sum(piece_bytes(k, dtype, block) for k in chunk_sizes(numel, n))


def collective(numel: int, n: int, c: Codec) -> tuple[str, int]:
    """How the compressed all-reduce of ``numel`` values among n participants is counted (ALGORITHM.md §7):
    a codec that sums as one all-reduce of B bytes (the reduce-scatter and the all-gather move 2(n−1)·B
    together, as a ring does), one that is gathered as an all-gather of B bytes from each (n(n−1)·B)."""
    return ("all_reduce" if c.sums else "all_gather"), payload_bytes(numel, n, c)


def sent_bytes(
    numel: int, n: int, dtype: str | torch.dtype, block: int = DEFAULT_BLOCK, participant: int = 0
) -> int:
    """Bytes participant m sends: Σ_{r≠m} b(c_r) (exchange) + (n − 1)·b(c_m) (all-gather); 0 for n = 1.
    A codec that does not sum: its whole encoding to each of the n − 1 others, (n − 1)·b(P).

    For float32 the backend's ring all-reduce chooses its own split among participants; this gives the
    same-chunk split, whose total over participants is the ring's exact 2(n − 1)·4P.
    """
    if n <= 1:
        return 0
    c = _codec(dtype, block)
    if c is not None and not c.sums:
        return (n - 1) * c.nbytes(numel)
    sizes = [piece_bytes(c, dtype, block) for c in chunk_sizes(numel, n)]
    return sum(sizes) - sizes[participant] + (n - 1) * sizes[participant]


def wire_bytes_all_reduce(numel: int, n: int, dtype: str | torch.dtype, block: int = DEFAULT_BLOCK) -> int:
    """Bytes on the wire summed over the n participants: 2(n − 1)·B (divide by n for the per-worker mean).

    int8 / int4: 2(n − 1)·Σ_r (code_bytes(c_r) + 4⌈c_r/S⌉), ALGORITHM.md §9.4's n·2(n − 1)/n·(P·bits/8 + 4⌈P/S⌉)
    when the chunks are whole blocks; bfloat16 / float16: 2(n − 1)·2P; float32 (ring): 2(n − 1)·4P. A codec
    that does not sum (topk) is all-gathered: n(n − 1)·b(P).
    """
    if n <= 1:
        return 0
    c = _codec(dtype, block)
    if c is not None and not c.sums:
        return n * (n - 1) * c.nbytes(numel)
    return 2 * (n - 1) * payload_bytes(numel, n, dtype, block)


# --------------------------------------------------------------------------------------------------
# Encoding (what one participant puts on the wire for one chunk) and decoding, by the wire's name
# --------------------------------------------------------------------------------------------------


def encode(x: torch.Tensor, dtype: str, block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """A float32 chunk → its bytes on the wire (uint8), by the codec registered as ``dtype``."""
    c = codec(dtype, block)
    if c is None:
        raise ValueError("float32 is not encoded")
    return c.encode(x)


def decode(
    buf: torch.Tensor, numel: int, dtype: str, block: int = DEFAULT_BLOCK, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Bytes of one encoded chunk of ``numel`` values → float32 (a new tensor, or ``out``)."""
    c = codec(dtype, block)
    if c is None:
        raise ValueError("float32 is not encoded")
    return c.decode(buf, numel, out)


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


class Bystander:
    """A process that hosts none of the n participants but, like every process, calls every collective:
    nothing to send, nothing received (torch.distributed runs the collective among the group's ranks
    alone)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.local: Sequence[int] = []

    def exchange(
        self, send: Sequence[Sequence[torch.Tensor]], sizes: Sequence[int]
    ) -> list[list[torch.Tensor]]:
        return []

    def all_gather(self, mine: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]:
        return []

    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        raise RuntimeError("a bystander has nothing to reduce")


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
    dtype: str | torch.dtype | Codec,
    block: int = DEFAULT_BLOCK,
    group_ops: GroupOps | None = None,
    feedback: Sequence[ErrorFeedback] | None = None,
    numel: int | None = None,
    weights: Sequence[float] | None = None,
) -> torch.Tensor | None:
    """Σ over the n participants of their float32 vectors, through a codec on the wire (``dtype``: a
    :class:`~adloco.library.comm.codecs.Codec`, or a wire name with ``block``).

    A codec that :attr:`~adloco.library.comm.codecs.Codec.averages_senders` (topk) combines the n decoded vectors
    per value over the participants that sent it: value i is Σ_{m∈S_i} x_{m,i} · W / Σ_{m∈S_i} w_m, S_i the
    participants whose encoding holds i, ``weights`` w_m every participant's weight in the sum (each x_m
    already weighted by it; None: all 1) and W = Σ_m w_m; a value every participant sent is their plain
    sum, one that none sent is 0 (SparseLoCo's average of the sparse pseudo-gradients, arXiv 2508.15706).

    ``tensors``: the vectors of the local participants (``group_ops.local``): one in a torch.distributed
    group, all n in process, none on a process or thread that only takes part in what every process must
    call (then pass ``numel``; it returns None). ``group_ops`` None: in process, n = len(tensors). Returns
    a new flat float32 tensor, the same (bitwise, for every codec) on every participant and in every
    backend; float32 sums with the backend's own all-reduce.

    ``feedback``: one :class:`ErrorFeedback` per local participant, or None. Participant m then sends
    enc(Δ_m + e_m) and keeps e_m ← Δ_m + e_m − dec(enc(Δ_m + e_m)), its own encoding (the reduced sum's
    encoding is not fed back). Ignored for float32 and for n = 1 (nothing is lost).

    With n = 1 nothing travels and nothing is encoded: the vector comes back as it is.
    """
    ops: GroupOps = group_ops if group_ops is not None else InProcessGroup(len(tensors))
    c = _codec(dtype, block)
    n, local = ops.n, list(ops.local)
    if len(tensors) != len(local):
        raise ValueError(f"{len(tensors)} tensors for {len(local)} local participants")
    if feedback is not None and len(feedback) != len(local):
        raise ValueError(f"{len(feedback)} error-feedback states for {len(local)} local participants")
    flat = [t.reshape(-1) for t in tensors]
    if numel is None:
        numel = flat[0].numel()
    if any(t.numel() != numel for t in flat):
        raise ValueError("all-reduce of vectors of different lengths")
    if any(t.dtype != torch.float32 for t in flat):
        raise TypeError("compressed_all_reduce expects float32 vectors")
    if n == 1:
        return flat[0].clone() if flat else None
    if c is None:
        return ops.all_reduce(flat) if flat else None
    if weights is not None and len(weights) != n:
        raise ValueError(f"{len(weights)} weights for {n} participants")
    if not c.sums:
        return _gathered(flat, c, ops, feedback, numel, weights)

    counts = chunk_sizes(numel, n)
    sizes = [c.nbytes(k) for k in counts]

    # 1. every local participant encodes its n chunks (its own included)
    send: list[list[torch.Tensor]] = []
    for i, v in enumerate(flat):
        if feedback is not None:
            v = feedback[i].compensate(v)  # Δ_m + e_m
        pieces = [c.encode(x) for x in v.split(counts)]
        if feedback is not None:
            feedback[i].remember(v, _decode_all(pieces, counts, c, v))
        send.append(pieces)
    received = ops.exchange(send, sizes)

    # 2. each local participant r sums its chunk in float32, in rank order, and encodes the sum
    reduced = []
    for r, pieces in zip(local, received, strict=True):
        acc = c.decode(pieces[0], counts[r])
        scratch = torch.empty_like(acc)
        for m in range(1, n):
            acc.add_(c.decode(pieces[m], counts[r], out=scratch))
        reduced.append(c.encode(acc))

    # 3. all-gather the encoded sums; everyone decodes them
    gathered = ops.all_gather(reduced, sizes)
    return _decode_all(gathered, counts, c, flat[0]) if flat else None


def _gathered(
    flat: Sequence[torch.Tensor],
    c: Codec,
    ops: GroupOps,
    feedback: Sequence[ErrorFeedback] | None,
    numel: int,
    weights: Sequence[float] | None = None,
) -> torch.Tensor | None:
    """A codec whose encodings do not sum (``sums`` False): every participant's whole encoding is
    all-gathered, and everyone decodes the n of them and sums them in float32, in participant order; where
    the codec :attr:`~adloco.library.comm.codecs.Codec.averages_senders`, each value is then scaled by W over the
    weight of the participants that sent it (:func:`compressed_all_reduce`)."""
    mine = []
    for i, v in enumerate(flat):
        if feedback is not None:
            v = feedback[i].compensate(v)
        mine.append(c.encode(v))
        if feedback is not None:
            feedback[i].remember(v, c.decode(mine[-1], numel))
    every = ops.all_gather(mine, [c.nbytes(numel)] * ops.n)
    if not flat:
        return None
    if not c.averages_senders:
        out = c.decode(every[0], numel)
        scratch = torch.empty_like(out)
        for piece in every[1:]:
            out.add_(c.decode(piece, numel, out=scratch))
        return out
    w = [1.0] * ops.n if weights is None else [float(x) for x in weights]
    out = torch.zeros(numel, dtype=torch.float32, device=flat[0].device)
    held = torch.zeros_like(out)  # Σ of the senders' weights, value by value
    scratch, sent = torch.empty_like(out), torch.empty(numel, dtype=torch.bool, device=out.device)
    for m, piece in enumerate(every):
        out.add_(c.decode(piece, numel, out=scratch, support=sent))
        held.add_(sent.to(torch.float32), alpha=w[m])
    some = held > 0
    out.mul_(sum(w)).div_(held.clamp_(min=torch.finfo(torch.float32).tiny))
    return torch.where(some, out, 0.0)


def _decode_all(
    pieces: Sequence[torch.Tensor], counts: Sequence[int], c: Codec, like: torch.Tensor
) -> torch.Tensor:
    """The n decoded chunks, concatenated (decoded in place into one new vector)."""
    out = torch.empty(sum(counts), dtype=torch.float32, device=like.device)
    for p, part in zip(pieces, out.split(list(counts)), strict=True):
        c.decode(p, part.numel(), out=part)
    return out


def all_reduce_inprocess(
    tensors: Sequence[torch.Tensor],
    dtype: str | torch.dtype | Codec,
    block: int = DEFAULT_BLOCK,
    feedback: Sequence[ErrorFeedback] | None = None,
) -> torch.Tensor:
    """The in-process form: all n workers' vectors here; the result every participant of the distributed
    all-reduce gets (bitwise for every codec; float32 sums in rank order)."""
    out = compressed_all_reduce(tensors, dtype, block, InProcessGroup(len(tensors)), feedback)
    assert out is not None
    return out


__all__ = [
    "WIRE_DTYPES",
    "Bystander",
    "GroupOps",
    "InProcessGroup",
    "TorchDistGroup",
    "TorchDistParticipants",
    "WireDtype",
    "all_reduce_inprocess",
    "chunk_sizes",
    "collective",
    "compressed_all_reduce",
    "decode",
    "encode",
    "payload_bytes",
    "piece_bytes",
    "sent_bytes",
    "wire_bytes_all_reduce",
]
