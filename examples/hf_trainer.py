"""DiLoCo under a Hugging Face `transformers.Trainer`: a tiny Llama learns byte-level Python source.

    python examples/hf_trainer.py                                          # 2 workers: 2 Trainers in 2 threads
    torchrun --standalone --nproc-per-node 2 examples/hf_trainer.py        # 2 workers: 1 Trainer per process

Every worker runs its own, unmodified `Trainer` (its own model replica, AdamW, scheduler and shard of
the data); every H = 20 optimizer steps the workers all-reduce their pseudo-gradient and take an outer
Nesterov step, and in between they never talk. Written against transformers 5.x; its Trainer needs
accelerate (`pip install accelerate`, in adloco's dev extras).

How it plugs in: the optimizer step hooks of `with algo:`, switched on and off by a `TrainerCallback`.
  * You pass `optimizers=(opt, scheduler)` to `Trainer` and `opt` to `DiLoCo`. `Trainer` wraps `opt` in
    accelerate's `AcceleratedOptimizer` (`Trainer._prepare_for_training` -> `Accelerator.prepare`). The
    Trainer calls its `step()` once per optimizer step, after the last micro-batch of gradient
    accumulation (`Trainer._run_epoch`), and `AcceleratedOptimizer.step` calls `opt.step()` when
    `GradientState.sync_gradients` is set, which the Trainer sets for that micro-batch. The step hooks DiLoCo registers on `opt` fire
    inside `opt.step()`, so H counts exactly the Trainer's optimizer steps, and the synchronization lands
    after the Trainer's gradient clipping and step, before its scheduler step and `zero_grad`.
  * `DiLoCoCallback.on_train_begin` (which runs after `_prepare_for_training`) checks that the optimizer
    the Trainer steps wraps `opt`, that the Trainer is not distributed, and that `max_steps` is a whole
    number of rounds (so training ends on a synchronization), then enters `with algo:`; `on_train_end`
    leaves it.
  * Why not a wrapper optimizer: the Trainer, accelerate and the LR scheduler all reach into the optimizer
    (`param_groups`, `state`, `state_dict`, `load_state_dict` at prepare time), so a wrapper must forward
    all of it and still be a `torch.optim.Optimizer`; the hooks change nothing the Trainer sees. Why not
    sync from `on_optimizer_step` alone: it is the same moment, but adloco's hooks already count steps.

Under torchrun, one Trainer per process, kept from going distributed. accelerate decides that a
process is one of several from environment variables alone (`PartialState._prepare_backend` reads
LOCAL_RANK and WORLD_SIZE, among others). Left as they are, it joins the process group itself and
`Accelerator.prepare_model` wraps the model in DistributedDataParallel (MULTI_CPU here), which
all-reduces every gradient at every step and defeats DiLoCo; the Trainer would also all-gather token
counts and losses. So `hide_launch` removes those variables before `TrainingArguments` is built (its
`__post_init__` sets up accelerate's state), then the script joins torchrun's group itself
(`init_process_group("gloo", rank=..., world_size=...)`; MASTER_ADDR and MASTER_PORT are still set),
which DiLoCo's default communicator uses. Each Trainer sees one process (`args.world_size == 1`, checked
by the callback; no DDP, asserted after training), and as its sampler no longer splits the data, each
worker is handed its own shard (`Dataset.shard(world, rank)`).

In one process, two Trainers in two threads, one `ThreadComm` each on a shared `Hub`. accelerate
keeps process-wide state (`PartialState`, `AcceleratorState`, `GradientState`: Borg singletons), so:
  * every `TrainingArguments` and `Trainer` is built in the main thread, before any training:
    `TrainingArguments.__post_init__` -> `_setup_devices` calls `AcceleratorState._reset_state`, which
    would wipe the state under a Trainer training in another thread. Both Trainers share one
    `TrainingArguments`, so the reset happens once;
  * only `trainer.train()` runs in the threads. Both set the shared `GradientState.sync_gradients`
    before each micro-batch; with `gradient_accumulation_steps=1` it is True at every step, but with
    accumulation one thread would turn it off while the other is about to step, and the step would be
    skipped, so this mode needs `gradient_accumulation_steps=1` (asserted). The dataloaders register in
    a shared list too (`GradientState._add_dataloader`), which only evaluation reads
    (`gather_for_metrics`): evaluate in the main thread, while no thread trains;
  * DiLoCo's constructor is itself a collective (worker 0's θ is broadcast), so each thread builds its
    own `DiLoCo` before training.
The threads show the protocol in one process; they are no faster than the workers one after the
other, often slower (the GIL: at this model size the Trainer's loop is mostly Python).

The model is a `LlamaForCausalLM` from a `LlamaConfig` (random init, float32 as adloco needs,
about 270k parameters); the tokens are bytes (ids 0..255), so no tokenizer is trained or downloaded.
"""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

import datasets
import torch
from _common import corpus, finish
from torch import nn
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    get_cosine_schedule_with_warmup,
)

from adloco import DiLoCo, Hub, Outer, ThreadComm

ROUNDS, H, BATCH, BLOCK = 6, 20, 16, 64  # 120 optimizer steps per worker of 16 rows of 64 bytes
STEPS = ROUNDS * H
# What accelerate reads to decide it runs distributed (PartialState._prepare_backend).
DIST_ENV = ("LOCAL_RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


class DiLoCoCallback(TrainerCallback):
    """Runs the Trainer's optimizer steps under ``algo`` (``with algo:``) for the length of ``train()``."""

    def __init__(self, algo: DiLoCo, optimizer: torch.optim.Optimizer) -> None:
        self.algo, self.optimizer = algo, optimizer

    def on_train_begin(self, args: TrainingArguments, state: Any, control: Any, **kw: Any) -> None:
        stepped = kw.get("optimizer")
        if getattr(stepped, "optimizer", stepped) is not self.optimizer:  # AcceleratedOptimizer wraps ours
            raise ValueError("the Trainer steps another optimizer: give it optimizers=(opt, scheduler)")
        if args.world_size != 1:
            raise ValueError(
                f"the Trainer runs distributed (world size {args.world_size}): accelerate would wrap the model in "
                "DistributedDataParallel and all-reduce every step; hide the launcher's variables (see hide_launch)"
            )
        if state.max_steps % self.algo.H:
            raise ValueError(f"max_steps {state.max_steps}: not a multiple of inner_steps {self.algo.H}")
        self.algo.__enter__()

    def on_train_end(self, args: TrainingArguments, state: Any, control: Any, **kw: Any) -> None:
        self.algo.__exit__(None, None, None)


class LastRound(TrainerCallback):
    """Keeps a copy of the parameters one step before the end: H − 1 steps into the last round."""

    def __init__(self) -> None:
        self.theta: torch.Tensor | None = None

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == state.max_steps - 1:
            self.theta = flat(kw["model"])


def flat(model: nn.Module | None) -> torch.Tensor:
    assert model is not None
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def blocks(data: torch.Tensor) -> datasets.Dataset:
    """Rows of BLOCK byte ids; the labels are the inputs (the model shifts them)."""
    rows = data[: len(data) // BLOCK * BLOCK].view(-1, BLOCK).tolist()
    return datasets.Dataset.from_dict({"input_ids": rows, "labels": rows})


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=BLOCK,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def make_trainer(args: TrainingArguments, train: datasets.Dataset, val: datasets.Dataset) -> Trainer:
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    schedule = get_cosine_schedule_with_warmup(opt, num_warmup_steps=H, num_training_steps=STEPS)
    trainer = Trainer(
        model=model, args=args, train_dataset=train, eval_dataset=val, optimizers=(opt, schedule)
    )
    trainer.remove_callback(PrinterCallback)  # keep the output to the lines below
    return trainer


def train_worker(trainer: Trainer, comm: Any = None) -> tuple[DiLoCo, LastRound]:
    """One worker: DiLoCo over this Trainer's model and optimizer, then the Trainer's own train()."""
    opt = trainer.optimizer
    assert opt is not None
    # comm: the given ThreadComm, else torch.distributed's default group (under torchrun)
    algo = DiLoCo(trainer.model, opt, inner_steps=H, outer=Outer.nesterov(lr=0.7, momentum=0.9), comm=comm)
    last = LastRound()
    trainer.add_callback(DiLoCoCallback(algo, opt))
    trainer.add_callback(last)
    trainer.train()
    assert not isinstance(trainer.model_wrapped, nn.parallel.DistributedDataParallel)
    return algo, last


@dataclass
class Result:
    rank: int
    world: int
    where: str
    trainer: Trainer  # worker 0's on rank 0
    algo: DiLoCo
    before: float
    mids: list[torch.Tensor]  # every worker's θ one step before the last sync
    ends: list[torch.Tensor]  # and after it


def hide_launch() -> tuple[int, int] | None:
    """Under torchrun: (rank, world), and the variables that would make accelerate go distributed removed
    (see the module docstring). Else None."""
    if "WORLD_SIZE" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for name in DIST_ENV:
        os.environ.pop(name, None)
    return rank, world


def in_processes(
    rank: int, world: int, args: TrainingArguments, train: datasets.Dataset, val: datasets.Dataset
) -> Result:
    """This process's worker under torchrun: one Trainer, on its own shard of the data."""
    import torch.distributed as dist

    # Joined after TrainingArguments was built, which would warn about a group the Trainer does not use.
    dist.init_process_group("gloo", rank=rank, world_size=world)
    trainer = make_trainer(args, train.shard(num_shards=world, index=rank), val)
    before = trainer.evaluate()["eval_loss"]
    algo, last = train_worker(trainer)
    assert last.theta is not None
    mids: list[torch.Tensor] = [torch.zeros_like(last.theta) for _ in range(world)]
    ends: list[torch.Tensor] = [torch.zeros_like(last.theta) for _ in range(world)]
    dist.all_gather(mids, last.theta)  # for the printout only: every worker's parameters
    dist.all_gather(ends, flat(trainer.model))
    return Result(rank, world, "processes", trainer, algo, before, mids, ends)


def in_threads(args: TrainingArguments, train: datasets.Dataset, val: datasets.Dataset) -> Result:
    """Two workers in this process: two Trainers built here, each trained in a thread of its own."""
    world = 2
    assert args.gradient_accumulation_steps == 1  # GradientState.sync_gradients is shared
    trainers = [make_trainer(args, train.shard(num_shards=world, index=r), val) for r in range(world)]
    before = trainers[0].evaluate()["eval_loss"]
    hub = Hub(world)
    results: list[Any] = [None] * world

    def run(r: int) -> None:
        try:
            results[r] = train_worker(trainers[r], ThreadComm(hub, r))
        except BaseException as e:
            results[r] = e
            hub.abort()  # the other thread stops waiting in its next collective

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for res in results:
        if isinstance(res, BaseException):
            raise res
    mids = [last.theta for _, last in results]
    ends = [flat(t.model) for t in trainers]
    return Result(0, world, "threads", trainers[0], results[0][0], before, mids, ends)


def main() -> None:
    torch.set_num_threads(1)
    launch = hide_launch()  # before TrainingArguments, which sets up accelerate's state
    train_bytes, val_bytes = corpus()
    train, val = blocks(train_bytes), blocks(val_bytes)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            use_cpu=True,
            max_steps=STEPS,
            per_device_train_batch_size=BATCH,
            per_device_eval_batch_size=64,
            gradient_accumulation_steps=1,
            logging_strategy="no",
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
        )
        r = in_processes(*launch, args, train, val) if launch else in_threads(args, train, val)
        if r.rank == 0:
            after = r.trainer.evaluate()["eval_loss"]
            mid = max(float((m - r.mids[0]).abs().max()) for m in r.mids)
            end = max(float((e - r.ends[0]).abs().max()) for e in r.ends)
            sent = r.algo.totals.bytes / 1e6
            print(f"workers {r.world} ({r.where}), rounds {r.algo.round} of {H} steps, sent {sent:.1f} MB")
            print(f"max |θ_m − θ_0| one step before the last sync {mid:.2e}, after it {end:.2e}")
            print(f"validation loss {r.before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    main()
    finish()
