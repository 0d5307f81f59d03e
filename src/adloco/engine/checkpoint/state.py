"""What a checkpoint of ``adloco train`` holds, and how each rank writes and reads its own part of it.

Every rank gives its own tensors to torch.distributed.checkpoint (:mod:`.storage`), keyed by what they are:
``trainer/<t>/<key>`` (θ, the outer optimizer's state and a Δ's average in flight, ``pending``, of the
trainers its workers serve), ``worker/<w>/<key>`` (a worker's inner optimizer state, error feedback and
own start) and ``rng/rank-<q>`` (its torch generators). A sharded worker's ranks give their P/k values of
every flat vector as pieces of the whole model's vector (ALGORITHM.md §12), so a checkpoint resumes with
any ``runtime.shards``; a tensor several processes hold alike is written once. The run-level state (the
algorithm's replicated decisions with every worker's scalars, the driver's progress, the config) is JSON,
written by rank 0 beside it (:mod:`.files`). No rank gathers another's tensors.

On resume every rank reads the tensors it needs, whatever ranks wrote them: those of its own workers and
of the trainers they serve, or, when the number of workers changed, every trainer's (trainers may merge,
ALGORITHM.md §9.2), each cut to its shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch

from adloco.engine.checkpoint import storage
from adloco.engine.checkpoint.files import Checkpoint, verify
from adloco.engine.driver import rng_state, set_rng_state
from adloco.errors import PeerFailed, UserError

if TYPE_CHECKING:
    from adloco.engine.driver import Driver
    from adloco.library.comm.base import Comm
    from adloco.library.flat import ShardedFlat

_GROUPS: dict[int, Any] = {}


def group_for(comm: Comm, timeout: float | None = None) -> Any:
    """The process group of checkpoint collectives: None in one process, else a gloo group of its own, so
    that a write behind training (``checkpoint.async_save``) never shares a group with the training's
    collectives; its collectives give up after ``timeout`` seconds (a lost peer; None: gloo's default).
    Created once per communicator; every process calls it at the same point."""
    if comm.world == 1:
        return None
    got = _GROUPS.get(id(comm))
    if got is None:
        import datetime

        import torch.distributed as dist

        limit = None if timeout is None else datetime.timedelta(seconds=timeout)
        got = _GROUPS[id(comm)] = dist.new_group(backend="gloo", timeout=limit)
    return got


def refuse(comm: Comm, message: str, kind: type[UserError] = UserError) -> UserError:
    """A refusal every rank reached together: said by the root rank, the others exit quietly."""
    if comm.rank == comm.root or comm.world == 1:
        return kind(message)
    return PeerFailed(message)


def gather(obj: Any, group: Any) -> list[Any]:
    """Every rank's ``obj`` (small, JSON-like) over the checkpoint group; [obj] in one process."""
    if group is None:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


class RunState:
    """This rank's part of a checkpoint: :meth:`capture` for writing, :meth:`read` and :meth:`load` on resume."""

    def __init__(self, driver: Driver) -> None:
        self.driver, self.comm = driver, driver.comm
        flat = driver.algo.view.first.flat
        self.whole = flat.full_numel
        self.sharded: ShardedFlat | None = cast("ShardedFlat", flat) if self.comm.shards.size > 1 else None

    # -- writing ---------------------------------------------------------------------------------------
    def _piece(self, v: torch.Tensor) -> torch.Tensor | storage.Pieces:
        """A sharded rank's P/k values of a flat vector as pieces of the whole; anything else as it is."""
        flat = self.sharded
        if flat is None or v.dim() != 1 or v.numel() != flat.numel:
            return v
        return storage.Pieces(self.whole, [(v[lo : lo + n], g) for lo, g, n in flat.pieces(flat.index)])

    def capture(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """This rank's tensors (flat keys) and the run-level state it knows (its workers' scalars); every
        process calls it between rounds (with ``sync.overlap`` it waits for what is in flight)."""
        algo = self.driver.algo.state_dict()
        tensors: dict[str, Any] = {}
        for t, parts in sorted(algo.pop("trainers").items()):
            for k, v in sorted(parts.items()):
                tensors[f"trainer/{t}/{k}"] = self._piece(v)
        scalars = {}
        for w, rep in sorted(algo.pop("replicas").items()):
            scalars[str(w)] = rep["scalars"]
            for k, v in sorted(rep["inner"].items()):
                tensors[f"worker/{w}/{k}"] = self._piece(v)
        tensors[f"rng/rank-{self.comm.rank}"] = torch.cat(
            [x.to(torch.uint8).reshape(-1) for x in rng_state()]
        )
        return tensors, {"algorithm": algo, "scalars": scalars}

    def run_level(self, parts: list[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
        """The run-level state of ``state.json`` from every rank's :meth:`capture` (rank 0)."""
        algo = dict(parts[0]["algorithm"])
        algo["replicas"] = {w: s for part in parts for w, s in sorted(part["scalars"].items())}
        algo["replicas"] = dict(sorted(algo["replicas"].items(), key=lambda x: int(x[0])))
        return {"algorithm": algo, "driver": self.driver.state_dict(), "config": config}

    # -- reading ---------------------------------------------------------------------------------------
    def read(self, where: str, meta: dict[str, Any], group: Any) -> dict[str, Any]:
        """The state this process loads (:meth:`load`), its tensors read from the checkpoint at ``where``;
        every process calls it."""
        algo = dict(meta["algorithm"])
        saved = storage.tensors(storage.metadata(where))
        local = sorted(self.driver.algo.view.workers)
        allocation = {int(w): int(t) for w, t in algo["allocation"].items()}
        if int(algo["workers"]) != self.comm.n_workers:  # resized: any trainer may merge into any other
            trainers = {int(t) for t in algo["requests"]}
        else:
            trainers = {allocation[w] for w in local}
        want = {f"trainer/{t}/" for t in trainers} | {f"worker/{w}/" for w in local}
        into: dict[str, Any] = {}
        values: dict[str, torch.Tensor] = {}
        for key, (shape, dtype) in sorted(saved.items()):
            if key.startswith("rng/"):
                if key != f"rng/rank-{self.comm.rank}":  # its own generators only
                    continue
            elif not any(key.startswith(p) for p in want):
                continue
            flat = self.sharded
            if flat is not None and list(shape) == [self.whole]:
                buf = torch.zeros(flat.numel, dtype=dtype)
                into[key] = storage.Pieces(
                    self.whole, [(buf[lo : lo + n], g) for lo, g, n in flat.pieces(flat.index)]
                )
            else:
                buf = torch.zeros(shape, dtype=dtype)
                into[key] = buf
            values[key] = buf
        storage.read(into, where, group)
        trainer_state: dict[int, dict[str, torch.Tensor]] = {}
        inner: dict[int, dict[str, torch.Tensor]] = {}
        rng: dict[str, torch.Tensor] = {}
        for key, v in values.items():
            kind, who, name = key.split("/", 2) if key.count("/") >= 2 else (*key.split("/", 1), "")
            if kind == "trainer":
                trainer_state.setdefault(int(who), {})[name] = v
            elif kind == "worker":
                inner.setdefault(int(who), {})[name] = v
            else:
                rng[who] = v
        scalars = algo.pop("replicas")
        algo["trainers"] = trainer_state
        algo["replicas"] = {
            int(w): {"scalars": s, "inner": inner.get(int(w), {})} for w, s in scalars.items()
        }
        return {"algorithm": algo, "rng": rng, "driver": meta["driver"]}

    def load(self, state: dict[str, Any]) -> None:
        """Every component takes its part (this process's workers, this rank's generators)."""
        self.driver.algo.load_state_dict(state["algorithm"])
        self.driver.load_state_dict(state["driver"])
        mine = state["rng"].get(f"rank-{self.comm.rank}")
        sizes = [x.numel() for x in rng_state()]
        if mine is not None and mine.numel() == sum(sizes):  # a rank new to the run keeps fresh ones
            set_rng_state(list(torch.split(mine.to(torch.uint8), sizes)))


def restore(driver: Driver, ck: Checkpoint | None, timeout: float | None = None) -> bool:
    """Continue from the checkpoint the root rank found (``ck``; None on the other ranks and in a new
    run): one of another model is refused in one line; every process learns from the root whether the
    run continues and where the checkpoint is, checks the checksums of its share of the files, and reads
    its own part. Returns whether it continues. Every process calls it; ``timeout``: how long the
    checkpoints' collectives wait for a silent peer (:func:`group_for`)."""
    comm = driver.comm
    group = group_for(comm, timeout)
    if ck is not None and (
        ck.meta["driver"].get("model") != driver.fingerprint()
        or ck.meta["algorithm"].get("parameters") != driver.n_params
    ):
        raise UserError(
            f"checkpoint {str(ck.path)!r}: holds a model of {ck.meta['algorithm'].get('parameters', 0):,} "
            f"parameters with other shapes or names; this run builds {driver.n_params:,} "
            f"({driver.cfg.model.name!r}): a run resumes with its own model"
        )
    found = comm.all_gather_json({"url": ck.url, "meta": ck.meta} if ck is not None else None)[comm.root]
    if found is None:
        return False
    where, meta = str(found["url"]), dict(found["meta"])  # type: ignore[index]
    wrong = [e for e in comm.all_gather_json(verify(where, meta["files"], comm.rank, comm.world)) if e]
    if wrong:
        raise refuse(comm, str(wrong[0]))
    state = RunState(driver)
    state.load(state.read(where, meta, group))
    return True
