"""A module's parameters and gradients as views of two flat float32 buffers.

Copying θ in and out, forming Δ, clipping, reducing and checking finiteness are then single tensor ops
on P contiguous values. Autograd accumulates into the gradient views in place (as DDP's
``gradient_as_bucket_view`` does), so adloco zeroes gradients, never sets them to None; if a user's
loop does (``optimizer.zero_grad()`` sets them to None by default), :meth:`FlatModule.alias_grads`
re-attaches the views before adloco's next backward pass.

Flattening keeps every ``nn.Parameter`` object (only its storage moves), so an optimizer built on
``model.parameters()`` before or after flattening keeps working. The engine builds its inner optimizer
on :attr:`FlatModule.groups` instead: two tensors (matrices with weight decay, the rest without) rather
than dozens.
"""

from __future__ import annotations

import torch
from torch import nn

# The module's FlatModule lives in the module's own __dict__ (not in a global weak-keyed map, whose
# values would keep their keys, and so every flattened model, alive forever): the two are freed together.
_ATTR = "_adloco_flat"


def flatten(module: nn.Module) -> FlatModule:
    """The module's :class:`FlatModule`, created on first use (the parameters move into it), and again
    when its parameters no longer live in it (a deep copy of the module, or its parameters moved); a
    module sharded with FSDP2 (``fully_shard``: its parameters are DTensors) gets a :class:`ShardedFlat`."""
    flat = module.__dict__.get(_ATTR)
    if not isinstance(flat, FlatModule) or not flat.holds(module):
        flat = ShardedFlat(module) if _sharded(module) else FlatModule(module)
    return flat


def _sharded(module: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    _reshard(module)
    return any(isinstance(p, DTensor) for p in module.parameters())


def _reshard(module: nn.Module) -> None:
    """Put every FSDP2 unit of ``module`` back in its sharded state: after a forward pass without a
    backward one (an evaluation) the root unit keeps its parameters gathered, and they, not the shards,
    are then what ``parameters()`` returns and what the next forward pass uses."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


class FlatModule:
    aliased = True  # the parameters are views of the buffer (ShardedFlat: copies)
    full_numel: int  # the whole model's values (sharded: more than this rank's numel)

    def __init__(self, module: nn.Module) -> None:
        params = list(module.parameters())  # unique: tied weights appear once
        if not params:
            raise ValueError("model: has no parameters")
        if any(p.dtype != torch.float32 for p in params):
            kinds = sorted({str(p.dtype) for p in params})
            raise ValueError(
                f"model: parameters must be float32 (found {', '.join(kinds)}); use mixed precision "
                "(precision='bf16' or 'fp16') instead of converting the model"
            )
        devices = {p.device for p in params}
        if len(devices) > 1:
            raise ValueError(
                f"model: parameters on several devices ({', '.join(map(str, devices))}); a worker holds "
                "a whole replica on one device"
            )
        decay = [p for p in params if p.ndim >= 2]
        other = [p for p in params if p.ndim < 2]
        device = params[0].device
        self.numel = self.full_numel = sum(p.numel() for p in params)
        self.n_decay = sum(p.numel() for p in decay)
        self.param = torch.empty(self.numel, device=device, dtype=torch.float32)  # (P,)
        self.grad = torch.zeros(self.numel, device=device, dtype=torch.float32)  # (P,)
        self.params: list[nn.Parameter] = decay + other  # in flat order
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                view = self.param[offset : offset + n]
                view.copy_(p.detach().reshape(-1))
                p.data = view.view_as(p)
                offset += n
        self.alias_grads()
        self.module = module
        self._make_groups()
        module.__dict__[_ATTR] = self

    def _make_groups(self) -> None:
        """What the engine's inner optimizer sees: two leaf tensors aliasing the flat buffer (matrices with
        weight decay, the rest without), their gradients the flat gradient's."""
        self.groups: list[nn.Parameter] = []
        for lo, hi in ((0, self.n_decay), (self.n_decay, self.numel)):
            if hi > lo:
                g = nn.Parameter(self.param[lo:hi])
                g.grad = self.grad[lo:hi]
                self.groups.append(g)
        self.decay_flags = [True, False] if self.n_decay and self.n_decay < self.numel else [self.n_decay > 0]

    def holds(self, module: nn.Module) -> bool:
        """Whether ``module``'s parameters are this flat buffer's views."""
        base, esize = self.param.data_ptr(), self.param.element_size()
        end = base + self.numel * esize
        params = list(module.parameters())
        return len(params) == len(self.params) and all(
            p is q and p.dtype == torch.float32 and base <= p.data_ptr() < end
            for p, q in zip(sorted(params, key=id), sorted(self.params, key=id), strict=True)
        )

    def alias_grads(self) -> None:
        """Point every parameter's ``.grad`` at its view of the flat gradient (after a user's
        ``zero_grad(set_to_none=True)``, or an optimizer that replaced them)."""
        offset = 0
        first = self.params[0].grad
        if first is not None and first.data_ptr() == self.grad.data_ptr():
            return
        for p in self.params:
            n = p.numel()
            p.grad = self.grad[offset : offset + n].view_as(p)
            offset += n

    def gather_grads(self) -> torch.Tensor:
        """The gradient as a flat (P,) tensor whatever the user's loop did to ``.grad`` (None counts as
        zero): the flat buffer itself when still aliased, else a copy into it."""
        first = self.params[0].grad
        if first is not None and first.data_ptr() == self.grad.data_ptr():
            return self.grad
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                self.grad[offset : offset + n].zero_()
            else:
                self.grad[offset : offset + n].copy_(p.grad.reshape(-1))
            offset += n
        return self.grad

    def scatter_grads(self) -> None:
        """Copy the flat gradient back into parameters whose ``.grad`` is not a view of it."""
        first = self.params[0].grad
        if first is not None and first.data_ptr() == self.grad.data_ptr():
            return
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is not None and p.grad.data_ptr() != self.grad[offset].data_ptr():
                p.grad.copy_(self.grad[offset : offset + n].view_as(p))
            offset += n

    def zero_grad(self) -> None:
        self.alias_grads()
        self.grad.zero_()

    def clone_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state dict with every tensor copied out of the shared flat storage."""
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def push(self) -> None:
        """Nothing: the parameters are views of the buffer (:class:`ShardedFlat` copies)."""

    def after_step(self) -> None:
        """Nothing: the parameters are views of the buffer (:class:`ShardedFlat` copies)."""

    def collect(self) -> None:
        """Nothing: backward accumulates into the buffer's views (:class:`ShardedFlat` copies)."""


class ShardedFlat(FlatModule):
    """The flat buffers of this rank's shards of a module sharded with FSDP2 (ALGORITHM.md §12): P/k values
    (this rank's pieces of every parameter, in flat order), copied rather than aliased, since FSDP owns
    its parameters' storage.

    The buffer is the worker's θ as the round sees it. :meth:`push` copies it into the shards (after
    every write: an optimizer step on :attr:`groups`, a load); after every backward pass :meth:`collect`
    adds the shards' gradients (reduce-scattered by FSDP: the mean over the worker's ranks) into
    :attr:`grad` and clears them, so :attr:`grad` accumulates exactly as the aliased buffer does.
    """

    aliased = False

    def __init__(self, module: nn.Module) -> None:
        _reshard(module)
        params = list(module.parameters())
        kinds = sorted({str(p.dtype) for p in params})
        if kinds != ["torch.float32"]:
            raise ValueError(f"model: parameters must be float32 (found {', '.join(kinds)})")
        decay = [p for p in params if p.ndim >= 2]
        other = [p for p in params if p.ndim < 2]
        self.params = decay + other
        self.locals = [p.to_local() for p in self.params]  # type: ignore[attr-defined]  # FSDP storage
        device = self.locals[0].device
        self.numel = sum(t.numel() for t in self.locals)
        self.n_decay = sum(t.numel() for t in self.locals[: len(decay)])
        self.param = torch.empty(self.numel, device=device, dtype=torch.float32)
        self.grad = torch.zeros(self.numel, device=device, dtype=torch.float32)
        self.module = module
        self.pull()
        self._make_groups()
        # where this rank's values sit in the whole model's flat layout (an unsharded replica's)
        self.full_numel = sum(p.numel() for p in self.params)
        mesh = self.params[0].device_mesh  # type: ignore[attr-defined]
        self.k, self.index = mesh.size(), mesh.get_local_rank()
        if [t.numel() for t in self.locals] != [n for _, _, n in self.pieces(self.index)]:
            raise ValueError(
                "model: sharded other than fully_shard's default (dim 0, in k near-equal chunks)"
            )
        module.__dict__[_ATTR] = self

    def pieces(self, index: int) -> list[tuple[int, int, int]]:
        """(offset in shard ``index``'s buffer, offset in the whole model's flat layout, length) of every
        parameter's piece: fully_shard cuts dim 0 as ``torch.chunk`` does (chunks of ⌈d/k⌉ rows)."""
        out, local, whole = [], 0, 0
        for p in self.params:
            rows = p.shape[0] if p.ndim else 1
            per_row = p.numel() // rows if rows else 0
            chunk = -(-rows // self.k)
            lo, hi = min(index * chunk, rows), min((index + 1) * chunk, rows)
            out.append((local, whole + lo * per_row, (hi - lo) * per_row))
            local += (hi - lo) * per_row
            whole += p.numel()
        return out

    def reshard(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's values of a vector in the whole model's flat layout (a checkpoint's)."""
        return torch.cat([full[g : g + n] for _, g, n in self.pieces(self.index)])

    def unshard(self, local: torch.Tensor, group: object) -> torch.Tensor | None:
        """The whole model's flat vector from every rank's ``local`` values, on the worker's first rank
        (None on the others); every rank of the worker calls it, in the same order."""
        import torch.distributed as dist

        longest = max(sum(n for _, _, n in self.pieces(j)) for j in range(self.k))
        padded = torch.zeros(longest, device=local.device, dtype=local.dtype)
        padded[: local.numel()] = local
        first = dist.get_global_rank(group, 0)  # type: ignore[arg-type]
        parts = [torch.empty_like(padded) for _ in range(self.k)] if self.index == 0 else None
        dist.gather(padded, parts, dst=first, group=group)  # type: ignore[arg-type]
        if parts is None:
            return None
        full = torch.empty(self.full_numel, device=local.device, dtype=local.dtype)
        for j, part in enumerate(parts):
            for lo, g, n in self.pieces(j):
                full[g : g + n] = part[lo : lo + n]
        return full

    def holds(self, module: nn.Module) -> bool:
        _reshard(module)
        params = list(module.parameters())
        return len(params) == len(self.params) and {id(p) for p in params} == {id(p) for p in self.params}

    @torch.no_grad()
    def _copy(self, into_shards: bool) -> None:
        """The buffer into the shards (``into_shards``) or the other way round, every FSDP unit put back
        in its sharded state first."""
        _reshard(self.module)
        offset = 0
        for t in self.locals:
            piece = self.param[offset : offset + t.numel()]
            if into_shards:
                t.copy_(piece.view_as(t))
            else:
                piece.copy_(t.reshape(-1))
            offset += t.numel()

    def push(self) -> None:
        """The buffer into the shards the module computes with."""
        self._copy(into_shards=True)

    @torch.no_grad()
    def collect(self) -> None:
        """grad += the shards' gradients of the last backward pass; theirs cleared for the next."""
        offset = 0
        for p, t in zip(self.params, self.locals, strict=True):
            n = t.numel()
            if p.grad is not None:
                self.grad[offset : offset + n].add_(p.grad.to_local().reshape(-1))  # type: ignore[attr-defined]
                p.grad = None
            offset += n

    # Who steps: the engine's optimizer on :attr:`groups` (the buffer is θ; pushed into the shards after a
    # step), or the user's on the module's own DTensor parameters (the shards are θ; pulled into the
    # buffer after a step). Replica sets it from the optimizer it is given.
    user_steps = False

    def pull(self) -> None:
        """The shards into the buffer (at the start, and after a user's optimizer stepped on them)."""
        self._copy(into_shards=False)

    def after_step(self) -> None:
        """Keep the buffer and the shards equal after an optimizer step: whichever it stepped on is θ."""
        if self.user_steps:
            self.pull()
        else:
            self.push()

    def alias_grads(self) -> None:
        """Nothing to alias: the shards' gradients are collected after each backward pass."""

    def gather_grads(self) -> torch.Tensor:
        return self.grad

    @torch.no_grad()
    def scatter_grads(self) -> None:
        """A user's optimizer steps on the DTensor parameters: give them the buffer's gradient (the
        engine's steps on :attr:`groups`, whose gradients are the buffer's already)."""
        if not self.user_steps:
            return
        offset = 0
        for p, t in zip(self.params, self.locals, strict=True):
            p.grad = like(p, self.grad[offset : offset + t.numel()].clone())
            offset += t.numel()

    def zero_grad(self) -> None:
        self.grad.zero_()
        for p in self.params:
            p.grad = None

    def clone_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole module's state dict, gathered from every shard on the worker's first rank (empty
        elsewhere); every rank of the worker calls it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        self.push()
        full = get_model_state_dict(
            self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return {k: v.detach().clone() for k, v in full.items() if isinstance(v, torch.Tensor)}


def like(p: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """This rank's flat ``values`` of ``p`` shaped as ``p``: a DTensor placed as ``p`` is when it is one
    (a sharded module's gradient or optimizer state), else a view."""
    mesh = getattr(p, "device_mesh", None)
    if mesh is None:
        return values.view_as(p)
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        values.view_as(p.to_local()),  # type: ignore[attr-defined]
        mesh,
        getattr(p, "placements"),  # noqa: B009 - a DTensor's (mypy sees a Tensor)
        run_check=False,
        shape=p.shape,
        stride=p.stride(),
    )
