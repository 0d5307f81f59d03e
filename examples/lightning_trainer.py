"""DiLoCo under a PyTorch Lightning `Trainer`: a small character model learns Python source, with
Lightning's own checkpoints (resume one with `trainer.fit(..., ckpt_path=...)`).

    python examples/lightning_trainer.py                                     # 1 worker
    torchrun --standalone --nproc-per-node 2 examples/lightning_trainer.py   # 2 workers, strategy="ddp"

`AdLoCoCallback(build)` builds DiLoCo over the LightningModule and its optimizer when training starts and
hooks the optimizer's step: every H = 20 optimizer steps the workers average their pseudo-gradient and
take an outer Nesterov step. Under torchrun Lightning joins the process group, gives each process its
own shard of the data and wraps the module in DistributedDataParallel, whose per-step all-reduce the
callback switches off. The callback's state (outer momentum, θ, each worker's inner AdamW state) rides
in Lightning's checkpoints. Needs `pip install 'adloco[lightning]'`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytorch_lightning as pl
import torch
from _common import CharModel, corpus, finish, loss_fn, sample, val_loss
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from adloco import DiLoCo, Outer
from adloco.integrations.lightning import AdLoCoCallback

H, ROUNDS, BATCH = 20, 6, 32
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # every worker starts from the same θ (DiLoCo also broadcasts worker 0's)
        self.model = CharModel()

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        return loss_fn(self.model, (batch[0], batch[1]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def diloco(module: torch.nn.Module, opt: torch.optim.Optimizer) -> DiLoCo:
    return DiLoCo(module, opt, inner_steps=H, outer=Outer.nesterov(lr=0.7, momentum=0.9), batch_size=BATCH)


def fit(train: torch.Tensor, folder: Path, resume: Path | None = None) -> tuple[Module, AdLoCoCallback]:
    """ROUNDS rounds of H steps; a checkpoint every round into folder/ckpt; ``resume``: one to continue."""
    module, callback = Module(), AdLoCoCallback(diloco)
    trainer = pl.Trainer(
        max_steps=ROUNDS * H,
        accelerator="cpu",
        devices=WORLD,
        strategy="ddp" if WORLD > 1 else "auto",
        callbacks=[
            callback,
            ModelCheckpoint(folder / "ckpt", "{step}", every_n_train_steps=H, save_top_k=-1),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
    )
    # windows for the whole run; under torchrun Lightning gives each process its own share of them
    x, y = sample(train, ROUNDS * H * BATCH * WORLD, torch.Generator().manual_seed(0))
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True), ckpt_path=resume)
    return module, callback


def main() -> None:
    torch.set_num_threads(1)
    train, val = corpus()
    with tempfile.TemporaryDirectory() as out:
        before = val_loss(Module().model, val)
        module, callback = fit(train, Path(out))
        algo = callback.algo
        assert algo is not None
        if int(os.environ.get("RANK", "0")) == 0:  # Lightning writes every checkpoint into rank 0's folder
            saved = sorted(p.name for p in (Path(out) / "ckpt").iterdir())
            print(
                f"workers {algo.comm.n_workers}, rounds {algo.round} of {H} steps, sent {algo.totals.bytes / 1e6:.1f} MB"
            )
            print(f"checkpoints {', '.join(saved)}")
            print(f"validation loss {before:.3f} -> {val_loss(module.model, val):.3f}")


if __name__ == "__main__":
    main()
    finish()
