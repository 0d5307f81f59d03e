"""Sizing: parameter counts of the presets, the memory lower bound, and where a config is refused."""

from __future__ import annotations

import pytest
import torch

from adloco.config import resolve
from adloco.errors import UserError
from adloco.models import sizing

GIB = 2**30


@pytest.mark.parametrize("name", list(sizing.SHAPES))
def test_parameter_count_of_every_preset_is_the_built_models(name: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    for vocab in (300, 4096):
        with torch.device("meta"):  # shapes only: the 300M preset allocates nothing
            model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, **sizing.SHAPES[name]))
        assert sizing.llama_parameters(sizing.SHAPES[name], vocab) == sum(
            p.numel() for p in model.parameters()
        )


def test_the_estimate_counts_replicas_optimizer_state_and_one_step() -> None:
    est = sizing.estimate(1000, replicas=4, optimizer="adamw", trainers=2)
    objects = sizing.REPLICA_OBJECTS_PER_LAYER
    assert est.state == 4 * (4 * 4 * 1000 + objects) + 2 * 4 * 1000 and est.step == 0
    sgd = sizing.estimate(1000, replicas=1, optimizer="sgd", momentum=0.0)
    assert sgd.state == 2 * 4 * 1000 + objects  # parameters and gradients only
    step = sizing.estimate(10, 1, micro_batch=2, step_rows=8, seq_len=16, per_token=100)
    assert step.step == 2 * 16 * 100 + 8 * 16 * 8 and step.total == step.state + step.step
    assert sizing.optimizer_buffers("adamw") == 2 and sizing.optimizer_buffers("sgd", 0.9) == 1
    assert sizing.optimizer_buffers("sgd", 0.0) == 0
    assert sizing.optimizer_buffers("muon", 0.0) == 1  # its own momentum, whatever SGD's inner.momentum says
    probes = sizing.estimate(1000, replicas=2, optimizer="sgd", momentum=0.9, probe_gradients=8)
    assert probes.state == 2 * ((2 + 1 + 8) * 4 * 1000 + objects)


def test_physical_memory_is_this_machines() -> None:
    assert 2**28 < sizing.physical_memory() < 2**50


def test_the_engine_can_check_a_built_model() -> None:
    """After the model is built its parameter count is exact: the same function judges it."""
    est = sizing.estimate(10**9, replicas=8, optimizer="adamw", trainers=8)
    with pytest.raises(UserError) as e:
        sizing.refuse_if_over(est, 64 * GIB, "this machine has", "algorithm.workers", 8, "'my/model'")
    assert str(e.value) == (
        "config: algorithm.workers = 8: 8 replicas of 'my/model' (1.0B parameters) need ~149 GiB of "
        "parameters, gradients and optimizer state; this machine has 64.0 GiB of memory"
    )
    sizing.refuse_if_over(est, 256 * GIB, "this machine has", "algorithm.workers", 8, "'my/model'")


def test_defaults_fit_and_checkpoints_are_judged_once_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "physical_memory", lambda: 4 * GIB)
    resolve()  # the embedded default fits a small machine
    resolve(None, ["model.name=some/checkpoint", "algorithm.workers=100000", "algorithm.trainers=1"])


def test_a_gpu_larger_than_the_machine_counts_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "physical_memory", lambda: 16 * GIB)
    monkeypatch.setattr(sizing, "cuda_memory", lambda: 80 * GIB)
    big = ["model.name=microllama-300m", "data.tokenizer=bpe:32000", "inner.optimizer=adamw"]
    resolve(None, big)  # device auto: the replicas may live on the 80 GiB GPU
    with pytest.raises(UserError, match=r"this machine has 16\.0 GiB of memory$"):
        resolve(None, [*big, "runtime.device=cpu"])
    with pytest.raises(
        UserError, match=r"^config: algorithm.workers = 20: 20 replicas .* the GPU has 80\.0 GiB"
    ):
        resolve(None, [*big, "algorithm.workers=20"])


def test_under_torchrun_a_machine_holds_its_local_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "physical_memory", lambda: 16 * GIB)
    monkeypatch.setattr(sizing, "cuda_memory", lambda: None)
    sets = ["model.name=microllama-300m", "data.tokenizer=bpe:32000", "runtime.device=cpu"]
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    resolve(None, sets)  # 4 machines with one worker each: one replica here
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(UserError, match=r"^config: algorithm.workers = 4: 4 replicas of microllama-300m"):
        resolve(None, sets)
