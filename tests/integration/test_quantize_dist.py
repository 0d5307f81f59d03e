"""The compressed all-reduce over real gloo processes equals the in-process one, bitwise, on every rank.

One launch per world size (2 and 4): each process (one thread, a file store in a temporary folder, no
TCP listener) holds every worker's vector, sends its own, and checks the result of every dtype (topk, the
sparse codec, all-gathered), with and without error feedback, in a sub-group, and with two participants
per process, against the in-process computation; float32 (gloo's own all_reduce) is checked against the
sum within rounding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = [(1001, 64), (4096, 256), (3, 256), (0, 64)]  # P, block: odd, whole blocks, P < n, empty
COMPRESSED = ["bfloat16", "float16", "int8", "int4", "topk"]  # topk: blocks of `block`, 1/64 kept


def worker(rank: int, world: int, store: str, out: str) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    from adloco.library.comm.compressed import (
        TorchDistGroup,
        TorchDistParticipants,
        all_reduce_inprocess,
        compressed_all_reduce,
    )
    from adloco.library.comm.quantize import ErrorFeedback

    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    checked: list[str] = []

    def vectors(P: int, seed: int, n: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(P, generator=g) * (1 + 10 * m) for m in range(n)]

    ops = TorchDistGroup()
    for P, block in CASES:
        xs = vectors(P, P + world, world)
        for dtype in COMPRESSED:
            got = compressed_all_reduce([xs[rank]], dtype, block, ops)
            ref = all_reduce_inprocess(xs, dtype, block)
            assert torch.equal(got, ref), (rank, P, block, dtype, (got - ref).abs().max())
            checked.append(f"{dtype}/{P}")
        got = compressed_all_reduce([xs[rank]], "float32", block, ops)
        ref = all_reduce_inprocess(xs, "float32", block)
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)
        checked.append(f"float32/{P}")

    # error feedback: three rounds, every rank's e_m equal to the in-process worker m's
    xs = vectors(777, 1, world)
    for dtype in ("int4", "float16", "topk"):
        mine, everyone = ErrorFeedback(), [ErrorFeedback() for _ in range(world)]
        for r in range(3):
            deltas = [x * (r + 1) for x in xs]
            got = compressed_all_reduce([deltas[rank]], dtype, 32, ops, feedback=[mine])
            ref = all_reduce_inprocess(deltas, dtype, 32, feedback=everyone)
            assert torch.equal(got, ref) and torch.equal(mine.error, everyone[rank].error), (dtype, r)
        checked.append(f"feedback/{dtype}")

    # two participants per process (a process hosting two workers), topk with error feedback
    owner = [p for p in range(world) for _ in range(2)]
    xs = vectors(3000, 3, 2 * world)
    ops2 = TorchDistParticipants(None, owner, rank)
    mine2, everyone2 = [ErrorFeedback(), ErrorFeedback()], [ErrorFeedback() for _ in owner]
    for r in range(2):
        got = compressed_all_reduce(
            [xs[2 * rank] * (r + 1), xs[2 * rank + 1] * (r + 1)], "topk", 256, ops2, mine2
        )
        ref = all_reduce_inprocess([x * (r + 1) for x in xs], "topk", 256, feedback=everyone2)
        assert torch.equal(got, ref) and torch.equal(mine2[1].error, everyone2[2 * rank + 1].error), r
    checked.append("participants/topk")

    # a sub-group of the odd ranks (every rank creates it, as new_group requires)
    odd = list(range(1, world, 2))
    sub = dist.new_group(odd)
    if rank in odd:
        xs = vectors(515, 7, world)
        got = compressed_all_reduce([xs[rank]], "int8", 64, TorchDistGroup(sub, odd))
        assert torch.equal(got, all_reduce_inprocess([xs[r] for r in odd], "int8", 64))
        checked.append("subgroup")
    dist.barrier()
    dist.destroy_process_group()
    Path(out).write_text(json.dumps(checked))


def launch(world: int, tmp: Path) -> list[list[str]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    store = tmp / f"store{world}"
    outs = [tmp / f"out{world}.{r}.json" for r in range(world)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(r), str(world), str(store), str(outs[r])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{logs[r][-3000:]}"
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_equals_in_process_bitwise(world: int, tmp_path: Path) -> None:
    checked = launch(world, tmp_path)
    per_case = [f"{d}/{P}" for P, _ in CASES for d in [*COMPRESSED, "float32"]]
    for r in range(world):
        extra = ["subgroup"] if r % 2 else []
        feedback = ["feedback/int4", "feedback/float16", "feedback/topk", "participants/topk"]
        assert checked[r] == per_case + feedback + extra


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
