"""`adloco config` says why a default is what it is (adloco.config.reasons): every reason names a real key
and real sections of RESULTS.md, shows while the value is the default or the method's preset, and goes
away where the user set the value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adloco.cli import main
from adloco.config.load import field_docs
from adloco.config.reasons import PRESET_REASONS, REASONS
from adloco.config.schema import preset_values

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "RESULTS.md"


def test_every_reason_names_a_key_and_sections_that_exist() -> None:
    keys = {f"{s}.{k}" for s, k, _, _ in field_docs()}
    headings = [m.group(1) for m in re.finditer(r"^#{2,3} (.+)$", RESULTS.read_text(encoding="utf-8"), re.M)]
    for key, (why, sections) in REASONS.items():
        assert key in keys, key
        assert why and "\n" not in why
        for section in sections:
            assert any(h.startswith(section) for h in headings), f"{key}: no RESULTS heading {section!r}"
    for (method, key), (_, sections) in PRESET_REASONS.items():
        section, name = key.split(".")
        assert name in preset_values(method, section), f"{method}'s preset does not set {key}"
        for s in sections:
            assert any(h.startswith(s) for h in headings), f"{method} {key}: no RESULTS heading {s!r}"


def _why(out: str, key: str) -> str | None:
    """The reason printed under ``key`` (indented ``key: value``), or None."""
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(f"  {key}:"))
    after = lines[i + 1] if i + 1 < len(lines) else ""
    return after.split("why this default: ", 1)[1] if "why this default: " in after else None


def test_config_says_why_while_the_value_is_the_default_or_the_preset(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["config", "inner"]) == 0
    assert (_why(capsys.readouterr().out, "optimizer") or "").startswith(
        "auto: Muon for a language model where every process runs on a CPU, else AdamW"
    )
    assert main(["config", "inner", "--set", "inner.optimizer=muon"]) == 0
    assert _why(capsys.readouterr().out, "optimizer") is None  # the user's choice: nothing to explain
    assert main(["config", "outer", "--set", "algorithm.method=diloco"]) == 0
    out = capsys.readouterr().out
    assert (_why(out, "optimizer") or "").startswith("DiLoCo's preset: SGD without momentum")
    assert "DiLoCo's outer step: the preset" in (_why(out, "lr") or "")
    assert (
        main(["config", "outer", "--set", "algorithm.method=diloco", "--set", "outer.optimizer=nesterov"])
        == 0
    )
    out = capsys.readouterr().out
    assert _why(out, "optimizer") is None and _why(out, "lr") is not None  # the preset's lr still stands
    assert main(["config", "--plain", "inner"]) == 0
    assert "why" not in capsys.readouterr().out  # plain YAML: values only


def test_diloco_s_preset_is_the_step_results_names() -> None:
    """RESULTS' section on DiLoCo's outer step names the preset; the table that every run reads holds it."""
    from adloco.library.presets import PRESETS

    text = RESULTS.read_text(encoding="utf-8")
    section = text.split("## DiLoCo's outer step: the preset", 1)[1].split("\n## ", 1)[0]
    assert "DiLoCo's preset outer step is **SGD at lr 0.5 without momentum**" in section
    assert PRESETS["diloco"]["outer"] == {"optimizer": "sgd", "lr": 0.5}


def test_the_defaults_the_long_grid_kept_are_the_ones_it_names() -> None:
    """RESULTS' grid at 8x the budget names what it kept (H 12; b_max 8 as what null means on a CPU, which it
    found capping AdLoCo's steps); the fields hold those values, and `adloco config` says why under each."""
    from adloco.config.schema import AlgorithmConfig
    from adloco.library.settings import Switch

    text = RESULTS.read_text(encoding="utf-8")
    section = text.split("### Knobs chosen again at 8×", 1)[1].split("\n## ", 1)[0]
    assert "DiLoCo's H 12 (H 24 halves" in section
    assert "b_max 8 is what `switch.b_max: null` means on a CPU" in section
    assert AlgorithmConfig().inner_steps == 12
    assert Switch().b_max is None and Switch().b_max_or_default == 8
    for key in ("algorithm.inner_steps", "switch.b_max", "batch.eta"):
        assert "Knobs chosen again at 8×" in REASONS[key][1], key


def test_the_norm_test_counts_the_rows_requested_by_default_as_results_decided() -> None:
    """RESULTS' section on the norm test's bound names the default it led to; the field holds it (null:
    the requested rows, with the norm test), and `adloco config` says why under the key."""
    from adloco.library.settings import AdaptiveBatch

    text = RESULTS.read_text(encoding="utf-8")
    section = text.split("#### The norm test's probe held AdLoCo's batch", 1)[1].split("\n#### ", 1)[0]
    assert (
        "**The default follows: `batch.noise_rows` is null, which is `requested` with the norm test.**"
        in section
    )
    assert AdaptiveBatch().noise_rows is None
    assert AdaptiveBatch().noise_of(4, 10) == 40  # the rows requested: 4 workers x 10
    assert AdaptiveBatch(noise_rows="probed").noise_of(4, 10) is None
    assert "Knobs chosen again at 8×" in REASONS["batch.noise_rows"][1]
