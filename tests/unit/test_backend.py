"""Which process group backend a machine's devices allow (a pure function of the layout)."""

from __future__ import annotations

import pytest


def test_the_process_group_backend_follows_the_devices() -> None:
    from adloco.engine.dist.join import pick_backend
    from adloco.errors import UserError

    assert pick_backend("auto", use_cuda=False, local_processes=4, devices=0) == "gloo"
    assert pick_backend("auto", use_cuda=True, local_processes=2, devices=2) == "nccl"
    # NCCL refuses two ranks on one device ("Duplicate GPU detected"): auto falls back to gloo
    assert pick_backend("auto", use_cuda=True, local_processes=2, devices=1) == "gloo"
    assert pick_backend("gloo", use_cuda=True, local_processes=1, devices=1) == "gloo"
    with pytest.raises(UserError, match="2 processes on this machine share 1 CUDA device"):
        pick_backend("nccl", use_cuda=True, local_processes=2, devices=1)
    with pytest.raises(UserError, match="NCCL needs CUDA"):
        pick_backend("nccl", use_cuda=False, local_processes=1, devices=0)
