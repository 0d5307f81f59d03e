"""Checkpoints of ``adloco train``: the format on disk (:mod:`.files`), what a checkpoint holds and how
it reaches every process (:mod:`.state`), and the background writer (:mod:`.saver`)."""

from adloco.engine.checkpoint.files import (
    DIR,
    FORMAT,
    STATE,
    Checkpoint,
    CheckpointWriteError,
    Writer,
    complete,
    folder,
    load,
    locate,
    name,
    save,
)

__all__ = [
    "DIR",
    "FORMAT",
    "STATE",
    "Checkpoint",
    "CheckpointWriteError",
    "Writer",
    "complete",
    "folder",
    "load",
    "locate",
    "name",
    "save",
]
