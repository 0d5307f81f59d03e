"""The state of an algorithm object (``state_dict`` / ``load_state_dict``): what a checkpoint holds, and
how it continues on another number of workers (ALGORITHM.md §9.2). A mixin of :class:`adloco.method.AdLoCo`
(not torch's ``Stateful`` protocol, which it satisfies), kept apart so the round reads in one sitting."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import torch

from adloco.algorithms import merging
from adloco.round import Totals, TrainerState

if TYPE_CHECKING:
    from adloco.algorithms.outer import OuterOptimizer
    from adloco.comm.base import Comm
    from adloco.comm.quantize import ErrorFeedback
    from adloco.flat import ShardedFlat
    from adloco.replica import Replica
    from adloco.settings import AdaptiveBatch, Merging, Wire
    from adloco.sync import Flight


class AlgorithmState:
    """``state_dict`` (this process's part), ``full_state_dict`` (everything, on the root rank) and
    ``load_state_dict`` (either; resized when written with another number of workers)."""

    if TYPE_CHECKING:  # what the algorithm object provides
        comm: Comm
        replicas: dict[int, Replica]
        trainers: dict[int, TrainerState]
        feedback: dict[int, ErrorFeedback] | None
        device: torch.device
        wire: Wire
        _flights: list[Flight]
        _starts: dict[int, torch.Tensor]
        _own: dict[int, torch.Tensor]
        allocation: dict[int, int]
        b_max: dict[int, int]
        n_params: int
        totals: Totals
        speed: dict[int, float]
        scratch: torch.Tensor
        round: int
        bad_rounds: int
        membership: dict[str, Any] | None
        on_resize: str
        merging: Merging
        batch: AdaptiveBatch
        _h: int

        @property
        def requests(self) -> dict[int, int]: ...
        @property
        def alive(self) -> list[int]: ...
        def members(self) -> dict[int, list[int]]: ...
        def theta(self, t: int) -> torch.Tensor: ...
        def _plan(self) -> None: ...
        def _new_outer(self) -> OuterOptimizer: ...
        def _receive(self, f: Flight) -> None: ...
        def _land(self, f: Flight, behind: float = 0.0, step: bool = True) -> None: ...
        @property
        def streaming(self) -> bool: ...

    def state_dict(self) -> dict[str, Any]:
        """This process's state: the replicated decisions, θ and outer state of the trainers it hosts,
        and the inner state of its workers. Between rounds only. With ``comm.overlap``, it first waits for
        what is in flight: each trainer's average (``pending``) is kept, to be applied when it would have
        landed (ALGORITHM.md §13)."""
        pending = self._in_flight()
        return {
            **self._meta(),
            "trainers": {
                t: {"theta": tr.theta, **tr.outer.state_dict(), **pending.get(t, {})}
                for t, tr in self.trainers.items()
                if tr.hosted
            },
            "replicas": {
                w: {"inner": self._inner_state(w), "scalars": rep.scalars()}
                for w, rep in self.replicas.items()
            },
        }

    def _inner_state(self, w: int) -> dict[str, torch.Tensor]:
        """Worker w's inner optimizer state, its error feedback (``feedback_error``) when kept, and its
        own start (``start``: eager's, or streaming's parameters between their fragments' synchronizations)
        when it has one."""
        out = self.replicas[w].inner_state()
        if self.feedback is not None and self.feedback[w].error is not None:
            out["feedback_error"] = self.feedback[w].state_dict()["error"]
        if w in self._starts:
            out["start"] = self._starts[w]
        return out

    def _in_flight(self) -> dict[int, dict[str, torch.Tensor]]:
        """Wait for every Δ in flight (``comm.overlap``) without applying it: trainer -> its average."""
        for f in self._flights:
            self._receive(f)
        return {f.trainer: {"pending": f.buf} for f in self._flights}

    def _meta(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "workers": self.comm.n_workers,
            "parameters": self._whole_params(),
            "requests": self.requests,
            "allocation": dict(self.allocation),
            "b_max": dict(self.b_max),
            "bad_rounds": self.bad_rounds,
            "totals": dataclasses.asdict(self.totals),
            "speed": dict(self.speed),
            # ALGORITHM.md §10: each trainer's b₀ and noise ratio B̂ (its lr multiplier follows from them)
            "lr_state": {t: [tr.b0, tr.noise] for t, tr in sorted(self.trainers.items())},
            # comm.overlap: what was in flight (its average is the trainer's `pending`) and its traffic
            "in_flight": [
                {"trainer": f.trainer, "round": f.round, "records": [r.to_dict() for r in f.pending.records]}
                for f in self._flights
            ],
        }

    def _whole_params(self) -> int:
        """P of the whole model (sharded workers, ALGORITHM.md §12: not this rank's P/k)."""
        return next(iter(self.replicas.values())).flat.full_numel

    def full_state_dict(self) -> dict[str, Any] | None:
        """Every trainer's and worker's state, gathered on the root rank (None elsewhere): what a checkpoint
        holds, independent of how workers were spread over processes. Every process must call it; the
        transfers are output, not training, and are not counted.

        Sharded workers (ALGORITHM.md §12): each shard index gathers its P/k values as unsharded workers
        gather theirs, on the ranks of the root's worker, which then put every vector together in the whole
        model's flat layout on the root: the checkpoint is the one an unsharded run writes, so it resumes
        with any number of workers and any ``runtime.shards``."""
        root = self.comm.at_root
        shards = self.comm.shards
        members = self.members()
        buf = self.scratch
        pending = self._in_flight()
        trainers: dict[int, dict[str, torch.Tensor]] = {}
        for t in self.alive:
            tr = self.trainers[t]
            trainers[t] = {}
            parts: list[tuple[str, torch.Tensor | None]] = [("theta", tr.theta)]
            if tr.outer.has_state:
                parts.append(("momentum", tr.momentum()))
            if t in pending:
                parts.append(("pending", pending[t]["pending"] if tr.hosted else None))
            for key, value in parts:
                if value is not None:
                    buf.copy_(value)
                self.comm.fetch(buf, members[t][0])
                if root:
                    trainers[t][key] = buf.clone()
        inners = {w: self._inner_state(w) for w in self.replicas}
        layouts: dict[int, Any] = {}
        mine = {
            str(w): {"keys": {k: list(v.shape) for k, v in inners[w].items()}, "scalars": rep.scalars()}
            for w, rep in self.replicas.items()
        }
        for q, part in enumerate(self.comm.all_gather_json(mine)):
            if q % shards.size == shards.index:  # sharded: the layouts of this shard index's ranks
                layouts.update({int(w): v for w, v in dict(part).items()})  # type: ignore[call-overload]
        replicas: dict[int, dict[str, Any]] = {}
        for w in range(self.comm.n_workers):
            inner = inners.get(w, {})
            got: dict[str, torch.Tensor] = {}
            for k, shape in sorted(layouts[w]["keys"].items()):
                t_buf = (
                    inner[k].to(self.device).clone()
                    if k in inner
                    else torch.zeros(shape, device=self.device, dtype=torch.float32)
                )
                self.comm.fetch(t_buf, w)
                if root:
                    got[k] = t_buf.cpu()
            replicas[w] = {"inner": got, "scalars": layouts[w]["scalars"]}
        self.comm.drain()  # output, not training
        if not root:
            return None
        if shards.size > 1:  # the root worker's ranks put each vector together, in one order
            flat = cast("ShardedFlat", next(iter(self.replicas.values())).flat)
            n = flat.numel

            def whole(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
                out = {}
                for key in sorted(d):
                    v = d[key]
                    if v.dim() == 1 and v.numel() == n:
                        got = flat.unshard(v.to(self.device), shards.group)
                        v = got.cpu() if got is not None else v
                    out[key] = v
                return out

            trainers = {t: whole(v) for t, v in sorted(trainers.items())}
            replicas = {w: {**r, "inner": whole(r["inner"])} for w, r in sorted(replicas.items())}
            if shards.index != 0:
                return None
        return {**self._meta(), "trainers": trainers, "replicas": replicas}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` or :meth:`full_state_dict` (this process takes its part).

        A worker the state has no inner state for starts a fresh inner optimizer. A full state written
        with another number of workers is first resized (ALGORITHM.md §9.2, :meth:`_resized`); what changed is
        in :attr:`membership`."""
        if int(state["parameters"]) != self._whole_params():
            raise ValueError(
                f"state: holds a model of {int(state['parameters']):,} parameters; these replicas have "
                f"{self._whole_params():,}"
            )
        self.membership = None
        if int(state["workers"]) != self.comm.n_workers:
            state = self._resized(state, self.comm.n_workers)
        if self.comm.shards.size > 1:
            state = self._this_shard(state)
        self.round = int(state["round"])
        self.allocation = {int(w): int(t) for w, t in state["allocation"].items()}
        self.b_max = {int(w): int(x) for w, x in state["b_max"].items()}
        self.bad_rounds = int(state["bad_rounds"])
        self.totals = Totals(**state["totals"])
        self.speed = {int(w): float(v) for w, v in state.get("speed", {}).items()}
        lr_state = {int(t): v for t, v in state.get("lr_state", {}).items()}  # absent before lr_scaling
        saved = {int(t): v for t, v in state["trainers"].items()}
        self.trainers = {}
        hosted = {self.allocation[w] for w in self.replicas}
        for t, b in sorted((int(t), int(b)) for t, b in state["requests"].items()):
            tr = TrainerState(t, b, self._new_outer())
            b0, noise = lr_state.get(t, (None, None))
            tr.b0 = None if b0 is None else float(b0)
            tr.noise = None if noise is None else float(noise)
            if t in hosted:
                if t not in saved or saved[t].get("theta") is None:
                    raise ValueError(f"state: holds no parameters for trainer {t}, which this process hosts")
                tr.theta = saved[t]["theta"].to(self.device, torch.float32, copy=True)
                if tr.outer.has_state and "momentum" in saved[t]:
                    tr.outer.load_state_dict({"momentum": saved[t]["momentum"].to(self.device)})
            self.trainers[t] = tr
        self._load_flights(state.get("in_flight", []), saved)
        reps = {int(w): v for w, v in state["replicas"].items()}
        self._starts, self._own = {}, {}
        for w, rep in self.replicas.items():
            got = reps.get(w)
            inner = dict(got["inner"]) if got else {}
            error = inner.pop("feedback_error", None)
            start = inner.pop("start", None)
            if self.feedback is not None:
                self.feedback[w].load_state_dict({} if error is None else {"error": error.to(self.device)})
            rep.load_inner_state(inner)
            if got:
                rep.load_scalars(got["scalars"])
            rep.b_max = self.b_max[w]
            if start is not None and ((self.wire.overlap == "eager" and self._flights) or self.streaming):
                self._starts[w] = start.to(self.device, torch.float32, copy=True)
            rep.load(self._starts.get(w, self.theta(self.allocation[w])))
        self._h = 0
        self._plan()

    def _load_flights(self, entries: list[dict[str, Any]], saved: Mapping[int, Mapping[str, Any]]) -> None:
        """What was in flight when the state was written, landed already: each trainer's average is applied
        at the end of the next round, as it would have been. A trainer merged away by a resize loses its
        (ALGORITHM.md §13); without ``comm.overlap`` it is applied now, once."""
        from adloco.comm.base import CommRecord, Pending
        from adloco.sync import Flight

        self._flights = []
        members = self.members()
        for e in entries:
            t = int(e["trainer"])
            tr = self.trainers.get(t)
            got = saved.get(t, {}).get("pending")
            if tr is None or (tr.hosted and got is None):
                continue
            buf = (
                torch.empty_like(self.scratch)
                if got is None
                else got.to(self.device, torch.float32, copy=True)
            )
            records = [CommRecord(**r) for r in e["records"]]
            ws = members[t]
            self._flights.append(
                Flight(t, Pending.landed(tr.hosted, records), buf, ws, ws, int(e["round"]), received=True)
            )
        if self.wire.overlap == "none" or getattr(self, "ddp", False):
            for f in list(self._flights):
                self._land(f)

    def _this_shard(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A state in the whole model's flat layout with every vector cut to this rank's values (sharded
        workers; a state this process wrote itself, :meth:`state_dict`, is already)."""
        flat = cast("ShardedFlat", next(iter(self.replicas.values())).flat)
        full = flat.full_numel

        def cut(d: Mapping[str, Any]) -> dict[str, Any]:
            return {
                k: flat.reshard(v)
                if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == full
                else v
                for k, v in d.items()
            }

        return {
            **state,
            "trainers": {t: cut(v) for t, v in state["trainers"].items()},
            "replicas": {w: {**r, "inner": cut(r["inner"])} for w, r in state["replicas"].items()},
        }

    def _resized(self, state: Mapping[str, Any], n: int) -> dict[str, Any]:
        """A full state of N workers as one of ``n``: trainers merged by policy while more trainers than
        workers are alive (θ and momentum weighted by requests), workers shared by requests, requests
        re-derived (``on_resize``); a worker keeps its inner state only if it serves the same trainer."""
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
        m = self.merging
        plan = membership.resize(
            requests,
            old,
            n,
            policy=m.policy,
            size=m.size,
            survivor_batch=m.survivor_batch,
            mode=m.allocation,
            batch=self.on_resize,
            cap=self.batch.max,
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
        self.membership = {
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
        }

    def gather_parameters(self, t: int) -> torch.Tensor | None:
        """Trainer t's θ on the root rank (sharded: this rank's shard of it, on every rank of the root's
        worker), None elsewhere; every process must call it (not counted)."""
        tr = self.trainers[t]
        buf = self.scratch
        if tr.theta is not None:
            buf.copy_(tr.theta)
        self.comm.fetch(buf, self.members()[t][0])
        self.comm.drain()
        return buf.clone() if self.comm.at_root else None
