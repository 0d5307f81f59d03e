"""The trainer callbacks with the real trainers, in this process: a Hugging Face Trainer and a Lightning
Trainer each run DiLoCo's rounds, save with their own checkpoints, and a run resumed from the middle one
ends bit for bit where the uninterrupted run ended. (Two processes under torchrun:
tests/integration/test_integrations_dist.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from adloco import DDP, DiLoCo
from tests.integrations_common import (
    STEPS,
    H,
    hf_run,
    lightning_run,
)


def test_hf_trainer_saves_and_resumes_exactly(tmp_path: Path) -> None:
    full = hf_run(tmp_path / "full")
    assert full.algo.round == STEPS // H and full.algo.totals.examples is None
    assert (tmp_path / "full" / f"checkpoint-{H}" / "adloco-state-0.pt").is_file()
    assert not torch.equal(full.theta, full.start)  # it trained
    resumed = hf_run(tmp_path / "full", resume=f"checkpoint-{H}")
    assert resumed.algo.round == STEPS // H
    torch.testing.assert_close(resumed.theta, full.theta, rtol=0, atol=0)
    # without the algorithm's state the resumed run differs (the outer momentum is lost)
    (tmp_path / "full" / f"checkpoint-{H}" / "adloco-state-0.pt").unlink()
    with pytest.raises(FileNotFoundError, match="holds no adloco state"):
        hf_run(tmp_path / "full", resume=f"checkpoint-{H}")


def other() -> DiLoCo:
    m = torch.nn.Linear(2, 2)
    return DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"save_steps": H + 1}, "save_steps = 3: not a multiple of inner_steps 2"),
        ({"max_steps": STEPS + 1}, "max_steps 7: not a multiple of inner_steps 2"),
        ({"build": lambda m, o: DDP(m, o, inner_steps=H)}, "DDP averages gradients"),
        ({"build": lambda m, o: "no"}, "returned str"),
        ({"build": lambda m, o: other()}, "over the model and optimizer it is given"),
    ],
)
def test_hf_trainer_refuses(tmp_path: Path, change: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        hf_run(tmp_path, **change)


def test_lightning_saves_and_resumes_exactly(tmp_path: Path) -> None:
    full = lightning_run(tmp_path)
    assert full.algo.round == STEPS // H
    ckpt = tmp_path / "ckpt" / f"step={H}.ckpt"
    assert ckpt.is_file()
    held = torch.load(ckpt, weights_only=True)["callbacks"]
    assert held["AdLoCoCallback"]["states"][0]["round"] == 1
    resumed = lightning_run(tmp_path / "again", resume=ckpt)
    assert resumed.algo.round == STEPS // H
    torch.testing.assert_close(resumed.theta, full.theta, rtol=0, atol=0)


def test_lightning_refuses_a_checkpoint_inside_a_round(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"optimizer step 3, 1 step\(s\) into a round of 2"):
        lightning_run(tmp_path, every=3)


def test_callbacks_refuse_a_build_that_is_not_a_function() -> None:
    from adloco.integrations import hf, lightning

    with pytest.raises(TypeError, match=r"build: a function \(model, optimizer\) -> algorithm"):
        hf.AdLoCoCallback(other())  # type: ignore[arg-type]  # the algorithm, not a function that builds it
    with pytest.raises(TypeError, match=r"build: a function \(module, optimizer\) -> algorithm"):
        lightning.AdLoCoCallback("diloco")  # type: ignore[arg-type]
