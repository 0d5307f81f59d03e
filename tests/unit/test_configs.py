"""The ready configs in configs/: they resolve, the default is the default, the paper's says what it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adloco.config import dump_yaml, resolve
from tests.helpers import driver, run_main, run_round

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_config_resolves(name: str) -> None:
    resolve(CONFIGS / name)  # a bench section is `adloco bench`'s: train and config ignore it


def test_a_config_resolves_without_torch_unless_a_codec_is_named() -> None:
    """Resolving (what `adloco config`, `train` and each of a bench's runs do first) imports no torch for
    float32, the default, or for DiLoCo's preset outer step (which asks whether a codec brings its own):
    under a second, not four."""
    import subprocess
    import sys

    code = (
        "import sys; from adloco.config import resolve; resolve(None, []); "
        "resolve(None, ['algorithm.method=diloco']); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_adloco_train_refuses_a_bad_key_without_importing_torch() -> None:
    """A config `adloco train` refuses is said before anything imports torch (a second, where importing
    torch to say it took four)."""
    import subprocess
    import sys

    code = (
        "import sys; from adloco.cli import main; "
        "code = main(['train', '--set', 'inner.muon_ns_dtype=float16', '--set', 'runtime.shards=0']); "
        "print(code, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2 False", out.stderr[-2000:]
    assert out.stderr.startswith("adloco: error: config: ")


def test_the_bench_config_resolves_for_every_variant() -> None:
    import argparse

    from adloco.bench import ABLATIONS, METHODS, variants

    args = argparse.Namespace(
        config=str(CONFIGS / "bench-cpu.yaml"),
        overrides=[],
        methods=",".join(METHODS),
        ablations=",".join(ABLATIONS),
        budget=None,
        target=None,
    )
    settings, todo = variants(args)
    assert (settings["budget"], settings["seeds"], len(todo)) == (4096, [0, 1, 2], 7)
    # every method is tuned on its own grid, and the outer step is an axis of DiLoCo's and AdLoCo's
    grids = settings["grids"]
    assert {m: len(g) for m, g in grids.items()} == {"adloco": 6, "diloco": 4, "localsgd": 5, "ddp": 4}
    assert {g.values["outer.optimizer"] for g in grids["adloco"]} == {"average", "nesterov"}
    for name, sets in todo:
        c = resolve(None, sets, base=settings["raw"])
        # a fixed budget, the same rounds for all, and no warmup that would favour the methods with more steps
        assert (c.algorithm.budget, c.algorithm.rounds, c.inner.warmup_fraction) == (4096, 22, 0.0), name
    localsgd = resolve(None, dict(todo)["localsgd"], base=settings["raw"])
    assert localsgd.inner.momentum == 0.0  # Stich's plain SGD, not the inherited 0.9


def test_the_larger_model_comparison_differs_from_the_tuned_one_in_the_model_alone() -> None:
    """configs/bench-cpu-10m.yaml: bench-cpu.yaml's settings on llama-10m, each method pinned at a
    setting of its llama-tiny grid, no grid of its own."""
    from adloco.config import load_yaml

    small, large = load_yaml(CONFIGS / "bench-cpu.yaml"), load_yaml(CONFIGS / "bench-cpu-10m.yaml")
    small_bench, large_bench = small.pop("bench"), large.pop("bench")
    assert large.pop("model") == {"name": "llama-10m"} and small.pop("model") == {"name": "llama-tiny"}
    assert large == small
    assert large_bench["budget"] == small_bench["budget"] and "sweep" not in large_bench
    assert len(large_bench["seeds"]) >= 2
    pins = large_bench["methods"]
    assert set(pins) == set(small_bench["sweep"])
    for method, grid in small_bench["sweep"].items():
        both = small_bench["methods"].get(method, {})  # the inner optimizer both pin (AdamW, as measured)
        assert all(pins[method][k] == v for k, v in both.items()), method
        for key, value in pins[method].items():
            assert key in both or (key in grid and value in grid[key]), (method, key, value)


def test_default_yaml_is_the_embedded_default() -> None:
    assert dump_yaml(resolve(CONFIGS / "default.yaml")) == dump_yaml(resolve())


def test_paper_config_has_the_appendix_settings() -> None:
    c = resolve(CONFIGS / "paper-microllama-c4.yaml")
    a, b = c.algorithm, c.batch
    assert (a.rounds, a.inner_steps, a.workers, a.trainers) == (20, 200, 4, 4)
    assert (c.inner.lr, c.outer.optimizer, c.outer.lr) == (2e-5, "sgd", 0.5)
    assert (b.initial, b.eta, b.vartheta, b.nu, b.test) == (1, 0.8, 0.01, 0.3, "augmented_inner_product")
    assert (c.merge.every, c.switch.mode, c.runtime.workers_per_process) == (3, "threshold", 4)
    assert (c.data.source, c.data.hub_config, c.data.streaming) == ("allenai/c4", "en", True)
    assert (c.model.name, c.model.reinit_output, c.model.precision) == ("keeeeenw/MicroLlama", True, "fp16")


def test_paper_config_stops_at_once_without_a_gpu_or_the_hub() -> None:
    p = run_main("train", "-c", str(CONFIGS / "paper-microllama-c4.yaml"))
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert "no CUDA device is available" in line or "offline" in line


@pytest.mark.parametrize("name", ["diloco.yaml", "localsgd.yaml"])
def test_baseline_configs_run(name: str) -> None:
    c = resolve(
        CONFIGS / name,
        [
            "model.name=llama-micro",
            "data.seq_len=8",
            "algorithm.rounds=1",
            "algorithm.inner_steps=2",
            "batch.initial=2",
            "switch.b_max=2",
            "eval.max_examples=4",
            "logging.progress=off",
        ],
    )
    out = run_round(driver(c))
    assert len([e for e in out["events"] if e["event"] == "worker"]) == 4
    assert not [e for e in out["events"] if e["event"] == "merge"]


def test_shape_messages_quote_any_value() -> None:
    """Values are quoted as written, braces included (they once went through str.format)."""
    from adloco.errors import UserError

    with pytest.raises(UserError) as e:
        resolve(base={"algorithm": [{"a": 1}]})
    assert str(e.value) == (
        "config: algorithm = [{'a': 1}]: a section must be a mapping of its keys, "
        "e.g. 'algorithm: {method: adloco}'"
    )
    with pytest.raises(
        UserError, match=r"^--set 'batch=\{x\}': 'batch' is a section; .* --set batch.test=norm$"
    ):
        resolve(None, ["batch={x}"])


def _bench_args(name: str, methods: str = "adloco,diloco,diloco-schedule") -> Any:
    """``adloco bench --config configs/NAME --methods METHODS``'s arguments."""
    import argparse

    return argparse.Namespace(
        config=str(CONFIGS / name),
        overrides=[],
        methods=methods,
        ablations="",
        budget=None,
        target=None,
        select="ppl",
    )


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("scale-*.yaml")))
def test_the_scale_benches_plan_what_results_says(name: str) -> None:
    """configs/scale-*.yaml (benchmarks/RESULTS.md, "Does AdLoCo pay as models grow"): AdLoCo, DiLoCo and
    DiLoCo with a batch schedule; every variant resolves at every setting; the runs as planned."""
    from adloco.bench import plan, variants

    settings, todo = variants(_bench_args(name))
    size, corpus = name.removesuffix(".yaml").split("-")[1:]
    assert settings["budget"] == 4096 and resolve(CONFIGS / name).data.source == corpus
    runs = {"tiny": 34, "10m": 17, "30m": 20}[size]
    assert len(plan(settings, todo)) == runs
    # DiLoCo's grids are chosen for time to AdLoCo's final perplexity
    assert settings["target"] == "adloco"
    assert settings["rules"]["diloco"] == settings["rules"]["diloco-schedule"] == "time"
    for variant, sets in todo:
        for g in settings["grids"].get(variant, []) or [None]:
            extra = g.sets if g is not None else []
            if variant in settings["derived"]:
                parent = settings["grids"][settings["derived"][variant]["from"]][0]
                extra = [*parent.sets, *settings["derived"][variant]["sets"], *extra]
            c = resolve(None, [*sets, *extra], base=settings["raw"])
            assert c.inner.warmup_fraction == 0.0 and c.algorithm.budget == 4096
            if variant == "diloco-schedule":
                assert c.batch.schedule != "none" and c.batch.test == "none"


def test_the_sparse_comparison_runs_each_wire_on_each_method() -> None:
    """configs/bench-cpu-sparse.yaml and its llama-10m twin: AdLoCo and DiLoCo at their tuned settings,
    each as float32, int4 with error feedback and topk (error feedback on by default), AdLoCo's θ in int4
    where Δ is compressed; derived variants named adloco-... are variants, not ablations."""
    import argparse

    from adloco.bench import variants
    from adloco.bench.grid import plan
    from adloco.config import load_yaml

    names = "adloco,adloco-int4,adloco-topk,diloco,diloco-int4,diloco-topk"
    wires = {}
    for name in ("bench-cpu-sparse.yaml", "bench-cpu-10m-sparse.yaml"):
        args = argparse.Namespace(
            config=str(CONFIGS / name), overrides=[], methods=names, ablations="", budget=None, target=None
        )
        settings, todo = variants(args)
        tasks = plan(settings, todo)
        assert len(tasks) == 6 * len(settings["seeds"])
        for t in tasks[:6]:
            assert t.setting is not None
            c = resolve(None, [*t.base, *t.setting.sets, *t.extra], base=settings["raw"])
            wires[t.variant] = (c.algorithm.method, c.comm.dtype, c.comm.feedback, c.comm.theta_wire)
        assert wires == {
            "adloco": ("adloco", "float32", False, "float32"),
            "adloco-int4": ("adloco", "int4", True, "int4"),
            "adloco-topk": ("adloco", "topk", True, "int4"),
            "diloco": ("diloco", "float32", False, "float32"),
            "diloco-int4": ("diloco", "int4", True, "int4"),  # θ follows Δ (DiLoCo has no merges or moves)
            "diloco-topk": ("diloco", "topk", True, "int4"),
        }
    small, large = (
        load_yaml(CONFIGS / "bench-cpu-sparse.yaml"),
        load_yaml(CONFIGS / "bench-cpu-10m-sparse.yaml"),
    )
    assert small.pop("model") == {"name": "llama-tiny"} and large.pop("model") == {"name": "llama-10m"}
    small_bench, large_bench = small.pop("bench"), large.pop("bench")
    assert small_bench.pop("seeds") == [0, 1, 2] and large_bench.pop("seeds") == [0, 1]
    assert small == large and small_bench == large_bench  # the model and the seeds alone differ


CHOSEN = {  # RESULTS, the scaling benches' choices on seed 0 (the schedule: a power law from D₀)
    ("tiny", "fortunes"): {
        "adloco": {"inner.lr": 0.002, "batch.eta": 0.9, "switch.b_max": 8},
        "diloco": {"inner.lr": 0.004, "algorithm.inner_steps": 24, "batch.initial": 4},
        "diloco-schedule": {"batch.schedule_examples": 2048},
    },
    ("tiny", "stdlib"): {
        "adloco": {"inner.lr": 0.001, "batch.eta": 0.9, "switch.b_max": 8},
        "diloco": {"inner.lr": 0.004, "algorithm.inner_steps": 12, "batch.initial": 4},
        "diloco-schedule": {"batch.schedule_examples": 2048},
    },
    ("10m", "stdlib"): {
        "adloco": {"inner.lr": 0.002, "batch.eta": 0.8, "switch.b_max": 16},
        "diloco": {"inner.lr": 0.002, "algorithm.inner_steps": 12, "batch.initial": 4},
        "diloco-schedule": {"batch.schedule_examples": 1024},
    },
}
LONG = {  # the long benches: (size, corpus, times the scaling bench's budget)
    "long-tiny-fortunes.yaml": ("tiny", "fortunes", 8),
    "long-tiny-stdlib.yaml": ("tiny", "stdlib", 8),
    "long16-tiny-stdlib.yaml": ("tiny", "stdlib", 16),
    "long16-tiny-fortunes.yaml": ("tiny", "fortunes", 16),
    "long-10m-stdlib.yaml": ("10m", "stdlib", 8),
}


@pytest.mark.parametrize("name", sorted(LONG))
def test_the_long_benches_run_the_scaling_benchs_choices_longer(name: str) -> None:
    """configs/long*.yaml (benchmarks/RESULTS.md, "A run eight times longer", "Knobs chosen again at 8×,
    and 16× the budget", "llama-10m at 8× the budget"): the settings its size's and corpus' scaling bench
    chose on seed 0, nothing swept, a multiple of its budget, two seeds."""
    from adloco.bench import plan, variants

    def planned(name: str) -> tuple[dict[str, Any], list[Any]]:
        settings, todo = variants(_bench_args(name))
        return settings, plan(settings, todo)

    size, corpus, times = LONG[name]
    settings, runs = planned(name)
    scale, _ = planned(f"scale-{size}-{corpus}.yaml")
    assert settings["budget"] == times * scale["budget"]
    assert all(len(g) == 1 for g in settings["grids"].values())  # one setting each: nothing swept
    assert [(r.variant, r.seed) for r in runs if r.seed == 0] == [
        ("adloco", 0),
        ("diloco", 0),
        ("diloco-schedule", 0),
    ] and len(runs) == 6
    chosen = CHOSEN[(size, corpus)]
    for r in runs:
        c = resolve(None, [*r.base, *r.extra], base=settings["raw"])
        want = chosen["adloco" if r.variant == "adloco" else "diloco"]
        got = {"inner.lr": c.inner.lr, "batch.eta": c.batch.eta, "switch.b_max": c.switch.b_max}
        got |= {"algorithm.inner_steps": c.algorithm.inner_steps, "batch.initial": c.batch.initial}
        assert all(got[k] == v for k, v in want.items()), (r.variant, got)
        assert (c.data.source, c.model.name) == (corpus, f"llama-{size}")
        assert c.algorithm.budget == settings["budget"] and c.inner.schedule == "constant"
        if r.variant == "diloco-schedule":
            assert (c.batch.schedule, c.batch.schedule_examples, c.batch.lr_scaling) == (
                "power",
                chosen["diloco-schedule"]["batch.schedule_examples"],
                "sqrt",
            )
    for method in ("adloco", "diloco"):  # each choice is a point of the scaling bench's grid (what it swept)
        assert any(
            "inner.lr" in g.values
            and all(chosen[method][k] == v for k, v in g.values.items() if k in chosen[method])
            for g in scale["grids"][method]
        )


COMPRESS_LONG = "adloco,adloco-int4,adloco-muon,diloco,diloco-int4,diloco-topk,diloco-muon,diloco-int4-muon,diloco-topk-muon"


@pytest.mark.parametrize("corpus", ["fortunes", "stdlib"])
def test_the_compression_bench_varies_the_wire_and_the_inner_optimizer_alone(corpus: str) -> None:
    """configs/compress-long-tiny-*.yaml (benchmarks/RESULTS.md, "Compression on long runs"): each
    variant is its method at the long run's setting with the wire, the inner optimizer or both changed
    and nothing else, but topk's outer step, SparseLoCo's (SGD lr 1); 9 variants x 2 seeds."""
    from adloco.bench import plan, variants

    settings, todo = variants(_bench_args(f"compress-long-tiny-{corpus}.yaml", COMPRESS_LONG))
    runs = plan(settings, todo)
    long_settings, _ = variants(_bench_args(f"long-tiny-{corpus}.yaml"))
    assert settings["budget"] == long_settings["budget"] == 32768 and len(runs) == 18
    from adloco.config import load_yaml

    methods = [
        load_yaml(CONFIGS / f"{b}-tiny-{corpus}.yaml")["bench"]["methods"] for b in ("compress-long", "long")
    ]
    assert methods[0] == methods[1]  # the long run's settings, unchanged
    for r in runs:
        c = resolve(None, [*r.base, *r.extra], base=settings["raw"])
        wire = "topk" if "topk" in r.variant else "int4" if "int4" in r.variant else "float32"
        assert c.comm.dtype == wire and c.comm.feedback == (wire != "float32")
        assert c.comm.theta_wire == {"float32": "float32", "int4": "int4", "topk": "int4"}[wire]
        assert c.inner.optimizer == ("muon" if "muon" in r.variant else "adamw")
        if wire == "topk":
            assert (c.outer.optimizer, c.outer.lr, c.comm.decay) == ("sgd", 1.0, 0.95)
        elif r.variant.startswith("diloco"):
            assert (c.outer.optimizer, c.outer.lr, c.outer.momentum) == ("nesterov", 0.5, 0.0)
        else:
            assert c.outer.optimizer == "average"


BENCH_CONFIGS = sorted(
    p.name for p in CONFIGS.glob("*.yaml") if p.name not in ("default.yaml", "diloco.yaml", "localsgd.yaml")
)


@pytest.mark.parametrize("name", BENCH_CONFIGS)
def test_every_published_config_runs_the_inner_optimizer_it_was_measured_with(name: str) -> None:
    """``inner.optimizer``'s default became auto (Muon on a CPU): every config whose runs RESULTS.md
    publishes pins AdamW where it left the key unset, so its command still gives its numbers; LocalSGD
    keeps its preset's SGD (a pin at the top of a file would have taken it), and a variant that asks for
    Muon still gets it."""
    from adloco.bench import plan, variants
    from adloco.config import load_yaml

    raw = load_yaml(CONFIGS / name)
    if "bench" not in raw:  # a single run's config (the paper's setting)
        assert resolve(str(CONFIGS / name), []).inner.optimizer == "adamw"
        return
    named = {
        *raw["bench"].get("methods", {}),
        *raw["bench"].get("sweep", {}),
        *raw["bench"].get("variants", {}),
    }
    settings, todo = variants(_bench_args(name, ",".join(sorted(named))))
    for r in plan(settings, todo):
        c = resolve(None, [*r.base, *r.extra], base=settings["raw"])
        wanted = "sgd" if c.algorithm.method == "localsgd" else "muon" if "muon" in r.variant else "adamw"
        assert c.inner.optimizer == wanted, (name, r.variant)


def test_the_embedded_default_and_the_example_configs_follow_the_inner_default() -> None:
    """The demo and configs/diloco.yaml run the default (auto); LocalSGD its preset's SGD."""
    assert resolve(None, []).inner.optimizer == "auto"
    assert resolve(str(CONFIGS / "default.yaml"), []).inner.optimizer == "auto"
    assert resolve(str(CONFIGS / "diloco.yaml"), []).inner.optimizer == "auto"
    assert resolve(str(CONFIGS / "localsgd.yaml"), []).inner.optimizer == "sgd"
