"""Regressions: θ of a process whose only worker of a trainer was left out, the compressed all-reduce in
threads that host no worker of a group, flattened modules being freed, and ``inner_state: reset`` in the
hooked mode."""

from __future__ import annotations

import copy
import gc
import weakref

import torch
from torch import nn

from adloco import AdaptiveBatch, AdLoCo, Merging
from adloco.comm.inprocess import InProcessComm
from adloco.engine.driver import Driver
from adloco.flat import flatten
from tests.helpers import build_fn, run_threaded, synthetic_data, tiny_config
from tests.toy import Data, loss_fn, models


def test_a_process_whose_worker_is_left_out_still_gets_the_outer_step() -> None:
    cfg = tiny_config(
        **{
            "algorithm": {"workers": 2, "trainers": 1, "rounds": 2},
            "outer": {"optimizer": "nesterov"},
            "merge": {"policy": "none"},
        }
    )
    data = synthetic_data(seq_len=cfg.data.seq_len)

    def make(comm):  # type: ignore[no-untyped-def]
        d = Driver(cfg, comm, data, build_fn(data, cfg), torch.device("cpu"), log=lambda s: None)
        step_all = d.algo.step_all

        def poisoned(batches, *, stop=False):  # type: ignore[no-untyped-def]
            out = step_all(batches, stop=stop)
            if d.algo.round == 1 and d.algo.step_in_round == 1 and 1 in d.algo.replicas:
                d.algo.replicas[1].flat.param.fill_(float("nan"))  # worker 1 (thread 1's only one) blows up
            return out

        d.algo.step_all = poisoned  # type: ignore[method-assign]
        return d

    ref = make(InProcessComm(2))
    for _ in range(2):
        ref.run_round()
    for d in run_threaded(make, {0: 0, 1: 1}, 2):
        assert torch.equal(d.algo.theta(0), ref.algo.theta(0)), d.comm.rank
        assert torch.equal(d.algo.trainers[0].outer.v, ref.algo.trainers[0].outer.v), d.comm.rank
        for w, rep in d.algo.replicas.items():
            assert torch.equal(rep.flat.param, ref.algo.replicas[w].flat.param)


def test_compressed_all_reduce_in_threads_hosting_no_worker_of_a_trainer() -> None:
    # trainer 0 = workers {0, 1} on both threads, trainer 1 = worker {2} on thread 1 alone
    cfg = tiny_config(
        **{
            "algorithm": {"workers": 3, "trainers": 2, "rounds": 2},
            "merge": {"policy": "none"},
            "comm": {"dtype": "int8", "block": 64, "error_feedback": True},
        }
    )
    data = synthetic_data(seq_len=cfg.data.seq_len)

    def make(comm):  # type: ignore[no-untyped-def]
        return Driver(cfg, comm, data, build_fn(data, cfg), torch.device("cpu"), log=lambda s: None)

    ref = make(InProcessComm(3))
    for _ in range(2):
        ref.run_round()
    assert ref.algo.allocation == {0: 0, 1: 0, 2: 1}
    for d in run_threaded(make, {0: 0, 1: 1, 2: 1}, 2):
        assert d.algo.totals.by_kind == ref.algo.totals.by_kind
        for t, tr in d.algo.trainers.items():
            if tr.hosted:
                assert torch.equal(tr.theta, ref.algo.theta(t))
        assert d.algo.feedback is not None and ref.algo.feedback is not None
        for w, fb in d.algo.feedback.items():
            ref_error = ref.algo.feedback[w].error
            assert (fb.error is None and ref_error is None) or torch.equal(fb.error, ref_error)


def test_a_flattened_module_is_freed_and_a_copy_gets_its_own_buffer() -> None:
    m = nn.Linear(64, 64)
    flat = flatten(m)
    copied = copy.deepcopy(m)
    flat_copy = flatten(copied)
    assert flat_copy is not flat and flat_copy.param.data_ptr() == copied.weight.data_ptr()
    module, buffer = weakref.ref(m), weakref.ref(flat)
    del m, flat
    gc.collect()
    assert module() is None and buffer() is None


def test_inner_state_reset_in_the_hooked_mode_begins_before_the_round() -> None:
    H = 3
    ms = models(2)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in ms]
    algo = AdLoCo(
        ms,
        opts,
        inner_steps=H,
        trainers=1,
        loss_fn=loss_fn,
        inner_state="reset",
        batch=AdaptiveBatch("none", initial=2, statistics=False),
        merge=Merging("none"),
    )
    data = Data()
    with algo:
        for r in range(2):
            for h in range(H):
                for w, (m, o) in enumerate(zip(ms, opts, strict=True)):
                    o.zero_grad()
                    loss_fn(m, data.batch(w, r, h, 2)).backward()
                    o.step()
    assert algo.round == 2
    for o in opts:  # every round's H steps, from a fresh state
        assert {int(s["step"]) for s in o.state.values()} == {H}
