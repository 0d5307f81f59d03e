"""DiLoCo with workers larger than one device: each worker is a group of ranks holding one replica
sharded with FSDP2 (`fully_shard`), in a plain PyTorch loop.

    torchrun --standalone --nproc-per-node 4 examples/diloco_fsdp.py   # 2 workers x 2 shards

A 2-D device mesh (worker, shard): the ranks of a worker shard its parameters and optimizer state
between them and split its batch, as FSDP always does; every H = 20 steps the workers all-reduce their
pseudo-gradients, each rank its own shard with the ranks of the same shard index in the other workers
(ALGORITHM.md §12). Compared with the unsharded loop (diloco_own_loop.py), what is new is the mesh,
`fully_shard`, and `TorchDistComm(mesh=mesh)`.
"""

from __future__ import annotations

import torch
from _common import CharModel, corpus, distributed, finish, loss_fn, sample, val_loss
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from adloco import DiLoCo, Outer, TorchDistComm

STEPS, H, BATCH, SHARDS = 200, 20, 32, 2


def main() -> None:
    rank, world = distributed()
    if world % SHARDS:
        raise SystemExit(f"run with a multiple of {SHARDS} processes: torchrun --nproc-per-node 4 {__file__}")
    mesh = init_device_mesh("cpu", (world // SHARDS, SHARDS), mesh_dim_names=("worker", "shard"))
    train, val = corpus()
    torch.manual_seed(0)
    model = CharModel()
    for layer in model.mlp:  # each linear layer its own FSDP unit, the rest the root's
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh["shard"])
    fully_shard(model, mesh=mesh["shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    before = val_loss(model, val)
    algo = DiLoCo(
        model, opt, inner_steps=H, comm=TorchDistComm(mesh=mesh), outer=Outer.nesterov(lr=0.7, momentum=0.9)
    )
    data = torch.Generator().manual_seed(rank)  # every rank reads its own part of its worker's batch
    with algo:
        for _ in range(STEPS):
            loss = loss_fn(model, sample(train, BATCH // SHARDS, data))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()  # every H-th step also synchronizes
            opt.zero_grad()
    after = val_loss(model, val)  # every worker holds the same θ after the last sync
    if rank == 0:
        sent = algo.totals.bytes / 1e6
        print(f"workers {algo.comm.n_workers} x {SHARDS} shards, rounds {algo.round}, sent {sent:.2f} MB")
        print(f"validation loss {before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    main()
    finish()
