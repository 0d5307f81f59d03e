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


def test_the_cuda_search_budgets_each_workers_error_feedback(monkeypatch: pytest.MonkeyPatch) -> None:
    """b_max on CUDA: every worker's error feedback (P float32, on by default for topk) is state beside
    the optimizer's, budgeted like it (the search itself is stubbed: no GPU here)."""
    import torch

    from adloco.engine import memory
    from tests.helpers import driver, tiny_config

    seen: list[float] = []

    def search(step: object, budget: float, state_bytes: int, hi: int, device: object) -> int:
        seen.append(state_bytes)
        return 2

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**34, 2**35))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(memory, "cuda_b_max", search)
    for dtype in ("int4", "topk"):
        d = driver(tiny_config(**{"algorithm": {"rounds": 1}, "comm": {"dtype": dtype}}))
        d._search_b_max(4)
    P = d.algo.n_params
    assert seen[1] - seen[0] == 4 * P  # int4 keeps none by default, topk one P-vector a worker


def test_the_memory_check_counts_error_feedback(monkeypatch: pytest.MonkeyPatch) -> None:
    from adloco.config import resolve
    from adloco.models import sizing

    objects = sizing.REPLICA_OBJECTS_PER_LAYER
    est = sizing.estimate(1000, replicas=2, optimizer="sgd", feedback=True)
    assert est.state == 2 * ((2 + 1) * 4 * 1000 + objects)
    seen: list[bool] = []
    real = sizing.estimate

    def spy(*args: object, **kwargs: object) -> sizing.Estimate:
        seen.append(bool(kwargs.get("feedback", args[11] if len(args) > 11 else False)))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sizing, "estimate", spy)
    resolve(None, ["comm.dtype=topk"])
    assert seen and all(seen)
    seen.clear()
    resolve(None, ["comm.dtype=int4"])
    assert seen and not any(seen)
