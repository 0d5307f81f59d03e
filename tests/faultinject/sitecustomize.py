"""Test-only fault injection for subprocesses: Python imports this file at start-up when
``tests/faultinject`` is on PYTHONPATH (see ``tests/helpers.py: with_faults``). Nothing in ``src/`` knows.

``ADLOCO_TEST_FAULT`` holds comma-separated faults:
  ``kill@R:N``   SIGKILL rank R at the start of round N;
  ``stop@R:N``   SIGSTOP it there (a hung process that neither answers nor dies);
  ``term@R:N``   send it SIGTERM there (as a scheduler would), to stop it cleanly;
  ``term@R:N:S`` send it SIGTERM after inner step S of round N (mid-round; ``int@R:N:S``: SIGINT);
  ``nan@W:N``    worker W's parameters become non-finite in round N (``nan@W:N-M``: rounds N to M);
  ``oom@W:B``    worker W runs out of memory on any micro-batch of more than B rows;
  ``diskfull@N`` the checkpoint of round N meets a full disk.
Process faults (kill, stop, term, int) strike the first attempt only, not the processes an elastic
agent restarts.
"""

from __future__ import annotations

import os

SPEC = os.environ.get("ADLOCO_TEST_FAULT", "")


def _faults(kind: str) -> list[list[str]]:
    out = []
    for item in SPEC.split(","):
        action, _, where = item.strip().partition("@")
        if action == kind:
            out.append(where.split(":"))
    return out


def _install() -> None:
    import errno
    import signal

    import torch

    from adloco import method, replica
    from adloco.engine import checkpoint

    def rank() -> int:
        # a process fault strikes the first attempt only: the processes an elastic agent restarts are spared
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
            return -1
        return int(os.environ.get("RANK", "0"))

    step_all = method.AdLoCo.step_all

    def faulty_step_all(self, batches, *, stop=False):  # type: ignore[no-untyped-def]
        round_, h = self.round + 1, self.step_in_round
        if h == 0:  # the start of a round
            for action, sig in (("kill", signal.SIGKILL), ("stop", signal.SIGSTOP), ("term", signal.SIGTERM)):
                for r, n, *at in _faults(action):
                    if int(r) == rank() and int(n) == round_ and not at:
                        os.kill(os.getpid(), sig)
        out = step_all(self, batches, stop=stop)
        for action, sig in (("term", signal.SIGTERM), ("int", signal.SIGINT)):
            for r, n, *at in _faults(action):
                if int(r) == rank() and int(n) == round_ and at and int(at[0]) == h + 1:
                    os.kill(os.getpid(), sig)
        return out

    method.AdLoCo.step_all = faulty_step_all

    init, sync = method.AdLoCo.__init__, method.AdLoCo.sync

    def tagged_init(self, *args, **kw):  # type: ignore[no-untyped-def]
        init(self, *args, **kw)
        for w, rep in self.replicas.items():
            rep._test_worker = w

    def poisoned_sync(self, abort=False):  # type: ignore[no-untyped-def]
        for w, span in _faults("nan"):
            lo, _, hi = span.partition("-")
            if int(w) in self.replicas and int(lo) <= self.round + 1 <= int(hi or lo):
                self.replicas[int(w)].flat.param.data.fill_(float("nan"))
        return sync(self, abort)

    method.AdLoCo.__init__ = tagged_init
    method.AdLoCo.sync = poisoned_sync

    fb = replica.Replica.forward_backward

    def forward_backward(self, batch, scale):  # type: ignore[no-untyped-def]
        for w, limit in _faults("oom"):
            if getattr(self, "_test_worker", None) == int(w) and replica.n_rows(batch) > int(limit):
                raise torch.OutOfMemoryError(f"test fault: more than {limit} rows")
        return fb(self, batch, scale)

    replica.Replica.forward_backward = forward_backward

    write = checkpoint.Writer._write

    def full_disk(self, filename, data):  # type: ignore[no-untyped-def]
        if f"diskfull@{self.round}" in SPEC.split(","):
            self._fail(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        return write(self, filename, data)

    checkpoint.Writer._write = full_disk


if SPEC:
    _install()
