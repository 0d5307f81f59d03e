"""Which training blocks each worker reads (ALGORITHM.md §3): reproducible from (seed, trainer, worker, round).

Every trainer draws from its own random subset of the training blocks. Each round the subset is
shuffled with a generator keyed by (seed, trainer, round) and cut into one disjoint shard per worker of
the trainer; a worker reads its shard in order and, if it needs more, reshuffles it (keyed also by the
worker's index and the pass). Nothing depends on what ran before, so any round can be replayed exactly.
"""

from __future__ import annotations

import numpy as np

_SUBSET, _ROUND, _PASS = 1, 2, 3  # stream tags, so no two streams share a key


def trainer_subset(n_blocks: int, fraction: float, seed: int, trainer: int) -> np.ndarray:
    """The sorted block indices trainer ``trainer`` draws from (all blocks when fraction is 1)."""
    if fraction >= 1.0:
        return np.arange(n_blocks, dtype=np.int64)
    size = max(1, round(fraction * n_blocks))
    rng = np.random.default_rng([seed, _SUBSET, trainer])
    return np.sort(rng.choice(n_blocks, size=size, replace=False)).astype(np.int64)


class ShardStream:
    """The blocks one worker reads in one round: its disjoint shard of the trainer's subset."""

    def __init__(
        self, subset: np.ndarray, seed: int, trainer: int, round_: int, index: int, count: int
    ) -> None:
        perm = np.random.default_rng([seed, _ROUND, trainer, round_]).permutation(subset)
        self.shard = np.array_split(perm, count)[index]
        if len(self.shard) == 0:  # more workers than blocks: share rather than starve
            self.shard = perm[index % len(perm) : index % len(perm) + 1]
        self._key = (seed, trainer, round_, index)
        self._order = self.shard
        self._pos = 0
        self._pass = 0

    def take(self, k: int) -> np.ndarray:
        """The next ``k`` block indices (reshuffling the shard when it runs out)."""
        out = []
        while k > 0:
            if self._pos == len(self._order):
                self._pass += 1
                seed, trainer, round_, index = self._key
                rng = np.random.default_rng([seed, _PASS, trainer, round_, index, self._pass])
                self._order = rng.permutation(self.shard)
                self._pos = 0
            n = min(k, len(self._order) - self._pos)
            out.append(self._order[self._pos : self._pos + n])
            self._pos += n
            k -= n
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
