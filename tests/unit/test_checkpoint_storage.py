"""A checkpoint's tensors through torch.distributed.checkpoint (adloco.engine.checkpoint.storage): a
sharded worker's pieces read back in any layout, and DCP's pickled table read without running code."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from adloco.engine.checkpoint import storage
from adloco.errors import UserError


def _pieces(whole: torch.Tensor, rows: list[int], k: int, index: int, zero: bool = False) -> storage.Pieces:
    """Shard ``index`` of ``k`` of a flat vector of parameters of ``rows`` rows of 3 values each, cut as
    fully_shard cuts dim 0 (chunks of ⌈rows/k⌉ rows), like ShardedFlat.pieces."""
    parts, offset = [], 0
    for r in rows:
        chunk = -(-r // k)
        lo, hi = min(index * chunk, r), min((index + 1) * chunk, r)
        piece = whole[offset + lo * 3 : offset + hi * 3].clone()
        parts.append((torch.zeros_like(piece) if zero else piece, offset + lo * 3))
        offset += r * 3
    return storage.Pieces(whole.numel(), parts)


def test_pieces_of_two_shards_read_back_whole_and_in_three(tmp_path: Path) -> None:
    rows = [5, 2, 7]
    whole = torch.randn(sum(rows) * 3)
    both = _pieces(whole, rows, 2, 0).parts + _pieces(whole, rows, 2, 1).parts  # both ranks' pieces
    where = str(tmp_path / "ck")
    storage.write(
        {"trainer/0/theta": storage.Pieces(whole.numel(), both), "step": torch.tensor([3.0])},
        where,
        None,
        False,
    )
    assert storage.tensors(storage.metadata(where)) == {
        "trainer/0/theta": (torch.Size([whole.numel()]), torch.float32),
        "step": (torch.Size([1]), torch.float32),
    }
    got = {"trainer/0/theta": torch.zeros_like(whole)}
    storage.read(got, where, None)
    assert torch.equal(got["trainer/0/theta"], whole)  # k 2 -> 1
    for index in range(3):  # k 2 -> 3: each shard's pieces, whatever pieces were written
        mine = _pieces(whole, rows, 3, index, zero=True)
        storage.read({"trainer/0/theta": mine}, where, None)
        assert mine.parts and all(torch.equal(t, whole[o : o + t.numel()]) for t, o in mine.parts), index


def test_a_whole_vector_read_as_pieces(tmp_path: Path) -> None:
    rows = [4, 3]
    whole = torch.arange(21, dtype=torch.float32)
    where = f"memory://{tmp_path.name}/ck"
    storage.write({"v": whole}, where, None, background=True).result()  # type: ignore[union-attr]
    mine = _pieces(whole, rows, 2, 1, zero=True)
    storage.read({"v": mine}, where, None)
    assert all(torch.equal(t, whole[o : o + t.numel()]) for t, o in mine.parts)  # k 1 -> 2


def test_a_table_that_would_run_code_is_refused(tmp_path: Path) -> None:
    where = str(tmp_path / "ck")
    storage.write({"v": torch.ones(2)}, where, None, False)
    ran = tmp_path / "RAN"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (Path.touch, (ran,))

    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(UserError, match=r"\.metadata is not DCP's metadata \(refused to build pathlib"):
        storage.metadata(where)
    assert not ran.exists()
