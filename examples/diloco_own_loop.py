"""DiLoCo in a plain PyTorch loop: your model, your AdamW, your forward/backward/step.

    torchrun --standalone --nproc-per-node 2 examples/diloco_own_loop.py   # 2 workers, one per process
    python examples/diloco_own_loop.py                                       # 1 worker (plain training)

`with algo:` hooks the optimizer's step: every H = 20 steps the workers all-reduce their pseudo-gradient
Δ = θ - θ_m and take an outer Nesterov step; in between they never talk. Compared with your loop
without adloco, two lines are new: building `DiLoCo(...)` and `with algo:`.
"""

from __future__ import annotations

import torch
from _common import CharModel, corpus, distributed, finish, loss_fn, sample, val_loss

from adloco import DiLoCo, Outer

STEPS, H, BATCH = 200, 20, 32


def main() -> None:
    rank, world = distributed()
    train, val = corpus()
    torch.manual_seed(0)
    model = CharModel()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    before = val_loss(model, val)
    # comm: torch.distributed's default group under torchrun, else this process alone
    algo = DiLoCo(model, opt, inner_steps=H, outer=Outer.nesterov(lr=0.7, momentum=0.9))
    data = torch.Generator().manual_seed(rank)  # each worker reads its own samples
    with algo:
        for _ in range(STEPS):
            loss = loss_fn(model, sample(train, BATCH, data))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()  # every H-th step also synchronizes
            opt.zero_grad()
    after = val_loss(model, val)  # every worker holds the same θ after the last sync
    if rank == 0:
        sent = algo.totals.bytes / 1e6
        print(f"workers {world}, rounds {algo.round}, sent {sent:.1f} MB")
        print(f"validation loss {before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    main()
    finish()
