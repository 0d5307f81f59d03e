"""What a checkpoint of ``adloco train`` holds, as Stateful components, and how it reaches every process.

A checkpoint is the state dicts of three components, each its own (nobody reaches into another's
privates): ``algorithm``, the library object's full state (every trainer's θ, outer state and request,
every worker's inner state, the replicated decisions); ``driver``, the run's progress (evaluations, elapsed
and simulated time, restarts, the model's fingerprint); and ``rng``, each rank's torch generators.
:meth:`RunState.gather` collects them on the rank that writes the run directory; after a restart,
:meth:`RunState.share` sends what that rank read to every process over the process group, so no shared
file system is needed. How the state is laid out on disk is :mod:`adloco.engine.checkpoint.files`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch

from adloco.engine.checkpoint.files import Checkpoint, load
from adloco.engine.driver import rng_state, set_rng_state
from adloco.errors import UserError

if TYPE_CHECKING:
    from adloco.comm.base import Comm
    from adloco.engine.driver import Driver


class Generators:
    """Each rank's torch generators (dropout draws from them), keyed ``rank-<q>``: gathered on the root,
    and each rank loads its own back (a rank new to the run keeps fresh ones)."""

    def __init__(self, comm: Comm, device: torch.device) -> None:
        self.comm, self.device = comm, device

    def _first_workers(self) -> dict[int, int]:
        """Every rank's first worker: what the communicator addresses a rank by."""
        return {q: self.comm.workers_of(q)[0] for q in range(self.comm.world) if self.comm.workers_of(q)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every rank's generators on the root (this rank's own elsewhere); every process calls it."""
        mine = torch.cat([x.to(torch.uint8).reshape(-1) for x in rng_state()]).to(self.device)
        if self.comm.shards.size > 1:  # a worker's ranks: one gather over every rank (a few KB each)
            every = self.comm.all_gather_json(mine.cpu().tolist())
            return {f"rank-{q}": torch.tensor(v, dtype=torch.uint8) for q, v in enumerate(every)}  # type: ignore[arg-type]
        out = {}
        for q, w in sorted(self._first_workers().items()):
            got = mine.clone()
            self.comm.fetch(got, w)
            out[f"rank-{q}"] = got.cpu()
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        mine = state.get(f"rank-{self.comm.rank}")
        sizes = [x.numel() for x in rng_state()]
        if mine is not None and mine.numel() == sum(sizes):
            set_rng_state(list(torch.split(mine.to(torch.uint8), sizes)))


class RunState:
    """The components of a run's checkpoint: ``algorithm``, ``driver`` and ``rng``."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.comm = driver.comm
        self.rng = Generators(driver.comm, driver.device)

    def gather(self) -> dict[str, Any] | None:
        """Everything a checkpoint holds, on the root rank (None elsewhere); every process calls it."""
        algo = self.driver.algo.full_state_dict()
        rng = self.rng.state_dict()
        if algo is None:
            return None
        return {"algorithm": algo, "rng": rng, "driver": self.driver.state_dict()}

    def load(self, state: dict[str, Any]) -> None:
        """Every component takes its part (this process's workers, this rank's generators)."""
        self.driver.algo.load_state_dict(state["algorithm"])
        self.driver.load_state_dict(state["driver"])
        self.rng.load_state_dict(state["rng"])

    def share(self, state: dict[str, Any] | None) -> dict[str, Any]:
        """The checkpoint's state, read by the root rank alone (``state`` elsewhere None), on every process:
        the metadata and every trainer's tensors to all, each worker's inner state to the process that
        will host that worker id, each rank's generators to that rank. The transfers are not counted."""
        comm = self.comm
        if comm.world == 1:
            assert state is not None
            return state
        if comm.shards.size > 1:
            return self._share_whole(state)
        root = comm.rank == comm.root
        src = comm.workers_of(comm.root)[0]  # the root rank's process, addressed by one of its workers
        device = self.driver.device

        def shapes(d: dict[str, torch.Tensor]) -> dict[str, list[int]]:
            return {k: list(v.shape) for k, v in d.items()}

        meta: dict[str, Any] = {}
        if root:
            assert state is not None
            algo = state["algorithm"]
            meta = {
                "algorithm": {k: v for k, v in algo.items() if k not in ("trainers", "replicas")},
                "trainers": {str(t): shapes(v) for t, v in algo["trainers"].items()},
                "replicas": {
                    str(w): {"scalars": r["scalars"], "inner": shapes(r["inner"])}
                    for w, r in algo["replicas"].items()
                },
                "rng": shapes(state["rng"]),
                "driver": state["driver"],
            }
        meta = cast(dict[str, Any], comm.all_gather_json(meta)[comm.root])
        everyone = list(range(comm.n_workers))
        # every trainer's tensors to every process (resizing may merge any of them)
        trainers: dict[int, dict[str, torch.Tensor]] = {}
        for t, keys in sorted(meta["trainers"].items(), key=lambda x: int(x[0])):
            trainers[int(t)] = {}
            for k, shape in sorted(keys.items()):
                buf = torch.zeros(shape, device=device)
                if root:
                    buf.copy_(state["algorithm"]["trainers"][int(t)][k])  # type: ignore[index]
                comm.broadcast(buf, src, everyone, "restore")
                trainers[int(t)][k] = buf
        # worker w's inner state to the process that hosts worker id w now
        replicas: dict[int, dict[str, Any]] = {}
        for w, info in sorted(meta["replicas"].items(), key=lambda x: int(x[0])):
            w = int(w)
            if w >= comm.n_workers:
                continue
            inner: dict[str, torch.Tensor] = {}
            for k, shape in sorted(info["inner"].items()):
                buf = torch.zeros(shape, device=device, dtype=torch.float32)
                if root:
                    buf.copy_(state["algorithm"]["replicas"][w]["inner"][k])  # type: ignore[index]
                comm.broadcast(buf, src, sorted({src, w}), "restore")
                inner[k] = buf
            if w in comm.local_workers or root:
                replicas[w] = {"scalars": info["scalars"], "inner": inner}
        # each rank's generators to that rank
        rng: dict[str, torch.Tensor] = {}
        first = self.rng._first_workers()
        for key, shape in sorted(meta["rng"].items()):
            q = int(key.split("-")[1])
            if q not in first:
                continue
            buf = torch.zeros(shape, dtype=torch.uint8, device=device)
            if root:
                buf.copy_(state["rng"][key])  # type: ignore[index]
            comm.broadcast(buf, src, sorted({src, first[q]}), "restore")
            if comm.rank == q:  # its own generators only (a rank new to the run keeps fresh ones)
                rng[key] = buf.cpu()
        comm.drain()  # a restart's transfers, not training
        algo_state = {**meta["algorithm"], "trainers": trainers, "replicas": replicas}
        return {"algorithm": algo_state, "rng": rng, "driver": meta["driver"]}

    def _share_whole(self, state: dict[str, Any] | None) -> dict[str, Any]:
        """Sharded workers (ALGORITHM.md §12): the whole checkpoint from the root to every process, each
        vector in the whole model's layout; every rank then cuts out its own values (load_state_dict)."""
        comm, device = self.comm, self.driver.device
        root = comm.rank == comm.root
        if root:
            assert state is not None
            layout = {
                "algorithm": {
                    k: v for k, v in state["algorithm"].items() if k not in ("trainers", "replicas")
                },
                "tensors": [
                    [path, list(v.shape), str(v.dtype).removeprefix("torch.")] for path, v in _tensors(state)
                ],
                "scalars": {str(w): r["scalars"] for w, r in state["algorithm"]["replicas"].items()},
                "driver": state["driver"],
            }
        meta = cast(dict[str, Any], comm.all_gather_json(layout if root else None)[comm.root])
        given = dict(_tensors(state)) if root and state is not None else {}
        out: dict[str, Any] = {
            "algorithm": {
                **meta["algorithm"],
                "trainers": {},
                "replicas": {int(w): {"scalars": s, "inner": {}} for w, s in meta["scalars"].items()},
            },
            "rng": {},
            "driver": meta["driver"],
        }
        for path, shape, dtype in meta["tensors"]:
            buf = torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
            if root:
                buf.copy_(given[tuple(path)])
            comm.spread(buf)
            section, *rest = path
            if section == "rng":
                if rest[0] == f"rank-{comm.rank}":  # its own generators only
                    out["rng"][rest[0]] = buf.cpu()
            elif section == "trainers":
                out["algorithm"]["trainers"].setdefault(int(rest[0]), {})[rest[1]] = buf
            else:
                out["algorithm"]["replicas"][int(rest[0])]["inner"][rest[1]] = buf
        return out


def _tensors(state: dict[str, Any] | None) -> list[tuple[tuple[str, ...], torch.Tensor]]:
    """Every tensor of a checkpoint's state with its path, in one order."""
    if state is None:
        return []
    algo = state["algorithm"]
    out: list[tuple[tuple[str, ...], torch.Tensor]] = []
    for t, d in sorted(algo["trainers"].items(), key=lambda x: int(x[0])):
        out += [(("trainers", str(t), k), v) for k, v in sorted(d.items())]
    for w, r in sorted(algo["replicas"].items(), key=lambda x: int(x[0])):
        out += [(("replicas", str(w), k), v) for k, v in sorted(r["inner"].items())]
    out += [(("rng", k), v) for k, v in sorted(state["rng"].items())]
    return out


def restore(driver: Driver, ck: Checkpoint | None) -> bool:
    """Continue from the checkpoint the root rank found (``ck``; None on the other ranks and in a new
    run): one of another model is refused in one line; every process learns from the root whether the
    run continues, and gets its state over the group (:meth:`RunState.share`). Returns whether it does."""
    if ck is not None and (
        ck.meta["driver"].get("model") != driver.fingerprint()
        or ck.meta["algorithm"].get("parameters") != driver.n_params
    ):
        raise UserError(
            f"checkpoint {str(ck.path)!r}: holds a model of {ck.meta['algorithm'].get('parameters', 0):,} "
            f"parameters with other shapes or names; this run builds {driver.n_params:,} "
            f"({driver.cfg.model.name!r}): a run resumes with its own model"
        )
    continues = bool(driver.comm.all_gather_json(ck is not None)[driver.comm.root])
    if continues:
        state = RunState(driver)
        state.load(state.share(load(ck) if ck is not None else None))
    return continues
