"""The commands in this process: adloco config (every field, its allowed values and doc, one section),
--version, --help, and a bench section that train and config ignore."""

from __future__ import annotations

from pathlib import Path

import pytest

from adloco.cli import main


def test_config_prints_every_field_with_its_doc(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "inner_steps: 12" in out and "# H: inner OPTIMIZER steps" in out
    assert main(["config", "--set", "algorithm.method=diloco", "--plain"]) == 0
    out = capsys.readouterr().out
    assert "optimizer: sgd" in out and "lr: 0.5" in out and "policy: none" in out


def test_version_is_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    import adloco as package

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"adloco {package.__version__}"
    assert importlib.metadata.version("adloco") == package.__version__  # pyproject reads it from there


def test_help_names_every_method_and_no_command_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "usage: adloco" in out and all(m in out for m in ("AdLoCo", "DiLoCo", "LocalSGD", "DDP"))


def test_config_lists_the_allowed_values_of_every_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  ")}
    assert "# (norm | inner_product | augmented_inner_product | none) " in lines["test"]
    assert "(smallest | largest_with_smallest | none)" in lines["policy"]
    assert "(requests | demand)" in lines["allocation"]
    assert "(adloco | diloco | localsgd | ddp)" in lines["method"]


def test_config_prints_one_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "merge", "--set", "algorithm.method=diloco", "--plain"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "merge:" and "policy: none" in out and "\nbatch:" not in out
    assert main(["config", "batch"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("batch:\n  test: norm") and "# adaptive" not in out.splitlines()[0]
    assert len([line for line in out.splitlines() if not line.startswith("  ")]) == 1


def test_a_bench_section_is_ignored_by_train_and_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from adloco.config import dump_yaml, resolve

    f = tmp_path / "with-bench.yaml"
    f.write_text("algorithm:\n  rounds: 3\nbench:\n  budget: 100\n  methods: {diloco: {outer.lr: 0.5}}\n")
    assert main(["config", "--config", str(f), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "rounds: 3" in out and "bench" not in out and "budget: null" in out
    assert dump_yaml(resolve(f)) == dump_yaml(resolve(None, ["algorithm.rounds=3"]))
    assert main(["config", "bench"]) == 2
    assert "`adloco bench`'s own section" in capsys.readouterr().err


def test_main_dispatches_every_subcommand_to_a_function_of_its_own() -> None:
    """cli.main parses, dispatches and turns errors into one line; each subcommand (train and config too)
    is a function in COMMANDS, so adding one is a parser and an entry, not a branch of main."""
    import inspect

    from adloco import cli

    assert set(cli.COMMANDS) == set(cli._commands(cli.build_parser()))
    assert len(inspect.getsource(cli.main).splitlines()) <= 45
