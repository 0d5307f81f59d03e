"""`adloco bench` over seeds and grids: the statistics against hand computations, curves on a common
grid, the selection rule, failed runs, concurrent runs, and simulated time priced from examples.

Most tests run the bench with a stand-in for `adloco train` (``FAKE``, below) that writes a recorded run
directory at once (:func:`tests.recorded.recorded_run`), so a grid over seeds takes seconds; one test
trains for real, two variants on two seeds, two at a time."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from adloco import bench
from adloco.bench import writer
from adloco.cli import main
from adloco.report import markdown as reporting
from adloco.report import plots, results
from tests.recorded import recorded_run

ROOT = Path(__file__).resolve().parents[2]

# `adloco train` as the bench calls it, made up: final perplexity 30 (adloco), 40 (diloco), 50 (others),
# + the seed, + 100·|outer.lr − 0.5| when outer.lr is set, − 20 at inner.lr 0.002, + 5 at
# algorithm.inner_steps 24 (whose curve gets there sooner), − batch.schedule_examples/100; 3 evaluations on
# the way down from 100.
# $FAKE_BENCH (JSON) may name runs that fail ("fail") or stop with a checkpoint, as on SIGTERM ("stop"), and a
# barrier folder where every run waits until "barrier" runs have started ("barrier": [folder, n]);
# "resolved": true writes the run's whole resolved config, as adloco train does, instead of the keys set.
# `--resume RUN_DIR` finishes that run in its own folder, from its config.yaml.
FAKE = """
import json, os, shutil, sys, time
from pathlib import Path
import yaml
sys.path.insert(0, {root!r})
from tests.recorded import recorded_run

argv = sys.argv[1:]
sets = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")
resumed = None
if "--resume" in argv:
    resumed = Path(argv[argv.index("--resume") + 1])
    saved = yaml.safe_load((resumed / "config.yaml").read_text())
    sets = {{f"{{s}}.{{k}}": str(v) for s, d in saved.items() for k, v in d.items() if v is not None}}
    sets["logging.out_dir"] = str(resumed.parent)
    print(f"fake resume {{resumed.name}}")
name, seed = sets["logging.name"], int(sets["algorithm.seed"])
spec = json.loads(os.environ.get("FAKE_BENCH", "{{}}"))
if spec.get("barrier"):
    folder, n = Path(spec["barrier"][0]), spec["barrier"][1]
    (folder / name).touch()
    deadline = time.time() + 30
    while len(list(folder.iterdir())) < n:
        if time.time() > deadline:
            print("fake: nobody else started", file=sys.stderr)
            sys.exit(9)
        time.sleep(0.05)
print(f"fake run {{name}}")
if name in spec.get("fail", []):
    print("Traceback (most recent call last):", file=sys.stderr)
    print("RuntimeError: the data went away", file=sys.stderr)
    sys.exit(3)
method = sets["algorithm.method"]
final = {{"adloco": 30.0, "diloco": 40.0}}.get(method, 50.0) + seed
if "outer.lr" in sets:
    final += 100 * abs(float(sets["outer.lr"]) - 0.5)
if sets.get("inner.lr") == "0.002":
    final -= 20
h24 = sets.get("algorithm.inner_steps") == "24"  # ends higher, gets there sooner
final += 5 if h24 else 0
final -= float(sets.get("batch.schedule_examples", 0)) / 100
curve = [final + 5, final, final] if h24 else [final + 40, final + 20, final]
config = {{}}
for k, v in sets.items():
    section, key = k.split(".")
    config.setdefault(section, {{}})[key] = v
config["algorithm"]["seed"] = seed
if spec.get("resolved") and resumed is None:  # the whole resolved config, as adloco train writes it
    import yaml
    from adloco.config import dump_yaml, resolve
    config = yaml.safe_load(dump_yaml(resolve(argv[argv.index("--config") + 1], [sets and f"{{k}}={{v}}" for k, v in sets.items()])))
if resumed is not None:
    config = saved
    shutil.rmtree(resumed)
    dirname = resumed.name
else:
    dirname = next(f"{{name}}-20260101-00000{{i}}" for i in range(10)
                   if not (Path(sets["logging.out_dir"]) / f"{{name}}-20260101-00000{{i}}").exists())
run = recorded_run(Path(sets["logging.out_dir"]), dirname, method,
                   curve, 2_000_000, seed=seed, config=config, label=name)
if resumed is None and name in spec.get("stop", []):
    (run / "summary.json").unlink()
    (run / "checkpoints" / "round-000001").mkdir(parents=True)
    (run / "checkpoints" / "round-000001" / "state.json").write_text("{{}}")
    print("stopped: checkpoint written", file=sys.stderr)
    sys.exit(143)
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE.format(root=str(ROOT)))
    monkeypatch.setattr(bench, "train_command", lambda: [sys.executable, str(script)])
    monkeypatch.setattr(bench, "prepare_data", lambda cfg: None)
    monkeypatch.delenv("FAKE_BENCH", raising=False)
    # the plots are drawn by the one test that looks at them (each bench's ten take 5 s, most of a test's)
    monkeypatch.setattr(writer, "draw", lambda *a, **k: [])
    return script


def fake_bench(tmp_path: Path, *args: str, config: dict[str, Any] | None = None) -> tuple[int, Path]:
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(yaml.safe_dump({"bench": {"budget": 300}, **(config or {})}))
    out = tmp_path / "cmp"
    return main(["bench", "--config", str(cfg), "--out", str(out), *args]), out


# -- statistics ---------------------------------------------------------------------------------------


def test_t_quantile_against_closed_forms() -> None:
    # df 1 (Cauchy): tan(π (p − 1/2)); df 2: √(2q²/(1 − q²)) with q = 2p − 1
    assert results.t_quantile(1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-12)
    assert results.t_quantile(2) == pytest.approx(math.sqrt(2 * 0.95**2 / (1 - 0.95**2)), rel=1e-12)
    assert results.t_quantile(4) == pytest.approx(2.776445105, rel=1e-9)  # printed tables
    assert results.t_quantile(30) == pytest.approx(2.042272456, rel=1e-9)


def test_seeds_aggregate_to_mean_range_and_t_interval() -> None:
    st = results.stats([30.0, 33.0, 36.0])
    assert st is not None
    # mean 33, s = √((9 + 0 + 9)/2) = 3, half-width t_{0.975,2} · 3/√3
    t2 = math.sqrt(2 * 0.95**2 / (1 - 0.95**2))
    assert (st.n, st.mean, st.min, st.max) == (3, 33.0, 30.0, 36.0)
    assert st.half == pytest.approx(t2 * 3 / math.sqrt(3))
    assert st.to_dict()["ci95"] == pytest.approx([33 - t2 * math.sqrt(3), 33 + t2 * math.sqrt(3)])
    two = results.stats([1.0, 2.0])
    assert two is not None and two.half is None and two.mean == 1.5  # no interval from 2 seeds
    assert results.stats([]) is None
    assert reporting.cell(st, "value") == "33.00 [30.00–36.00] ±7.45"
    assert reporting.cell(two, "seconds", of=3) == "1.5 s [1.0–2.0 s] (2/3 reached)"
    assert reporting.cell(None, "count", of=3) == "not reached (0/3)"


def test_figures_over_recorded_seeds(tmp_path: Path) -> None:
    runs = [
        results.load(recorded_run(tmp_path, f"a-s{s}", "adloco", ppls, 2_000_000, seed=s))
        for s, ppls in enumerate([[50.0, 30.0, 20.0], [60.0, 35.0, 26.0], [40.0, 32.0, 23.0]])
    ]
    agg = reporting.aggregate(runs, target=33.0)
    final = agg["final"]
    assert final is not None and (final.mean, final.min, final.max) == (23.0, 20.0, 26.0)
    # target 33 reached at round 2 (30), round 3 (26) and round 2 (32): 200, 300, 200 examples
    ex = agg["examples_to_target"]
    assert ex is not None and (ex.n, ex.mean, ex.min, ex.max) == (3, pytest.approx(700 / 3), 200, 300)
    by = agg["bytes_to_target"]
    assert by is not None and by.mean == pytest.approx(2_000_000 * 7 / 3)
    assert agg["sim_s"] is not None and agg["sim_s"].mean == pytest.approx(9.06)  # 3 rounds of 3.02 s


def test_curves_meet_on_a_common_grid_without_extrapolation() -> None:
    # one seed evaluated at x = 0, 2, 4, the other at 0, 3 (its budget ended it sooner)
    a = [(0.0, 100.0), (2.0, 60.0), (4.0, 20.0)]
    b = [(0.0, 120.0), (3.0, 30.0)]
    assert results.interpolate(a, [1.0, 3.0, 5.0]) == [80.0, 40.0, None]
    xs, mean, lo, hi = results.mean_curve([a, b])
    assert xs == [0.0, 2.0, 3.0]  # the union of x values, up to the shorter curve's end
    assert mean == pytest.approx([110.0, 0.5 * (60 + 60), 0.5 * (40 + 30)])  # b at 2: 120 − 2·30 = 60
    assert lo == pytest.approx([100.0, 60.0, 30.0]) and hi == pytest.approx([120.0, 60.0, 40.0])
    # a repeated x (nothing sent between two evaluations): the later evaluation counts
    assert results.interpolate([(0.0, 9.0), (1.0, 5.0), (1.0, 4.0), (2.0, 2.0)], [1.0, 1.5]) == [4.0, 3.0]


def test_variants_over_seeds_are_drawn_as_mean_and_band(tmp_path: Path) -> None:
    def variant(name: str, per_round: int, ppls: list[float]) -> tuple[str, list[results.Run]]:
        seeds = [
            recorded_run(
                tmp_path, f"{name}-s{s}", name, [p + s for p in ppls[: len(ppls) - s]], per_round, seed=s
            )
            for s in range(3)
        ]
        return name, results.load_all(seeds)

    groups = [
        variant("adloco", 2_000_000, [60.0, 40.0, 30.0]),
        variant("diloco", 4_000_000, [70.0, 50.0, 40.0]),
    ]
    figs = plots.make_figures([r for _, g in groups for r in g], 45.0, groups)
    ax = figs["val_ppl_vs_bytes.png"].axes[0]
    assert {"adloco (3 seeds)", "diloco (3 seeds)", "target 45.0"} <= {
        t.get_text() for t in ax.get_legend().get_texts()
    }
    assert len(ax.collections) == 2  # a min–max band each
    # the per-run plots show each variant's first seed, and say so
    assert [a.get_title() for a in figs["requests.png"].axes] == ["adloco (seed 0)", "diloco (seed 0)"]
    idle = figs["idle_share.png"].axes[0]
    assert {"adloco (3 seeds)", "diloco (3 seeds)"} <= {t.get_text() for t in idle.get_legend().get_texts()}


def test_simulated_compute_priced_from_examples(tmp_path: Path) -> None:
    paths = [
        recorded_run(tmp_path, "a", "adloco", [50.0, 30.0, 20.0], 2_000_000),
        recorded_run(tmp_path, "b", "diloco", [80.0, 60.0, 40.0], 4_000_000),
    ]
    runs = results.load_all(paths, compute="examples")
    # every worker event: 50 examples in 1 s or 2 s: median of 1/50 and 2/50 = 0.03 s per example
    assert runs[0].seconds_per_example == pytest.approx(0.03)
    assert "median of compute_s / examples over 12 worker events of 2 runs" in runs[0].compute_note
    # a round: 50 · 0.03 = 1.5 s on the slowest worker + the all-reduce (1 MB at 1 MB/s: 1.02 s)
    assert runs[0].points[1].sim_s == pytest.approx(1.5 + 1.02)
    assert runs[1].points[1].sim_s == pytest.approx(1.5 + 2.02)
    given = results.load_all(paths, compute="examples", seconds_per_example=0.01)
    assert given[0].points[3].sim_s == pytest.approx(3 * (0.5 + 1.02))
    measured = results.load_all(paths)
    assert measured[0].points[1].sim_s == pytest.approx(2 + 1.02)
    assert results.median_seconds_per_example(measured)[1] == 12


# -- selection ----------------------------------------------------------------------------------------


def test_the_best_setting_rule(tmp_path: Path) -> None:
    def run(name: str, ppls: list[float], per_round: int = 2_000_000) -> results.Run:
        return results.load(recorded_run(tmp_path, name, "diloco", ppls, per_round))

    a = run("a", [60.0, 40.0, 30.0])
    b = run("b", [50.0, 35.0, 25.0], 8_000_000)  # lowest perplexity, most bytes
    c = run("c", [35.0, 25.0, 25.0])  # ties with b on the final perplexity, later in the grid
    grid = [(0, a), (1, None), (2, b), (3, c)]
    assert bench.select(grid, "ppl", None) == 2  # the lowest; ties go to the first in grid order
    assert bench.select([(0, None), (1, a)], "ppl", None) == 1  # a failed setting is never chosen
    assert bench.select([(0, None)], "ppl", None) is None
    # to a target of 40: a and b at round 2 (b with 4 times the bytes), c at round 1
    assert bench.select(grid, "bytes", 40.0) == 3
    assert bench.select(grid, "time", 40.0) == 3
    assert bench.select([(0, a), (1, b)], "bytes", 40.0) == 0
    # b's 8 MB a round take 8.02 s on the wire (1 MB/s), a's 2 MB 2.02 s: a first at the same round
    assert bench.select([(0, b), (1, a)], "time", 40.0) == 1
    # a target a misses: those that reach it first, the rest after by final perplexity
    assert bench.select([(0, a), (1, b)], "time", 26.0) == 1
    assert bench.select([(0, a), (1, b)], "time", 10.0) == 1  # none reaches: by final perplexity


def test_eta_spreads_the_remaining_runs_over_the_jobs() -> None:
    assert bench.eta([], [5.0], 3, 2) is None
    assert bench.eta([10.0, 20.0], [], 3, 1) == pytest.approx(45.0)
    # 2 slots: one run 5 s into its 15, 3 queued: slots 10 and 0 -> 15 and 15 -> 30 and 15
    assert bench.eta([15.0], [5.0], 3, 2) == pytest.approx(30.0)


# -- the bench, with the stand-in for `adloco train` --------------------------------------------------


@pytest.mark.long
def test_seeds_and_a_grid_end_to_end(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "draw", plots.draw)  # this test looks at the plots
    config = {"bench": {"budget": 300, "sweep": {"diloco": {"outer.lr": [0.3, 0.5, 0.7]}}}}
    code, out = fake_bench(
        tmp_path,
        "--methods",
        "adloco,diloco",
        "--ablations",
        "no-merge",
        "--seeds",
        "0,1,2",
        "--sweep",
        "inner.clip=1.0,0.5",
        config=config,
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    runs = sorted(p.name.removesuffix("-20260101-000000") for p in (out / "runs").iterdir())
    # adloco's grid: inner.clip (2); diloco's: outer.lr x inner.clip (6), every one on seed 0
    assert runs == sorted(
        [f"adloco-g{g}-s0" for g in range(2)]
        + ["adloco-g0-s1", "adloco-g0-s2"]  # ties (clipping does not move the fake): the first
        + [f"diloco-g{g}-s0" for g in range(6)]
        + ["diloco-g2-s1", "diloco-g2-s2"]  # outer.lr 0.5, clip 1.0: #2 in grid order
        + [f"adloco-no-merge-s{s}" for s in range(3)]
    )
    assert "[1/15] adloco seed 0 started (inner.clip=1.0)" in printed.out
    assert "bench: diloco: selected outer.lr=0.5, inner.clip=1.0 (#2 of 6) by ppl" in printed.out
    cfg = yaml.safe_load(next((out / "runs").glob("adloco-no-merge-s1-*/config.yaml")).read_text())
    assert cfg["inner"]["clip"] == "1.0" and cfg["merge"]["policy"] == "none"  # from adloco's best
    results = json.loads((out / "results.json").read_text())
    diloco = results["variants"]["diloco"]
    assert diloco["setting"] == {"outer.lr": 0.5, "inner.clip": 1.0} and diloco["setting_index"] == 2
    assert [r["final"] for r in diloco["runs"]] == [40.0, 41.0, 42.0]
    final = diloco["aggregate"]["final"]
    half = math.sqrt(2 * 0.95**2 / (1 - 0.95**2)) * 1 / math.sqrt(3)  # s = 1
    assert final["mean"] == 41.0 and final["ci95"] == pytest.approx([41 - half, 41 + half])
    assert results["target"] == 42.0 and not results["target_given"]  # the highest final of any run
    assert [row["final"] for row in results["grids"]["diloco"]] == [60.0, 60.0, 40.0, 40.0, 60.0, 60.0]
    assert [row["selected"] for row in results["grids"]["diloco"]].index(True) == 2
    assert results["compute"]["mode"] == "examples" and results["compute"]["seconds_per_example"] == 0.03
    text = (out / "report.md").read_text()
    assert "**the lowest final validation perplexity** on seed 0" in text
    assert (
        "| diloco | diloco | outer.lr=0.5, inner.clip=1.0 (#2 of 6) | 3 | 41.00 [40.00–42.00] ±2.48 |" in text
    )
    assert "| adloco-no-merge | adloco | AdLoCo's: inner.clip=1.0 (#0 of 2) | 3 |" in text
    assert "## Grid of diloco (seed 0)" in text and "| 2 | outer.lr=0.5, inner.clip=1.0 | 40.00 |" in text
    assert "0.03 ms per example" not in text and "30 ms per example" in text
    assert "interpolated linearly onto a common x grid" in text
    assert (out / "plots" / "val_ppl_vs_bytes.png").stat().st_size > 1000
    assert "![idle_share.png](plots/idle_share.png)" in text


def test_a_derived_variant_tunes_its_own_grid_from_its_parents_choice_selected_by_time(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench.variants: DiLoCo with a batch schedule, from DiLoCo's selected setting; DiLoCo's grid and the
    variant's selected by time to the target AdLoCo's seed-0 run set (bench.target: adloco)."""
    config = {
        "bench": {
            "budget": 300,
            "target": "adloco",
            "select": {"diloco": "time", "diloco-sched": "time"},
            "variants": {"diloco-sched": {"from": "diloco", "set": {"batch.schedule": "ramp"}}},
            "sweep": {
                "diloco": {"algorithm.inner_steps": [12, 24], "inner.lr": [0.001, 0.002]},
                "diloco-sched": {"batch.schedule_examples": [100, 200]},
            },
        }
    }
    code, out = fake_bench(
        tmp_path, "--methods", "adloco,diloco,diloco-sched", "--seeds", "0,1", config=config
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    runs = sorted(p.name.removesuffix("-20260101-000000") for p in (out / "runs").iterdir())
    assert runs == sorted(
        ["adloco-s0", "adloco-s1", *(f"diloco-g{g}-s0" for g in range(4)), "diloco-g3-s1"]
        + ["diloco-sched-g0-s0", "diloco-sched-g1-s0", "diloco-sched-g0-s1"]
    )
    # by final perplexity inner.lr 0.002 at H 12 (20) would win; to AdLoCo's 30, H 24 (25) gets there first
    assert "bench: diloco: selected algorithm.inner_steps=24, inner.lr=0.002 (#3 of 4) by time to 30.00" in (
        printed.out
    )
    # the variant's grid runs as soon as DiLoCo's setting is chosen, before the other seeds
    assert printed.out.index("diloco-sched seed 0 started") < printed.out.index("adloco seed 1 started")
    # a tie on time goes to the first setting (by final perplexity, 200 would have won)
    assert (
        "bench: diloco-sched: selected batch.schedule_examples=100 (#0 of 2) by time to 30.00" in printed.out
    )
    cfg = yaml.safe_load(next((out / "runs").glob("diloco-sched-g0-s1-*/config.yaml")).read_text())
    assert cfg["inner"]["lr"] == "0.002" and cfg["algorithm"]["inner_steps"] == "24"
    assert cfg["batch"]["schedule"] == "ramp" and cfg["batch"]["schedule_examples"] == "100"
    results = json.loads((out / "results.json").read_text())
    assert results["target_given"] == 30.0
    assert results["select"]["rules"] == {"diloco": "time", "diloco-sched": "time"}
    sched = results["variants"]["diloco-sched"]
    assert sched["method"] == "diloco" and sched["setting"] == {"batch.schedule_examples": 100}
    assert [r["final"] for r in sched["runs"]] == [24.0, 25.0]
    text = (out / "report.md").read_text()
    assert "diloco-sched starts from diloco's selected setting." in text
    assert (
        "| diloco-sched | diloco | diloco's + batch.schedule=ramp: batch.schedule_examples=100 (#0 of 2) |"
        in (text)
    )


def test_derived_variants_and_rules_refuse_bad_input(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        ({"variants": {"diloco": {"from": "diloco"}}}, "adloco,diloco", "bench.variants.diloco: a new name"),
        ({"variants": {"x": {"from": "sgd"}}}, "adloco", "bench.variants.x: holds from (one of adloco"),
        (
            {"variants": {"x": {"from": "diloco"}}, "sweep": {"diloco": {"outer.lr": [0.5, 0.7]}}},
            "adloco,x",
            "x starts from diloco's selected setting, so with a grid for diloco, --methods must include diloco",
        ),
        ({"select": {"diloco": "fast"}}, "diloco", "bench.select: a mapping of variants (diloco) to a rule"),
        ({"target": "ddp"}, "diloco", "bench.target = 'ddp': a perplexity, or one of --methods (diloco)"),
        (
            {"select": {"diloco": "time"}, "sweep": {"diloco": {"outer.lr": [0.5, 0.7]}}},
            "diloco",
            "bench.select.diloco = 'time': needs a target",
        ),
        (
            {
                "variants": {"x": {"from": "diloco", "set": {"batch.schedule": "ramp"}}},
                "sweep": {"diloco": {"inner.lr": [0.002, 0.004]}},
            },
            "adloco,x",
            "x starts from diloco's",
        ),
        (
            {"target": "diloco", "select": {"diloco": "time"}, "sweep": {"diloco": {"outer.lr": [0.5, 0.7]}}},
            "diloco",
            "bench.target = 'diloco' with bench.select.diloco = 'time': diloco's grid would rank by the target",
        ),
    ]
    for i, (section, methods, message) in enumerate(cases):
        where = tmp_path / str(i)
        where.mkdir()
        code, _ = fake_bench(where, "--methods", methods, config={"bench": {"budget": 300, **section}})
        err = capsys.readouterr().err
        assert code == 2 and message in err, (section, err)


def test_a_variant_runs_alone_when_its_parent_has_one_setting(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to choose: the variant runs without its parent, at the parent's pins and its own sets,
    the config it would have beside its parent (but for its name and folder)."""
    config = {
        "bench": {
            "budget": 300,
            "methods": {"diloco": {"outer.lr": 0.3}},
            "variants": {"sched": {"from": "diloco", "set": {"batch.schedule": "ramp"}}},
        }
    }
    configs = {}
    for methods in ("sched", "diloco,sched"):
        where = tmp_path / methods.replace(",", "-")
        where.mkdir()
        code, out = fake_bench(where, "--methods", methods, "--seeds", "0", config=config)
        assert code == 0, capsys.readouterr().err
        runs = {p.name.removesuffix("-20260101-000000"): p for p in (out / "runs").iterdir()}
        assert set(runs) == {"sched-s0"} | ({"diloco-s0"} if "," in methods else set())
        cfg = yaml.safe_load((runs["sched-s0"] / "config.yaml").read_text())
        del cfg["logging"]["out_dir"]
        configs[methods] = cfg
    assert configs["sched"] == configs["diloco,sched"]
    assert configs["sched"]["outer"]["lr"] == "0.3" and configs["sched"]["batch"]["schedule"] == "ramp"


def test_settings_pinned_in_the_bench_section_are_reported(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A method pinned by bench.methods (no grid) is reported at its pins, not as its bare preset."""
    config = {"bench": {"budget": 300, "methods": {"diloco": {"outer.lr": 0.5, "outer.momentum": 0.0}}}}
    code, out = fake_bench(tmp_path, "--methods", "adloco,diloco", "--seeds", "0", config=config)
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["variants"]["diloco"]["setting"] == {"outer.lr": 0.5, "outer.momentum": 0.0}
    assert results["variants"]["adloco"]["setting"] == {}
    text = (out / "report.md").read_text()
    assert "| diloco | diloco | outer.lr=0.5, outer.momentum=0.0 | 1 |" in text
    assert "| adloco | adloco | preset | 1 |" in text


def test_a_failed_run_is_reported_and_the_others_still_run(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"fail": ["diloco-s1"]}))
    code, out = fake_bench(tmp_path, "--methods", "adloco,diloco,ddp", "--seeds", "0,1")
    printed = capsys.readouterr()
    assert code == 1
    assert "[5/6] diloco seed 1 FAILED (exit code 3)" in printed.out
    assert "adloco: error: bench: variant diloco seed 1 failed (exit code 3); see " in printed.err
    assert "RuntimeError: the data went away" in printed.err
    assert "1 of 6 runs did not finish: diloco seed 1 (failed)" in printed.err
    note = (out / "runs" / "diloco-s1-failed" / "bench-failure.txt").read_text()
    assert "exit code: 3" in note and note.endswith("RuntimeError: the data went away\n")
    assert (out / "logs" / "diloco-s1.out.log").read_text() == "fake run diloco-s1\n"
    assert len(list((out / "runs").glob("ddp-s1-*"))) == 1  # the run after it went on
    text = (out / "report.md").read_text()
    assert "| diloco | 1 | failed | 3 | `runs/diloco-s1-failed` | RuntimeError: the data went away |" in text
    assert "| diloco | diloco | preset | 1 of 2 | 40.00 |" in text  # seed 0 alone
    results = json.loads((out / "results.json").read_text())
    assert results["failed"][0]["exit_code"] == 3
    assert [r["status"] for r in results["variants"]["diloco"]["runs"]] == ["ok", "failed"]


def test_a_grid_that_all_fails_skips_what_needs_it(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"fail": ["adloco-g0-s0", "adloco-g1-s0"]}))
    code, out = fake_bench(
        tmp_path,
        "--methods",
        "adloco,ddp",
        "--ablations",
        "no-switch",
        "--seeds",
        "0,1",
        "--sweep",
        "inner.lr=1e-3,2e-3",
    )
    printed = capsys.readouterr()
    assert code == 1
    assert "adloco seed 1 skipped: no setting of adloco's grid finished on seed 0" in printed.out
    assert "adloco-no-switch seed 0 skipped" in printed.out
    text = (out / "report.md").read_text()
    assert "| adloco | adloco | no setting finished | 0 of 2 |" in text
    assert (
        "| adloco-no-switch | 0 | skipped | — | — | no setting of adloco's grid finished on seed 0 |" in text
    )
    assert "## Grid of adloco (seed 0)" in text
    # --sweep gives every method a grid: ddp's too
    assert "| ddp | ddp | inner.lr=0.001 (#0 of 2) | 2 | 50.50 [50.00–51.00] |" in text


def test_jobs_run_side_by_side(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # every run waits until two have started: one at a time, the first would give up after 30 s
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"barrier": [str(barrier), 2]}))
    code, out = fake_bench(tmp_path, "--methods", "adloco,ddp", "--jobs", "2")
    assert code == 0
    cfgs = [yaml.safe_load(p.read_text()) for p in (out / "runs").glob("*/config.yaml")]
    assert [c["runtime"]["threads"] for c in cfgs] == ["1", "1"]  # one thread each


def test_report_only_prices_a_finished_bench_again(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"fail": ["ddp-g1-s1"]}))
    sweep = {"diloco": {"outer.lr": [0.3, 0.5]}, "ddp": {"inner.lr": [0.001, 0.002]}}
    code, out = fake_bench(
        tmp_path,
        "--methods",
        "diloco,ddp",
        "--seeds",
        "0,1",
        config={"bench": {"budget": 300, "sweep": sweep}},
    )
    assert code == 1
    before = json.loads((out / "results.json").read_text())
    again = tmp_path / "again"
    args = ["--compute", "measured", "--bandwidth", "1e7", "--target", "45", "--out", str(again)]
    assert main(["bench", "--report-only", str(out), *args]) == 0
    after = json.loads((again / "results.json").read_text())
    assert (
        after["variants"]["diloco"]["setting"] == before["variants"]["diloco"]["setting"] == {"outer.lr": 0.5}
    )
    assert after["compute"]["mode"] == "measured" and after["target"] == 45.0
    # a round: the slowest worker's measured 2 s + 1 MB all-reduced among 2 at 10 MB/s (0.1 s + 0.02 s)
    first = after["variants"]["diloco"]["runs"][0]
    assert first["sim_s"] == pytest.approx(3 * 2.12) and first["run"].startswith("../cmp/runs/diloco-g1-s0-")
    assert before["variants"]["diloco"]["runs"][0]["sim_s"] == pytest.approx(3 * (1.5 + 1.02))
    assert after["failed"][0]["folder"] == "../cmp/runs/ddp-g1-s1-failed"
    text = (again / "report.md").read_text()
    assert text.count("Reported again by `adloco bench --report-only") == 1
    grid = text[text.index("## Grid of diloco (seed 0)") :].splitlines()
    selected = [row for row in grid if row.endswith("| **selected** |")]
    assert selected[0].startswith("| 1 | outer.lr=0.5 | 40.00 |")  # the grid and its selection as they were
    assert "measured compute" in text and "on 10 MB/s and 10 ms latency" in text
    capsys.readouterr()
    assert main(["bench", "--report-only", str(tmp_path)]) == 2
    assert "no readable results.json of adloco bench" in capsys.readouterr().err


def test_bad_bench_options(fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def err(*args: str, config: dict[str, Any] | None = None) -> str:
        code, out = fake_bench(tmp_path, *args, config=config)
        assert code == 2 and not out.exists()
        return capsys.readouterr().err.strip().removeprefix("adloco: error: ")

    assert err("--seeds", "0,x") == "--seeds '0,x': seeds are integers, e.g. 0,1,2"
    assert err("--seeds", "1,1") == "--seeds '1,1': distinct integers in [0, 2**31), e.g. 0,1,2"
    assert err("--sweep", "algorithm.seed=1,2") == (
        "--sweep 'algorithm.seed=1,2': algorithm.seed is set by the bench for every run (seeds: --seeds), "
        "not swept"
    )
    assert err("--sweep", "outer.lr") == "--sweep 'outer.lr': must look like section.key=v1,v2,..."
    assert err("--methods", "diloco", "--sweep", "outer.lr=0.5,-1").startswith(
        "variant diloco at outer.lr=-1: config: outer.lr = -1"
    )
    assert err("--sweep", "outer.lr=0.5,0.7").startswith(  # AdLoCo averages: an lr would change nothing
        "variant adloco at outer.lr=0.5: config: outer.lr = 0.5: applies to outer.optimizer sgd and nesterov only"
    )
    assert err("--select", "time") == "--select time: needs a target (--target or bench.target)"
    assert err("--jobs", "0") == "--jobs 0: must be >= 1"
    assert err("--bandwidth", "1e6").startswith("--bandwidth/--latency: only with --report-only")
    assert err(config={"bench": {"budget": 300, "sweep": {"fedavg": {"outer.lr": [1]}}}}).endswith(
        "bench.sweep: keys must be among adloco, diloco, localsgd, ddp"
    )
    assert err("--methods", "ddp", "--ablations", "no-merge", "--sweep", "inner.lr=1e-3,2e-3").startswith(
        "--ablations: they start from AdLoCo's selected setting"
    )


def test_a_bench_resumes_keeping_the_runs_that_finished(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bench that lost runs (here one failed; a killed bench is the same) goes on with --resume: the
    runs that finished with the config their task runs are kept, the others run; bad resumes are one line."""
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True, "fail": ["diloco-s1"]}))
    args = ("--methods", "adloco,diloco", "--seeds", "0,1")
    code, out = fake_bench(tmp_path, *args)
    assert code == 1
    capsys.readouterr()
    # a finished run whose config is not its task's (made by other code, or edited) runs again
    edited = next((out / "runs").glob("adloco-s1-*/config.yaml"))
    cfg = yaml.safe_load(edited.read_text())
    cfg["inner"]["lr"] = 0.5
    edited.write_text(yaml.safe_dump(cfg))
    (out / "runs" / "adloco-s1-20260101-000000").rename(out / "runs" / "adloco-s1-20250101-000000")
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True}))
    code, _ = fake_bench(tmp_path, *args, "--resume")
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "[1/4] adloco seed 0 finished before: adloco-s0-20260101-000000" in printed.out
    assert "diloco seed 0 finished before" in printed.out
    assert "adloco seed 1 started" in printed.out and "diloco seed 1 started" in printed.out
    results = json.loads((out / "results.json").read_text())
    assert [r["status"] for v in ("adloco", "diloco") for r in results["variants"][v]["runs"]] == ["ok"] * 4
    assert (out / "runs" / "adloco-s1-20250101-000000").is_dir()  # nothing the user had is lost
    assert (out / "logs" / "diloco-s1.out.log").read_text() == "fake run diloco-s1\n" * 2

    def err(*more: str, config: dict[str, Any] | None = None) -> str:
        code, _ = fake_bench(tmp_path, *args, *more, config=config)
        assert code == 2
        return capsys.readouterr().err.strip().removeprefix("adloco: error: ")

    assert err("--resume", config={"bench": {"budget": 300}, "inner": {"lr": 0.1}}).startswith(
        f"--resume: {out}/shared.yaml differs from this command's config"
    )
    assert err().startswith(f"--out {str(out)!r}: exists and is not empty")
    assert main(["bench", "--resume", "--budget", "100"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "adloco: error: --resume: needs --out BENCH_DIR, the bench to go on with"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["bench", "--resume", "--budget", "100", "--out", str(empty)]) == 2
    assert "not a folder adloco bench made" in capsys.readouterr().err


def test_a_bench_made_before_a_key_goes_on_under_a_config_that_writes_out_the_value_it_ran_with(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bench whose resolved.yaml predates ``batch.noise_rows`` ran as ``probed``: --resume under a config
    that pins ``probed`` goes on (shared.yaml written again as the command's), and one that takes the
    default now (null) is refused in one line naming the key."""
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True, "fail": ["diloco-s0"]}))
    args = ("--methods", "adloco,diloco", "--seeds", "0")
    code, out = fake_bench(tmp_path, *args)
    assert code == 1
    resolved = yaml.safe_load((out / "resolved.yaml").read_text())
    del resolved["batch"]["noise_rows"]  # as the code before the key wrote it, and the runs' configs
    (out / "resolved.yaml").write_text(yaml.safe_dump(resolved))
    for saved in (out / "runs").glob("*/config.yaml"):
        run_config = yaml.safe_load(saved.read_text())
        del run_config["batch"]["noise_rows"]
        saved.write_text(yaml.safe_dump(run_config))
    capsys.readouterr()
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True}))
    assert fake_bench(tmp_path, *args, "--resume")[0] == 2
    assert capsys.readouterr().err.strip() == (
        f"adloco: error: --resume: {out} ran with batch.noise_rows: probed, whose default has changed since "
        "(now null): add `noise_rows: probed` under `batch:` to its config, or --set batch.noise_rows=probed, "
        "to go on as it began"
    )
    assert (
        fake_bench(
            tmp_path, *args, "--resume", config={"batch": {"noise_rows": "probed"}, "inner": {"lr": 0.1}}
        )[0]
        == 2
    )  # the added key written out, and something else changed
    assert "shared.yaml differs from this command's config (a bench" in capsys.readouterr().err
    pinned = {"batch": {"noise_rows": "probed"}}
    code, _ = fake_bench(tmp_path, *args, "--resume", config=pinned)
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "shared.yaml written again: this command's config" in printed.out
    assert "adloco seed 0 finished before" in printed.out  # kept: its config.yaml as it resumes
    assert yaml.safe_load((out / "shared.yaml").read_text())["batch"] == {"noise_rows": "probed"}
    assert yaml.safe_load((out / "resolved.yaml").read_text())["batch"]["noise_rows"] == "probed"


def begun_with_a_failed_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failed: str,
    *args: str,
) -> Path:
    """A fake bench run with ``args`` whose run ``failed`` failed (exit 1), so that --resume has a run to
    keep and one to run; the fake runs succeed from here on."""
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True, "fail": [failed]}))
    code, out = fake_bench(tmp_path, *args)
    assert code == 1
    capsys.readouterr()
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True}))
    return out


def test_a_bench_resumed_where_a_value_would_resolve_otherwise_is_refused_naming_it(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config file the same, a value the bench's resolved.yaml holds that this command would run
    otherwise (a default changed since the bench began, a --set dropped or changed) is refused in one line
    naming the key, before anything is written or run; the --set it names goes on, keeping the finished
    runs; where runs log and their thread count may differ."""
    args = ("--methods", "adloco,diloco", "--seeds", "0")
    out = begun_with_a_failed_run(
        tmp_path, monkeypatch, capsys, "diloco-s0", *args, "--set", "inner.optimizer=muon"
    )
    before = {p: p.read_bytes() for p in [out / "shared.yaml", out / "resolved.yaml"]}
    runs_before = sorted(p.name for p in (out / "runs").iterdir())

    def refused(*more: str) -> str:
        assert fake_bench(tmp_path, *args, "--resume", *more)[0] == 2
        assert {p: p.read_bytes() for p in before} == before
        assert sorted(p.name for p in (out / "runs").iterdir()) == runs_before
        return capsys.readouterr().err.strip()

    assert refused() == (  # the --set that began it, left out (as a default changed since would be)
        f"adloco: error: --resume: {out} ran with inner.optimizer: muon; this command would run auto (its "
        "default has changed since, or the command that began the bench set it): --set inner.optimizer=muon "
        "goes on as it began"
    )
    assert refused("--set", "inner.optimizer=adamw") == (
        f"adloco: error: --resume: {out} ran with inner.optimizer: muon; this command sets adamw: a bench goes "
        "on with the settings it began with: --set inner.optimizer=muon goes on as it began"
    )
    # a default that changed: the bench's resolved.yaml (and its runs') as older code resolved inner.lr
    resolved = yaml.safe_load((out / "resolved.yaml").read_text())
    default_lr = resolved["inner"]["lr"]
    resolved["inner"]["lr"] = default_lr * 2
    (out / "resolved.yaml").write_text(yaml.safe_dump(resolved))
    before[out / "resolved.yaml"] = (out / "resolved.yaml").read_bytes()
    for saved in (out / "runs").glob("*/config.yaml"):
        run_config = yaml.safe_load(saved.read_text())
        run_config["inner"]["lr"] = default_lr * 2
        saved.write_text(yaml.safe_dump(run_config))
    assert (
        f"ran with inner.lr: {default_lr * 2:g}; this command would run {default_lr:g} (its default"
        in refused("--set", "inner.optimizer=muon")
    )
    code, _ = fake_bench(
        tmp_path,
        *args,
        "--resume",
        "--set",
        "inner.optimizer=muon",
        "--set",
        f"inner.lr={default_lr * 2}",
        "--set",
        "runtime.threads=1",
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "adloco seed 0 finished before" in printed.out and "diloco seed 0 started" in printed.out


def test_a_config_that_now_names_the_value_a_bench_ran_with_lets_it_go_on(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A default changed and the published configs pin its old value (``inner.optimizer: adamw``): a bench
    begun when its file left the key unset goes on where the file's value reaches no run differently, at
    the value the bench resolved it to (a key no preset of a method it runs fills), or under this command's
    --set of the key; at another value, or a key such a preset fills (DiLoCo's outer step) without a --set,
    it is refused as before, nothing written."""
    args = ("--methods", "adloco,diloco", "--seeds", "0")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    out = begun_with_a_failed_run(a, monkeypatch, capsys, "diloco-s0", *args)
    stored = (out / "shared.yaml").read_bytes()
    assert fake_bench(a, *args, "--resume", config={"inner": {"clip": 0.5}})[0] == 2
    assert "shared.yaml differs from this command's config" in capsys.readouterr().err
    # DiLoCo's preset fills outer.optimizer: named at the shared value (AdLoCo's), it would change DiLoCo's runs
    assert fake_bench(a, *args, "--resume", config={"outer": {"optimizer": "average"}})[0] == 2
    assert "shared.yaml differs from this command's config" in capsys.readouterr().err
    assert (out / "shared.yaml").read_bytes() == stored
    # LocalSGD's preset fills inner.optimizer, but the bench runs no LocalSGD
    code, _ = fake_bench(a, *args, "--resume", config={"inner": {"clip": 1.0, "optimizer": "auto"}})
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "adloco seed 0 finished before" in printed.out and "diloco seed 0 started" in printed.out
    # begun with --set inner.optimizer=muon; the file now pins adamw, which the --set overrides
    muon = ("--set", "inner.optimizer=muon")
    out = begun_with_a_failed_run(b, monkeypatch, capsys, "diloco-s0", *args, *muon)
    code, _ = fake_bench(b, *args, *muon, "--resume", config={"inner": {"optimizer": "adamw"}})
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "adloco seed 0 finished before" in printed.out and "diloco seed 0 started" in printed.out


@pytest.mark.parametrize("before", ["the-key", "auto"])
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_changed_default_of_a_key_no_run_reads_leaves_a_bench_to_go_on(
    fake: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    optimizer: str,
    before: str,
) -> None:
    """A bench begun when Muon ran bfloat16 by default (before ``inner.muon_ns_dtype`` existed: its
    resolved.yaml and its runs' configs lack the key; or before ``auto``: they say bfloat16) goes on with
    its finished runs where none of its runs reads the key (AdamW), and is refused in one line naming it
    where they do (Muon), until the --set named goes on."""
    args = ("--methods", "adloco,diloco", "--seeds", "0", "--set", f"inner.optimizer={optimizer}")
    out = begun_with_a_failed_run(tmp_path, monkeypatch, capsys, "diloco-s0", *args)
    for saved in [out / "resolved.yaml", *(out / "runs").glob("*/config.yaml")]:
        config = yaml.safe_load(saved.read_text())
        assert config["inner"]["muon_ns_dtype"] == "auto"
        if before == "the-key":
            del config["inner"]["muon_ns_dtype"]
        else:
            config["inner"]["muon_ns_dtype"] = "bfloat16"
        saved.write_text(yaml.safe_dump(config))
    code, _ = fake_bench(tmp_path, *args, "--resume")
    printed = capsys.readouterr()
    if optimizer == "muon":
        assert code == 2
        assert (
            "ran with inner.muon_ns_dtype: bfloat16, whose default has changed since (now auto)"
            if before == "the-key"
            else "ran with inner.muon_ns_dtype: bfloat16; this command would run auto"
        ) in printed.err
        code, _ = fake_bench(tmp_path, *args, "--set", "inner.muon_ns_dtype=bfloat16", "--resume")
        printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "adloco seed 0 finished before" in printed.out and "diloco seed 0 started" in printed.out


def test_a_resumed_bench_compares_the_keys_its_methods_presets_read(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LocalSGD's preset steps SGD, which reads ``inner.momentum``: a bench of it begun with a --set of the
    key and resumed without is refused naming it, though the shared config's optimizer (AdamW) does not
    read it; the keys the bench sets for every run (algorithm.rounds...) are not compared."""
    args = ("--methods", "localsgd,adloco", "--seeds", "0")
    out = begun_with_a_failed_run(
        tmp_path, monkeypatch, capsys, "localsgd-s0", *args, "--set", "inner.momentum=0.5"
    )
    assert fake_bench(tmp_path, *args, "--resume")[0] == 2
    assert "ran with inner.momentum: 0.5; this command would run 0" in capsys.readouterr().err
    resolved = yaml.safe_load((out / "resolved.yaml").read_text())
    resolved["algorithm"]["rounds"] += 7  # a key the bench sets for each run: the shared one is not run
    (out / "resolved.yaml").write_text(yaml.safe_dump(resolved))
    code, _ = fake_bench(tmp_path, *args, "--set", "inner.momentum=0.5", "--resume")
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "adloco seed 0 finished before" in printed.out


def test_a_resumed_bench_whose_grid_finished_runs_the_seeds_its_selection_frees(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--resume of a bench whose whole grid finished before: the kept runs complete the grid, its
    selection frees the other seeds' runs, and they run (a pass that only kept runs used to end the bench
    with the seeds queued and 'did not finish')."""
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True, "fail": ["adloco-g0-s1", "adloco-g1-s1"]}))
    args = ("--methods", "adloco", "--seeds", "0,1", "--sweep", "inner.lr=0.001,0.002")
    code, out = fake_bench(tmp_path, *args)
    assert code == 1
    capsys.readouterr()
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True}))
    code, _ = fake_bench(tmp_path, *args, "--resume")
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "adloco seed 0 finished before: adloco-g0-s0-20260101-000000" in printed.out
    assert "adloco seed 0 finished before: adloco-g1-s0-20260101-000000" in printed.out
    assert "adloco seed 1 started" in printed.out
    results = json.loads((out / "results.json").read_text())
    assert [r["status"] for r in results["variants"]["adloco"]["runs"]] == ["ok", "ok"]


@pytest.mark.parametrize("pinned", [True, False])
def test_a_stopped_run_from_before_a_key_was_added_continues_as_it_ran(
    fake: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    pinned: bool,
) -> None:
    """A run whose config.yaml was written before ``batch.noise_rows`` existed ran as ``probed``: --resume
    continues it where the bench pins ``probed`` (its config as it resumes is the task's), and runs the task
    afresh where the bench takes the default (null: requested), which the run never trained with."""
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True, "stop": ["adloco-s0"]}))
    args = ("--methods", "adloco", "--seeds", "0")
    config = {"batch": {"noise_rows": "probed"}} if pinned else None
    code, out = fake_bench(tmp_path, *args, config=config)
    assert code == 1
    capsys.readouterr()
    saved = out / "runs" / "adloco-s0-20260101-000000" / "config.yaml"
    old = yaml.safe_load(saved.read_text())
    del old["batch"]["noise_rows"]  # as the code before the key wrote it
    saved.write_text(yaml.safe_dump(old))
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True}))
    code, _ = fake_bench(tmp_path, *args, "--resume", config=config)
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert ("adloco seed 0 continued: adloco-s0-20260101-000000" in printed.out) is pinned
    assert ("adloco seed 0 started" in printed.out) is not pinned


def test_a_resumed_bench_continues_its_stopped_runs_from_their_checkpoints(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped part-way (SIGTERM, or a lost machine after a checkpoint) is continued by --resume with
    ``adloco train --resume`` in its own folder, when its config is its task's and it holds a complete
    checkpoint; otherwise its task runs afresh beside it."""
    stop = ["adloco-s0", "adloco-s1", "diloco-s1"]
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True, "stop": stop}))
    args = ("--methods", "adloco,diloco", "--seeds", "0,1")
    code, out = fake_bench(tmp_path, *args)
    assert code == 1
    capsys.readouterr()
    runs = out / "runs"
    first = {n: runs / f"{n}-20260101-000000" for n in stop}
    assert all(
        (d / "bench-failure.txt").is_file() and not (d / "summary.json").exists() for d in first.values()
    )
    assert "with --resume, continues it" in (first["adloco-s1"] / "bench-failure.txt").read_text()
    shutil.rmtree(first["adloco-s0"] / "checkpoints")  # lost before its first checkpoint
    edited = yaml.safe_load((first["diloco-s1"] / "config.yaml").read_text())
    edited["inner"]["lr"] = 0.5  # not the config its task runs now
    (first["diloco-s1"] / "config.yaml").write_text(yaml.safe_dump(edited))
    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True}))
    code, _ = fake_bench(tmp_path, *args, "--resume")
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert (
        "adloco seed 1 continued: adloco-s1-20260101-000000 from its checkpoint round-000001" in printed.out
    )
    assert "fake resume adloco-s1-20260101-000000" in printed.out
    assert "adloco seed 0 started" in printed.out and "diloco seed 1 started" in printed.out
    assert "diloco seed 0 finished before" in printed.out
    results = json.loads((out / "results.json").read_text())
    folders = {
        (v, r["seed"]): (r["status"], Path(r["run"]).name)
        for v in results["variants"]
        for r in results["variants"][v]["runs"]
    }
    assert folders[("adloco", 1)] == ("ok", "adloco-s1-20260101-000000")  # the same folder, finished
    assert folders[("adloco", 0)] == ("ok", "adloco-s0-20260101-000001")  # afresh, beside the old one
    assert folders[("diloco", 1)] == ("ok", "diloco-s1-20260101-000001")
    assert not (first["adloco-s1"] / "bench-failure.txt").exists()
    assert (first["adloco-s0"] / "bench-failure.txt").is_file() and (
        first["diloco-s1"] / "config.yaml"
    ).is_file()


# -- one run as a benchmark script starts it (adloco.bench.runner.Train) --------------------------------

# `adloco train` made up: prints its arguments, writes a run directory named as the engine names them
# (``--set runner.dir=elastic`` as under the elastic agent), or fails as $FAKE_TRAIN says.
FAKE_TRAIN = """
import json, os, sys
from pathlib import Path
argv = sys.argv[1:]
sets = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")
print(" ".join(argv))
how = os.environ.get("FAKE_TRAIN", "")
if how == "fail":
    print("Traceback (most recent call last):", file=sys.stderr)
    print("RuntimeError: the data went away", file=sys.stderr)
    sys.exit(3)
if how == "nothing":
    sys.exit(0)
suffix = "rdzv-1" if sets.get("runner.dir") == "elastic" else "20260101-000000"
run = Path(sets["logging.out_dir"]) / (sets["logging.name"] + "-" + suffix)
run.mkdir(parents=True, exist_ok=True)
evs = [{"event": "start", "round": 0}, {"event": "round", "round": 1}, {"event": "round", "round": 2}]
(run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\\n" for e in evs))
(run / "summary.json").write_text(json.dumps({"rounds": 2, "sets": sets}))
"""


@pytest.fixture
def fake_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    script = tmp_path / "fake_adloco_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.delenv("FAKE_TRAIN", raising=False)
    return [sys.executable, str(script)]


def test_a_benchmark_run_returns_its_own_run_directory_summary_and_events(
    fake_train: list[str], tmp_path: Path
) -> None:
    """Train: the command line a script gets (--nproc, --max-restarts, --config, its sets, then where
    and under which name), the run directory the run made (not an older one of the same name, also
    one named as the elastic agent names it), its summary and its events."""
    from adloco.bench.runner import Train, train_command

    out = tmp_path / "runs"
    (out / "a-20250101-000000").mkdir(parents=True)  # an older run of the same name: not this one
    train = Train(
        ["x.y=1"], out, "a", config=tmp_path / "c.yaml", nproc=2, max_restarts=1, command=fake_train
    )
    assert train.argv == [
        *fake_train,
        *["--nproc", "2", "--max-restarts", "1", "--config", str(tmp_path / "c.yaml")],
        *["--set", "x.y=1", "--set", f"logging.out_dir={out}", "--set", "logging.name=a"],
    ]
    done = train.run()
    assert done.folder == out / "a-20260101-000000" and done.summary["sets"]["x.y"] == "1"
    assert done.stdout.startswith("--nproc 2 --max-restarts 1 --config")
    assert [e["round"] for e in done.events("round")] == [1, 2] and len(done.events()) == 3
    elastic = Train(["runner.dir=elastic"], out, "b", command=fake_train).run()
    assert elastic.folder == out / "b-rdzv-1"
    assert Train([], out, "c").argv[:4] == train_command() == [sys.executable, "-m", "adloco", "train"]


def test_a_benchmark_run_that_fails_is_one_message_with_its_command_and_stderr(
    fake_train: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adloco.bench.runner import RunFailed, Train

    monkeypatch.setenv("FAKE_TRAIN", "fail")
    with pytest.raises(RunFailed) as failed:
        Train(["x.y=1"], tmp_path / "runs", "a", command=fake_train).run()
    text = str(failed.value.code)
    assert text.startswith("a: failed (exit code 3): ") and "--set x.y=1" in text
    assert text.endswith("\n  Traceback (most recent call last):\n  RuntimeError: the data went away")
    assert isinstance(failed.value, SystemExit)  # a script that does not catch it ends with this message
    monkeypatch.setenv("FAKE_TRAIN", "nothing")
    with pytest.raises(RunFailed, match="a: failed \\(it wrote no run directory\\)"):
        Train([], tmp_path / "runs", "a", command=fake_train).run()


def test_claims_give_per_seed_ratios_and_a_replaced_adloco_drops_its_ablations() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "claims", Path(__file__).parents[2] / "benchmarks" / "claims.py"
    )
    assert spec is not None and spec.loader is not None
    claims = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(claims)

    def bench(**finals: list[float]) -> dict[str, Any]:
        runs = {
            v: {"runs": [{"seed": s, "final": f, "bytes": 1.0} for s, f in enumerate(fs)]}
            for v, fs in finals.items()
        }
        return {"target": 300.0, "network": None, "compute": {"seconds_per_example": 0.01}, "variants": runs}

    def row(text: str, claim: str) -> str:
        return next(x for x in text.splitlines() if x.startswith(f"| {claim}"))

    main = bench(
        adloco=[200.0, 90.0],
        diloco=[100.0, 100.0],
        **{"adloco-no-merge": [400.0, 180.0], "adloco-no-switch": [200.0, 90.0]},
    )
    text = claims.table(main)
    assert row(text, "lower final perplexity than DiLoCo").endswith("| 1.45 [0.90–2.00] | 2 | mixed |")
    assert row(text, "merging helps").endswith("| 0.50 [0.50–0.50] | 2 | confirmed |")
    assert row(text, "switch mode helps").endswith("| 1.00 [1.00–1.00] | 2 | no difference |")
    assert row(text, "reaches the target in fewer examples").endswith("| — | 0 | not shown |")
    again = claims.merged([main, bench(adloco=[300.0, 300.0])])
    assert row(claims.table(again), "lower final perplexity than DiLoCo").endswith(
        "| 3.00 [3.00–3.00] | 2 | refuted |"
    )
    assert row(claims.table(again), "merging helps").endswith("| — | 0 | not shown |")
    with pytest.raises(SystemExit, match="priced differently"):
        claims.merged([main, {**bench(adloco=[1.0]), "target": 250.0}])


def test_link_speed_reprices_a_finished_bench_for_other_links(tmp_path: Path) -> None:
    """benchmarks/link_speed.py: on a fast link the time ratio is the compute ratio (3 rounds against 2),
    on a slow one AdLoCo's fewer bytes win; a folder that is not a bench is one line and exit code 2."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import link_speed
    finally:
        sys.path.pop(0)
    bench_dir = tmp_path / "bench"
    variants: dict[str, Any] = {}
    for method, ppls, nbytes in (
        ("adloco", [50.0, 30.0, 20.0], 1_000_000),
        ("diloco", [40.0, 20.0, 10.0], 8_000_000),
    ):
        runs = []
        for seed in (0, 1):
            run = recorded_run(
                bench_dir / "runs",
                f"{method}-s{seed}",
                method,
                ppls,
                nbytes,
                seed,
                {"model": {"name": "llama-tiny"}},
            )
            runs.append({"seed": seed, "status": "ok", "folder": str(run.relative_to(bench_dir))})
        variants[method] = {"runs": runs}
    doc = {
        "target": 20.0,
        "compute": {"mode": "examples", "seconds_per_example": 0.01},
        "network": {"bandwidth": 1e6, "latency": 0.01},
        "variants": variants,
        "grids": {},
        "failed": [],
        "intro": [],
        "target_given": 20.0,
    }
    (bench_dir / "results.json").write_text(json.dumps(doc))
    pair = ("adloco", "diloco")
    loaded, runs_by = link_speed._load_bench(bench_dir, pair)
    fast = link_speed.ratios(loaded, runs_by, pair, 1e12)
    assert fast == pytest.approx([1.5, 1.5], rel=1e-4)
    ladder = [
        statistics.fmean(link_speed.ratios(loaded, runs_by, pair, m * 1e6 / 8)) for m in (1000, 10, 1, 0.1)
    ]
    assert ladder == sorted(ladder, reverse=True) and ladder[0] > 1 > ladder[-1]

    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "link_speed.py"),
            str(bench_dir),
            "--mbits",
            "1e9,0.1",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "| link | `llama-tiny`, 2 seeds (10.0 ms per example) |" in done.stdout
    assert "| 1e+09 Mbit/s | 1.50 [1.50–1.50] |" in done.stdout
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "link_speed.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "results.json" in bad.stderr


def test_sparse_tables_a_partial_bench_at_equal_bytes(tmp_path: Path) -> None:
    """benchmarks/sparse.py --report-only: each variant's finished seeds counted in its row, perplexity at
    the bytes of the method's sparsest variant (the initial model's where a run had sent more by its first
    evaluation), bytes to the target (by default the highest final perplexity); no finished run is one
    line and exit code 2."""
    runs = tmp_path / "bench" / "runs"
    spec = {
        "adloco": ([50.0, 30.0, 20.0], 1_000_000),
        "adloco-int4": ([52.0, 31.0, 21.0], 125_000),
        "adloco-topk": ([60.0, 35.0, 25.0], 100_000),
        "diloco": ([40.0, 22.0, 18.0], 1_000_000),
        "diloco-topk": ([45.0, 30.0, 24.0], 100_000),
        "diloco-muon": ([30.0, 20.0, 15.0], 1_000_000),  # a group of its own: diloco-topk-muon its sparsest
        "diloco-topk-muon": ([35.0, 25.0, 19.0], 500_000),
    }
    for variant, (ppls, nbytes) in spec.items():
        for seed in (0, 1) if variant.startswith("adloco") else (0,):  # DiLoCo's seed 1 not finished
            name = f"{variant}-s{seed}"
            model = {"model": {"name": "llama-tiny"}}
            recorded_run(
                runs,
                f"{name}-20260101-000000",
                variant.split("-")[0],
                [p + seed for p in ppls],
                nbytes,
                seed,
                model,
                name,
            )
    (runs / "diloco-s1-20260101-000000").mkdir()  # a run that has not finished: no summary.json
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sparse.py"), "--report-only", str(tmp_path / "bench")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in done.stdout.splitlines()}
    assert "target 26.0" in done.stdout  # adloco-topk seed 1's final, the highest
    # variant, wire, seeds, final, bytes, at the sparsest's bytes, bytes to the target
    assert rows["adloco"][2:7] == [
        "2",
        "20.5 [20.0–21.0]",
        "3.0 MB",
        "100.0 [100.0–100.0] at 0.3 MB",
        "3.0 MB [3.0 MB–3.0 MB]",
    ]
    assert rows["adloco-int4"][5] == "31.5 [31.0–32.0] at 0.3 MB"
    assert rows["adloco-topk"][5] == "25.5 [25.0–26.0] at 0.3 MB"
    assert rows["diloco"][2:4] == ["1", "18.0"] and rows["diloco"][6] == "2.0 MB"
    assert "diloco-int4" not in rows
    assert rows["diloco-muon"][5] == "30.0 at 1.5 MB"  # at the muon group's sparsest bytes, not diloco-topk's
    lines = [line.split(" | ")[0].lstrip("| ") for line in done.stdout.splitlines() if line.startswith("| d")]
    assert lines == ["diloco", "diloco-topk", "diloco-muon", "diloco-topk-muon"]  # grouped, float32 first
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sparse.py"), "--report-only", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no finished run" in bad.stderr


@pytest.mark.long
def test_scaling_tables_and_plots_adloco_over_its_rivals_by_model_size(
    fake: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/claims.py --column and benchmarks/scaling.py on two benches of different models."""
    import importlib.util

    def load(name: str) -> Any:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    monkeypatch.setenv("FAKE_BENCH", json.dumps({"resolved": True}))
    folders = {}
    for model in ("llama-tiny", "llama-10m"):
        where = tmp_path / model
        where.mkdir()
        config = {
            "model": {"name": model},
            "bench": {
                "budget": 300,
                "target": 45.0,
                "variants": {
                    "diloco-schedule": {
                        "from": "diloco",
                        "set": {"batch.schedule": "ramp", "batch.schedule_examples": 500},
                    }
                },
            },
        }
        code, folders[model] = fake_bench(
            where, "--methods", "adloco,diloco,diloco-schedule", "--seeds", "0,1", config=config
        )
        assert code == 0, capsys.readouterr().err
    claims, scaling = load("claims"), load("scaling")
    text = claims.columns(
        [(m, json.loads((folders[m] / "results.json").read_text())) for m in ("llama-tiny", "llama-10m")]
    )
    # finals: adloco 30 + seed, diloco 40 + seed, diloco with the schedule 40 + seed − 5
    assert "| claim | llama-tiny, 2 seeds, target 45 | llama-10m, 2 seeds, target 45 |" in text
    assert (
        "| lower final perplexity than DiLoCo | 0.75 [0.75–0.76] confirmed | 0.75 [0.75–0.76] confirmed |"
        in text
    )
    assert "| lower final perplexity than DiLoCo with a batch schedule | 0.86 [0.86–0.86] confirmed |" in text
    assert "merging helps" not in text  # no column ran the ablation
    points = [scaling.point(folders[m]) for m in ("llama-tiny", "llama-10m")]
    assert [p["parameters"] for p in points] == [1_377_408, 11_228_480]
    assert points[1]["model"] == "llama-10m" and points[1]["corpus"] == "stdlib"
    table = scaling.table(points)
    assert "| stdlib | llama-tiny | 1.4 M | 45 | 2 | 0.75 [0.75–0.76] |" in table
    scaling.plot(points, tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


# -- benchmarks/gpu_scale.sh: the scaling benches on a GPU ----------------------------------------------

GPU_SCALE = ROOT / "benchmarks" / "gpu_scale.sh"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ([], "usage: prepare FROZEN | run SECONDS | collect FILES FROZEN"),
        (["prepare", "{tmp}/none"], "prepare: {tmp}/none: not a checkout with src/adloco and .venv"),
        (["run", "ten"], "run: SECONDS: a whole number of seconds, not 'ten'"),
        (["collect", "{tmp}/none", "{tmp}"], "collect: FILES FROZEN: folders expected"),
    ],
)
def test_gpu_scale_refuses_bad_arguments_in_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    done = subprocess.run(
        ["bash", str(GPU_SCALE), *(a.format(tmp=tmp_path) for a in args)], capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"gpu_scale.sh: {line.format(tmp=tmp_path)}\n"


def test_gpu_scale_collect_adds_the_finished_runs_a_bench_lacks(tmp_path: Path) -> None:
    """collect: the runs that finished on the GPU join the bench's folder; an unfinished one and one the
    folder already has (by name) are left out, and nothing the folder had is replaced."""
    gpu = tmp_path / "gpu"
    for name, finished in [("a-s0-1", True), ("b-s0-1", False), ("c-s0-1", True)]:
        run = gpu / "scale-10m-x" / "runs" / name
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("x: 1\n")
        if finished:
            (run / "summary.json").write_text("{}")
    (gpu / "scale-10m-x" / "shared.yaml").write_text("model: {}\n")
    (gpu / "scale-10m-x.log").write_text("log\n")
    files = tmp_path / "files"
    files.mkdir()
    archive = str(files / "scale-10m-x.tar.gz")
    subprocess.run(["tar", "-C", str(gpu), "-czf", archive, "scale-10m-x", "scale-10m-x.log"], check=True)
    out = tmp_path / "frozen" / "benchmarks" / "out"
    kept = out / "scale-10m-x" / "runs" / "c-s0-1"
    kept.mkdir(parents=True)
    (kept / "summary.json").write_text('{"mine": 1}')
    done = subprocess.run(
        ["bash", str(GPU_SCALE), "collect", str(files), str(tmp_path / "frozen")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "scale-10m-x: 1 runs from the GPU\n"
    assert sorted(p.name for p in (out / "scale-10m-x" / "runs").iterdir()) == ["a-s0-1", "c-s0-1"]
    assert (kept / "summary.json").read_text() == '{"mine": 1}'
    assert (out / "scale-10m-x-gpu.log").read_text() == "log\n"
    assert (out / "scale-10m-x" / "shared.yaml").read_text() == "model: {}\n"
