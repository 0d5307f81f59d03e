"""Switch mode (ALGORITHM.md §5; AdLoCo paper, section 4.2): micro-batch and accumulation from the request and b_max."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """How one worker runs one inner step of request b."""

    micro: int  # examples per forward/backward
    accum: int  # micro-batches per optimizer step
    capped: bool  # the request was cut down to fit one micro-batch

    @property
    def effective(self) -> int:
        """Examples per optimizer step."""
        return self.micro * self.accum


def plan(b: int, b_max: int, mode: str, kappa: float) -> Plan:
    """``threshold``: accumulate only when b > κ·b_max (then ⌈b/b_max⌉ micro-batches of b_max), else
    one micro-batch of min(b, b_max). ``accumulate``: always ⌈b/b_max⌉ micro-batches of min(b, b_max).
    ``cap``: never accumulate, one micro-batch of min(b, b_max)."""
    if b < 1 or b_max < 1:
        raise ValueError(f"request ({b}) and b_max ({b_max}) must be >= 1")
    if mode == "threshold":
        if b > kappa * b_max:
            return Plan(b_max, math.ceil(b / b_max), False)
        return Plan(min(b, b_max), 1, b > b_max)
    if mode == "accumulate":
        return Plan(min(b, b_max), math.ceil(b / b_max), False)
    if mode == "cap":
        return Plan(min(b, b_max), 1, b > b_max)
    raise ValueError(f"unknown switch mode {mode!r}")


def mode_for(schedule: str, mode: str, trainers_alive: int) -> str:
    """``reference`` reproduces the reference implementation: accumulate while more than one trainer
    lives, threshold once one is left. ``fixed`` always uses ``mode``."""
    if schedule == "fixed":
        return mode
    if schedule == "reference":
        return "accumulate" if trainers_alive > 1 else "threshold"
    raise ValueError(f"unknown switch schedule {schedule!r}")
