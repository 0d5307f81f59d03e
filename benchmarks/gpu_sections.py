"""Sections 1 to 7 of ``benchmarks/gpu.py``: env (the child's device and matmul ceiling), precision,
b_max, oom, torchrun, overhead (the engine 1x1 against the plain loop, both traced) and multi (the
engine's workers on one GPU, with ``summarize_multi`` and its targets). Each ``sec_*`` takes the shared
``Ctx`` and its time box and returns the section's result (``gpu_ctx`` holds what they share).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from gpu_ctx import HERE, Ctx, SectionError, _ppl, _slim, rank_errors


def sec_env(ctx: Ctx, box: float) -> dict[str, Any]:
    r = ctx.child("env", box)
    if "cuda" not in r:  # the child failed early: ask torch alone, so the CUDA sections still run
        q = ctx.spawn("cuda?", [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"], 60)
        r["cuda"] = q["output"].strip().endswith("True")
    ctx.cuda = bool(r.get("cuda"))
    ctx.ceiling = r.get("bf16_tflops") if ctx.cuda else None
    if "error" in r:
        raise SectionError(r["error"], r)
    return r


def sec_precision(ctx: Ctx, box: float) -> dict[str, Any]:
    end = time.time() + box
    precisions = ["fp32", "fp16"] if ctx.dry and not ctx.cuda else ["fp32", "bf16", "fp16"]
    out: dict[str, Any] = {
        "config": "the default (no config file)" + ("" if ctx.dry else ", algorithm.rounds=4"),
        "runs": {},
    }
    for prec in precisions:
        left = end - time.time()
        if left < 5:
            out["runs"][prec] = {"skipped": "section time limit"}
            continue
        sets: dict[str, Any] = {"model.precision": prec}
        if not ctx.dry:
            sets["algorithm.rounds"] = 4
        rec = ctx.cli(f"precision-{prec}", sets, min(left, 150))
        if not ctx.cuda and prec != "fp32":
            rec["expected"] = "mixed precision needs CUDA: the engine refuses it on CPU with exit code 2"
        ck = rec.get("checkpoint", {}).get("worker_scalars") or {}
        if ck:
            rec["loss_scale"] = {w: s[0] for w, s in ck.items() if s}
            rec["skipped_steps"] = {w: s[2] for w, s in ck.items() if s}
        out["runs"][prec] = _slim(rec)
        ctx.say(
            f"  precision {prec}: rc {rec['rc']}, {rec['wall_s']}s, ppl {_ppl(rec)}"
            + (f", error: {rec['error']}" if rec.get("error") else "")
        )
    return out


def sec_bmax(ctx: Ctx, box: float) -> dict[str, Any]:
    end = time.time() + box
    out: dict[str, Any] = {
        "note": (
            "switch.b_max null: the coordinator searches the largest micro-batch whose forward+backward peak plus "
            "AdamW state (2 x 4 x P bytes) stays under switch.memory_fraction x free memory / local workers "
            "(engine/memory.py cuda_b_max, Coordinator._search_b_max). Not budgeted: the probe's kept vectors "
            "(Worker.sample_sum, P floats, when the test needs the shared mean; Worker.chunks, k x P floats, for "
            "the inner-product tests), and the in-process workers run one after another, so dividing by the "
            "workers under-uses memory for activations."
        ),
        "runs": {},
    }
    if not ctx.cuda:
        return {"skipped": "needs CUDA (on CPU b_max is 8: there is no search)", **out}
    # batch.initial 8: the probe cuts the first step's batch into k = min(8, probe_chunks = 8) chunks
    base = {
        "data.seq_len": 256,
        "algorithm.rounds": 1,
        "algorithm.inner_steps": 2,
        "algorithm.trainers": 1,
        "batch.initial": 8,
        "batch.max": 4096,
        "eval.max_examples": 32,
        "eval.batch_size": 8,
    }
    # An inner-product run of microllama-300m (its probe keeps 8 x P floats per worker) does not fit the
    # time box: its end-of-run checkpoint alone is ~9 GB. The memory it would keep is computed below.
    runs: list[tuple[str, dict[str, Any]]] = [("llama-10m", {}), ("llama-30m", {}), ("microllama-300m", {})]
    if ctx.dry:
        runs = [("llama-micro", {})]
        base = {"algorithm.trainers": 1, "batch.initial": 8, "batch.max": 4096}
    for model, extra in runs:
        label = model + (" + " + ", ".join(f"{k}={v}" for k, v in extra.items()) if extra else "")
        left = end - time.time()
        if left < 10:
            out["runs"][label] = {"skipped": "section time limit"}
            continue
        rec = ctx.cli(
            f"bmax-{model}-{len(out['runs'])}",
            {**base, "model.name": model, **extra},
            min(left, 120),
            dry_sets=True,
        )
        rec = _slim(rec)
        P = (rec.get("checkpoint") or {}).get("parameters") or (
            int(rec["params_m"] * 1e6) if rec.get("params_m") else None
        )
        search = rec.get("b_max_search")
        if P:
            k = 8  # batch.probe_chunks default
            rec["probe"] = {
                "P": P,
                "chunks_bytes_per_worker": k * P * 4,
                "sample_sum_bytes_per_worker": P * 4,
                "adamw_state_bytes_budgeted": 2 * 4 * P,
            }
            if search:
                budget = search["memory_fraction"] * search["free_gib"] * 2**30 / search["workers"]
                rec["probe"]["budget_bytes_per_worker"] = int(budget)
                rec["probe"]["chunks_share_of_budget"] = round(k * P * 4 / budget, 3)
        out["runs"][label] = rec
        peak = (rec.get("summary") or {}).get("peak_memory_bytes")
        ctx.say(
            f"  b_max {label}: rc {rec['rc']}, {rec['wall_s']}s, "
            + (
                f"b_max {search['b_max']} (free {search['free_gib']} GiB / {search['workers']} workers)"
                if search
                else "no b_max line"
            )
            + (f", peak {peak / 2**30:.1f} GiB" if peak else "")
            + (f", error: {rec['error']}" if rec.get("error") else "")
        )
    return out


def sec_oom(ctx: Ctx, box: float) -> dict[str, Any]:
    end = time.time() + box
    if not ctx.cuda:
        return {"skipped": "needs CUDA (the memory cap and out-of-memory errors are CUDA's)"}
    gib = 1.0 if ctx.dry else 6.0
    launcher = [sys.executable, str(HERE / "gpu_launch.py"), "--mem-gib", str(gib), "--"]
    base = {
        "model.name": "llama-30m",
        "data.seq_len": 256,
        "algorithm.method": "diloco",
        "algorithm.workers": 1,
        "algorithm.trainers": 1,
        "algorithm.rounds": 2,
        "algorithm.inner_steps": 2,
        "batch.initial": 512,
        "batch.max": 512,
        "eval.max_examples": 16,
        "eval.batch_size": 8,
    }
    if ctx.dry:
        base.update({"model.name": "llama-micro", "data.seq_len": 32})
    out: dict[str, Any] = {"cap_gib": gib, "runs": {}}
    for label, extra in (
        ("switch.b_max=512 fixed", {"switch.b_max": 512}),
        ("switch.b_max searched under the cap", {}),
    ):
        left = end - time.time()
        if left < 10:
            out["runs"][label] = {"skipped": "section time limit"}
            continue
        rec = _slim(ctx.cli(f"oom-{len(out['runs'])}", {**base, **extra}, min(left, 90), launcher=launcher))
        out["runs"][label] = rec
        ctx.say(
            f"  oom {label}: rc {rec['rc']}, {rec['wall_s']}s, halvings {rec.get('oom_halvings', [])}"
            + (f", b_max search {rec['b_max_search']['b_max']}" if rec.get("b_max_search") else "")
            + (f", error: {rec['error']}" if rec.get("error") else "")
        )
    return out


def sec_torchrun(ctx: Ctx, box: float) -> dict[str, Any]:
    end = time.time() + box
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    common = {"algorithm.method": "diloco", "algorithm.rounds": 2, "runtime.timeout": 60}
    cases: list[tuple[str, list[str], dict[str, Any]]] = [
        (
            "NCCL, 2 ranks on one GPU",
            [*run, "--nproc-per-node", "2", "-m", "adloco"],
            {"algorithm.workers": 2, "algorithm.trainers": 1},
        ),
        (
            "gloo forced (gpu_launch.py --force-gloo), 2 ranks on one GPU",
            [*run, "--nproc-per-node", "2", str(HERE / "gpu_launch.py"), "--force-gloo", "--"],
            {"algorithm.workers": 2, "algorithm.trainers": 1},
        ),
        (
            "1 rank x 2 workers (runtime.workers_per_process=2)",
            [*run, "--nproc-per-node", "1", "-m", "adloco"],
            {"algorithm.workers": 2, "algorithm.trainers": 1, "runtime.workers_per_process": 2},
        ),
    ]
    out: dict[str, Any] = {
        "note": (
            "engine/backends/torchdist.py picks nccl whenever the process runs on CUDA (backend = 'nccl' if "
            "use_cuda else 'gloo'): there is no config switch for gloo on CUDA; the gloo case patches "
            "init_process_group from outside (benchmarks/gpu_launch.py)."
        ),
        "runs": {},
    }
    for label, launcher, sets in cases:
        if not ctx.cuda:
            out["runs"][label] = {
                "skipped": "needs CUDA (on CPU every rank uses gloo: tests/test_distributed.py)"
            }
            continue
        left = end - time.time()
        if left < 10:
            out["runs"][label] = {"skipped": "section time limit"}
            continue
        limit = min(left, 40 if "gloo" in label else 100)
        rec = _slim(
            ctx.cli(
                f"torchrun-{len(out['runs'])}", {**common, **sets}, limit, launcher=launcher, keep_output=True
            )
        )
        if rec["rc"] != 0:
            rec["error_lines"] = rank_errors(rec.get("full_output", ""))
            if rec["error_lines"]:
                rec["error"] = rec["error_lines"][0] + (
                    " (then killed at the time limit)" if rec["timed_out"] else ""
                )
        rec.pop("full_output", None)
        out["runs"][label] = rec
        ctx.say(
            f"  torchrun {label}: rc {rec['rc']}, {rec['wall_s']}s, ppl {_ppl(rec)}"
            + (f", error: {rec['error']}" if rec.get("error") else "")
        )
    return out


def sec_overhead(ctx: Ctx, box: float) -> dict[str, Any]:
    """The engine 1x1 against a plain loop at the same shape: tokens/s, and both traced (torch.profiler
    summaries side by side: host and device ms a step, host reads, the costliest operators); then the
    engine with runtime.compile (MFU)."""
    end = time.time() + box
    out: dict[str, Any] = {}
    # the engine: 1 trainer x 1 worker, constant batch, on the largest preset (the 125M shape is no preset)
    b = 2 if ctx.dry else 16
    sets: dict[str, Any] = {
        "model.name": "microllama-300m",
        "data.seq_len": 1024,
        "algorithm.method": "diloco",
        "algorithm.workers": 1,
        "algorithm.trainers": 1,
        "algorithm.rounds": 4,
        "algorithm.inner_steps": 10,
        "batch.initial": b,
        "batch.max": b,
        "switch.b_max": b,
        "eval.max_examples": 16,
        "eval.batch_size": 8,
        "checkpoint.every": 0,
        "logging.trace": 4,  # the last round, warm: its steps under torch.profiler
        "runtime.cuda_graphs": "false",  # as the plain loop steps (its default, auto, would capture it)
    }
    if ctx.cuda:
        sets["model.precision"] = "bf16"
    if ctx.dry:
        sets.update({"model.name": "llama-micro", "data.seq_len": 32, "algorithm.inner_steps": 3})
    seq = int(sets["data.seq_len"])

    def engine(name: str, extra: dict[str, Any], timeout: float) -> dict[str, Any]:
        rec = _slim(ctx.cli(name, {**sets, **extra}, timeout))
        per_round = [
            round(r["examples"] * seq / r["train_s"])
            for r in rec.get("rounds", [])
            if r.get("train_s") and r.get("examples")
        ]
        rec["tokens_per_s_by_round"] = per_round
        # round 3: warm and untraced (round 1 pays for start-up, round 2 for the first snapshot of the
        # inner state's host buffers, round 4 for the profiler)
        rec["tokens_per_s"] = per_round[2] if len(per_round) > 2 else (per_round[-1] if per_round else None)
        ctx.say(
            f"  {name}: rc {rec['rc']}, {rec['wall_s']}s, tokens/s by round {per_round}"
            + (f", error: {rec['error']}" if rec.get("error") else "")
        )
        return rec

    # startup, data, the first evaluation, 4 x 10 steps (the last traced): ~45 s on an H100
    rec = engine("engine-1x1", {}, min(100.0, max(45.0, box / 3)))
    rec["what"] = (
        f"adloco train: {sets['model.name']} preset (vocab from the bpe:4096 stdlib tokenizer), seq {seq}, "
        f"batch {b}, {'bf16' if ctx.cuda else 'fp32'}, DiLoCo 1 trainer x 1 worker, H={sets['algorithm.inner_steps']}; "
        "tokens/s = round 3's examples x seq / train_s (no evaluation; round 4 is traced)"
    )
    rec["trace"] = _trace_summary(ctx, "engine-1x1")
    out["engine"] = rec
    out["plain_trace"] = ctx.child("plain_trace", max(20, min(90, end - time.time() - 60)))
    # the steps alone, both under the same profiler: wall ms a step, plain / engine (above 1: the engine's
    # step is the faster)
    e_ms = (rec.get("trace") or {}).get("wall_ms_per_step")
    p_ms = ((out["plain_trace"] or {}).get("summary") or {}).get("wall_ms_per_step")
    if e_ms and p_ms:
        out["step_plain_over_engine"] = round(p_ms / e_ms, 3)
    plain = ctx.child("overhead", max(20, end - time.time() - (0 if ctx.dry else 90)))
    out["plain"] = plain
    eng_shape = next(
        (v for k, v in (plain.get("variants") or {}).items() if k.startswith("engine shape")), None
    )
    fpt = (eng_shape or {}).get("flops_per_token")
    ceiling = (ctx.ceiling or 0) * 1e12
    if eng_shape and eng_shape.get("tokens_per_s") and rec.get("tokens_per_s"):
        ratio = rec["tokens_per_s"] / eng_shape["tokens_per_s"]
        out["engine_vs_plain"] = round(ratio, 3)
        if eng_shape.get("mfu_measured") is not None:
            out["engine_mfu_measured"] = round(eng_shape["mfu_measured"] * ratio, 4)
            out["engine_mfu_datasheet"] = round(eng_shape["mfu_datasheet"] * ratio, 4)
        P = (rec.get("checkpoint") or {}).get("parameters")
        if P and eng_shape.get("params"):
            out["engine_params_vs_plain"] = [P, eng_shape["params"]]
    # the engine compiled (inductor): over 85 s of compilation for this model on an H100
    left = end - time.time()
    # (on a CPU the unit tier runs the compiled engine with aot_eager: tests/unit/test_gpu_paths.py)
    if left > (30 if ctx.dry else 150) and ctx.cuda:
        compiled = {"runtime.compile": "true", "logging.trace": 0}
        comp = engine("engine-1x1-compiled", compiled, left - 5)
        if comp.get("tokens_per_s") and fpt and ceiling:
            comp["mfu_measured"] = round(comp["tokens_per_s"] * fpt / ceiling, 4)
        out["engine_compiled"] = comp
    else:
        out["engine_compiled"] = {"skipped": "section time limit" if ctx.cuda else "CUDA only"}
    for name, v in (plain.get("variants") or {}).items():
        ctx.say(
            f"  plain {name}: "
            + (
                f"{v.get('tokens_per_s')} tok/s, MFU {v.get('mfu_measured')} (measured ceiling) / {v.get('mfu_datasheet')} (989)"
                if "tokens_per_s" in v
                else str(v)
            )
        )
    if plain.get("error"):
        raise SectionError(plain["error"], out)
    return out


def _trace_summary(ctx: Ctx, name: str) -> dict[str, Any]:
    """The summary ``logging.trace`` wrote in the run directory of ``name``'s run."""
    found = sorted((ctx.work / "runs" / name).glob("*/trace/round-*.summary.json"))
    return json.loads(found[-1].read_text()) if found else {"error": "no trace written"}


def sec_multi(ctx: Ctx, box: float) -> dict[str, Any]:
    """The engine's workers on one GPU, one after another and at once (runtime.cuda_graphs), k = 1, 2, 4 of
    llama-tiny and llama-10m; one `adloco train` with runtime.cuda_graphs; then the earlier micro-benchmarks
    (sequential, graphs, processes, ...) with what time is left."""
    end = time.time() + box
    r: dict[str, Any] = {}
    r["engine"] = ctx.child("engine", max(20.0, box * 0.6))
    sets = {
        "model.name": "llama-tiny",
        "algorithm.method": "diloco",
        "algorithm.workers": 4,
        "algorithm.rounds": 2,
        "runtime.cuda_graphs": "true",
    }
    if ctx.cuda:
        sets["model.precision"] = "bf16"
    cli = _slim(ctx.cli("cuda-graphs-4-workers", sets, max(10.0, min(60.0, end - time.time() - 20))))
    if not ctx.cuda:
        cli["expected"] = "runtime.cuda_graphs needs CUDA: refused on CPU with exit code 2"
    r["cli"] = cli
    ctx.say(f"  adloco train with runtime.cuda_graphs (4 workers): rc {cli['rc']}, ppl {_ppl(cli)}")
    # Muon inside the graphs (its lr a device tensor), against Muon stepped eagerly one worker after another:
    # what Muon costs a GPU run per second, the question its being the default waits on
    r["cli_muon"] = {}
    for graphs in ("true", "false") if ctx.cuda else ("true",):
        left = end - time.time() - 20
        if left < 15:
            r["cli_muon"][graphs] = {"skipped": "no time left in the section"}
            break
        rec = _slim(
            ctx.cli(
                f"muon-graphs-{graphs}",
                {**sets, "inner.optimizer": "muon", "runtime.cuda_graphs": graphs},
                min(90.0, left),
                keep_output=True,
            )
        )
        # a capture that fails runs the step eagerly from then on: the timing would be eager steps'
        rec["capture_failed"] = "could not be captured" in rec.pop("full_output", "")
        r["cli_muon"][graphs] = rec
        ctx.say(
            f"  ... with Muon, runtime.cuda_graphs {graphs}: rc {rec['rc']}, ppl {_ppl(rec)}, "
            f"train {_train_s(rec)} s, a capture failed: {rec['capture_failed']}"
        )
    r["micro"] = ctx.child("multi", max(10.0, end - time.time()))
    summary = summarize_multi(r)
    r["summary"] = summary
    for line in summary.get("lines", []):
        ctx.say("  " + line)
    if (r["engine"].get("error") and not r["engine"].get("shapes")) or (
        r["micro"].get("error") and not r["micro"].get("shapes")
    ):
        raise SectionError(r["engine"].get("error") or r["micro"]["error"], r)
    return r


def _train_s(rec: dict[str, Any]) -> float | None:
    """The seconds a run's rounds trained (their train_s summed), or None."""
    got = [x["train_s"] for x in rec.get("rounds") or [] if isinstance(x.get("train_s"), (int, float))]
    return round(sum(got), 3) if got else None


TARGETS = {"llama-tiny": 6.0, "llama-10m": 2.5}  # x one sequential worker's examples/s, 4 workers at once


def summarize_multi(r: dict[str, Any]) -> dict[str, Any]:
    """The engine's workers at once at the largest k against one sequential worker, per shape, and whether
    that meets the target (llama-tiny 6x, llama-10m 2.5x)."""
    out: dict[str, Any] = {"lines": [], "best": {}}
    eng = r.get("engine") or {}
    ks = eng.get("ks") or []
    if not ks:
        return out
    kmax = str(max(ks))
    for shape, rec in (eng.get("shapes") or {}).items():
        g = (rec.get("graphs") or {}).get(kmax, {})
        q = (rec.get("sequential") or {}).get(kmax, {})
        x = g.get("vs_one_sequential")
        out["best"][shape] = {"graphs": x, "sequential": q.get("vs_one_sequential"), "k": int(kmax)}
        target = TARGETS.get(shape)
        verdict = (
            "" if x is None or target is None else f"; target {target}x {'met' if x >= target else 'not met'}"
        )
        at_once = f"{x}x" if x is not None else f"not measured ({g.get('skipped') or g.get('error')})"
        out["lines"].append(
            f"{shape}: k={kmax} workers at once (cuda_graphs) {at_once} one sequential worker's examples/s, "
            f"one after another {q.get('vs_one_sequential')}x{verdict}"
        )
    return out
