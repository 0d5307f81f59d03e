"""AdLoCo in your own loop: the loop asks adloco how many rows each step needs and hands it the batch;
adloco runs the step (micro-batches, the gradient probe, clipping, your optimizer) and, every H steps,
the outer step, the batch test that grows each trainer's batch, and merges of trainers.

    torchrun --standalone --nproc-per-node 2 examples/adloco_own_loop.py   # 2 workers, one per process
    python examples/adloco_own_loop.py                                       # 2 workers in this process

Two trainers start with one worker each; they merge after round 2 and then share both workers.
"""

from __future__ import annotations

import torch
from _common import CharModel, corpus, distributed, finish, loss_fn, sample, val_loss

from adloco import AdaptiveBatch, AdLoCo, Merging, Outer, Switch

ROUNDS, H = 6, 10


def main() -> None:
    rank, world = distributed()
    train, val = corpus()
    workers = 2 if world == 1 else 1  # without torchrun, simulate both workers in this process
    torch.manual_seed(0)
    models = [CharModel() for _ in range(workers)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1) for m in models]
    before = val_loss(models[0], val)
    algo = AdLoCo(
        models if workers > 1 else models[0],
        opts if workers > 1 else opts[0],
        inner_steps=H,
        trainers=2,
        loss_fn=loss_fn,
        outer=Outer("average"),
        batch=AdaptiveBatch("norm", initial=8, max=256, eta=0.5),
        merge=Merging("smallest", every=2),
        switch=Switch(b_max=64),  # the largest micro-batch a worker runs at once: bigger requests accumulate
    )
    streams = {w: torch.Generator().manual_seed(1000 + w) for w in algo.local_workers}  # worker w's data
    for _ in range(ROUNDS):
        plans = dict(algo.plans)  # which trainer each local worker serves this round, and its batch
        for _ in range(H):
            # a real loop would read the trainer's own data shard: plans[w].trainer, .index, .of
            batches = {w: sample(train, algo.batch_size(w), streams[w]) for w in algo.local_workers}
            algo.step_all(batches)  # the H-th step synchronizes
        report = algo.last_report
        if rank == 0 and report is not None:
            served = {w: p.trainer for w, p in plans.items()}
            merged = f", merged {report.merge.merged}" if report.merge else ""
            print(f"round {algo.round}: requests {algo.requests}, workers here served {served}{merged}")
    model = algo.model_of(algo.alive[0])
    assert model is not None  # every process hosts a worker of the last trainer
    after = val_loss(model, val)
    if rank == 0:
        print(
            f"workers {algo.comm.n_workers}, trainers {len(algo.alive)}, sent {algo.totals.bytes / 1e6:.1f} MB"
        )
        print(f"validation loss {before:.3f} -> {after:.3f}")
        print(f"parameter checksum {float(sum(p.double().abs().sum() for p in model.parameters())):.6f}")


if __name__ == "__main__":
    main()
    finish()
