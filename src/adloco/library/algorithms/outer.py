"""The outer step on the pseudo-gradient Δ = θ − mean_m θ_m (ALGORITHM.md §1, step 4): any
``torch.optim.Optimizer`` over a trainer's θ, stepped with Δ as its gradient, as torchft's DiLoCo does.

``outer.optimizer`` names a preset (``average``, ``sgd``, ``nesterov``: :class:`OuterSGD`, whose arithmetic
is fixed bit for bit) or, in the library, is a callable that takes the trainer's parameters
(:class:`OuterParams`) and returns any optimizer. :class:`OuterOptimizer` holds what that callable built for
one trainer and is what the round talks to: it steps, takes the trial step of eager overlap, and gives
and takes the optimizer's state as a flat dictionary of tensors (:meth:`OuterOptimizer.state_dict`), which
is what merges weigh, moves send, checkpoints keep and an aborted round restores. No state key is known
by name outside the optimizer.

The flat state: for each state entry ``k`` of the optimizer's per-parameter state, the values of every
parameter that have its shape are laid out as one vector ``k`` in θ's flat layout (ALGORITHM.md §0; a
parameter without it contributes zeros); any other entry (a step counter, a factored statistic) is kept
as ``k.j``, j the parameter's index in the flat layout's order. Numbers come back as 0-dim tensors. The
param groups (the hyperparameters) are the callable's: they are not carried, so a resumed run may change
them (``outer.lr``), and an optimizer that counts in its param groups rather than in its state restarts
that count on a resume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

PRESETS = ("average", "sgd", "nesterov")


class OuterParams(list[torch.Tensor]):
    """What an outer optimizer's callable is given: a list holding one tensor, the trainer's flat
    parameters θ (P float32 values in the flat layout of ALGORITHM.md §0; with ``sync.fragments`` > 1, one
    fragment's values). Pass it to any element-wise optimizer as it is (``torch.optim.SGD(params, ...)``).

    An optimizer that needs the model's shapes (a Muon-style orthogonalized step) takes :meth:`shaped`
    instead: views of the same memory shaped as the model's parameters, in the flat layout's order
    (matrices first), named by :attr:`names`: all of them, or with streaming fragments the whole tensors
    of this fragment (a factory's fragments end between tensors). Not on sharded workers
    (``runtime.shards`` > 1): a rank holds rows of each matrix, and a matrix-aware step on rows is not the
    step on the matrix. Either way the optimizer must keep the very tensors it was given: adloco sets their
    ``.grad`` to the matching views of Δ before each outer step."""

    def __init__(
        self, theta: torch.Tensor, shapes: Sequence[tuple[str, torch.Size]] | None, why: str = ""
    ) -> None:
        super().__init__([theta])
        self._shapes = None if shapes is None else list(shapes)
        self._why = why  # why there are no shapes
        self.asked = False  # whether the factory asked for the shapes (names or shaped())

    @property
    def names(self) -> list[str]:
        """The model's parameter names, in the order of :meth:`shaped`."""
        return [n for n, _ in self._need_shapes()]

    def shaped(self) -> list[torch.Tensor]:
        """Views of θ shaped as the model's parameters, in the flat layout's order."""
        out, offset, theta = [], 0, self[0]
        for _, shape in self._need_shapes():
            n = shape.numel()
            out.append(theta[offset : offset + n].view(shape))
            offset += n
        return out

    def _need_shapes(self) -> list[tuple[str, torch.Size]]:
        self.asked = True
        if self._shapes is None:
            raise ValueError(f"outer.optimizer: params.shaped() has no shapes here: {self._why}")
        return self._shapes


def model_shapes(module: nn.Module, params: Sequence[nn.Parameter]) -> list[tuple[str, torch.Size]]:
    """(name, shape) of a model's ``params`` (in the flat layout's order)."""
    names = {id(p): n for n, p in module.named_parameters()}
    return [(names[id(p)], p.shape) for p in params]


def asks_shapes(
    make: Callable[[OuterParams], torch.optim.Optimizer],
    theta: torch.Tensor,
    shapes: Sequence[tuple[str, torch.Size]],
) -> bool:
    """Whether the factory ``make`` asks for the model's shapes (``params.shaped()`` or ``params.names``)
    when given all of ``theta``: it builds its optimizer once, which is dropped (nothing steps)."""
    params = OuterParams(theta, shapes)
    make(params)
    return params.asked


def shapes_within(
    shapes: Sequence[tuple[str, torch.Size]], part: slice
) -> list[tuple[str, torch.Size]] | None:
    """The tensors of ``shapes`` (the flat layout's, in order) that make up ``part`` of it exactly, or None
    where ``part`` begins or ends inside a tensor."""
    out, offset = [], 0
    for name, shape in shapes:
        end = offset + shape.numel()
        if part.start <= offset and end <= part.stop:
            out.append((name, shape))
        elif offset < part.stop and end > part.start:  # cut by the part's start or stop
            return None
        offset = end
    return out


class OuterSGD(torch.optim.Optimizer):
    """The presets as one torch optimizer, with adloco's arithmetic fixed bit for bit (Δ is the gradient):

    ``average``: θ ← θ − Δ (LocalSGD; SGD with lr 1). ``sgd``: θ ← θ − lr·Δ.
    ``nesterov``: v ← μv + Δ; θ ← θ − lr·Δ − lr·μ·v (PyTorch SGD's Nesterov update, within float32 rounding of
    ``torch.optim.SGD(lr, momentum, nesterov=True)``; v starts at 0 and is float32 whatever dtype Δ travelled
    in, kept as the state entry ``momentum``)."""

    def __init__(self, params: Any, kind: str = "average", lr: float = 1.0, momentum: float = 0.0) -> None:
        if kind not in PRESETS:
            raise ValueError(f"unknown outer optimizer {kind!r}: one of {', '.join(PRESETS)}, or a callable")
        super().__init__(params, {"kind": kind, "lr": lr, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            kind, lr, mu = group["kind"], group["lr"], group["momentum"]
            for theta in group["params"]:
                delta = theta.grad
                if delta is None:
                    continue
                if kind == "average":
                    theta.sub_(delta)
                elif kind == "sgd":
                    theta.sub_(delta, alpha=lr)
                else:
                    state = self.state[theta]
                    if "momentum" not in state:
                        state["momentum"] = torch.zeros_like(theta, dtype=torch.float32)
                    v = state["momentum"]
                    v.mul_(mu).add_(delta)
                    theta.sub_(delta, alpha=lr).sub_(v, alpha=lr * mu)

    @torch.no_grad()
    def trial(self, theta: torch.Tensor, delta: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` ← the θ one step on ``delta`` gives (``theta``: this optimizer's only parameter), its
        state untouched: the eager start, in closed form."""
        group = self.param_groups[0]
        kind, lr, mu = group["kind"], group["lr"], group["momentum"]
        if kind == "average":
            return torch.sub(theta, delta, out=out)
        if kind == "sgd":
            return torch.sub(theta, delta, alpha=lr, out=out)
        v = self.state[theta].get("momentum")  # θ − lr·Δ − lr·μ·(μv + Δ)
        torch.add(delta, v if v is not None else torch.zeros_like(delta), alpha=mu, out=out)
        out.mul_(mu).add_(delta)
        return out.mul_(-lr).add_(theta)


class NotAnOptimizer(ValueError):
    """A factory returned something else than a ``torch.optim.Optimizer``."""

    def __init__(self, made: object) -> None:
        self.reason = f"the factory returned a {type(made).__name__}, not a torch.optim.Optimizer"
        super().__init__(f"outer.optimizer: {self.reason}")


class _Part:
    """The optimizer of one part of θ (a streaming fragment, or all of it) and where its parameters lie."""

    def __init__(self, optimizer: torch.optim.Optimizer, theta: torch.Tensor, start: int) -> None:
        self.optimizer, self.start = optimizer, start
        self.params: list[tuple[torch.Tensor, int]] = []  # each parameter and its offset in θ
        base, size, end = theta.data_ptr(), theta.element_size(), theta.data_ptr() + theta.nbytes
        for group in optimizer.param_groups:
            for p in group["params"]:
                ptr = p.data_ptr()
                if not (base <= ptr < end and p.is_contiguous() and p.dtype == theta.dtype):
                    raise ValueError(
                        "outer.optimizer: the optimizer must step the tensors its callable was given (the flat "
                        "params, or params.shaped()), not copies of them"
                    )
                self.params.append((p, (ptr - base) // size))


class OuterOptimizer:
    """One trainer's outer step: the torch optimizer(s) ``optimizer`` makes (a preset name, with ``lr`` and
    ``momentum``; or a callable ``(OuterParams) -> torch.optim.Optimizer``), one per part of θ (``parts``:
    the streaming fragments; default all of θ), made over the θ it is first given. ``shapes``: the model's
    parameters' names and shapes, for :meth:`OuterParams.shaped` (each part's whole tensors); None, or
    ``why`` not (sharded workers)."""

    def __init__(
        self,
        optimizer: str | Callable[[OuterParams], torch.optim.Optimizer] = "average",
        lr: float = 1.0,
        momentum: float = 0.0,
        *,
        parts: Sequence[slice] | None = None,
        shapes: Sequence[tuple[str, torch.Size]] | None = None,
        why: str = "the model's shapes were not given",
    ) -> None:
        if isinstance(optimizer, str):
            if optimizer not in PRESETS:
                raise ValueError(f"unknown outer optimizer {optimizer!r}: one of {', '.join(PRESETS)}")
            self.kind, self.lr, self.mu = optimizer, lr, momentum
            self.make: Callable[[OuterParams], torch.optim.Optimizer] = self._preset
        elif callable(optimizer):
            self.kind, self.make = "custom", optimizer
        else:
            raise ValueError(f"outer.optimizer = {optimizer!r}: a preset name or a callable")
        self._parts_given, self._shapes, self._why = parts, shapes, why
        self._theta: torch.Tensor | None = None
        self._parts: list[_Part] = []
        self._held: dict[str, torch.Tensor] = {}  # a state loaded before there was a θ to hold it

    def _preset(self, params: OuterParams) -> torch.optim.Optimizer:
        return OuterSGD(params, self.kind, self.lr, self.mu)

    # -- binding to θ ----------------------------------------------------------------------------------
    def _bind(self, theta: torch.Tensor) -> None:
        """Make the optimizers over ``theta`` (again, if θ is another tensor now: the state goes along)."""
        if theta is self._theta:
            return
        state = self.state_dict()
        n = theta.numel()
        parts = self._parts_given or [slice(0, n)]
        self._theta, self._parts = theta, []
        for part in parts:
            start, stop, _ = part.indices(n)
            shapes, why = None, self._why
            if self._shapes is not None:
                shapes = shapes_within(self._shapes, slice(start, stop))
                why = (
                    f"the streaming fragment θ[{start}:{stop}] begins or ends inside a tensor (the model has "
                    "too few tensors for every one of sync.fragments to end between them)"
                )
            params = OuterParams(theta[start:stop], shapes, why)
            made = self.make(params)
            if not isinstance(made, torch.optim.Optimizer):
                raise NotAnOptimizer(made)
            self._parts.append(_Part(made, theta, start))
        self._held = {}
        self.load_state_dict(state)

    def _part(self, theta: torch.Tensor, part: slice) -> _Part:
        self._bind(theta)
        start = part.indices(theta.numel())[0]
        for p in self._parts:
            if p.start == start:
                return p
        raise ValueError(f"outer optimizer: no part of θ starts at {start}")

    def _params(self) -> Iterator[tuple[int, torch.optim.Optimizer, torch.Tensor, int]]:
        """Every parameter (its index in the flat layout's order, its optimizer, itself, its offset)."""
        j = 0
        for part in self._parts:
            for p, offset in part.params:
                yield j, part.optimizer, p, offset
                j += 1

    # -- the step --------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, theta: torch.Tensor, delta: torch.Tensor, part: slice = slice(None)) -> None:
        """θ[part] stepped on ``delta`` (Δ of that part: a streaming fragment's): each parameter's ``.grad``
        is its view of Δ for the step."""
        got = self._part(theta, part)
        for p, offset in got.params:
            rel = offset - got.start
            p.grad = delta[rel : rel + p.numel()].view(p.shape)
        try:
            got.optimizer.step()
        finally:
            for p, _ in got.params:
                p.grad = None

    @torch.no_grad()
    def trial(self, theta: torch.Tensor, delta: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` ← the θ that :meth:`step` would give, leaving θ and the state as they are (the eager
        outer step of one worker's own Δ, ALGORITHM.md §13); returns ``out``. A preset takes it in closed
        form; any other optimizer steps a twin made by the same callable over ``out``, on a deep copy of
        the state (an optimizer whose step depends on more than its state and θ cannot be eager)."""
        self._bind(theta)
        first = self._parts[0].optimizer
        if isinstance(first, OuterSGD) and len(self._parts) == 1:
            return first.trial(self._parts[0].params[0][0], delta, out)
        twin = OuterOptimizer(self.make, parts=self._parts_given, shapes=self._shapes, why=self._why)
        out.copy_(theta)
        twin.load_state_dict({k: v.clone() for k, v in self.state_dict().items()})
        twin.step(out, delta)
        return out

    # -- its state -------------------------------------------------------------------------------------
    @property
    def has_state(self) -> bool:
        """Whether the optimizer keeps any state (a momentum, a step count...)."""
        return bool(self.state_dict())

    @property
    def v(self) -> torch.Tensor | None:
        """The presets' momentum (``nesterov``), or None."""
        return self.state_dict().get("momentum")

    def layout(self, numel: int) -> dict[str, tuple[list[int], torch.dtype]] | None:
        """The flat state's entries, shapes and dtypes, where known without a step (the presets), else None:
        then they are what :meth:`state_dict` holds once the optimizer stepped."""
        if self.kind == "custom":
            return None
        return {"momentum": ([numel], torch.float32)} if self.kind == "nesterov" else {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The optimizer's per-parameter state as flat tensors (module docstring): a vector in θ's flat layout
        per entry of the parameters' shape, ``k.j`` for any other; no param groups."""
        if self._theta is None:
            return dict(self._held)
        n = self._theta.numel()
        spread: dict[str, list[tuple[int, torch.Tensor]]] = {}
        out: dict[str, torch.Tensor] = {}
        for j, opt, p, offset in self._params():
            for k, v in opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.shape == p.shape:
                    spread.setdefault(k, []).append((offset, v))
                elif isinstance(v, torch.Tensor | int | float):
                    out[f"{k}.{j}"] = torch.as_tensor(v)
                else:
                    raise ValueError(
                        f"outer optimizer state {k!r}: {type(v).__name__}, not a tensor or a number"
                    )
        for k, segments in spread.items():
            (offset, first), *rest = segments
            if not rest and offset == 0 and first.dim() == 1 and first.numel() == n:
                out[k] = first  # one flat parameter: its state as it is
                continue
            whole = torch.zeros(n, dtype=first.dtype, device=first.device)
            for offset, v in segments:
                whole[offset : offset + v.numel()] = v.reshape(-1)
            out[k] = whole
        return dict(sorted(out.items()))

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """The optimizer's state from :meth:`state_dict` (copied; an empty one clears it). A state for a
        preset that keeps none (``average``, ``sgd``) is refused rather than dropped: it was saved with
        another outer step, whose momentum would silently be lost."""
        if self.kind in ("average", "sgd") and state:
            raise ValueError(
                f"outer state: holds {', '.join(sorted(state))}, but outer.optimizer is {self.kind!r}, which "
                "keeps none (DiLoCo's preset is 'sgd' under sync.overlap delayed); load it with the outer "
                "step it was saved with (for example outer.optimizer='nesterov')"
            )
        if self._theta is None:
            self._held = {k: v.detach().clone() for k, v in state.items()}
            return
        own = {k: v.detach().to(self._theta.device, copy=True) for k, v in state.items()}
        for j, opt, p, offset in self._params():
            entry: dict[str, Any] = {}
            for k, v in own.items():
                name, _, index = k.rpartition(".")
                if index.isdigit() and name:
                    if int(index) == j:
                        entry[name] = v
                else:
                    entry[k] = v[offset : offset + p.numel()].view(p.shape)
            opt.state.pop(p, None)
            if entry:
                opt.state[p] = entry


def state_bytes(make: Callable[[OuterParams], torch.optim.Optimizer]) -> float:
    """Bytes of state per value of θ that the optimizers ``make`` builds keep once they stepped, by a probe:
    one step over a small θ (a 16 × 16 matrix and a 16-vector, flat or shaped, on the CPU). Counted: the
    state tensors of a parameter's shape (a momentum, Adam's two moments), which grow with θ; not counted:
    numbers and smaller statistics (a step count, a factored second moment), which grow with the tensors.
    What the memory estimate adds per trainer for a factory (:func:`adloco.config.checks.outer_state`)."""
    shapes = [("probe.weight", torch.Size([16, 16])), ("probe.bias", torch.Size([16]))]
    n = sum(shape.numel() for _, shape in shapes)
    outer = OuterOptimizer(make, shapes=shapes)
    delta = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 1e-3
    outer.step(torch.zeros(n), delta)
    kept = 0
    for _, opt, p, _ in outer._params():
        for v in opt.state.get(p, {}).values():
            if isinstance(v, torch.Tensor) and v.shape == p.shape:
                kept += v.numel() * v.element_size()
    return kept / n
