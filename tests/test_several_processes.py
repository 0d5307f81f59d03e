"""The coordinator, written once, gives the same run when several processes each host some workers.

Processes are threads with a fake communicator (tests/threadcomm.py); real torch.distributed processes
are tested with the distributed backend.
"""

from __future__ import annotations

import pytest
import torch

from adloco.engine.backends.inprocess import InProcessComm
from adloco.engine.coordinator import Coordinator
from tests.helpers import build_fn, synthetic_data, tiny_config
from tests.threadcomm import run_threaded


def reference_and_threaded(cfg, owner, rounds):  # type: ignore[no-untyped-def]
    data = synthetic_data(seq_len=cfg.data.seq_len)

    def make(comm):  # type: ignore[no-untyped-def]
        return Coordinator(cfg, comm, data, build_fn(data, cfg), torch.device("cpu"), log=lambda s: None)

    ref = make(InProcessComm(cfg.algorithm.workers))
    history = []
    for _ in range(rounds):
        ref.run_round()
        history.append((ref.requests, dict(ref.allocation)))
    return ref, run_threaded(make, owner, rounds)


@pytest.mark.parametrize(
    ("test", "estimator", "outer"),
    [
        ("norm", "pooled", "nesterov"),
        ("inner_product", "pooled", "average"),  # ‖ḡ‖² is known only where ḡ was all-reduced
        ("augmented_inner_product", "pooled", "sgd"),
        ("norm", "paper", "nesterov"),
    ],
)
def test_two_processes_match_one(test: str, estimator: str, outer: str) -> None:
    cfg = tiny_config(
        **{
            "algorithm": {"workers": 4, "trainers": 2, "rounds": 3},
            "batch": {"test": test, "estimator": estimator, "eta": 0.3, "vartheta": 0.05, "nu": 0.3},
            "merge": {"every": 2},
            "outer": {"optimizer": outer},
        }
    )
    owner = {0: 0, 1: 1, 2: 0, 3: 1}  # each trainer's workers sit on both processes
    ref, coords = reference_and_threaded(cfg, owner, 3)
    for c in coords:
        assert c.requests == ref.requests
        assert c.allocation == ref.allocation
        assert c.totals.bytes == ref.totals.bytes and c.totals.messages == ref.totals.messages
        for t, tr in c.trainers.items():
            if tr.hosted:
                torch.testing.assert_close(tr.theta, ref.theta(t), rtol=1e-5, atol=1e-6)
    assert max(ref.requests.values()) > 2  # the test did move the requests


def test_merges_and_moves_across_processes() -> None:
    # 4 trainers on 4 workers, one per process: every merge and every move crosses processes
    cfg = tiny_config(
        **{
            "algorithm": {"workers": 4, "trainers": 4, "rounds": 4},
            "merge": {"every": 1},
            "outer": {"optimizer": "nesterov"},
            "batch": {"eta": 0.3},
        }
    )
    owner = {0: 0, 1: 1, 2: 2, 3: 3}
    ref, coords = reference_and_threaded(cfg, owner, 4)
    assert len(ref.trainers) == 1
    for c in coords:
        assert c.requests == ref.requests and c.allocation == ref.allocation
        (t,) = c.trainers
        torch.testing.assert_close(c.theta(t), ref.theta(t), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c.trainers[t].outer.v, ref.trainers[t].outer.v, rtol=1e-5, atol=1e-6)
        for w, worker in c.workers.items():
            torch.testing.assert_close(worker.flat.param, ref.workers[w].flat.param, rtol=1e-5, atol=1e-6)


def test_processes_that_disagree_stop_the_run() -> None:
    from adloco.engine.coordinator import DecisionMismatch

    cfg = tiny_config(
        **{"algorithm": {"workers": 2, "trainers": 2, "rounds": 2}, "merge": {"policy": "none"}}
    )
    data = synthetic_data(seq_len=cfg.data.seq_len)

    def make(comm):  # type: ignore[no-untyped-def]
        c = Coordinator(cfg, comm, data, build_fn(data, cfg), torch.device("cpu"), log=lambda s: None)
        if comm.rank == 1:  # a bug or non-deterministic arithmetic on one process
            c.trainers[0].request += 10  # beyond what one round of the batch test reaches
        return c

    with pytest.raises(DecisionMismatch, match="round 1: processes disagree"):
        run_threaded(make, {0: 0, 1: 1}, 1)
