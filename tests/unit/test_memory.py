"""b_max search (ALGORITHM.md §5) and the local launcher's network exposure."""

from __future__ import annotations

import pytest

from adloco.engine.dist.launch import child_env, loopback_interface
from adloco.engine.memory import largest_fitting


@pytest.mark.parametrize("limit,hi,want", [(13, 100, 13), (13, 8, 8), (1, 64, 1), (64, 64, 64), (0, 64, 1)])
def test_largest_fitting(limit: int, hi: int, want: int) -> None:
    tried: list[int] = []

    def fits(b: int) -> bool:
        tried.append(b)
        return b <= limit

    assert largest_fitting(fits, hi) == want
    assert max(tried) <= hi and len(tried) <= 2 * hi.bit_length() + 1  # doubling, then bisection
    assert all(b >= 1 for b in tried)


def test_local_processes_meet_on_loopback_only() -> None:
    env = child_env(1, 4, "/tmp/x/store")
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("1", "4", "4")
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["ADLOCO_STORE"] == "/tmp/x/store"  # a file store
    lo = loopback_interface()
    if lo is not None:
        assert env["GLOO_SOCKET_IFNAME"] == lo and env["NCCL_SOCKET_IFNAME"] == lo
