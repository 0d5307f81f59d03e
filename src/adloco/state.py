"""The state of an algorithm object (``state_dict`` / ``load_state_dict``): what a checkpoint holds, how
it is gathered from every process, and how it continues on another number of workers (ALGORITHM.md §9.2).

Each part states its own: a trainer its θ, outer state and the average of a Δ in flight
(:meth:`adloco.trainer.Trainer.state_dict`), a worker its inner optimizer and error feedback
(:meth:`adloco.workers.Workers.state`) plus its own start, which its trainer keeps; the algorithm adds its
replicated decisions (:func:`meta`). The functions here put them together, for this process
(:func:`local`) or gathered on the root rank (:func:`full`), and take them apart again (:func:`load`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch

from adloco.algorithms import merging
from adloco.round import Totals
from adloco.settings import Merging
from adloco.streaming import in_flight
from adloco.trainer import Trainer

if TYPE_CHECKING:
    from adloco.flat import ShardedFlat
    from adloco.method import AdLoCo


def meta(algo: AdLoCo) -> dict[str, Any]:
    """The replicated decisions: the same on every process."""
    return {
        "round": algo.round,
        "workers": algo.comm.n_workers,
        "parameters": whole_params(algo),
        "requests": algo.requests,
        "allocation": dict(algo.allocation),
        "b_max": dict(algo.b_max),
        "bad_rounds": algo.bad_rounds,
        "totals": dataclasses.asdict(algo.totals),
        "speed": dict(algo.speed),
        # ALGORITHM.md §10: each trainer's b₀ and noise ratio B̂ (its lr multiplier follows from them)
        "lr_state": {t: [tr.b0, tr.noise] for t, tr in sorted(algo.trainers.items())},
        # comm.overlap: what was in flight (its average is the trainer's `pending`) and its traffic
        "in_flight": [
            {"trainer": f.trainer, "round": f.round, "records": [r.to_dict() for r in f.pending.records]}
            for f in in_flight(algo.trainers)
        ],
    }


def whole_params(algo: AdLoCo) -> int:
    """P of the whole model (sharded workers, ALGORITHM.md §12: not this rank's P/k)."""
    return next(iter(algo.replicas.values())).flat.full_numel


def worker_state(algo: AdLoCo, w: int) -> dict[str, torch.Tensor]:
    """Local worker w's state: its inner optimizer and error feedback, and its own start (``start``:
    eager's, or streaming's parameters between their fragments' synchronizations) when it has one."""
    out = algo.workers.state(w)
    starts = algo.trainers[algo.allocation[w]].starts
    if w in starts:
        out["start"] = starts[w]
    return out


def local(algo: AdLoCo) -> dict[str, Any]:
    """This process's state (:meth:`adloco.method.AdLoCo.state_dict`): with ``comm.overlap`` it first waits
    for what is in flight, whose average each trainer keeps as ``pending`` (ALGORITHM.md §13)."""
    algo.schedule.receive(algo.trainers)
    return {
        **meta(algo),
        "trainers": {t: tr.state_dict() for t, tr in algo.trainers.items() if tr.hosted},
        "replicas": {
            w: {"inner": worker_state(algo, w), "scalars": rep.scalars()} for w, rep in algo.replicas.items()
        },
    }


def full(algo: AdLoCo) -> dict[str, Any] | None:
    """Every trainer's and worker's state, gathered on the root rank (None elsewhere).

    Sharded workers (ALGORITHM.md §12): each shard index gathers its P/k values as unsharded workers
    gather theirs, on the ranks of the root's worker, which then put every vector together in the whole
    model's flat layout on the root: the checkpoint is the one an unsharded run writes, so it resumes
    with any number of workers and any ``runtime.shards``."""
    comm, device = algo.comm, algo.device
    root = comm.at_root
    shards = comm.shards
    members = algo.members()
    buf = algo.scratch
    pending = algo.schedule.receive(algo.trainers)
    trainers: dict[int, dict[str, torch.Tensor]] = {}
    for t in algo.alive:
        tr = algo.trainers[t]
        trainers[t] = {}
        parts: list[tuple[str, torch.Tensor | None]] = [("theta", tr.theta)]
        if tr.outer.has_state:
            parts.append(("momentum", tr.momentum()))
        if t in pending:
            parts.append(("pending", pending[t] if tr.hosted else None))
        for key, value in parts:
            if value is not None:
                buf.copy_(value)
            comm.fetch(buf, members[t][0])
            if root:
                trainers[t][key] = buf.clone()
    inners = {w: worker_state(algo, w) for w in algo.replicas}
    layouts: dict[int, Any] = {}
    mine = {
        str(w): {"keys": {k: list(v.shape) for k, v in inners[w].items()}, "scalars": rep.scalars()}
        for w, rep in algo.replicas.items()
    }
    for q, part in enumerate(comm.all_gather_json(mine)):
        if q % shards.size == shards.index:  # sharded: the layouts of this shard index's ranks
            layouts.update({int(w): v for w, v in dict(part).items()})  # type: ignore[call-overload]
    replicas: dict[int, dict[str, Any]] = {}
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
        replicas[w] = {"inner": got, "scalars": layouts[w]["scalars"]}
    comm.drain()  # output, not training
    if not root:
        return None
    if shards.size > 1:  # the root worker's ranks put each vector together, in one order
        flat = cast("ShardedFlat", next(iter(algo.replicas.values())).flat)
        n = flat.numel

        def whole(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            out = {}
            for key in sorted(d):
                v = d[key]
                if v.dim() == 1 and v.numel() == n:
                    got = flat.unshard(v.to(device), shards.group)
                    v = got.cpu() if got is not None else v
                out[key] = v
            return out

        trainers = {t: whole(v) for t, v in sorted(trainers.items())}
        replicas = {w: {**r, "inner": whole(r["inner"])} for w, r in sorted(replicas.items())}
        if shards.index != 0:
            return None
    return {**meta(algo), "trainers": trainers, "replicas": replicas}


def load(algo: AdLoCo, state: Mapping[str, Any], new_trainer: Callable[[int, int], Trainer]) -> None:
    """Restore ``algo`` from :func:`local` or :func:`full` (this process takes its part): the replicated
    decisions, every trainer (θ and outer state where hosted; ``new_trainer(id, request)`` makes one), what
    was in flight, every local worker's state and start. A full state written with another number of
    workers is first resized (:func:`resized`); what changed is in ``algo.membership``."""
    if int(state["parameters"]) != whole_params(algo):
        raise ValueError(
            f"state: holds a model of {int(state['parameters']):,} parameters; these replicas have "
            f"{whole_params(algo):,}"
        )
    algo.membership = None
    n = algo.comm.n_workers
    if int(state["workers"]) != n:
        state, algo.membership = resized(state, n, algo.merging, algo.on_resize, algo.batch.max)
    if algo.comm.shards.size > 1:
        state = this_shard(state, cast("ShardedFlat", next(iter(algo.replicas.values())).flat))
    algo.round = int(state["round"])
    algo.allocation = {int(w): int(t) for w, t in state["allocation"].items()}
    algo.b_max = {int(w): int(x) for w, x in state["b_max"].items()}
    algo.bad_rounds = int(state["bad_rounds"])
    algo.totals = Totals(**state["totals"])
    algo.speed = {int(w): float(v) for w, v in state.get("speed", {}).items()}
    lr_state = {int(t): v for t, v in state.get("lr_state", {}).items()}  # absent before lr_scaling
    saved = {int(t): v for t, v in state["trainers"].items()}
    algo.trainers = {}
    hosted = {algo.allocation[w] for w in algo.replicas}
    for t, b in sorted((int(t), int(b)) for t, b in state["requests"].items()):
        tr = new_trainer(t, b)
        b0, noise = lr_state.get(t, (None, None))
        tr.b0 = None if b0 is None else float(b0)
        tr.noise = None if noise is None else float(noise)
        if t in hosted:
            if t not in saved or saved[t].get("theta") is None:
                raise ValueError(f"state: holds no parameters for trainer {t}, which this process hosts")
            tr.load_state_dict(saved[t], algo.device)
        algo.trainers[t] = tr
    averages = {t: v.get("pending") for t, v in saved.items()}
    algo.schedule.restore(algo.trainers, state.get("in_flight", []), averages, algo.members(), algo.scratch)
    reps = {int(w): v for w, v in state["replicas"].items()}
    starts_kept = algo.schedule.streaming or (algo.schedule.eager and bool(in_flight(algo.trainers)))
    for w, rep in algo.replicas.items():
        got = reps.get(w)
        inner = dict(got["inner"]) if got else {}
        start = inner.pop("start", None)
        algo.workers.load(w, inner, got["scalars"] if got else None, algo.b_max[w])
        tr = algo.trainers[algo.allocation[w]]
        if start is not None and starts_kept:
            tr.starts[w] = start.to(algo.device, torch.float32, copy=True)
        rep.load(algo.start_of(w))


def this_shard(state: Mapping[str, Any], flat: ShardedFlat) -> dict[str, Any]:
    """A state in the whole model's flat layout with every vector cut to this rank's values (sharded
    workers; a state this process wrote itself, :meth:`~adloco.method.AdLoCo.state_dict`, is already)."""
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


def gather_parameters(algo: AdLoCo, t: int) -> torch.Tensor | None:
    """Trainer t's θ on the root rank (sharded: this rank's shard of it), None elsewhere (not counted)."""
    tr = algo.trainers[t]
    buf = algo.scratch
    if tr.theta is not None:
        buf.copy_(tr.theta)
    algo.comm.fetch(buf, algo.members()[t][0])
    algo.comm.drain()
    return buf.clone() if algo.comm.at_root else None


def resized(
    state: Mapping[str, Any], n: int, m: Merging, on_resize: str, cap: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A full state of N workers as one of ``n`` (ALGORITHM.md §9.2): trainers merged by policy while more
    trainers than workers are alive (θ and the outer state weighted by requests), workers shared by
    requests, requests re-derived (``on_resize``, capped at ``cap``); a worker keeps its inner state only
    if it serves the same trainer. Returns the state and what changed (``membership``)."""
    from adloco.algorithms import membership

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
        for key in ("theta", "momentum"):
            parts = {t: trainers[t][key] for t in step.merged if key in trainers[t]}
            if len(parts) == len(step.merged):
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
