"""The README's programs for your own loop run exactly as written, in one process (here; under torchrun:
tests/e2e/test_readme_under_torchrun.py), and a saved state continues the same run."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
import torch

from tests.helpers import readme_programs


def test_the_readme_holds_two_programs() -> None:
    programs = readme_programs()
    assert len(programs) == 2 and "DiLoCo(" in programs[0] and "AdLoCo(" in programs[1]


@pytest.mark.parametrize("index", [0, 1], ids=["diloco-hooked", "adloco-step-all"])
def test_a_readme_program_runs_as_written_in_one_process(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    out = io.StringIO()
    namespace: dict[str, object] = {"__name__": "__main__"}
    with contextlib.redirect_stdout(out):
        exec(compile(readme_programs()[index], f"README program {index}", "exec"), namespace)  # noqa: S102
    algo = namespace["algo"]
    if index == 0:
        assert out.getvalue() == "rank 0: 5 rounds, 3200 examples, 0 bytes\n"  # one worker: nothing sent
    else:
        assert algo.round == 6 and out.getvalue().count("\nround ") == 5  # type: ignore[attr-defined]
        assert "merged [0, 1]" in out.getvalue()
        assert os.path.isfile("adloco-state-0.pt")


def test_a_saved_state_continues_the_same_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's way to save (torch.save of state_dict, torch.load with weights_only) resumes bit for bit."""
    from adloco import AdaptiveBatch, AdLoCo, Merging
    from tests.toy import Data, build, run_round

    def make() -> AdLoCo:
        return build(
            AdLoCo,
            3,
            inner_steps=2,
            trainers=2,
            batch=AdaptiveBatch(eta=0.3, initial=2),
            merge=Merging(every=2),
        )

    data = Data()
    a = make()
    for _ in range(3):
        run_round(a, data)
    torch.save(a.state_dict(), tmp_path / "state.pt")
    b = make()
    b.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    for _ in range(2):
        run_round(a, data)
        run_round(b, data)
    assert a.requests == b.requests and a.allocation == b.allocation and a.totals == b.totals
    for t in a.alive:
        assert torch.equal(a.theta(t), b.theta(t))
