"""Models that start sharded (ALGORITHM.md §12): with runtime.shards = k every rank builds its worker's
replica on the meta device, shards it and materializes its own rows only, with exactly the values an
unsharded run starts from. A rank of k is emulated in this process with torch's fake process group
(collectives do nothing; building a replica needs none), one rank after another."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from adloco.engine.build import build_replicas
from adloco.library.comm.inprocess import InProcessComm
from adloco.models import ModelFactory
from adloco.models.meta import InitPlan, NotReplayable
from tests.helpers import synthetic_data, tiny_config

CPU = torch.device("cpu")


def _rows(full: torch.Tensor, index: int, k: int) -> torch.Tensor:
    """Shard ``index`` of ``k`` as fully_shard cuts dim 0 (torch.chunk's chunks of ⌈d/k⌉ rows)."""
    rows = full.shape[0]
    chunk = -(-rows // k)
    return full[min(index * chunk, rows) : min((index + 1) * chunk, rows)]


def _ranks(k: int) -> Iterator[tuple[int, Any]]:
    """Each shard index of a worker of k ranks in turn: (index, that rank's 1-D shard mesh)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    for index in range(k):
        dist.init_process_group("fake", store=FakeStore(), rank=index, world_size=k)
        try:
            yield index, init_device_mesh("cpu", (k,))
        finally:
            dist.destroy_process_group()


def _sharded_comm(worker: int, k: int, mesh: Any) -> Any:
    """What build_replicas reads of a sharded TorchDistComm (the worker this rank belongs to, k, the mesh)."""
    return SimpleNamespace(local_workers=[worker], shards=SimpleNamespace(size=k), mesh={"shard": mesh})


def _whole_build_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def whole(self: Any, seed: int) -> nn.Module:
        raise AssertionError("the whole model was built")

    monkeypatch.setattr(ModelFactory, "build", whole)


CASES = {
    # llama-tiny: tied embeddings (the LM head's own draws are made, then dropped), 4096-row vocabulary
    "same": ({"model": {"name": "llama-tiny", "init": "same"}}, 2, "causal_lm"),
    # one seed per trainer; k = 3 cuts no dim evenly (64 rows of vocabulary, 128 of hidden)
    "independent": ({"model": {"name": "llama-tiny", "init": "independent"}}, 3, "causal_lm"),
    # classification: a padding row (a partial write) and a redrawn head per trainer
    "reinit_output": (
        {
            "model": {
                "name": "llama-micro",
                "init": "independent",
                "reinit_output": True,
                "task": "classification",
            }
        },
        2,
        "classification",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_rank_starts_from_its_rows_of_the_unsharded_start(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sections, k, task = CASES[case]
    cfg = tiny_config(**{**sections, "algorithm": {"workers": 2, "trainers": 2}})
    data = synthetic_data()
    labels = 3 if task == "classification" else 0
    factory = ModelFactory(cfg.model, data.vocab_size, cfg.data.seq_len, data.eos_id, data.pad_id, labels)
    whole = build_replicas(cfg, InProcessComm(2), factory, CPU)  # the unsharded run's two workers
    if case != "same":  # the two trainers start apart (their seeds, or their heads, differ)
        assert any(
            not torch.equal(a, b) for a, b in zip(whole[0].parameters(), whole[1].parameters(), strict=True)
        )
    _whole_build_refused(monkeypatch)
    for worker in (0, 1):
        ref = dict(whole[worker].named_parameters())
        buffers = dict(whole[worker].named_buffers())
        for index, mesh in _ranks(k):
            said: list[str] = []
            (model,) = build_replicas(cfg, _sharded_comm(worker, k, mesh), factory, CPU, said.append)
            assert said == []
            names = [n for n, _ in model.named_parameters()]
            assert names == list(ref)
            for name, p in model.named_parameters():
                assert p.device_mesh is not None  # a DTensor, sharded
                assert torch.equal(p.to_local(), _rows(ref[name], index, k)), (case, worker, index, name)
            for name, b in model.named_buffers():
                assert torch.equal(b, buffers[name]), name


def test_a_checkpoint_is_loaded_whole_then_sharded_and_said_so(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, intermediate_size=32, **shape)).save_pretrained(
        tmp_path / "m"
    )
    cfg = tiny_config(**{"model": {"name": str(tmp_path / "m")}, "algorithm": {"workers": 1, "trainers": 1}})
    factory = ModelFactory(cfg.model, 64, cfg.data.seq_len, 0, 0)
    ref = dict(factory.build(0).named_parameters())
    for index, mesh in _ranks(2):
        said: list[str] = []
        (model,) = build_replicas(cfg, _sharded_comm(0, 2, mesh), factory, CPU, said.append)
        assert said == [
            f"runtime.shards = 2: every rank builds the whole model, then shards it (model.name = "
            f"{str(tmp_path / 'm')!r} is a checkpoint, loaded whole)"
        ]
        for name, p in model.named_parameters():
            assert torch.equal(p.to_local(), _rows(ref[name], index, 2)), name


class _Layers(nn.Module):
    """Constructor draws, overwritten whole, then partly (a padding row, a slice)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 6, padding_idx=3)
        self.lin = nn.Linear(6, 5)
        self.norm = nn.LayerNorm(5)
        self.extra = nn.Parameter(torch.ones(4, 3))
        self.dropped = nn.Linear(6, 6)  # drawn, then replaced: its draws still move the generator
        with torch.no_grad():
            self.lin.weight.uniform_(-1, 1).mul_(0.5).add_(0.25)  # written whole, then read and written
            self.extra[1:].normal_()
            self.dropped = nn.Linear(6, 2)


def test_replay_gives_the_values_of_the_build_one_storage_at_a_time() -> None:
    plan = InitPlan.record(_Layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        ref = dict(_Layers().named_parameters())
    got: dict[str, torch.Tensor] = {}
    for values in plan.replay(11):
        assert len(values) == 1  # one parameter at a time
        got.update({n: v.clone() for n, v in values.items()})
    assert got.keys() == ref.keys()
    for name, value in got.items():
        assert torch.equal(value, ref[name]), name


class _Orthogonal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(4, 4))
        nn.init.orthogonal_(self.w)  # a QR decomposition, copied in


class _OwnGenerator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(4, 4))
        with torch.no_grad():
            self.w.normal_(generator=torch.Generator().manual_seed(0))


class _Unset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(4, 4))
        with torch.no_grad():
            self.w[0].zero_()


class _Computed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4) * 2)


@pytest.mark.parametrize(
    ("build", "why"),
    [
        (_Orthogonal, "reads another tensor"),
        (_OwnGenerator, "draws from a generator of its own"),
        (_Unset, "parameter w is never written whole"),
        (_Computed, "parameter w is never written whole"),
    ],
)
def test_what_cannot_be_replayed_is_refused(build: type[nn.Module], why: str) -> None:
    with pytest.raises(NotReplayable, match=why):
        InitPlan.record(build)
