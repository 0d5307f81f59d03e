"""What the examples share: a small character-level language model in plain PyTorch, trained on the
running Python's own standard library source (no download), and its validation loss.

Nothing here is adloco: it stands for your model and your data.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

CONTEXT = 16  # characters the model sees
FILES = ("textwrap.py", "string.py", "shlex.py", "fnmatch.py", "heapq.py", "bisect.py", "queue.py", "glob.py")


def corpus() -> tuple[torch.Tensor, torch.Tensor]:
    """(train bytes, validation bytes) of a few standard-library modules, as int64 tensors."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join((root / f).read_bytes() for f in FILES if (root / f).is_file())
    data = torch.tensor(list(text), dtype=torch.long)
    cut = int(0.9 * len(data))
    return data[:cut], data[cut:]


class CharModel(nn.Module):
    """Embed CONTEXT bytes, an MLP, logits over the next byte: (B, CONTEXT) -> (B, 256)."""

    def __init__(self, width: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.mlp = nn.Sequential(nn.Linear(CONTEXT * width, hidden), nn.GELU(), nn.Linear(hidden, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(x).flatten(1))  # (B, CONTEXT, width) -> (B, CONTEXT·width) -> (B, 256)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The mean loss over the batch's rows (what adloco's step() asks of a loss function)."""
    x, y = batch
    return F.cross_entropy(model(x), y)


def sample(data: torch.Tensor, rows: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` random windows of CONTEXT bytes and the byte after each."""
    start = torch.randint(0, len(data) - CONTEXT - 1, (rows,), generator=generator)
    idx = start[:, None] + torch.arange(CONTEXT)
    return data[idx], data[start + CONTEXT]


@torch.no_grad()
def val_loss(model: nn.Module, data: torch.Tensor, rows: int = 2048) -> float:
    x, y = sample(data, rows, torch.Generator().manual_seed(1234))  # the same windows every time
    return float(loss_fn(model, (x, y)))


def distributed() -> tuple[int, int]:
    """(rank, world): join torchrun's process group (gloo, CPU) when launched by it, else (0, 1)."""
    if "RANK" not in os.environ:
        return 0, 1
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def finish() -> None:
    """Leave torchrun's process group, if this process joined one (a group left to the interpreter's exit
    can abort the process while gloo's threads still run)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
