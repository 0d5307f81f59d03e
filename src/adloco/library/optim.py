"""Several torch optimizers as one, and Muon for a model's hidden matrices with AdamW for the rest
(ALGORITHM.md §1, step 2).

A worker takes one ``torch.optim.Optimizer`` (:class:`adloco.library.replica.Replica`). Muon (``torch.optim.Muon``,
Jordan et al. 2024; "Muon is Scalable for LLM Training", arXiv 2502.16982) orthogonalizes the update of a
2-D weight matrix and is meant for the hidden layers only: embeddings, the output head, norms and biases
step with AdamW, as Keller Jordan's reference, Moonlight and torch's own documentation split them. The
two optimizers become one through :class:`CombinedOptimizer`; :func:`muon_adamw` builds the usual pair
for a model, :func:`muon_split` only says which parameters go where (to build your own).

:class:`Muon` is ``torch.optim.Muon`` with one choice added, the dtype of its Newton–Schulz iterations:
torch's runs them in bfloat16 always, which a CPU without native bfloat16 matmuls (no AVX512-BF16 or AMX)
emulates at many times a float32 matmul's cost (RESULTS, "Muon's Newton–Schulz on a CPU").
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

MuonAdjust = Literal["match_rms_adamw", "original"]
NsDtype = Literal["auto", "bfloat16", "float32"]
NS_DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
NS_CHOICES = ("auto", *NS_DTYPES)


@functools.cache
def emulates_bfloat16() -> bool:
    """Whether this machine's CPU lacks native bfloat16 matmuls (no AVX512-BF16 or AMX), so that it
    emulates them at many times a float32 matmul's cost; True where torch cannot say."""
    try:
        return not bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


def ns_dtype_for(ns_dtype: str, device_type: str) -> str:
    """The dtype Muon's Newton–Schulz iterations run in on a ``device_type`` device: ``auto`` is bfloat16
    (torch's) wherever it is computed natively, float32 on a CPU that emulates bfloat16 matmuls
    (:func:`emulates_bfloat16`), where it trains alike at several times less cost (benchmarks/RESULTS.md,
    Muon's Newton–Schulz on a CPU); bfloat16 and float32 are themselves."""
    if ns_dtype != "auto":
        return ns_dtype
    return "float32" if device_type == "cpu" and emulates_bfloat16() else "bfloat16"


def newton_schulz(
    update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """Muon's quintic Newton–Schulz iteration on a 2-D ``update``, in ``dtype``: the arithmetic of
    ``torch.optim.Muon``'s (the wide orientation, the Frobenius normalization, ``steps`` iterations of X <-
    aX + (bA + cA²)X with A = XXᵀ), which fixes bfloat16."""
    a, b, c = coefficients
    x = update.to(dtype)
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def _lr_factor(adjust: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's ``adjust_lr_fn``: the factor of the lr for a matrix of ``shape``."""
    rows, cols = shape[:2]
    if adjust is None or adjust == "original":
        return math.sqrt(max(1.0, rows / cols))
    if adjust == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


class Muon(torch.optim.Muon):
    """``torch.optim.Muon`` whose Newton–Schulz iterations run in ``ns_dtype`` (torch has no option for it):
    torch's step (momentum, Nesterov, coefficients, lr adjustment, decoupled weight decay), with the
    iterations in bfloat16 equal to torch's bit for bit, or in float32, which a CPU without native bfloat16
    matmuls runs many times faster; ``auto`` (the default) is bfloat16 but on such a CPU, where it is
    float32 (:func:`ns_dtype_for`, read from the parameters' device at each step: processes that must
    agree on it pass the dtype itself, as ``adloco train`` does). The step is written out here rather than
    delegated, so that torch's step hooks run once. The state and the param groups are torch's: a checkpoint loads into either. On a
    worker sharded with ``fully_shard`` its matrices are DTensors, whose products gather each matrix, so
    every shard orthogonalizes the whole of it and keeps its rows (as torch's Muon does there).

    Its learning rate may be a 0-dim tensor on the parameters' device (as ``Replica.device_lrs`` sets it
    for a CUDA graph): the step then reads nothing on the host, so it can be captured, which torch's Muon
    (``float(lr)`` at every step) cannot; within float rounding of the step at the same Python float."""

    def __init__(self, params: Any, *, ns_dtype: NsDtype = "auto", **kwargs: Any) -> None:
        if ns_dtype not in NS_CHOICES:
            raise ValueError(f"Muon ns_dtype = {ns_dtype!r}: one of {', '.join(NS_CHOICES)}")
        super().__init__(params, **kwargs)
        self.ns_dtype: NsDtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            bufs: list[torch.Tensor] = []
            if self._init_group(group, params, grads, bufs):
                raise ValueError("Muon: complex parameters are not supported")
            if not params:
                continue
            dtype = NS_DTYPES[ns_dtype_for(self.ns_dtype, params[0].device.type)]
            lr, wd, momentum = group["lr"], group["weight_decay"], group["momentum"]
            on_device = isinstance(lr, torch.Tensor)  # a CUDA graph's lr, read at each replay
            if not on_device:
                lr = float(lr)
            for param, grad, buf in zip(params, grads, bufs, strict=True):
                buf.lerp_(grad, 1 - momentum)
                update = grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = newton_schulz(
                    update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype
                )
                factor = _lr_factor(group["adjust_lr_fn"], param.shape)
                param.mul_(1 - lr * wd)
                if on_device:  # tensor arithmetic only: nothing is read on the host
                    param.addcmul_(update, lr * factor, value=-1)  # one rounding, as add_(alpha=)
                else:
                    param.add_(update, alpha=-lr * factor)
        return loss


class _State(MutableMapping[torch.Tensor, Any]):
    """The per-parameter state of several optimizers seen as one mapping: each parameter's entry is read
    from, and written to, the state of the optimizer that owns it. What the combined optimizer's
    ``state`` is (torch's ``Optimizer.state`` is a ``defaultdict(dict)``: so is a missing entry here)."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)
        self._owners: dict[int, torch.optim.Optimizer] = {}

    def _owner(self, p: torch.Tensor) -> torch.optim.Optimizer:
        o = self._owners.get(id(p))
        if o is None:  # first use, or groups added since
            self._owners = {id(q): o for o in self.optimizers for g in o.param_groups for q in g["params"]}
            o = self._owners.get(id(p))
            if o is None:
                raise KeyError("a tensor that none of the combined optimizers steps")
        return o

    def __getitem__(self, p: torch.Tensor) -> Any:
        return self._owner(p).state[p]

    def __setitem__(self, p: torch.Tensor, value: Any) -> None:
        self._owner(p).state[p] = value

    def __delitem__(self, p: torch.Tensor) -> None:
        del self._owner(p).state[p]

    def __iter__(self) -> Iterator[torch.Tensor]:
        for o in self.optimizers:
            yield from o.state

    def __len__(self) -> int:
        return sum(len(o.state) for o in self.optimizers)

    def __contains__(self, p: object) -> bool:
        return any(p in o.state for o in self.optimizers)

    def get(self, p: torch.Tensor, default: Any = None) -> Any:
        for o in self.optimizers:
            if p in o.state:
                return o.state[p]
        return default

    def clear(self) -> None:
        for o in self.optimizers:
            o.state.clear()


class CombinedOptimizer(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters as one ``torch.optim.Optimizer``: :meth:`step` steps each
    in turn; ``param_groups`` is theirs, in order (the very dicts: setting a group's ``lr`` here sets it
    there); ``state`` is theirs, each parameter's entry where its optimizer keeps it; ``state_dict`` and
    ``load_state_dict`` are torch's over all of them. Step hooks registered here run once per combined step
    (and each optimizer's own hooks with its own step).

    ``CombinedOptimizer(torch.optim.AdamW(rest), torch.optim.Muon(matrices))`` is what a worker takes for
    Muon (or pass the optimizers as a list for one model: adloco combines them). Load a state through this
    object, not through one of its optimizers (that one's groups would no longer be the ones seen here).
    """

    optimizers: list[torch.optim.Optimizer]  # the parts, in the order given (a combined one's flattened)

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        if len(optimizers) == 1 and isinstance(optimizers[0], (list, tuple)):
            optimizers = tuple(optimizers[0])
        if not optimizers:
            raise ValueError("CombinedOptimizer: give at least one optimizer")
        flat: list[torch.optim.Optimizer] = []
        for o in optimizers:
            if not isinstance(o, torch.optim.Optimizer):
                raise ValueError(
                    f"CombinedOptimizer: expected torch.optim.Optimizer objects, got {type(o).__name__}"
                )
            flat.extend(o.optimizers if isinstance(o, CombinedOptimizer) else [o])
        seen: set[int] = set()
        for o in flat:
            for g in o.param_groups:
                for p in g["params"]:
                    if id(p) in seen:
                        raise ValueError(
                            "CombinedOptimizer: a parameter is stepped by two of the optimizers; give each "
                            "parameter to one of them"
                        )
                    seen.add(id(p))
        self.optimizers = flat
        # torch's constructor takes the groups as they are (the same dicts), with no defaults to add
        super().__init__([g for o in flat for g in o.param_groups], {})
        self.state = _State(flat)  # type: ignore[assignment]

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.optimizers:
            o.step()
        return loss

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "optimizers": self.optimizers}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """torch's ``load_state_dict`` (and unpickling) set ``param_groups`` and ``state`` anew: hand each
        optimizer its groups and its parameters' entries again."""
        super().__setstate__(state)
        groups, at = self.param_groups, 0
        for o in self.optimizers:
            n = len(o.param_groups)
            o.param_groups = groups[at : at + n]
            at += n
        loaded = self.__dict__["state"]
        if not isinstance(loaded, _State):
            view = _State(self.optimizers)
            for o in self.optimizers:
                o.state = defaultdict(dict)
            for p, entry in loaded.items():
                view[p] = entry
            self.state = view  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "CombinedOptimizer(" + ", ".join(type(o).__name__ for o in self.optimizers) + ")"


def muon_split(model: nn.Module, adamw: Sequence[str] = ()) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the matrices Muon steps, the rest) of ``model``'s parameters, in ``model.parameters()``'s order.

    Muon takes every 2-D weight of the hidden layers; the rest goes to AdamW: every parameter that is not
    2-D (norms, biases), the input embeddings and the output head (a Hugging Face model's
    ``get_input_embeddings()`` / ``get_output_embeddings()``, every ``nn.Embedding``; tied, they are one
    parameter; a task head, every parameter outside the model's ``base_model``: a classifier, which Muon
    left at chance on a small BERT, tests/e2e/test_classification.py), and the parameters named in
    ``adamw`` (a name, or the name of a module holding them)."""
    keep: set[int] = set()
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        fn = getattr(model, getter, None)
        try:
            mod = fn() if callable(fn) else None
        except (NotImplementedError, AttributeError):  # a model class without the method's wiring
            mod = None
        if isinstance(mod, nn.Module):
            keep.update(id(p) for p in mod.parameters())
    for mod in model.modules():
        if isinstance(mod, nn.Embedding):
            keep.update(id(p) for p in mod.parameters())
    # a Hugging Face model's task head (a classifier, a score or QA layer: the parameters outside its
    # base_model, the backbone) maps the last hidden state to the outputs, as the LM head does
    base = getattr(model, "base_model", None)
    if isinstance(base, nn.Module) and base is not model:
        inside = {id(p) for p in base.parameters()}
        keep.update(id(p) for p in model.parameters() if id(p) not in inside)
    names = dict(model.named_parameters())
    for name in adamw:
        hits = [p for n, p in names.items() if n == name or n.startswith(name + ".")]
        if not hits:
            raise ValueError(f"muon adamw = {name!r}: no parameter of the model has that name")
        keep.update(id(p) for p in hits)
    matrices = [p for p in model.parameters() if p.ndim == 2 and id(p) not in keep]
    rest = [p for p in model.parameters() if p.ndim != 2 or id(p) in keep]
    return matrices, rest


def muon_adamw(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.95),
    momentum: float = 0.95,
    lr_ratio: float = 1.0,
    adjust_lr: MuonAdjust = "match_rms_adamw",
    adamw: Sequence[str] = (),
    ns_dtype: NsDtype = "auto",
    capturable: bool = False,
) -> CombinedOptimizer:
    """Muon on ``model``'s hidden matrices and AdamW on the rest (:func:`muon_split`), as one optimizer.

    AdamW: ``lr``, ``betas``, ``weight_decay`` on its matrices (the embeddings, the head) and none on
    norms and biases. Muon: lr ``lr`` × ``lr_ratio`` (the group keeps ``lr_ratio``: ``adloco train``'s
    schedule sets each group's lr to the schedule's value times it), Nesterov ``momentum``, the same
    decoupled ``weight_decay``, and ``adjust_lr`` (torch's ``adjust_lr_fn``): ``match_rms_adamw`` scales
    each matrix's step to AdamW's RMS (0.2·√max(A, B); Moonlight), so that AdamW's lr and weight decay
    carry over and ``lr_ratio`` 1 is the start; ``original`` is Keller Jordan's √max(1, A/B), whose lr is
    about 0.02 (``lr_ratio`` = 0.02 / lr). ``ns_dtype``: the dtype of Muon's Newton–Schulz iterations
    (:class:`Muon`): bfloat16, torch's; float32, for a CPU that emulates bfloat16 (:func:`emulates_bfloat16`);
    ``auto``, either as the parameters' device computes it (:func:`ns_dtype_for`).
    ``capturable``: the AdamW part fused and capturable, so that the pair steps inside a CUDA graph
    (:class:`Muon` takes its lr as a device tensor as it is). The AdamW groups come first (a worker
    reports the first group's lr)."""
    matrices, rest = muon_split(model, adamw)
    if not matrices:
        raise ValueError("inner.optimizer = 'muon': the model has no hidden 2-D matrices for Muon to step")
    decay = [p for p in rest if p.ndim >= 2]
    plain = [p for p in rest if p.ndim < 2]
    groups = [{"params": ps, "weight_decay": wd} for ps, wd in ((decay, weight_decay), (plain, 0.0)) if ps]
    parts: list[torch.optim.Optimizer] = []
    if groups:
        graph = {"capturable": True, "fused": True} if capturable else {}
        parts.append(torch.optim.AdamW(groups, lr=lr, betas=betas, **graph))
    muon = Muon(
        matrices,
        ns_dtype=ns_dtype,
        lr=lr * lr_ratio,
        weight_decay=weight_decay,
        momentum=momentum,
        nesterov=True,
        adjust_lr_fn=adjust_lr,
    )
    for g in muon.param_groups:
        g["lr_ratio"] = lr_ratio
    parts.append(muon)
    return CombinedOptimizer(*parts)


def is_muon(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is, or combines, a ``torch.optim.Muon``."""
    parts = optimizer.optimizers if isinstance(optimizer, CombinedOptimizer) else [optimizer]
    return any(isinstance(o, torch.optim.Muon) for o in parts)
