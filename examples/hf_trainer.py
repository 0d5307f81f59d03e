"""DiLoCo under a Hugging Face `transformers.Trainer`: a tiny Llama learns byte-level Python source.

    python examples/hf_trainer.py                                          # 2 workers: 2 Trainers in 2 threads
    torchrun --standalone --nproc-per-node 2 examples/hf_trainer.py        # 2 workers: 1 Trainer per process

Every worker runs its own, unmodified `Trainer` (its own model replica, AdamW, scheduler and shard of
the data); every H = 20 optimizer steps the workers all-reduce their pseudo-gradient and take an outer
Nesterov step, and in between they never talk. Written against transformers 5.x; its Trainer needs
accelerate (`pip install accelerate`, in adloco's dev extras).

How it plugs in: `adloco.integrations.hf.AdLoCoCallback(build)`. At the start of `train()` it calls
`build(model, optimizer)` with the Trainer's model and optimizer (here DiLoCo over them) and enters the
algorithm's hooked form (`with algo:`): the hooks fire inside the Trainer's `optimizer.step()`, so H
counts the Trainer's optimizer steps; at the end of `train()` it leaves it. It also keeps the algorithm's
state in the Trainer's checkpoints (see docs/guides/hf-trainer.md).

Under torchrun, one Trainer per process, and accelerate as it always runs there: it joins torchrun's
process group (which DiLoCo's default communicator uses), gives each process its own share of the data,
and wraps the model in DistributedDataParallel, whose per-step gradient all-reduce the callback switches
off. `average_tokens_across_devices=False` keeps each worker's loss its own (the Trainer would otherwise
all-gather token counts at every step).

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
    (`gather_for_metrics`): evaluate in the main thread, while no thread trains.
The threads show the protocol in one process; they are no faster than the workers one after the
other, often slower (the GIL: at this model size the Trainer's loop is mostly Python).

The model is a `LlamaForCausalLM` from a `LlamaConfig` (random init, float32 as adloco needs,
about 270k parameters); the tokens are bytes (ids 0..255), so no tokenizer is trained or downloaded.
"""

from __future__ import annotations

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
from adloco.integrations.hf import AdLoCoCallback

ROUNDS, H, BATCH, BLOCK = 6, 20, 16, 64  # 120 optimizer steps per worker of 16 rows of 64 bytes
STEPS = ROUNDS * H


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
    """One worker: the Trainer's own train(), with DiLoCo over its model and optimizer."""

    def build(model: nn.Module, opt: torch.optim.Optimizer) -> DiLoCo:
        # comm: the given ThreadComm, else torch.distributed's default group (under torchrun)
        return DiLoCo(model, opt, inner_steps=H, outer=Outer.nesterov(lr=0.7, momentum=0.9), comm=comm)

    algo, last = AdLoCoCallback(build), LastRound()
    trainer.add_callback(algo)
    trainer.add_callback(last)
    trainer.train()
    assert algo.algo is not None
    return algo.algo, last


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


def in_processes(args: TrainingArguments, train: datasets.Dataset, val: datasets.Dataset) -> Result:
    """This process's worker under torchrun: one Trainer; accelerate shares the data out by process."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()  # the group accelerate joined
    trainer = make_trainer(args, train, val)
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
            average_tokens_across_devices=False,  # each worker's loss its own, no all-gather a step
        )  # under torchrun, accelerate joins the process group here
        r = in_processes(args, train, val) if args.world_size > 1 else in_threads(args, train, val)
        after = r.trainer.evaluate()["eval_loss"]  # every process: evaluation gathers across them
        if r.rank == 0:
            mid = max(float((m - r.mids[0]).abs().max()) for m in r.mids)
            end = max(float((e - r.ends[0]).abs().max()) for e in r.ends)
            sent = r.algo.totals.bytes / 1e6
            print(f"workers {r.world} ({r.where}), rounds {r.algo.round} of {H} steps, sent {sent:.1f} MB")
            print(f"max |θ_m − θ_0| one step before the last sync {mid:.2e}, after it {end:.2e}")
            print(f"validation loss {r.before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    main()
    finish()
