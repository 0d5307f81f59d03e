"""A batch schedule (ALGORITHM.md §15): the next round's request as a pure function of the examples seen.

The field's answer to "which batch when" without a test: the batch grows with the data seen, not with
gradient statistics. Two rules, both starting at b₀ (``batch.initial``), never falling and capped at
``batch.max``; D is the run's training examples read so far (every worker's, probe rows included: what
``totals.examples`` counts), D₀ the schedule's scale in examples (``batch.schedule_examples``):

* ``power``: b(D) = ⌊b₀ · (D/D₀)^p⌋ once D > D₀, b₀ before: a power law in the data seen (Power Lines,
  arXiv 2505.13738: the optimal batch grows as a power of the tokens seen; the critical batch of arXiv
  2410.21676 grows with the data, nearly flat in model size).
* ``ramp``: b(D) = b₀ + ⌊(b_max − b₀) · min(D, D₀) / D₀⌋: a linear ramp from b₀ to the cap over the first
  D₀ examples (the batch-size warm-up of Psyche and of GPT-3's training).

Being a function of D alone, a resumed run (whose checkpoint keeps D) follows the same schedule bit for
bit, and every process computes the same request.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adloco.library.settings import AdaptiveBatch

RULES = ("none", "power", "ramp")


def request(rule: str, examples: int, initial: int, cap: int, scale: int, power: float) -> int:
    """The request b for the round after ``examples`` training examples were read, by ``rule``
    (``none`` keeps ``initial``); always in [initial, max(initial, cap)]."""
    if examples < 0 or initial < 1 or scale < 1:
        raise ValueError(
            f"batch schedule: examples {examples}, initial {initial}, scale {scale} out of range"
        )
    top = max(initial, cap)
    if rule == "none":
        return initial
    if rule == "power":
        if examples <= scale:
            return initial
        return min(top, max(initial, math.floor(initial * (examples / scale) ** power)))
    if rule == "ramp":
        return initial + (top - initial) * min(examples, scale) // scale
    raise ValueError(f"unknown batch schedule {rule!r}")


def of(batch: AdaptiveBatch, examples: int) -> int:
    """:func:`request` with the rule and its parameters from the ``batch`` dial."""
    return request(
        batch.schedule, examples, batch.initial, batch.max, batch.schedule_examples, batch.schedule_power
    )
