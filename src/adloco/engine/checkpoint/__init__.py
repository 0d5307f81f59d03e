"""Checkpoints of ``adloco train``: where they are and how one is completed and found (:mod:`.files`), each
rank's part of one (:mod:`.state`), their tensors through torch.distributed.checkpoint (:mod:`.storage`),
and the writer between rounds or behind training (:mod:`.saver`)."""

from adloco.engine.checkpoint.files import (
    DIR,
    FORMAT,
    STATE,
    Checkpoint,
    CheckpointWriteError,
    Folder,
    Writer,
    complete,
    configured_dir,
    locate,
    location,
    name,
    probe,
)

__all__ = [
    "DIR",
    "FORMAT",
    "STATE",
    "Checkpoint",
    "CheckpointWriteError",
    "Folder",
    "Writer",
    "complete",
    "configured_dir",
    "locate",
    "location",
    "name",
    "probe",
]
