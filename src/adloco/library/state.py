"""The state of an algorithm object (``state_dict`` / ``load_state_dict``): what a checkpoint holds, how
it is gathered from every process, and how it continues on another number of workers (ALGORITHM.md §9.2).

Each part states its own: a trainer its θ, outer state and the average of a Δ in flight
(:meth:`adloco.library.trainer.Trainer.state_dict`), a worker its inner optimizer and error feedback
(:meth:`adloco.library.workers.Workers.state`) plus its own start, which its trainer keeps; the algorithm adds its
replicated decisions (:func:`meta`). The functions here put them together, for this process
(:func:`local`) or gathered on the root rank (:func:`full`), and take them apart again (:func:`load`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from adloco.library.algorithms import allocation, merging
from adloco.library.comm.base import Comm
from adloco.library.round import Totals
from adloco.library.settings import Merging
from adloco.library.streaming import Schedule, in_flight
from adloco.library.trainer import Trainer, outer_layouts
from adloco.library.workers import Workers

if TYPE_CHECKING:
    from adloco.library.flat import ShardedFlat


@dataclass
class Decisions:
    """An algorithm object's replicated decisions, the same on every process: rounds completed, the
    allocation, every worker's b_max and measured speed, non-finite rounds in a row, and the totals."""

    round: int
    allocation: dict[int, int]
    b_max: dict[int, int]
    bad_rounds: int
    totals: Totals
    speed: dict[int, float]

    def fields(self) -> tuple[int, dict[int, int], dict[int, int], int, Totals, dict[int, float]]:
        return self.round, self.allocation, self.b_max, self.bad_rounds, self.totals, self.speed


def meta(d: Decisions, trainers: Mapping[int, Trainer], workers: Workers, n_workers: int) -> dict[str, Any]:
    """What every process writes alike: the decisions, every trainer's request and lr state, and what was
    in flight."""
    return {
        "round": d.round,
        "workers": n_workers,
        "parameters": whole_params(workers),
        "requests": {t: tr.request for t, tr in sorted(trainers.items())},
        "allocation": dict(d.allocation),
        "b_max": dict(d.b_max),
        "bad_rounds": d.bad_rounds,
        "totals": dataclasses.asdict(d.totals),
        "speed": dict(d.speed),
        # ALGORITHM.md §10: each trainer's b₀ and noise ratio B̂ (its lr multiplier follows from them)
        "lr_state": {t: [tr.b0, tr.noise] for t, tr in sorted(trainers.items())},
        # sync.overlap: what was in flight (its average is the trainer's `pending`) and its traffic
        "in_flight": [
            {"trainer": f.trainer, "round": f.round, "records": [r.to_dict() for r in f.pending.records]}
            for f in in_flight(trainers)
        ],
    }


def whole_params(workers: Workers) -> int:
    """P of the whole model (sharded workers, ALGORITHM.md §12: not this rank's P/k)."""
    return next(iter(workers.replicas.values())).flat.full_numel


def worker_state(w: int, workers: Workers, trainer: Trainer) -> dict[str, torch.Tensor]:
    """Local worker w's state: its inner optimizer and error feedback, and its own start (``start``:
    eager's, or streaming's parameters between their fragments' synchronizations), which its ``trainer``
    keeps, when it has one."""
    out = workers.state(w)
    if w in trainer.starts:
        out["start"] = trainer.starts[w]
    return out


def local(
    d: Decisions, trainers: Mapping[int, Trainer], workers: Workers, schedule: Schedule, comm: Comm
) -> dict[str, Any]:
    """This process's state (:meth:`adloco.library.method.AdLoCo.state_dict`): with ``sync.overlap`` it first waits
    for what is in flight, whose average each trainer keeps as ``pending`` (ALGORITHM.md §13)."""
    workers.between_rounds("state_dict", schedule.H)
    schedule.receive(trainers)
    return {
        **meta(d, trainers, workers, comm.n_workers),
        "trainers": {t: tr.state_dict() for t, tr in trainers.items() if tr.hosted},
        "replicas": {
            w: {"inner": worker_state(w, workers, trainers[d.allocation[w]]), "scalars": rep.scalars()}
            for w, rep in workers.replicas.items()
        },
    }


def full(
    d: Decisions,
    trainers: Mapping[int, Trainer],
    workers: Workers,
    schedule: Schedule,
    comm: Comm,
    buf: torch.Tensor,
) -> dict[str, Any] | None:
    """Every trainer's and worker's state, gathered on the root rank (None elsewhere); ``buf``: a P-vector
    to stand in where a value is not held.

    Sharded workers (ALGORITHM.md §12): each shard index gathers its P/k values as unsharded workers
    gather theirs, on the ranks of the root's worker, which then put every vector together in the whole
    model's flat layout on the root: the checkpoint is the one an unsharded run writes, so it resumes
    with any number of workers and any ``runtime.shards``."""
    workers.between_rounds("full_state_dict", schedule.H)
    device, replicas = workers.device, workers.replicas
    root = comm.at_root
    shards = comm.shards
    members = allocation.members(d.allocation)
    pending = schedule.receive(trainers)
    outer = outer_layouts(trainers, sorted(trainers), comm, buf.numel())
    gathered: dict[int, dict[str, torch.Tensor]] = {}
    for t in sorted(trainers):
        tr = trainers[t]
        gathered[t] = {}
        held = {"theta": tr.theta, **tr.outer.state_dict()} if tr.hosted else {}
        if t in pending:
            held["pending"] = pending[t]
        keys = ["theta", *outer[t], *(["pending"] if t in pending else [])]
        for key in keys:
            shape, dtype = outer[t].get(key, (list(buf.shape), buf.dtype))
            t_buf = (
                buf
                if (shape, dtype) == (list(buf.shape), buf.dtype)
                else torch.zeros(shape, dtype=dtype, device=device)
            )
            value = held.get(key)
            if value is not None:
                t_buf.copy_(value)
            else:  # an entry the optimizer does not hold yet (zero), or a place to stand
                t_buf.zero_()
            comm.fetch(t_buf, members[t][0])
            if root:
                gathered[t][key] = t_buf.clone()
    inners = {w: worker_state(w, workers, trainers[d.allocation[w]]) for w in replicas}
    layouts: dict[int, Any] = {}
    mine = {
        str(w): {"keys": {k: list(v.shape) for k, v in inners[w].items()}, "scalars": rep.scalars()}
        for w, rep in replicas.items()
    }
    for q, part in enumerate(comm.all_gather_json(mine)):
        if q % shards.size == shards.index:  # sharded: the layouts of this shard index's ranks
            layouts.update({int(w): v for w, v in dict(part).items()})  # type: ignore[call-overload]
    every: dict[int, dict[str, Any]] = {}
    for w in range(comm.n_workers):
        inner = inners.get(w, {})
        got: dict[str, torch.Tensor] = {}
        for k, shape in sorted(layouts[w]["keys"].items()):
            t_buf = (
                inner[k].to(device).clone()
                if k in inner
                else torch.zeros(shape, device=device, dtype=torch.float32)
            )
            comm.fetch(t_buf, w)
            if root:
                got[k] = t_buf.cpu()
        every[w] = {"inner": got, "scalars": layouts[w]["scalars"]}
    comm.drain()  # output, not training
    if not root:
        return None
    if shards.size > 1:  # the root worker's ranks put each vector together, in one order
        flat = cast("ShardedFlat", next(iter(replicas.values())).flat)
        n = flat.numel

        def whole(vectors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            out = {}
            for key in sorted(vectors):
                v = vectors[key]
                if v.dim() == 1 and v.numel() == n:
                    got = flat.unshard(v.to(device), shards.group)
                    v = got.cpu() if got is not None else v
                out[key] = v
            return out

        gathered = {t: whole(v) for t, v in sorted(gathered.items())}
        every = {w: {**r, "inner": whole(r["inner"])} for w, r in sorted(every.items())}
        if shards.index != 0:
            return None
    return {**meta(d, trainers, workers, comm.n_workers), "trainers": gathered, "replicas": every}


def load(
    state: Mapping[str, Any],
    comm: Comm,
    workers: Workers,
    schedule: Schedule,
    new_trainer: Callable[[int, int], Trainer],
    resize: tuple[Merging, str, int],
    like: torch.Tensor,
) -> tuple[Decisions, dict[int, Trainer], dict[str, Any] | None]:
    """Take this process's part of a state written by :func:`local` or :func:`full`: the decisions, every
    trainer (θ and outer state where hosted; ``new_trainer(id, request)`` makes one), what was in flight,
    every local worker's state, and where it starts. A full state written with another number of workers
    is first resized (:func:`resized`, with ``resize`` = the merge dial, ``on_resize`` and the cap on
    requests). Returns the decisions, the trainers and what changed (None: nothing)."""
    workers.between_rounds("load_state_dict", schedule.H)
    if int(state["parameters"]) != whole_params(workers):
        raise ValueError(
            f"state: holds a model of {int(state['parameters']):,} parameters; these replicas have "
            f"{whole_params(workers):,}"
        )
    membership = None
    n, device = comm.n_workers, workers.device
    if int(state["workers"]) != n:
        state, membership = resized(state, n, *resize)
    if comm.shards.size > 1:
        state = this_shard(state, cast("ShardedFlat", next(iter(workers.replicas.values())).flat))
    d = Decisions(
        int(state["round"]),
        {int(w): int(t) for w, t in state["allocation"].items()},
        {int(w): int(x) for w, x in state["b_max"].items()},
        int(state["bad_rounds"]),
        Totals(**state["totals"]),
        {int(w): float(v) for w, v in state.get("speed", {}).items()},
    )
    lr_state = {int(t): v for t, v in state.get("lr_state", {}).items()}  # absent before lr_scaling
    saved = {int(t): v for t, v in state["trainers"].items()}
    trainers: dict[int, Trainer] = {}
    hosted = {d.allocation[w] for w in workers.replicas}
    for t, b in sorted((int(t), int(b)) for t, b in state["requests"].items()):
        tr = new_trainer(t, b)
        b0, noise = lr_state.get(t, (None, None))
        tr.b0 = None if b0 is None else float(b0)
        tr.noise = None if noise is None else float(noise)
        if t in hosted:
            if t not in saved or saved[t].get("theta") is None:
                raise ValueError(f"state: holds no parameters for trainer {t}, which this process hosts")
            tr.load_state_dict(saved[t], device)
        trainers[t] = tr
    averages = {t: v.get("pending") for t, v in saved.items()}
    members = allocation.members(d.allocation)
    schedule.restore(trainers, state.get("in_flight", []), averages, members, like)
    reps = {int(w): v for w, v in state["replicas"].items()}
    starts_kept = schedule.streaming or (schedule.eager and bool(in_flight(trainers)))
    for w, rep in workers.replicas.items():
        got = reps.get(w)
        inner = dict(got["inner"]) if got else {}
        start = inner.pop("start", None)
        workers.load(w, inner, got["scalars"] if got else None, d.b_max[w])
        tr = trainers[d.allocation[w]]
        if start is not None and starts_kept:
            tr.starts[w] = start.to(device, torch.float32, copy=True)
        assert tr.theta is not None
        rep.load(tr.starts.get(w, tr.theta))
    return d, trainers, membership


def this_shard(state: Mapping[str, Any], flat: ShardedFlat) -> dict[str, Any]:
    """A state in the whole model's flat layout with every vector cut to this rank's values (sharded
    workers; a state this process wrote itself, :meth:`~adloco.library.method.AdLoCo.state_dict`, is already)."""
    full = flat.full_numel

    def cut(d: Mapping[str, Any]) -> dict[str, Any]:
        return {
            k: flat.reshard(v) if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == full else v
            for k, v in d.items()
        }

    return {
        **state,
        "trainers": {t: cut(v) for t, v in state["trainers"].items()},
        "replicas": {w: {**r, "inner": cut(r["inner"])} for w, r in state["replicas"].items()},
    }


def gather_parameters(tr: Trainer, first: int, comm: Comm, buf: torch.Tensor) -> torch.Tensor | None:
    """Trainer ``tr``'s θ on the root rank from its ``first`` worker's process (sharded: this rank's shard
    of it), None elsewhere; ``buf``: a P-vector to stand in where it is not held (not counted), and what is
    returned: valid until ``buf`` is next written (no copy: at the end of a run P/k floats on every rank
    of a sharded root worker)."""
    if tr.theta is not None:
        buf.copy_(tr.theta)
    comm.fetch(buf, first)
    comm.drain()
    return buf if comm.at_root else None


def resized(
    state: Mapping[str, Any], n: int, m: Merging, on_resize: str, cap: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A full state of N workers as one of ``n`` (ALGORITHM.md §9.2): trainers merged by policy while more
    trainers than workers are alive (θ and the outer state weighted by requests), workers shared by
    requests, requests re-derived (``on_resize``, capped at ``cap``); a worker keeps its inner state only
    if it serves the same trainer. Returns the state and what changed (``membership``)."""
    from adloco.library.algorithms import membership

    n_old = int(state["workers"])
    requests = {int(t): int(b) for t, b in state["requests"].items()}
    old = {int(w): int(t) for w, t in state["allocation"].items()}
    trainers = {int(t): dict(v) for t, v in state["trainers"].items()}
    missing = [t for t in requests if trainers.get(t, {}).get("theta") is None]
    if missing:
        raise ValueError(
            f"state: written with {n_old} workers, and resizing to {n} needs every trainer's parameters "
            f"(a full_state_dict); trainer(s) {missing} have none"
        )
    plan = membership.resize(
        requests,
        old,
        n,
        policy=m.policy,
        size=m.size,
        survivor_batch=m.survivor_batch,
        mode=m.allocation,
        batch=on_resize,
        cap=cap,
    )
    for step in plan.merges:
        merged = {}
        keys = {k for t in step.merged for k in trainers[t] if k != "pending"}  # θ and the outer state
        for key in sorted(keys):
            parts = {t: trainers[t][key] for t in step.merged if key in trainers[t]}  # absent: zero
            merged[key] = merging.weighted_merge(parts, step.weights)
        for t in step.merged:
            del trainers[t]
        trainers[step.survivor] = merged
    reps = {int(w): v for w, v in state["replicas"].items()}
    b_old = {int(w): int(x) for w, x in state["b_max"].items()}
    fallback = min(b_old.values())
    changed = {
        "workers_before": n_old,
        "workers": n,
        "left": plan.left,
        "joined": plan.joined,
        "merged": [s.merged for s in plan.merges],
        "kept": plan.kept,
    }
    return {
        **state,
        "workers": n,
        "requests": plan.requests,
        "allocation": plan.allocation,
        "b_max": {w: b_old.get(w, fallback) for w in range(n)},
        "speed": {},  # worker ids now name other devices: measure again
        # a merged trainer's b₀ and B̂ go with it; the survivor keeps its own
        "lr_state": {t: v for t, v in state.get("lr_state", {}).items() if int(t) in plan.requests},
        "trainers": trainers,
        "replicas": {w: reps[w] for w in plan.kept if w in reps},
    }, changed
