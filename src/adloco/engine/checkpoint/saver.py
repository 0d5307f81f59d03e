"""Checkpoints of ``adloco train``: the driver's state gathered between rounds, written in the background.

Training waits only while the state is gathered to the writing rank and copied to host memory; the
files (safetensors, SHA-256, fsync, the atomic rename, deleting the oldest) are written by one thread
while the next round runs. At most one write is in flight: the next checkpoint, the end of the run, a
stop and any error wait for it first. A write that failed (a full disk) is reported at that wait, and
the previous checkpoint is still complete.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from adloco import events
from adloco.engine import checkpoint
from adloco.engine.checkpoint.state import RunState
from adloco.engine.driver import Driver
from adloco.telemetry.metrics import MetricsSink


class Checkpointer:
    def __init__(
        self,
        driver: Driver,
        config: Callable[[], dict[str, Any]],
        run_dir: Path | None,
        sink: MetricsSink,
        keep: int,
        background: bool = True,
    ) -> None:
        self.driver, self.config, self.run_dir, self.sink, self.keep = driver, config, run_dir, sink, keep
        self.background = background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last: str | None = None
        self.saved_round: int | None = None  # every rank knows: the gather of that round's state happened

    def save(self, wait: bool = False) -> str:
        """Checkpoint the state after the last completed round (every rank calls it). Returns its name.

        The round last checkpointed is not written again (a stop right after a checkpoint)."""
        self.wait()
        round_ = self.driver.round
        if self.saved_round == round_:
            return checkpoint.name(round_)
        t0 = time.perf_counter()
        state = RunState(
            self.driver
        ).gather()  # a collective: every rank takes part, the writing rank gets it
        self.saved_round = round_
        name = checkpoint.name(round_)
        if self.run_dir is None or state is None:
            return name
        state = _to_host(state)
        stall = time.perf_counter() - t0
        run_dir, cfg = self.run_dir, self.config()

        def write() -> None:
            writer = checkpoint.Writer(run_dir, round_)
            try:
                path = checkpoint.save(writer, state, cfg, self.keep)
            except BaseException:
                writer.abort()
                raise
            self.sink.log(
                events.Checkpoint(
                    round=round_,
                    name=path.name,
                    bytes=sum(f.stat().st_size for f in path.iterdir()),
                    seconds=time.perf_counter() - t0,
                    stall_s=stall,
                ).to_dict()
            )
            self.last = path.name

        if self.background and not wait:
            self._thread = threading.Thread(target=self._run, args=(write,), name="adloco-checkpoint")
            self._thread.start()
        else:
            write()
        return name

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
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


def _to_host(x: Any) -> Any:
    """The state with every tensor in host memory (CUDA tensors copied: the next round will change them)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu() if x.is_cuda else x
    if isinstance(x, dict):
        return {k: _to_host(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_to_host(v) for v in x]
    return x
