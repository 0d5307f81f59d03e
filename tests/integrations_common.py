"""A tiny Llama trained by a Hugging Face Trainer and by a Lightning Trainer with adloco's callbacks: what
the in-process tests (tests/unit/test_integrations.py) and the two-process one
(tests/integration/test_integrations_dist.py, through integrations_worker.py) both run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adloco import DiLoCo, Outer
from adloco.library.method import AdLoCo
from tests.toy_lm import tiny_llama

H, ROUNDS, BATCH, SEQ = 2, 3, 4, 16
STEPS = H * ROUNDS


@dataclass
class Run:
    algo: AdLoCo
    theta: torch.Tensor  # the parameters at the end
    start: torch.Tensor  # and before training
    mid: torch.Tensor | None  # and one optimizer step before the end (before the last synchronization)


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rows(n: int) -> torch.Tensor:
    """n rows of SEQ token ids with some structure (a counter from a random start)."""
    start = torch.randint(0, 64, (n, 1), generator=torch.Generator().manual_seed(0))
    return (start + torch.arange(SEQ)) % 64


def diloco(model: nn.Module, opt: torch.optim.Optimizer) -> AdLoCo:
    return DiLoCo(model, opt, inner_steps=H, outer=Outer.nesterov(lr=0.7, momentum=0.9))


def hf_run(
    out: Path,
    resume: str | None = None,
    save_steps: int = H,
    max_steps: int = STEPS,
    build: Any = diloco,
) -> Run:
    """A Trainer (its own AdamW and linear schedule) over ``STEPS`` optimizer steps of BATCH rows per process,
    a checkpoint every ``save_steps``; ``resume``: a checkpoint folder under ``out`` to continue from."""
    import datasets
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from adloco.integrations.hf import AdLoCoCallback

    args = TrainingArguments(
        output_dir=str(out),
        use_cpu=True,
        max_steps=max_steps,
        per_device_train_batch_size=BATCH,
        learning_rate=3e-3,
        save_strategy="steps",
        save_steps=save_steps,
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        average_tokens_across_devices=False,
        seed=0,
    )
    data = rows(BATCH * STEPS * world()).tolist()
    model = tiny_llama(positions=SEQ)
    start = flat(model)
    callback = AdLoCoCallback(build)
    mid: list[torch.Tensor] = []

    class LastRound(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == state.max_steps - 1:
                mid.append(flat(model))

    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"input_ids": data, "labels": data}),
        callbacks=[callback, LastRound()],
    )
    trainer.train(resume_from_checkpoint=str(out / resume) if resume else None)
    assert callback.algo is not None
    return Run(callback.algo, flat(model), start, mid[0] if mid else None)


def lightning_run(root: Path, resume: Path | None = None, every: int | None = None) -> Run:
    """A Lightning Trainer over ``STEPS`` optimizer steps of BATCH rows per process, a checkpoint every
    ``every`` (default H) steps into ``root/ckpt``; ``resume``: a checkpoint file to continue from."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    from adloco.integrations.lightning import AdLoCoCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama(positions=SEQ)

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            (ids,) = batch
            return self.model(input_ids=ids, labels=ids).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    module = Tiny()
    start = flat(module)
    callback = AdLoCoCallback(diloco)
    mid: list[torch.Tensor] = []

    class LastRound(pl.Callback):
        def on_train_batch_end(self, trainer: Any, m: Any, *rest: Any) -> None:
            if trainer.global_step == STEPS - 1:
                mid.append(flat(module))

    save = ModelCheckpoint(root / "ckpt", "{step}", every_n_train_steps=every or H, save_top_k=-1)
    n = world()
    trainer = pl.Trainer(
        default_root_dir=root,
        max_steps=STEPS,
        accelerator="cpu",
        devices=n,
        strategy="ddp" if n > 1 else "auto",
        callbacks=[callback, save, LastRound()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    # an epoch is one batch of BATCH rows on every process: Lightning restarts the loader of an epoch
    # it resumes inside, so with one batch an epoch the resumed run sees the batches it would have seen
    loader = DataLoader(TensorDataset(rows(BATCH * n)), batch_size=BATCH)
    trainer.fit(module, loader, ckpt_path=resume)
    assert callback.algo is not None
    return Run(callback.algo, flat(module), start, mid[0] if mid else None)
