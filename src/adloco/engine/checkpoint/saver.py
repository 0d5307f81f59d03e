"""Checkpoints of ``adloco train``: every rank writes its own part, between rounds or behind training.

Every rank takes its part of the state (:meth:`RunState.capture`) and writes it through
torch.distributed.checkpoint into the hidden folder rank 0 prepared; the ranks then exchange the sizes and
SHA-256 of the files each wrote, and rank 0 completes the checkpoint (:class:`~.files.Writer`). With
``checkpoint.async_save`` the tensors are copied into host memory (DCP's staging), training goes on, and
the files are written and the checkpoint completed by a thread; at most one write is in flight: the next
checkpoint, the end of the run, a stop and any error wait for it first. A write that failed (a full
disk) is reported at that wait, and the previous checkpoint is still complete.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from adloco import events
from adloco.engine.checkpoint import files, storage
from adloco.engine.checkpoint.state import RunState, gather, group_for, refuse
from adloco.engine.driver import Driver
from adloco.errors import UserError
from adloco.telemetry.metrics import MetricsSink


class Checkpointer:
    """``where``: the run's checkpoint location (:func:`~.files.location`) as rank 0 knows it (None on
    the other ranks: they learn it from rank 0, which also checks that every rank reaches it)."""

    def __init__(
        self,
        driver: Driver,
        config: Callable[[], dict[str, Any]],
        where: str | None,
        run_dir: Path | None,
        sink: MetricsSink,
        keep: int,
        background: bool = False,
    ) -> None:
        self.driver, self.config, self.sink, self.keep = driver, config, sink, keep
        self.run_dir, self.background = run_dir, background
        self.comm = driver.comm
        self.group = group_for(self.comm)
        self.where = self._reach(where)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last: str | None = None
        self.saved_round: int | None = None  # every rank knows: that round's state was taken

    def _reach(self, where: str | None) -> str:
        """The location on every rank; rank 0 creates it and leaves a mark every other rank must see
        (a location on one machine's own disk, or in one process's memory, is refused in one line)."""
        comm, root = self.comm, self.comm.rank == self.comm.root
        problem = None
        mark = ""
        if root:
            assert where is not None
            mark = f".reach-{time.time_ns()}"
            try:
                fs, path = files.filesystem(where)
                fs.makedirs(path, exist_ok=True)
                fs.pipe_file(f"{path.rstrip('/')}/{mark}", b"")
            except (OSError, ValueError) as exc:
                problem = f"checkpoints: cannot write into {where} ({getattr(exc, 'strerror', None) or exc})"
        got = comm.all_gather_json({"where": where, "mark": mark, "problem": problem} if root else None)
        info = dict(got[comm.root])  # type: ignore[call-overload]
        where = str(info["where"])
        if info["problem"] is None and comm.world > 1:
            fs, path = files.filesystem(where)
            seen = fs.exists(f"{path.rstrip('/')}/{info['mark']}")
            blind = [q for q, ok in enumerate(comm.all_gather_json(seen)) if not ok]
            if blind:
                info["problem"] = (
                    f"checkpoints: {where} is not reachable from rank {blind[0]} (every rank writes its own "
                    "part: put checkpoint.dir, or logging.out_dir, on storage every machine shares)"
                )
        if root:
            try:
                fs, path = files.filesystem(where)
                fs.rm(f"{path.rstrip('/')}/{info['mark']}")
            except (OSError, ValueError):
                pass
        if info["problem"] is not None:
            raise refuse(comm, str(info["problem"]))
        return where

    def save(self, wait: bool = False) -> str:
        """Checkpoint the state after the last completed round (every rank calls it). Returns its name.

        The round last checkpointed is not written again (a stop right after a checkpoint)."""
        self.wait()
        round_ = self.driver.round
        name = files.name(round_)
        if self.saved_round == round_:
            return name
        t0 = time.perf_counter()
        state = RunState(self.driver)
        tensors, mine = state.capture()
        self.saved_round = round_
        root = self.comm.rank == self.comm.root
        writer = files.Writer(self.where, round_, self.run_dir)
        problem = None
        if root:
            try:
                writer.prepare()
            except files.CheckpointWriteError as exc:
                problem = str(exc)
        parts = self.comm.all_gather_json({"run": mine, "problem": problem})
        if parts[self.comm.root]["problem"] is not None:  # type: ignore[index]
            raise refuse(self.comm, str(parts[self.comm.root]["problem"]), files.CheckpointWriteError)  # type: ignore[index]
        meta = state.run_level([p["run"] for p in parts], self.config()) if root else {}  # type: ignore[index]
        background = self.background and not wait
        try:
            future = storage.write(tensors, writer.tmp, self.group, background)
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP gathers every rank's failure
            raise self._failed(writer, exc) from None
        stall = time.perf_counter() - t0  # behind training: what it waited for (the copy to host memory)

        def complete() -> None:
            try:
                if future is not None:
                    future.result()
                mine = files.own_files(writer.tmp, self.comm.rank)
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - the same on every rank
                raise self._failed(writer, exc) from None
            every = gather(mine, self.group)
            if not root:
                return
            manifest = {k: v for part in every for k, v in sorted(part.items())}
            path = writer.finish(meta, manifest, self.keep)
            seconds = time.perf_counter() - t0
            self.sink.log(
                events.Checkpoint(
                    round=round_,
                    name=path.name,
                    bytes=sum(int(v["bytes"]) for v in manifest.values()),
                    seconds=seconds,
                    stall_s=stall if future is not None else seconds,  # between rounds: all of it
                ).to_dict()
            )
            self.last = path.name

        if future is not None:
            self._thread = threading.Thread(target=self._run, args=(complete,), name="adloco-checkpoint")
            self._thread.start()
        else:
            complete()
        return name

    def _failed(self, writer: files.Writer, exc: BaseException) -> UserError:
        if self.comm.rank == self.comm.root:
            writer.abort()
        return refuse(self.comm, writer.message(_cause(exc)), files.CheckpointWriteError)

    def _run(self, complete: Callable[[], None]) -> None:
        try:
            complete()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread at the next wait
            self._error = exc

    def wait(self) -> None:
        """Until the write in flight is complete; re-raises its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err


def _cause(exc: BaseException) -> BaseException:
    """The first rank's error inside DCP's CheckpointException (an OSError says what the disk refused)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        if isinstance(first, tuple) and first and isinstance(first[0], BaseException):
            return first[0]
        if isinstance(first, BaseException):
            return first
    return exc
