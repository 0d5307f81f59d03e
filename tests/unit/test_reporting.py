"""`adloco report` on recorded run directories made here by hand, and `adloco bench` end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adloco import events
from adloco.cli import main
from adloco.report import plots, results
from tests.recorded import recorded_run, rewrite


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    return [
        recorded_run(tmp_path, "fast", "adloco", [50.0, 30.0, 20.0], 2_000_000),
        recorded_run(tmp_path, "slow", "diloco", [80.0, 60.0, 40.0], 4_000_000),
    ]


def test_simulated_time_and_the_target(runs: list[Path]) -> None:
    fast = results.load(runs[0])
    # a round: slowest worker 2 s + all-reduce of 1 MB among 2: 2·1/2 · 1e6/1e6 + 2 · 0.01 = 1.02 s
    assert [p.sim_s for p in fast.points] == pytest.approx([0, 3.02, 6.04, 9.06])
    got = results.reach(fast, 30.0)
    assert got is not None
    assert (got.round, got.examples, got.communications, got.bytes) == (2, 200, 2, 4_000_000)
    assert got.sim_s == pytest.approx(6.04)
    assert results.reach(fast, 10.0) is None
    # priced for another network without re-running: 10x the bandwidth
    assert results.load(runs[0], bandwidth=1e7).points[1].sim_s == pytest.approx(2 + 0.1 + 0.02)


def test_theorem_1_bound(runs: list[Path]) -> None:
    # σ²/(M η² (‖g‖² + σ²/(M b))) with σ² = 8, ‖g‖² = 1, M = 2, η = 0.5, b = 4: 8/(0.5 (1 + 1)) = 8
    (first, *_) = results.theorem1(results.load(runs[0]))
    assert first == (1, 0, pytest.approx(8.0), 8)


def test_report_command(runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "Target perplexity: **40.00**" in text  # the highest final perplexity
    rows = [line for line in text.splitlines() if line.startswith("| fast") or line.startswith("| slow")]
    assert rows[0].startswith("| fast | adloco | 3 | 20.00 | 200 | 2 | 4.0 MB | 6.0 s |")
    assert rows[1].startswith("| slow | diloco | 3 | 40.00 | 300 | 3 | 12.0 MB |")
    for name in (
        "val_ppl_vs_examples",
        "val_ppl_vs_communications",
        "val_ppl_vs_bytes",
        "val_ppl_vs_simulated_time",
        "requests",
        "trainers_alive",
        "allocation",
        "batch",
        "idle_share",
    ):
        assert (out / "plots" / f"{name}.png").stat().st_size > 1000
        assert f"plots/{name}.png" in text


def test_report_refuses_a_folder_that_is_not_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"adloco: error: run directory '{tmp_path}': no config.yaml (not a run directory)"
    )


def test_bench_checks_every_variant_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    code = main(["bench", "--budget", "10", "--methods", "adloco,fedavg", "--out", str(out)])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.strip() == (
        "adloco: error: --methods 'adloco,fedavg': 'fedavg' is not one of adloco, diloco, localsgd, ddp"
    )


def test_report_on_one_run_writes_beside_its_plots_and_says_it_is_one_run(runs: list[Path]) -> None:
    (runs[0] / "plots").mkdir()
    (runs[0] / "plots" / "val_ppl_vs_simulated_time.png").write_bytes(b"drawn at the end of the run")
    own = {p.name: p.read_bytes() for p in (runs[0] / "plots").iterdir()}
    assert main(["report", str(runs[0]), "--bandwidth", "1e5"]) == 0
    text = (runs[0] / "report" / "report.md").read_text()
    assert text.startswith(f"# adloco report: one run, {runs[0].name}\n")
    assert text.count("\n| fast | adloco |") == 1
    assert (runs[0] / "report" / "plots" / "val_ppl_vs_simulated_time.png").is_file()
    assert {p.name: p.read_bytes() for p in (runs[0] / "plots").iterdir()} == own  # the run's own, untouched


def test_report_states_the_network_it_priced(runs: list[Path], tmp_path: Path) -> None:
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "a")]) == 0
    assert "on 1 MB/s and 10 ms latency" in (tmp_path / "a" / "report.md").read_text()
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "b"), "--bandwidth", "1e7"]) == 0
    assert "on 10 MB/s and 10 ms latency" in (tmp_path / "b" / "report.md").read_text()


# -- the plots, as matplotlib figures ---------------------------------------------------------------


def legend_labels(fig: Any) -> set[str]:
    """Every label of every legend of the figure (the axes' and the figure's own)."""
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    return {t.get_text() for lg in legends for t in lg.get_texts()}


def labelled(ax: Any) -> set[str]:
    artists = [*ax.lines, *ax.collections, *ax.patches]
    return {a.get_label() for a in artists if a.get_label() and not a.get_label().startswith("_")}


def visible_ticks(axis: Any) -> list[float]:
    lo, hi = sorted(axis.get_view_interval())
    return [float(t) for t in axis.get_major_locator()() if lo <= t <= hi]


def integer_ticks(axis: Any) -> bool:
    ticks = visible_ticks(axis)
    return len(ticks) >= 2 and all(t.is_integer() for t in ticks)


@pytest.fixture
def figures(runs: list[Path], tmp_path: Path) -> dict[str, Any]:
    return plots.make_figures(results.load_all(runs), target=40.0)


def test_every_plot_with_several_series_has_a_legend(figures: dict[str, Any], tmp_path: Path) -> None:
    one = plots.make_figures([results.load(recorded_run(tmp_path, "one", "adloco", [50.0], 10))])
    assert (
        set(figures)
        == set(one)
        == {
            "val_ppl_vs_round.png",
            "val_ppl_vs_examples.png",
            "val_ppl_vs_communications.png",
            "val_ppl_vs_bytes.png",
            "val_ppl_vs_simulated_time.png",
            "requests.png",
            "trainers_alive.png",
            "allocation.png",
            "batch.png",
            "idle_share.png",
        }
    )
    for name, fig in [*figures.items(), *one.items()]:
        shown = legend_labels(fig)
        for ax in fig.axes:
            if len(labelled(ax)) > 1:
                assert labelled(ax) <= shown, name
    assert "trainer 0" in legend_labels(figures["allocation.png"])  # the colours explained


def test_curves_start_at_the_true_origin_and_say_whose_they_are(figures: dict[str, Any]) -> None:
    for x in ("round", "examples", "communications", "bytes", "simulated_time"):
        ax = figures[f"val_ppl_vs_{x}.png"].axes[0]
        assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0, x
        assert min(visible_ticks(ax.xaxis)) == 0, x  # 0 shown, nothing below it
        assert "trainer 0 (the lowest id alive" in ax.get_title(), x
        assert any(t.get_text() == "start: 100 (every run)" for t in ax.texts)  # one common start
    for x in ("round", "examples", "communications"):  # counts
        assert integer_ticks(figures[f"val_ppl_vs_{x}.png"].axes[0].xaxis), x
    bytes_ax = figures["val_ppl_vs_bytes.png"].axes[0]
    assert bytes_ax.get_xlabel() == "bytes communicated, all workers (MB)"
    assert bytes_ax.lines[0].get_xdata()[-1] == pytest.approx(6.0)  # 3 rounds of 2 MB
    time_ax = figures["val_ppl_vs_simulated_time.png"].axes[0]
    assert "simulated on 1 MB/s and 10 ms latency; compute measured" in time_ax.get_title()


def test_a_long_tail_is_clipped_and_drawn_whole_beside(runs: list[Path], tmp_path: Path) -> None:
    ddp = recorded_run(tmp_path, "ddp", "ddp", [40.0, 30.0, 25.0], 100_000_000)
    fig = plots.curve_figure([(r.label, [r]) for r in results.load_all([*runs, ddp])], "bytes")
    ax, legend_axes, whole = fig.axes
    assert ax.get_xlim() == pytest.approx((0, 1.1 * 12))  # 10% beyond the next longest run (12 MB)
    assert whole.get_xlim()[1] >= 300 and whole.get_title() == "whole range (shaded: the plot's)"
    assert [t.get_text() for t in ax.texts if "continues" in t.get_text()] == [
        "ddp continues to 300 MB (final 25) →"
    ]
    assert legend_labels(fig) >= {"fast", "slow", "ddp"}
    not_clipped = plots.curve_figure([(r.label, [r]) for r in results.load_all(runs)], "bytes")
    assert len(not_clipped.axes) == 1  # 12 MB against 6 MB: no tail to clip


def test_request_plot_marks_merges_and_the_switch_threshold(tmp_path: Path) -> None:
    merge = events.Merge(
        round=2, merged=[0, 1], survivor=0, weights={0: 0.5, 1: 0.5}, request=12, trainers_alive=1
    )

    def add_merge(e: dict[str, Any]) -> list[dict[str, Any]]:
        return [e, merge.to_dict()] if e["event"] == "trainer" and e["round"] == 2 else [e]

    run = rewrite(
        recorded_run(
            tmp_path, "a", "adloco", [50.0, 30.0, 20.0], 10, config={"switch": {"kappa": 2.0, "b_max": 8}}
        ),
        add_merge,
    )
    ax = plots.requests_figure([("a", results.load(run), 1)]).axes[0]
    (diamond,) = [line for line in ax.lines if line.get_marker() == "D"]
    assert (list(diamond.get_xdata()), list(diamond.get_ydata())) == ([2.5], [12])  # between rounds 2 and 3
    assert any(t.get_text() == "t0+t1 → t0" for t in ax.texts)
    (threshold,) = [line for line in ax.lines if line.get_label().startswith("κ·b_max")]
    assert list(threshold.get_ydata()) == [16, 16]
    assert "above it a worker accumulates micro-batches (b_max: config switch.b_max)" in threshold.get_label()
    assert any(t.get_text() == "κ·b_max = 2 × 8 = 16" for t in ax.texts)
    assert (
        "lowest request the paper's Theorem 1 allows, from the round before (constants reconstructed)"
        in labelled(ax)
    )
    assert integer_ticks(ax.xaxis) and integer_ticks(ax.yaxis) and ax.get_ylim()[0] == 0

    # a worker that accumulated ran micro-batches of b_max: the events say b_max, before the config
    def accumulate(e: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**e, "accum": 2, "effective": 8} if e["event"] == "worker" and e["round"] == 3 else e]

    th = results.switch_threshold(results.load(rewrite(run, accumulate)))
    assert th is not None and (th.kappa, th.b_max, th.source) == (2.0, 4, "the workers' micro-batch")
    plain = results.load(recorded_run(tmp_path, "b", "adloco", [50.0], 10))
    assert results.switch_threshold(plain) is None  # nobody reached b_max and the config does not say


def test_changes_of_workers_are_marked(tmp_path: Path) -> None:
    change = events.Membership(
        round=2, workers=1, workers_before=2, left=[1], joined=[], merged=[], restart_s=1.0, restarts=1
    )

    def restart(e: dict[str, Any]) -> list[dict[str, Any]]:
        if e["event"] == "worker" and e["round"] == 3 and e["worker"] == 1:
            return []  # worker 1 left
        return [e, change.to_dict()] if e["event"] == "round" and e["round"] == 2 else [e]

    run = results.load(rewrite(recorded_run(tmp_path, "a", "adloco", [50.0, 30.0, 20.0], 10), restart))
    assert results.memberships(run) == [change]  # read even where the schema's table lacks it
    ax = plots.curve_figure([("a", [run])], "round").axes[0]
    (line,) = [x for x in ax.lines if "workers" in x.get_label()]
    assert list(line.get_xdata()) == [2.5, 2.5] and line.get_label() == "2 → 1 workers after round 2"
    assert any(t.get_text() == "2 → 1 workers" for t in ax.texts)
    fig = plots.allocation_figure([("a", run, 1)])
    ax = fig.axes[0]
    assert any(t.get_text() == "2 → 1 workers" for t in ax.texts)
    assert {"trainer 0", "worker not in the run that round", "change of workers"} <= legend_labels(fig)
    image = ax.get_images()[0].get_array()
    assert tuple(image[1][2][:3]) == (1.0, 1.0, 1.0)  # worker 1 in round 3: white
    assert integer_ticks(ax.xaxis) and integer_ticks(ax.yaxis)


def test_counts_are_ticked_in_whole_numbers(figures: dict[str, Any]) -> None:
    alive = figures["trainers_alive.png"].axes[0]
    assert integer_ticks(alive.yaxis) and integer_ticks(alive.xaxis)
    fast, slow = alive.lines[:2]  # both 1 trainer throughout: drawn a little apart, both visible
    assert set(fast.get_ydata()) != set(slow.get_ydata())
    assert {round(y) for y in [*fast.get_ydata(), *slow.get_ydata()]} == {1}
    batch = figures["batch.png"]
    top, bottom = batch.axes[:2]
    assert (
        top.get_ylabel() == "examples" and bottom.get_ylabel() == "micro-batches\nper step"
    )  # one unit each
    assert integer_ticks(bottom.yaxis)


def test_idle_share_per_round(tmp_path: Path) -> None:
    def idle(e: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**e, "idle_share": 0.1 * e["round"]} if e["event"] in ("round", "trainer") else e]

    run = results.load(rewrite(recorded_run(tmp_path, "a", "adloco", [50.0, 30.0, 20.0], 10), idle))
    ax = plots.idle_share_figure([("a", [run])]).axes[0]
    (mean,) = [x for x in ax.lines if x.get_label() == "mean over trainers (the round's)"]
    assert list(mean.get_ydata()) == pytest.approx([0.1, 0.2, 0.3])
    assert ax.yaxis.get_major_formatter()(0.3) == "30%" and ax.get_ylim()[0] == 0
    assert "trainer 0" in labelled(ax)
