"""Step-time profiles (ALGORITHM.md §11): the fit against known costs, a profile's prices and its fixed-cost
share, its file and its bad files, profiles fitted from runs, `adloco profile`, and simulated time priced
by a profile (report, adloco train, benchmarks/link_speed.py and fixed_share.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from adloco.errors import UserError
from adloco.profile import StepProfile, fit, fit_runs
from adloco.report import results
from tests.helpers import driver, run_main, tiny_config
from tests.recorded import recorded_run

ROOT = Path(__file__).resolve().parents[2]


def test_the_fit_recovers_a_fixed_cost_and_a_cost_per_row() -> None:
    alpha, beta, residual = fit({m: 0.004 + 0.016 * m for m in (1, 2, 4, 8)})
    assert alpha == pytest.approx(0.004) and beta == pytest.approx(0.016) and residual < 1e-9
    with pytest.raises(UserError, match="at least two micro-batch sizes"):
        fit({4: 0.1})


def test_a_profile_prices_steps_and_says_its_fixed_share() -> None:
    p = StepProfile(alpha=0.004, beta=0.016, delta=0.002)
    assert p.step_seconds(8, 2) == pytest.approx(2 * (0.004 + 0.128) + 0.002)
    assert p.worker_seconds(3, 4, 1, passes=2, rows=6) == pytest.approx(
        3 * (0.004 + 0.064 + 0.002) + 0.008 + 0.096
    )
    assert p.fixed_share(4) == pytest.approx(0.004 / 0.068)
    q = p.with_fixed_share(0.9, 4)
    assert q.fixed_share(4) == pytest.approx(0.9)
    assert q.step_seconds(4, 1) == pytest.approx(p.step_seconds(4, 1))  # the same step at b₀, re-split
    assert q.step_seconds(16, 1) < p.step_seconds(16, 1)  # where a bigger batch is cheaper per example
    with pytest.raises(UserError, match=r"--fixed-share 1.0: must be in \[0, 1\)"):
        p.with_fixed_share(1.0, 4)


def test_a_profile_round_trips_and_a_bad_file_is_one_line(tmp_path: Path) -> None:
    p = StepProfile(alpha=0.004, beta=0.016, delta=0.002, device="cpu", timings={"1": 0.02})
    p.save(tmp_path / "p.json")
    assert StepProfile.load(tmp_path / "p.json") == p
    cases = {
        "missing.json": "no such file (adloco profile writes one)",
        "text.json": "not a profile (JSONDecodeError)",
        "other.json": "not a profile of format 1 (adloco profile writes one)",
        "negative.json": "alpha, beta and delta must be finite seconds >= 0, not all zero",
    }
    (tmp_path / "text.json").write_text("hello")
    (tmp_path / "other.json").write_text(json.dumps({"alpha": 1}))
    (tmp_path / "negative.json").write_text(json.dumps({"format": 1, "alpha": -1, "beta": 1, "delta": 0}))
    for name, why in cases.items():
        with pytest.raises(UserError) as err:
            StepProfile.load(tmp_path / name)
        assert str(err.value) == f"profile {str(tmp_path / name)!r}: {why}"


def test_a_profile_is_fitted_from_rounds_that_vary_and_refused_from_rounds_that_do_not() -> None:
    true = StepProfile(alpha=0.005, beta=0.02, delta=0.003)
    rows = []
    for micro, accum in ((2, 1), (4, 1), (8, 1), (8, 2), (8, 4)):
        steps = 12
        rows.append((true.worker_seconds(steps, micro, accum), steps, steps * accum, steps * micro * accum))
    got = fit_runs(rows)
    assert (got.alpha, got.beta, got.delta) == pytest.approx((0.005, 0.02, 0.003), rel=1e-6)
    with pytest.raises(UserError, match="all used one micro-batch size"):
        fit_runs([(1.0 + i * 1e-3, 12, 12, 48) for i in range(4)])
    # no step accumulated: α and δ are one fixed cost per pass, which prices those steps exactly
    flat = [(true.worker_seconds(12, m, 1), 12, 12, 12 * m) for m in (2, 4, 8)]
    one = fit_runs(flat)
    assert (one.alpha, one.beta, one.delta) == pytest.approx((0.008, 0.02, 0.0), rel=1e-6)
    assert (
        one.source
        == "fitted from 3 worker rounds, α with the optimizer step in it (the steps all accumulated alike)"
    )
    # a fit that would go negative is the best fit with that coefficient at 0, not the clipped one
    import numpy as np

    shapes = [(12, m, a) for m, a in ((2, 1), (4, 1), (8, 1), (8, 2), (8, 4))]
    neg = [(-0.001 * s * a + 0.02 * s * m * a + 0.003 * s, s, s * a, s * m * a) for s, m, a in shapes]
    got = fit_runs(neg)  # unconstrained: α = -0.001
    x = np.array([[e, s] for _, s, _, e in neg], dtype=float)
    (beta, delta), *_ = np.linalg.lstsq(x, np.array([c for c, *_ in neg]), rcond=None)
    assert got.alpha == 0 and (got.beta, got.delta) == pytest.approx((beta, delta), rel=1e-9)


def test_adloco_profile_measures_and_writes_a_profile(tmp_path: Path, text_corpus: Path) -> None:
    out = tmp_path / "p.json"
    ran = run_main(
        "profile",
        "--set",
        "model.name=llama-micro",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        "data.tokenizer=bpe:300",
        "--set",
        "data.seq_len=16",
        "--sizes",
        "1,2,4",
        "--repeats",
        "2",
        "--out",
        str(out),
    )
    assert ran.returncode == 0, ran.stderr
    p = StepProfile.load(out)
    assert set(p.timings) == {"1", "2", "4"} and p.model == "llama-micro" and p.seq_len == 16
    assert p.alpha + p.beta > 0 and p.delta > 0 and p.source == "measured"
    assert "fixed share at b₀ = 4: φ = " in ran.stdout and f"profile: {out}" in ran.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--sizes", "1,2"],
            "--sizes '1,2': must be at least 3 different micro-batch sizes >= 1, e.g. 1,2,4,8",
        ),
        (
            ["--sizes", "0,1,2"],
            "--sizes '0,1,2': must be at least 3 different micro-batch sizes >= 1, e.g. 1,2,4,8",
        ),
        (["--repeats", "0"], "--repeats 0: must be >= 1"),
        (["--out", "/nonexistent/p.json"], "--out '/nonexistent/p.json': its folder does not exist"),
    ],
)
def test_adloco_profile_refuses_bad_options_in_one_line(args: list[str], line: str) -> None:
    ran = run_main("profile", *args)
    assert ran.returncode == 2 and ran.stderr == f"adloco: error: {line}\n"


def test_a_report_prices_each_worker_by_the_profile(tmp_path: Path) -> None:
    run = recorded_run(tmp_path, "fast", "adloco", [50.0, 30.0], 2_000_000)
    prof = StepProfile(alpha=0.1, beta=0.01, delta=0.05)
    (loaded,) = results.load_all([run])
    results.price([loaded], profile=prof)
    # a worker: 50 examples in steps of 4 rows -> 12 steps; the probe's 16 chunks over 2 workers -> 8 passes,
    # 7 more than the step's one micro-batch; the round: the slowest worker + the all-reduce of 1 MB
    worker = 12 * (0.1 + 0.04 + 0.05) + 7 * 0.1
    network = 2 * 1 / 2 * 1e6 / 1e6 + 2 * 0.01
    assert loaded.points[1].sim_s == pytest.approx(worker + network)
    assert "priced by a step-time profile" in results.compute_sentence([loaded])
    with pytest.raises(UserError, match="--fixed-share: needs --profile"):
        results.price([loaded], fixed_share=0.5)
    prof.save(tmp_path / "p.json")
    ran = run_main("report", str(run), "--profile", str(tmp_path / "p.json"), "--fixed-share", "0.5")
    assert ran.returncode == 0, ran.stderr
    assert "fixed share 0.5 at b0 4" in (run / "report" / "report.md").read_text()


def test_a_run_prices_simulated_time_by_runtime_profile(tmp_path: Path) -> None:
    prof = StepProfile(alpha=0.5, beta=0.25, delta=0.125)
    prof.save(tmp_path / "p.json")
    cfg = tiny_config(f"runtime.profile={tmp_path / 'p.json'}", "network.latency=0", "network.bandwidth=1e30")
    d = driver(cfg)
    out = d.run_round()
    summary = out[-1]
    workers = [e for e in out if e.event == "worker"]
    slowest = max(
        prof.worker_seconds(e.examples // (e.micro * e.accum), e.micro, e.accum, 0, e.probe_examples)
        for e in workers
    )
    assert summary.sim_s >= slowest and summary.sim_s == pytest.approx(
        max(d.priced_compute(d.algo.last_report).values())
    )
    assert d.algo.fixed_rows == 2.0  # α/β: with balance speed, speeds net of it and rows shared by it
    slow = driver(
        tiny_config(f"runtime.profile={tmp_path / 'p.json'}", "runtime.emulate_speed=[1, 0.5, 1, 1]")
    )
    slow.run_round()
    priced = slow.priced_compute(slow.algo.last_report)
    assert priced[1] == pytest.approx(2 * priced[0])  # an emulated device half as fast: twice the time
    assert driver(tiny_config()).algo.fixed_rows == 0.0
    bad = run_main("train", "--set", f"runtime.profile={tmp_path / 'none.json'}")
    assert bad.returncode == 2
    assert (
        bad.stderr
        == f"adloco: error: config: runtime.profile = '{tmp_path / 'none.json'}': no such file (adloco profile writes one)\n"
    )


def test_a_run_fits_its_own_profile_from_its_rounds_with_runtime_profile_auto(
    tmp_path: Path, text_corpus: Path
) -> None:
    import dataclasses

    true = StepProfile(alpha=0.5, beta=0.25, delta=0.125)
    cfg = tiny_config(
        "runtime.profile=auto",
        "runtime.emulate_speed=[1, 0.5, 1, 1]",
        "network.latency=0",
        "network.bandwidth=1e30",
    )
    d = driver(cfg)
    d.run_round()
    real = d.algo.last_report

    def timed(micro: int, accum: int) -> object:  # the round as the true profile would have timed it
        ws = []
        for e in real.workers:
            e = dataclasses.replace(e, micro=micro, accum=accum, examples=2 * micro * accum, probe_examples=0)
            ws.append(
                dataclasses.replace(
                    e, compute_s=true.worker_seconds(2, micro, accum) / d.algo.emulate[e.worker]
                )
            )
        return dataclasses.replace(
            real, workers=ws, trainers=[dataclasses.replace(t, samples=0) for t in real.trainers]
        )

    assert d.auto_sums.n == 0 and d.profile is None and d.algo.fixed_rows == 0.0  # the first round: warm-up
    d._fit_own_profile(timed(2, 1))
    d._fit_own_profile(timed(2, 2))
    assert d.profile is None  # one micro-batch size: α and β cannot be told apart, compute stays measured
    d._fit_own_profile(timed(4, 1))
    got = d.profile
    assert got is not None and (got.alpha, got.beta, got.delta) == pytest.approx((0.5, 0.25, 0.125), rel=1e-9)
    assert (
        got.source == "fitted from 12 worker rounds of this run (runtime.profile auto)"
        and got.residual < 1e-6  # the fit is exact; its residual, from summed squares, is not quite 0
    )
    assert d.algo.fixed_rows == pytest.approx(2.0)  # the emulated worker was measured at its device's speed
    assert d.priced_compute(timed(4, 1))[1] == pytest.approx(2 * true.worker_seconds(2, 4, 1))
    again = driver(cfg)  # a resume: the same profile, the same shares
    again.load_state_dict(d.state_dict())
    assert again.profile == d.profile and again.algo.fixed_rows == d.algo.fixed_rows

    out = tmp_path / "runs"
    sets = ["model.name=llama-micro", "data.tokenizer=bpe:300", "data.seq_len=16", "algorithm.rounds=6"]
    sets += ["algorithm.inner_steps=2", "algorithm.trainers=1", "runtime.balance=speed"]
    sets += ["runtime.emulate_speed=[1, 0.5, 1, 0.25]", "switch.b_max=8", "logging.save_model=false"]
    sets += ["runtime.profile=auto", "logging.progress=off", "logging.plots=false", "eval.max_examples=4"]
    ran = run_main(
        "train",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={out}",
        *[a for kv in sets for a in ("--set", kv)],
    )
    assert ran.returncode == 0, ran.stderr
    (run,) = out.iterdir()
    micros = {
        json.loads(x)["micro"]
        for x in (run / "metrics.jsonl").read_text().splitlines()[1:]
        if json.loads(x)["event"] == "worker"
    }
    assert len(micros) >= 2, micros  # speeds shared rows unequally, so the run could fit its profile
    fitted = StepProfile.load(run / "profile.json")
    assert "runtime.profile auto" in fitted.source and fitted.model == "llama-micro" and fitted.seq_len == 16


def _bench(tmp_path: Path) -> Path:
    bench_dir = tmp_path / "bench"
    variants = {}
    for method, ppls, nbytes in (
        ("adloco", [50.0, 30.0, 20.0], 1_000_000),
        ("diloco", [40.0, 20.0, 10.0], 8_000_000),
    ):
        runs = []
        for seed in (0, 1):
            run = recorded_run(bench_dir / "runs", f"{method}-s{seed}", method, ppls, nbytes, seed)
            runs.append({"seed": seed, "status": "ok", "folder": str(run.relative_to(bench_dir))})
        variants[method] = {"method": method, "runs": runs}
    grid = []  # diloco's grid on seed 0: its selected run, and a slower one
    for index, ppls in enumerate(([40.0, 20.0, 10.0], [40.0, 30.0, 20.0])):
        run = recorded_run(bench_dir / "runs", f"diloco-g{index}-s0", "diloco", ppls, 8_000_000)
        grid.append(
            {
                "status": "ok",
                "folder": str(run.relative_to(bench_dir)),
                "setting_text": f"batch.initial={4 << index}",
            }
        )
    doc = {
        "target": 20.0,
        "compute": {"mode": "examples", "seconds_per_example": 0.01},
        "network": {"bandwidth": 1e6, "latency": 0.01},
        "variants": variants,
        "grids": {"diloco": grid},
        "failed": [],
        "intro": [],
        "target_given": 20.0,
    }
    (bench_dir / "results.json").write_text(json.dumps(doc))
    return bench_dir


def test_link_speed_and_fixed_share_price_a_bench_by_a_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench_dir = _bench(tmp_path)
    StepProfile(alpha=0.1, beta=0.01, delta=0.05).save(tmp_path / "p.json")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import fixed_share
        import link_speed
    finally:
        sys.path.pop(0)
    assert link_speed.main([str(bench_dir), "--mbits", "1e9", "--profile", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "(profile α 100.0 ms, β 10.0 ms/row, δ 50.0 ms, φ 0.71 at b₀ 4)" in out  # the price is named
    assert "| 1e+09 Mbit/s | 1.50 [1.50–1.50] |" in out  # 3 rounds against 2, alike
    assert (
        fixed_share.main(
            [
                str(bench_dir),
                "--profile",
                str(tmp_path / "p.json"),
                "--phi",
                "0.2,0.9",
                "--mbits",
                "1e9",
                "--plot",
                str(tmp_path / "phi.png"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| 0.2 | 1.50 [1.50–1.50] |" in out and (tmp_path / "phi.png").stat().st_size > 1000
    args = [str(bench_dir), "--profile", str(tmp_path / "p.json"), "--phi", "0.2", "--mbits", "1e9"]
    assert fixed_share.main([*args, "--fastest-b"]) == 0  # diloco at the grid setting that is soonest
    assert "| 0.2 | 1.50 [1.50–1.50] (batch.initial=4) |" in capsys.readouterr().out
    assert fixed_share.main([*args, "--fastest-b", "--variants", "diloco,adloco"]) == 2
    assert (
        capsys.readouterr().err
        == "fixed_share: --fastest-b: adloco's method 'adloco' has no grid in this bench\n"
    )
    assert fixed_share.main([str(bench_dir), "--profile", str(tmp_path / "p.json"), "--phi", "1.2"]) == 2
    assert capsys.readouterr().err == "fixed_share: --phi: numbers in [0, 1); --mbits: positive numbers\n"
