"""A worker's inner optimizer state in the flat layout (ALGORITHM.md §6: what a state holds).

The engine keeps a replica's parameters as one flat buffer (:mod:`adloco.library.flat`); the inner optimizer keeps
its state per tensor it updates. These functions map one to the other: where each optimized tensor lies in
the buffer (:func:`offsets`), the whole state as flat tensors for checkpoints, merges and moves
(:func:`flat_state`), and back (:func:`load_flat_state`). :class:`adloco.library.replica.Replica` calls them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from adloco.library.flat import FlatModule, ShardedFlat, like

HELD = ".held"  # an entry's companion: which optimized tensors hold it (flat_state)
Offsets = list[tuple[torch.Tensor, int, int]]  # (optimized tensor, offset in the flat buffer, values)


def offsets(optimizer: torch.optim.Optimizer, flat: FlatModule) -> Offsets:
    """(tensor, offset in the flat buffer, values in the buffer) of every tensor the optimizer updates.

    A sharded model's (ALGORITHM.md §12) optimizer may be the engine's, on the buffer's groups, or the
    user's, on the model's own DTensor parameters: then those hold θ and the buffer follows them."""
    if isinstance(flat, ShardedFlat):
        where = {id(p): (off, n) for p, (off, _, n) in zip(flat.params, flat.pieces(flat.index), strict=True)}
        mine = [p for g in optimizer.param_groups for p in g["params"]]
        if mine and all(id(p) in where for p in mine):
            flat.user_steps = True
            out = [(p, *where[id(p)]) for p in mine]
            if len({id(p) for p in mine}) != len(flat.params):
                raise ValueError("inner_optimizer: build it on all of model.parameters()")
            return out
    base, esize = flat.param.data_ptr(), flat.param.element_size()
    end = base + flat.numel * esize
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not (base <= p.data_ptr() < end):
                raise ValueError(
                    "inner_optimizer: updates a tensor that is not one of the model's parameters; build it "
                    "on model.parameters()"
                )
            out.append((p, (p.data_ptr() - base) // esize, p.numel()))
    covered = sum(n for _, _, n in out)
    if covered != flat.numel:
        raise ValueError(
            f"inner_optimizer: updates {covered:,} of the model's {flat.numel:,} parameter values; "
            "build it on all of model.parameters(), or give several that share them (a list per model: "
            "Muon on the matrices, AdamW on the rest)"
        )
    return out


def flat_state(
    optimizer: torch.optim.Optimizer, where: Offsets, numel: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """The optimizer's state as flat tensors: every per-parameter buffer as one (P,) tensor in the flat
    layout, scalar entries (``step``) as one value per optimized tensor; empty before the first step or
    after a reset. An entry that only some optimized tensors hold (Muon's momentum beside AdamW's moments,
    :mod:`adloco.library.optim`) is zero where the others lie, and ``<entry>.held`` (one 0/1 value per optimized
    tensor) says which hold it."""
    states = [optimizer.state.get(p, {}) for p, _, _ in where]
    if not all(states):
        return {}
    keys = list(dict.fromkeys(k for s in states for k, v in s.items() if isinstance(v, torch.Tensor)))
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        held = [isinstance(s.get(key), torch.Tensor) for s in states]
        if sum(held) == 0:
            continue
        v0 = next(s[key] for s, h in zip(states, held, strict=True) if h)
        if v0.dim() == 0:
            zero = torch.zeros((), dtype=torch.float32)
            out[key] = torch.stack(
                [
                    s[key].detach().to("cpu", torch.float32).reshape(()) if h else zero
                    for s, h in zip(states, held, strict=True)
                ]
            )
        else:
            make = torch.empty if all(held) else torch.zeros
            flat = make(numel, device=device, dtype=torch.float32)
            for (_, off, n), s, h in zip(where, states, held, strict=True):
                if h:
                    flat[off : off + n].copy_(local(s[key]).reshape(-1))
            out[key] = flat
        if not all(held):
            out[f"{key}{HELD}"] = torch.tensor(held, dtype=torch.float32)
    return out


def load_flat_state(
    optimizer: torch.optim.Optimizer,
    where: Offsets,
    numel: int,
    device: torch.device,
    state: Mapping[str, torch.Tensor],
) -> None:
    """The optimizer's state from :func:`flat_state`'s tensors (cleared first; left empty for an empty
    state)."""
    optimizer.state.clear()
    if not state:
        return
    held = {k.removesuffix(HELD): v for k, v in state.items() if k.endswith(HELD)}
    values = {k: v for k, v in state.items() if not k.endswith(HELD)}
    # step counts live on the host, except for fused or capturable optimizers (on the parameter's device)
    on_device = any(g.get("fused") or g.get("capturable") for g in optimizer.param_groups)
    for i, (p, off, n) in enumerate(where):
        entry: dict[str, torch.Tensor] = {}
        for key, v in values.items():
            if key in held and not bool(held[key][i]):
                continue
            if v.dim() == 1 and v.numel() == len(where) and v.numel() != numel:
                entry[key] = v[i].detach().to(p.device if on_device else "cpu", copy=True)
            else:
                entry[key] = like(p, v[off : off + n].to(device, copy=True))
        optimizer.state[p] = entry


def local(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's values on this rank; a tensor itself."""
    return (x.to_local() if hasattr(x, "to_local") else x).detach()
