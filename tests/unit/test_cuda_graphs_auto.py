"""``runtime.cuda_graphs: auto`` (ALGORITHM.md §14): on where the run is on CUDA and nothing the engine
refuses with graphs is set, off otherwise, the run's first line saying which and why; true and false as
written. The choice is a pure function of the config and whether the process is on CUDA, so every reason
is checked here on a CPU; that the graphs then run is the CUDA tests' (tests/unit/test_gpu_paths.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adloco.config import dump_yaml, resolve
from adloco.config.checks import cuda_graphs_choice
from adloco.errors import UserError
from tests.helpers import run_main, tiny_config, train_with_output

# Every setting the engine refuses with runtime.cuda_graphs: true, and the reason auto gives for it.
OBSTACLES = [
    (("model.precision=fp16",), "auto: model.precision fp16: its loss scaling decides on the host"),
    (("algorithm.method=ddp",), "auto: algorithm.method ddp: gradients are averaged inside the step"),
    (("runtime.shards=2",), "auto: runtime.shards 2: a sharded step runs collectives"),
    (
        ("runtime.compile=true", "runtime.compile_mode=reduce-overhead"),
        "auto: runtime.compile_mode reduce-overhead: it captures CUDA graphs of its own",
    ),
    (
        ("runtime.compile=true", "runtime.compile_mode=max-autotune"),
        "auto: runtime.compile_mode max-autotune: it captures CUDA graphs of its own",
    ),
    (
        ("batch.wd_scaling=timescale",),
        "auto: batch.wd_scaling timescale: a captured step keeps its weight decay",
    ),
]


def test_the_default_is_auto_and_adloco_config_shows_it() -> None:
    assert tiny_config().runtime.cuda_graphs == "auto"
    ran = run_main("config", "runtime")
    assert ran.returncode == 0
    assert any(line.split("#")[0].strip() == "cuda_graphs: auto" for line in ran.stdout.splitlines())
    assert "(auto | true | false)" in ran.stdout  # the choices, in the field's doc


def test_auto_is_on_on_cuda_and_off_without_it() -> None:
    cfg = tiny_config()
    assert cuda_graphs_choice(cfg, cuda=True) == (True, "auto: CUDA")
    assert cuda_graphs_choice(cfg, cuda=False) == (False, "auto: no CUDA")
    on_cpu = tiny_config("runtime.device=cpu")
    assert cuda_graphs_choice(on_cpu, cuda=False) == (False, "auto: runtime.device cpu")
    # Muon takes its lr as a device tensor (adloco.library.optim.Muon): it leaves graphs on
    assert cuda_graphs_choice(tiny_config("inner.optimizer=muon"), cuda=True) == (True, "auto: CUDA")
    # the compile modes that capture nothing themselves leave graphs on
    for mode in ("default", "max-autotune-no-cudagraphs"):
        compiled = tiny_config("runtime.compile=true", f"runtime.compile_mode={mode}")
        assert cuda_graphs_choice(compiled, cuda=True) == (True, "auto: CUDA")


@pytest.mark.parametrize("sets,reason", OBSTACLES, ids=[o[0][-1] for o in OBSTACLES])
def test_auto_is_off_for_what_true_is_refused_for(sets: tuple[str, ...], reason: str) -> None:
    """Each setting that makes ``cuda_graphs: true`` a one-line refusal turns ``auto`` off, named."""
    cfg = tiny_config(*sets)
    assert cuda_graphs_choice(cfg, cuda=True) == (False, reason)
    with pytest.raises(UserError, match="cuda_graphs"):
        tiny_config(*sets, "runtime.cuda_graphs=true")


def test_true_and_false_are_honoured_as_written() -> None:
    assert cuda_graphs_choice(tiny_config("runtime.cuda_graphs=false"), cuda=True) == (
        False,
        "runtime.cuda_graphs: false",
    )
    # on a machine without CUDA, true is refused before the run (check_placement); the choice keeps it
    assert cuda_graphs_choice(tiny_config("runtime.cuda_graphs=true"), cuda=True) == (
        True,
        "runtime.cuda_graphs: true",
    )
    assert cuda_graphs_choice(tiny_config("runtime.cuda_graphs=on"), cuda=True)[0] is True  # YAML's on
    # auto stays auto in the written config (a run resumed on another machine chooses again)
    assert "cuda_graphs: auto" in dump_yaml(resolve(overrides=["runtime.cuda_graphs=auto"]))


@pytest.mark.parametrize("value", ["maybe", "2", "[]"])
def test_a_value_that_is_none_of_them_is_one_line(value: str, tmp_path: Path) -> None:
    ran = run_main("train", "--set", f"runtime.cuda_graphs={value}", "--set", f"logging.out_dir={tmp_path}")
    assert ran.returncode == 2 and not any(tmp_path.iterdir())
    (line,) = ran.stderr.strip().splitlines()
    assert line.startswith("adloco: error: config: runtime.cuda_graphs = ")
    assert line.endswith(": must be true or false or 'auto'")


def test_the_runs_first_line_says_which_and_why(tmp_path: Path, text_corpus: Path) -> None:
    base = {
        "data.source": str(text_corpus),
        "model.name": "llama-micro",
        "data.tokenizer": "bpe:300",
        "data.seq_len": "16",
        "algorithm.rounds": "1",
        "algorithm.inner_steps": "1",
        "eval.max_examples": "4",
        "logging.progress": "plain",
        "logging.plots": "false",
        "logging.save_model": "false",
    }
    cuda = torch.cuda.is_available()
    expected = f"cuda graphs: {'on (auto: CUDA, 4 workers on one device)' if cuda else 'off (auto: no CUDA)'}"
    _, out = train_with_output(tmp_path / "auto", base)
    assert out.splitlines()[0] == expected
    _, out = train_with_output(tmp_path / "off", {**base, "runtime.cuda_graphs": "false"})
    assert out.splitlines()[0] == "cuda graphs: off (runtime.cuda_graphs: false)"
    _, out = train_with_output(tmp_path / "fp32-cpu", {**base, "runtime.device": "cpu"})
    assert out.splitlines()[0] == "cuda graphs: off (auto: runtime.device cpu)"
