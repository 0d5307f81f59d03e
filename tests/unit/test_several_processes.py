"""The round, written once, gives the same run when several processes each host some workers.

Processes are threads with :class:`adloco.library.comm.ThreadComm`; real torch.distributed processes are tested
with the distributed backend. Among them: a process whose only worker of a trainer is left out (its
update not finite) still takes the outer step, and a thread hosting no worker of a trainer still takes
part in its compressed all-reduce.
"""

from __future__ import annotations

import pytest
import torch

from adloco.engine.driver import Driver
from tests.helpers import (
    assert_copies_agree,
    build_fn,
    reference_and_threaded,
    run_threaded,
    synthetic_data,
    tiny_config,
)


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
        for w, worker in c.replicas.items():
            torch.testing.assert_close(worker.flat.param, ref.replicas[w].flat.param, rtol=1e-5, atol=1e-6)


def test_processes_that_disagree_stop_the_run() -> None:
    from adloco.library.method import DecisionMismatch

    cfg = tiny_config(
        **{"algorithm": {"workers": 2, "trainers": 2, "rounds": 2}, "merge": {"policy": "none"}}
    )
    data = synthetic_data(seq_len=cfg.data.seq_len)

    def make(comm):  # type: ignore[no-untyped-def]
        c = Driver(cfg, comm, data, build_fn(data, cfg), torch.device("cpu"), log=lambda s: None)
        if comm.rank == 1:  # a bug or non-deterministic arithmetic on one process
            c.algo.trainers[0].request += 10  # beyond what one round of the batch test reaches
        return c

    with pytest.raises(DecisionMismatch, match="round 1: processes disagree"):
        run_threaded(make, {0: 0, 1: 1}, 1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8", "int4"])
def test_compressed_wire_dtypes_give_the_same_bits_in_threads_and_in_process(dtype: str) -> None:
    """Every worker is a participant of the compressed all-reduce, whichever process hosts it: two
    threads hosting two workers each compute, bit for bit, what one process hosting all four does."""
    cfg = tiny_config(
        **{
            "algorithm": {"workers": 4, "trainers": 2, "rounds": 3},
            "batch": {"test": "augmented_inner_product", "vartheta": 0.05},
            "merge": {"every": 2},
            "outer": {"optimizer": "nesterov"},
            "comm": {"dtype": dtype, "block": 64, "error_feedback": dtype.startswith("int")},
        }
    )
    ref, coords = reference_and_threaded(cfg, {0: 0, 1: 1, 2: 0, 3: 1}, 3)
    assert_copies_agree(ref, coords)
    for c in coords:  # every worker kept its error
        assert all(fb.error is not None for fb in (c.feedback or {}).values())


@pytest.mark.long
@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "int4"])
def test_merges_and_moves_travel_compressed_and_every_copy_agrees(dtype: str) -> None:
    """comm.theta_dtype: θ and the outer momentum cross processes on merges and moves through the
    compressed all-reduce, counted at its size; every process holding a trainer keeps the same bits, and
    four threads compute what one process does."""

    def run(theta: str):  # type: ignore[no-untyped-def]
        cfg = tiny_config(
            **{
                "algorithm": {"workers": 4, "trainers": 4, "rounds": 4},
                "merge": {"every": 1},
                "outer": {"optimizer": "nesterov"},
                "batch": {"eta": 0.3},
                "comm": {"theta_dtype": theta, "block": 64},
            }
        )
        return reference_and_threaded(cfg, {0: 0, 1: 1, 2: 2, 3: 3}, 4)

    plain, _ = run("float32")
    ref, coords = run(dtype)
    assert {"merge", "move"} <= set(ref.totals.by_kind)  # the run did merge and move
    for kind in ("merge", "move"):  # bytes at the wire's size: 2, 1 or 1/2 byte a value, plus scales
        ratio = ref.totals.by_kind[kind] / plain.totals.by_kind[kind]
        assert ratio < {"bfloat16": 0.6, "int8": 0.35, "int4": 0.2}[dtype], (kind, ratio)
    assert ref.totals.by_kind["delta"] == plain.totals.by_kind["delta"]  # Δ's wire is its own
    (t,) = ref.trainers
    assert not torch.equal(ref.theta(t), plain.theta(t))  # rounded once on the way
    assert_copies_agree(ref, coords)
    for c in coords:  # θ on every copy, and momentum
        assert torch.equal(c.theta(t), ref.theta(t)) and torch.equal(
            c.trainers[t].outer.v, ref.trainers[t].outer.v
        )


def test_a_process_whose_worker_is_left_out_still_gets_the_outer_step() -> None:
    cfg = tiny_config(
        **{
            "algorithm": {"workers": 2, "trainers": 1, "rounds": 2},
            "outer": {"optimizer": "nesterov"},
            "merge": {"policy": "none"},
        }
    )

    def poison(d: Driver) -> None:
        step_all = d.algo.step_all

        def poisoned(batches, *, stop=False):  # type: ignore[no-untyped-def]
            out = step_all(batches, stop=stop)
            if d.algo.round == 1 and d.algo.step_in_round == 1 and 1 in d.algo.replicas:
                d.algo.replicas[1].flat.param.fill_(float("nan"))  # worker 1 (thread 1's only one) blows up
            return out

        d.algo.step_all = poisoned  # type: ignore[method-assign]

    ref, coords = reference_and_threaded(cfg, {0: 0, 1: 1}, 2, prepare=poison)
    for c in coords:
        assert torch.equal(c.theta(0), ref.theta(0)), c.comm.rank
        assert torch.equal(c.trainers[0].outer.v, ref.trainers[0].outer.v), c.comm.rank
        for w, rep in c.replicas.items():
            assert torch.equal(rep.flat.param, ref.replicas[w].flat.param)


def test_compressed_all_reduce_in_threads_hosting_no_worker_of_a_trainer() -> None:
    # trainer 0 = workers {0, 1} on both threads, trainer 1 = worker {2} on thread 1 alone
    cfg = tiny_config(
        **{
            "algorithm": {"workers": 3, "trainers": 2, "rounds": 2},
            "merge": {"policy": "none"},
            "comm": {"dtype": "int8", "block": 64, "error_feedback": True},
        }
    )
    ref, coords = reference_and_threaded(cfg, {0: 0, 1: 1, 2: 1}, 2)
    assert ref.allocation == {0: 0, 1: 0, 2: 1} and ref.feedback is not None
    assert_copies_agree(ref, coords)
