"""A model's initial values without the model: the writes that initialize it, recorded once and replayed
one parameter at a time (ALGORITHM.md §12, "Models that start sharded").

A model built on the CPU draws its parameters from torch's default generator in a fixed order: each
layer's constructor (``nn.Linear``'s Kaiming-uniform draw, ``nn.Embedding``'s normal draw and padding
row), then Hugging Face's ``post_init`` (``_init_weights``: normal draws, ones, zeros), some of which
overwrite values drawn before. :meth:`InitPlan.record` builds the model once under
:class:`~torch._subclasses.fake_tensor.FakeTensorMode` (tensors with shapes and no memory; Hugging Face's
code takes the same path it takes on the CPU, which it does not on the meta device, where it skips
``post_init``'s initialization) and keeps, in order, every operation that writes a parameter's storage
and every operation that draws from the generator. :meth:`InitPlan.replay` runs that list again on the
CPU, seeded as the whole build is: each draw takes the same values from the generator as in the
original build, a parameter's storage is kept only from its last whole overwrite to its last write,
and each parameter's whole value is handed out when its last write is done, then dropped. Host memory
is about one parameter, never the model; the values are bit for bit those of the whole build (a test
compares them for every preset, ``model.init`` and ``model.reinit_output``).

What cannot be replayed is refused with :class:`NotReplayable` (the caller then builds the whole model):
a write that reads another tensor (a parameter copied from a computed one, an orthogonal init), a draw
from an explicit generator, a parameter never wholly written. Buffers (Llama's rotary frequencies) are
not in the plan: :func:`materialize` has Hugging Face recompute them, as ``from_pretrained`` does after
loading onto the meta device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["InitPlan", "NotReplayable", "local_rows", "materialize"]

# In-place writes that do not read the values they overwrite: a whole overwrite by one of them starts a
# storage's live span (everything written before it is dead, except for what it drew from the generator).
_PURE = {
    "uniform_",
    "normal_",
    "fill_",
    "zero_",
    "random_",
    "exponential_",
    "cauchy_",
    "log_normal_",
    "geometric_",
}


class NotReplayable(Exception):
    """The model's initialization cannot be replayed one parameter at a time (the message says why)."""


@dataclass(frozen=True)
class _Geometry:
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


@dataclass
class _Write:
    """One recorded operation: ``func(*args, **kwargs)`` with the written tensor as ``_TARGET``."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    storage: int  # the written storage's key (a factory's: the storage it creates)
    target: _Geometry
    factory: bool  # creates its storage (no tensor input)
    seeded: bool  # draws from the default generator
    problem: str | None  # why it cannot be replayed, if it must be


class _Target:
    """Where the written tensor goes in a recorded call."""


_TARGET = _Target()


def _key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _geometry(t: torch.Tensor) -> _Geometry:
    return _Geometry(tuple(t.shape), tuple(t.stride()), int(t.storage_offset()), t.dtype)


class _Recorder(TorchDispatchMode):
    """Logs, in order, the writes and draws of the operations run under it (inside a FakeTensorMode)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[_Write] = []
        self.seen: set[int] = set()
        self.alive: list[torch.Tensor] = []  # holds every storage seen, so that no key is reused

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat = tree_flatten((args, kwargs))[0]
        inputs = [t for t in flat if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for t in outs:
            if _key(t) not in self.seen:
                self.seen.add(_key(t))
                self.alive.append(t)
        factory = not inputs  # creates its output from nothing (empty, ones, randn, arange ...)
        seeded = torch.Tag.nondeterministic_seeded in func.tags
        written: list[torch.Tensor] = []
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                arg = kwargs.get(a.name, args[i] if i < len(args) else None)
                if isinstance(arg, torch.Tensor):
                    written.append(arg)
        targets = outs if factory else written
        if not targets:
            if seeded:  # a draw into a new tensor computed from others (torch.normal(mean, std) ...)
                g = _geometry(outs[0]) if outs else _Geometry((), (), 0, torch.float32)
                why = f"{func} draws from tensors"
                self.writes.append(_Write(func, args, kwargs, -1, g, False, True, why))
            return out
        target = targets[0]
        problem = None
        if len(targets) != 1:
            problem = f"{func} writes {len(targets)} tensors"
        elif any(isinstance(x, torch.Generator) for x in flat):
            problem = f"{func} draws from a generator of its own"
        elif any(t is not target for t in inputs):
            problem = f"{func} reads another tensor"

        def put(x: Any) -> Any:
            return _TARGET if x is target else x

        call_args, call_kwargs = (args, kwargs) if factory else tree_map(put, (args, kwargs))
        self.writes.append(
            _Write(func, call_args, call_kwargs, _key(target), _geometry(target), factory, seeded, problem)
        )
        return out


@dataclass
class InitPlan:
    """The writes that initialize a model's parameters, in order (module docstring). ``params`` maps each
    parameter's storage to its names (tied parameters share one) and geometries."""

    writes: list[_Write]
    params: dict[int, list[tuple[str, _Geometry]]]
    storage_numel: dict[int, int]
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # storage -> (first, last) live write

    @classmethod
    def record(cls, build: Callable[[], nn.Module]) -> InitPlan:
        """The plan of ``build()`` (a function that builds the model on the CPU from the default generator),
        found by running it on fake tensors: no parameter memory, no draw from the generator."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        recorder = _Recorder()
        try:
            with FakeTensorMode(allow_non_fake_inputs=True), recorder:
                model = build()
        except NotReplayable:
            raise
        except Exception as exc:  # noqa: BLE001 - a model whose construction needs real values
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise NotReplayable(f"its construction needs real values ({first})") from None
        params: dict[int, list[tuple[str, _Geometry]]] = {}
        numel: dict[int, int] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            key = _key(p)
            params.setdefault(key, []).append((name, _geometry(p)))
            numel[key] = p.untyped_storage().nbytes() // p.element_size()
        plan = cls(recorder.writes, params, numel)
        plan._check()
        return plan

    def _check(self) -> None:
        """Find each parameter storage's live span, from its last whole overwrite to its last write, and
        refuse what cannot be replayed."""
        for key, names in self.params.items():
            mine = [i for i, w in enumerate(self.writes) if w.storage == key]
            whole = [i for i in mine if self._whole(self.writes[i], key)]
            if not whole:
                why = next((self.writes[i].problem for i in mine if self.writes[i].problem), None)
                raise NotReplayable(why or f"parameter {names[0][0]} is never written whole")
            self.spans[key] = (whole[-1], mine[-1])
        live = {
            i for key, (a, b) in self.spans.items() for i in range(a, b + 1) if self.writes[i].storage == key
        }
        for i, w in enumerate(self.writes):
            if w.problem and (w.seeded or i in live):
                raise NotReplayable(w.problem)

    def _whole(self, w: _Write, key: int) -> bool:
        """Whether ``w`` overwrites the whole storage ``key`` with values of its own (not ``empty``'s)."""
        g = w.target
        name = w.func.overloadpacket.__name__
        if not (w.factory and not name.startswith("empty")) and name not in _PURE:
            return False
        expected, step = [], 1
        for d in reversed(g.size):
            expected.append(step)
            step *= d
        contiguous = all(
            s == e for d, s, e in zip(g.size, g.stride, reversed(expected), strict=True) if d > 1
        )
        return contiguous and g.offset == 0 and step == self.storage_numel[key]

    def replay(self, seed: int) -> Iterator[dict[str, torch.Tensor]]:
        """Each parameter storage's final values, as ``{name: tensor}`` of the parameters that live in it,
        in the order their last writes come; the build's draws are taken from torch's default generator
        seeded with ``seed`` (the caller's generator state is kept: ``fork_rng``)."""
        starts = {a: key for key, (a, _) in self.spans.items()}
        ends: dict[int, list[int]] = {}
        for key, (_, b) in self.spans.items():
            ends.setdefault(b, []).append(key)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            live: dict[int, torch.Tensor] = {}
            for i, w in enumerate(self.writes):
                if i in starts and starts[i] == w.storage:
                    live[w.storage] = torch.empty(self.storage_numel[w.storage], dtype=w.target.dtype)
                if w.storage in live:  # inside its span: the span's writes are all replayed
                    g = w.target
                    _run(w, live[w.storage].as_strided(g.size, g.stride, g.offset))
                elif w.seeded:  # a draw whose values are dropped: it still moves the generator on
                    _run(w, None)
                for key in ends.get(i, []):
                    buf = live.pop(key)
                    yield {name: buf.as_strided(g.size, g.stride, g.offset) for name, g in self.params[key]}
                    del buf  # one parameter's storage at a time: gone before the next is made


def _run(w: _Write, target: torch.Tensor | None) -> None:
    """One recorded operation on the CPU, writing ``target`` (None: a scratch tensor of the recorded
    geometry, dropped)."""
    if w.factory:
        kwargs = dict(w.kwargs)
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        out = w.func(*w.args, **kwargs)
        if target is not None:
            target.copy_(out)
        return
    if target is None:
        g = w.target
        target = torch.empty_strided(g.size, g.stride, dtype=g.dtype)

    def put(x: Any) -> Any:
        return target if x is _TARGET else x

    args, kwargs = tree_map(put, (w.args, w.kwargs))
    w.func(*args, **kwargs)


def local_rows(param: Any, full: torch.Tensor) -> torch.Tensor:
    """The rows of ``full`` (a parameter's whole value) that this rank holds of ``param``, a DTensor
    sharded as ``fully_shard`` shards (dim 0 in chunks of ⌈d/k⌉ rows, as ``torch.chunk`` cuts it)."""
    from torch.distributed.tensor import Shard

    (placement,) = param.placements
    if not isinstance(placement, Shard) or placement.dim != 0:
        raise NotReplayable(f"a parameter is placed {placement}, not Shard(0)")
    mesh = param.device_mesh
    k, index = mesh.size(), mesh.get_local_rank()
    rows = full.shape[0] if full.ndim else 1
    chunk = -(-rows // k)
    lo, hi = min(index * chunk, rows), min((index + 1) * chunk, rows)
    return full[lo:hi]


def materialize(
    model: nn.Module,
    plan: InitPlan,
    seed: int,
    device: torch.device,
    after: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Give ``model`` (built on the meta device and sharded with ``fully_shard``) its storage on
    ``device`` and this rank's rows of the values the whole build from ``seed`` starts from: buffers
    recomputed by Hugging Face's ``initialize_weights`` (every parameter marked as initialized, so that
    only buffers are written), then each parameter's rows from ``plan.replay(seed)``. ``after(name,
    full)`` may replace a parameter's whole value before its rows are taken (``model.reinit_output``)."""

    model.to_empty(device=device)
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = [b for _, b in model.named_buffers()]
    with torch.no_grad():
        for b in buffers:
            if b.is_floating_point():
                b.fill_(float("nan"))
            elif b.dtype != torch.bool:
                b.fill_(torch.iinfo(b.dtype).min)
            else:
                raise NotReplayable("a boolean buffer")
        if buffers:
            if not hasattr(model, "initialize_weights"):
                raise NotReplayable("its buffers have no initialization of their own")
            for p in params.values():
                p._is_hf_initialized = True  # type: ignore[attr-defined]
            with torch.random.fork_rng(devices=[]):
                model.initialize_weights()  # type: ignore[operator]
            for name, b in model.named_buffers():
                unset = b.isnan() if b.is_floating_point() else b == torch.iinfo(b.dtype).min
                if bool(unset.any()):
                    raise NotReplayable(f"buffer {name} is not recomputed by its initialization")
        done: set[int] = set()
        for values in plan.replay(seed):
            _write(params, values, after, done)
            del values  # the whole parameter, gone before the next one is drawn
        missing = [n for n, p in params.items() if id(p) not in done]
        if missing:
            raise NotReplayable(f"parameter {missing[0]} is not in the plan")


def _write(
    params: dict[str, Any],
    values: dict[str, torch.Tensor],
    after: Callable[[str, torch.Tensor], torch.Tensor] | None,
    done: set[int],
) -> None:
    """This rank's rows of one storage's parameters (``values``: their whole values)."""
    from torch.distributed.tensor import DTensor

    for name, full in values.items():
        param = params.get(name)
        if param is None or id(param) in done:
            continue
        done.add(id(param))
        if after is not None:
            full = after(name, full)
        if isinstance(param, DTensor):
            param.to_local().copy_(local_rows(param, full))
        else:
            param.copy_(full)
