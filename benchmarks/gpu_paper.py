"""Sections 8 and 9 of ``benchmarks/gpu.py``, run only when named: compile (compile time on a cold and a
warm cache, by blocks against the whole model, and the compiled engine's tokens/s and MFU against the plain
loop) and paper (the paper's Figure 1 offline: ``paper_settings``, ``sec_paper``, ``paper_curve`` and
``draw_paper``, which ``--draw-paper`` also calls, with the estimates that size the runs).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

from gpu_ctx import ROOT, Ctx, SectionError, _ppl, _slim

COMPILE_LINE = re.compile(
    r"compile: (\d+) graphs? compiled; FX graph cache (\d+) hits, (\d+) misses; AOT autograd cache (\d+) hits, "
    r"(\d+) misses"
)


def sec_compile(ctx: Ctx, box: float) -> dict[str, Any]:
    """Compilation that pays inside a run (ALGORITHM.md §14): compile time on a cold cache of the decoder
    blocks each on its own against the whole model, in the plain loop; the engine compiled by blocks, cold
    and then warm (a second run reading the first one's cache), its tokens/s and MFU against the plain loop
    compiled the same way; the engine compiled whole if time is left. microllama-300m preset, 16 x 1,024
    tokens, bf16, DiLoCo 1 x 1, no CUDA graphs (the plain loop has none)."""
    end = time.time() + box
    backend = "inductor" if ctx.cuda else "aot_eager"  # on a CPU (the dry run): tracing, no code generated
    out: dict[str, Any] = {"backend": backend, "plain": {}, "engine": {}}
    seq = 32 if ctx.dry else 1024
    b = 2 if ctx.dry else 16
    sets: dict[str, Any] = {
        "model.name": "llama-micro" if ctx.dry else "microllama-300m",
        "data.seq_len": seq,
        "algorithm.method": "diloco",
        "algorithm.workers": 1,
        "algorithm.trainers": 1,
        "algorithm.rounds": 3,
        "algorithm.inner_steps": 3 if ctx.dry else 10,
        "batch.initial": b,
        "batch.max": b,
        "switch.b_max": b,
        "eval.max_examples": 16,
        "eval.batch_size": 8,
        "checkpoint.every": 0,
        "runtime.cuda_graphs": "false",
        "runtime.compile": "true",
        "runtime.compile_backend": backend,
    }
    if ctx.cuda:
        sets["model.precision"] = "bf16"
    if ctx.dry:
        sets.update({"data.max_examples": 60, "data.tokenizer": "bpe:300"})
    out["what"] = (
        f"{sets['model.name']} preset, {b} x {seq} tokens, {sets.get('model.precision', 'fp32')}, backend "
        f"{backend}; engine: adloco train, DiLoCo 1 x 1, H={sets['algorithm.inner_steps']}, 3 rounds, tokens/s of "
        "round 3; compile s (engine) = round 1's training time minus round 3's (compilation and first-step "
        "warm-up); compile s (plain loop) = its first step minus a warm step"
    )

    def fresh(name: str) -> Path:
        d = ctx.work / "compile-cache" / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def plain(scope: str, limit: float) -> dict[str, Any]:
        env = {**ctx.env, "TORCHINDUCTOR_CACHE_DIR": str(fresh(f"plain-{scope}"))}
        r = ctx.child("compile_plain", limit, "--scope", scope, "--backend", backend, env=env)
        if r.get("error") and "compile_s" not in r:
            r["compile_s_at_least"] = round(limit, 1)  # killed while compiling (or failed: see error)
        ctx.say(
            f"  plain loop compiled ({scope}): compile {r.get('compile_s', 'not finished')} s, "
            f"{r.get('tokens_per_s')} tokens/s, MFU {r.get('mfu_measured')}"
            + (f", error: {r['error']}" if r.get("error") else "")
        )
        return r

    def engine(name: str, scope: str, cache: Path, limit: float) -> dict[str, Any]:
        extra = {"runtime.compile_scope": scope, "runtime.compile_cache": str(cache)}
        rec = _slim(
            ctx.cli(name, {**sets, **extra}, limit, dry_sets=False, keep_output=True, drop_checkpoints=True)
        )
        per_round = [r.get("train_s") for r in rec.get("rounds", [])]
        rec["train_s_by_round"] = per_round
        toks = [
            round(r["examples"] * seq / r["train_s"])
            for r in rec.get("rounds", [])
            if r.get("train_s") and r.get("examples")
        ]
        rec["tokens_per_s_by_round"] = toks
        rec["tokens_per_s"] = toks[2] if len(toks) > 2 else None
        if len(per_round) > 2 and per_round[0] and per_round[2]:
            rec["compile_s"] = round(per_round[0] - per_round[2], 1)
        m = COMPILE_LINE.search(rec.get("full_output") or "")
        if m:
            g, fh, fm, ah, am = map(int, m.groups())
            rec["caches"] = {"graphs": g, "fx_hits": fh, "fx_misses": fm, "aot_hits": ah, "aot_misses": am}
        rec.pop("full_output", None)
        if rec.get("timed_out"):
            rec["compile_s_at_least"] = round(limit, 1)
        ctx.say(
            f"  {name}: rc {rec['rc']}, {rec['wall_s']}s, compile ~{rec.get('compile_s')} s, tokens/s by round "
            f"{toks}, caches {rec.get('caches')}" + (f", error: {rec['error']}" if rec.get("error") else "")
        )
        return rec

    def left() -> float:
        return end - time.time()

    # the plain loop by blocks, then whole (the comparison of compile times), then the engine by blocks on a
    # cold cache and on the cache it left (what a second run pays), then the engine whole if time is left
    short = 10 if ctx.dry else 30
    out["plain"]["blocks"] = plain("blocks", min(60.0, max(10.0, left() - 3 * short)))
    out["plain"]["model"] = plain("model", min(60.0, max(10.0, left() - 2 * short)))
    cache = fresh("engine-blocks")
    out["engine"]["blocks, cold cache"] = engine(
        "compile-blocks-cold", "blocks", cache, min(80.0, max(10.0, left() - short))
    )
    if left() > short:
        out["engine"]["blocks, warm cache"] = engine(
            "compile-blocks-warm", "blocks", cache, min(60.0, left() - 3)
        )
    else:
        out["engine"]["blocks, warm cache"] = {"skipped": "section time limit"}
    if not ctx.dry and left() > 80:  # (the dry run's plain loop has shown the whole model compiles)
        out["engine"]["model, cold cache"] = engine(
            "compile-model-cold", "model", fresh("engine-model"), left() - 3
        )
    else:
        out["engine"]["model, cold cache"] = {"skipped": "section time limit"}
    fpt = (out["plain"].get("blocks") or {}).get("flops_per_token")
    ceiling = (ctx.ceiling or 0) * 1e12
    for rec in out["engine"].values():
        if rec.get("tokens_per_s") and fpt and ceiling:
            rec["mfu_measured"] = round(rec["tokens_per_s"] * fpt / ceiling, 4)
    pb = out["plain"].get("blocks") or {}
    eb = out["engine"].get("blocks, cold cache") or {}
    if pb.get("tokens_per_s") and eb.get("tokens_per_s"):
        out["engine_vs_plain_blocks"] = round(eb["tokens_per_s"] / pb["tokens_per_s"], 3)
    if not any("tokens_per_s" in r for r in [*out["plain"].values(), *out["engine"].values()]):
        raise SectionError("nothing measured", out)
    return out


# The paper's Figure 1 (arXiv 2508.18182): microllama-300m, 4 workers on one GPU, AdLoCo against DiLoCo,
# perplexity against steps and against time. An estimate of one inner step of the 4 workers once AdLoCo's
# requests reach b_max (a few dozen rows of 512 tokens each, bf16, CUDA graphs) sizes H from the budget;
# the runs' own times are what is reported, and a run that outlasts its time box is plotted as far as it got.
PAPER_STEP_S = 0.25
# ... and an estimate of the engine's throughput on this model (one H100 measured 142k tokens/s at 16 x
# 1,024 tokens, RESULTS.md "On a GPU"): the examples both runs stop after (algorithm.budget), so that a
# run whose requests grow ends inside its box, with its last evaluation and summary
PAPER_TOKENS_S = 120_000
PAPER_LR = 3e-4  # inner lr from random init (the paper's 2e-5 continues a pretrained checkpoint)


def paper_settings(ctx: Ctx, box: float) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    """The settings both methods share, each method's own, and how the budget sized the runs. The paper's
    values are read from configs/paper-microllama-c4.yaml (the file that reproduces it on the hub); what
    this offline, time-boxed run changes is listed in ``changed``."""
    import yaml

    paper = yaml.safe_load((ROOT / "configs" / "paper-microllama-c4.yaml").read_text())
    a, inner, outer, batch = paper["algorithm"], paper["inner"], paper["outer"], paper["batch"]
    startup = (
        5.0 if ctx.dry else 45.0
    )  # a run's seconds besides its rounds: start, data, b_max, evaluation, end
    train = max(1.0, box / 2 - startup)
    rounds = 3 if ctx.dry else min(int(a["rounds"]), max(9, int(train / (PAPER_STEP_S * 10))))
    h = 2 if ctx.dry else max(3, min(int(a["inner_steps"]), int(train / (rounds * PAPER_STEP_S))))
    seq = 32 if ctx.dry else int(paper["data"]["seq_len"])
    examples = None if ctx.dry else max(256, int(train * PAPER_TOKENS_S / seq))
    common: dict[str, Any] = {
        "model.name": "llama-micro" if ctx.dry else "microllama-300m",
        "model.init": "same",
        # llama-micro (the dry run) ties its output layer to the embeddings: nothing of its own to redraw
        "model.reinit_output": "false" if ctx.dry else str(paper["model"]["reinit_output"]).lower(),
        "model.precision": "bf16" if ctx.cuda else "fp32",
        "data.source": "stdlib",
        "data.tokenizer": "bpe:300" if ctx.dry else "bpe:4096",
        "data.seq_len": seq,
        "algorithm.rounds": rounds,
        "algorithm.inner_steps": h,
        "algorithm.workers": a["workers"],
        "inner.optimizer": inner["optimizer"],
        "inner.lr": PAPER_LR,
        "inner.weight_decay": inner["weight_decay"],
        "inner.schedule": inner["schedule"],
        "inner.warmup_fraction": inner["warmup_fraction"],
        "outer.optimizer": outer["optimizer"],
        "outer.lr": outer["lr"],
        "batch.initial": batch["initial"],
        "switch.memory_fraction": paper["switch"]["memory_fraction"],
        "eval.every": 1,
        "eval.max_examples": 8 if ctx.dry else paper["eval"]["max_examples"],
        "checkpoint.every": 0,
    }
    if ctx.dry:
        common["data.max_examples"] = 60
    else:
        common["algorithm.budget"] = examples
    methods = {
        "AdLoCo": {
            "algorithm.method": "adloco",
            "algorithm.trainers": a["trainers"],
            **{f"batch.{k}": batch[k] for k in ("test", "max", "eta", "vartheta", "nu", "formula")},
            **{f"merge.{k}": v for k, v in paper["merge"].items()},
            **{f"switch.{k}": paper["switch"][k] for k in ("mode", "kappa")},
        },
        # the paper's baseline: DiLoCo (one trainer, a constant request, the same outer SGD)
        "DiLoCo": {"algorithm.method": "diloco", "algorithm.trainers": 1},
    }
    plan = {
        "rounds": rounds,
        "inner_steps": h,
        "paper": {"rounds": a["rounds"], "inner_steps": a["inner_steps"]},
        "step_s_estimate": PAPER_STEP_S,
        "examples_budget": examples,
        "changed": [
            "model: the microllama-300m preset from random initialization (the paper starts from the "
            "keeeeenw/MicroLlama checkpoint; no hub here), every trainer from one draw with its own output "
            "layer (model.init same, model.reinit_output true: the checkpoint's analogue)",
            f"inner.lr {PAPER_LR} (the paper's {inner['lr']} continues a pretrained model)",
            "data: Python's standard library, a 4,096-token BPE trained on it (the paper: C4, TinyLlama's "
            "tokenizer)",
            "model.precision bf16 (the paper: fp16); CUDA graphs as runtime.cuda_graphs auto chooses",
            f"rounds {rounds} x H {h} from the time budget (the paper: {a['rounds']} x {a['inner_steps']})"
            + (
                f", and each run stops after the round in which it read {examples:,} training examples "
                f"(algorithm.budget: the time budget at ~{PAPER_TOKENS_S:,} tokens/s)"
                if examples
                else ""
            ),
        ]
        + (
            ["dry run: llama-micro, 32-token blocks, a 300-token BPE on 60 files, on a CPU in fp32"]
            if ctx.dry
            else []
        ),
    }
    return common, methods, plan


def sec_paper(ctx: Ctx, box: float) -> dict[str, Any]:
    """The paper's setting (arXiv 2508.18182, Figure 1) on one GPU, offline: microllama-300m, 4 workers on
    one GPU, AdLoCo against DiLoCo at the paper's settings where it gives them
    (configs/paper-microllama-c4.yaml), bf16, rounds x H chosen from the budget; perplexity against inner
    steps and against training time, both methods, as a PNG, and the bytes each sent."""
    end = time.time() + box
    common, methods, plan = paper_settings(ctx, box)
    out: dict[str, Any] = {"plan": plan, "common": common, "methods": methods, "runs": {}}
    ctx.say(f"  paper: {plan['rounds']} rounds x H={plan['inner_steps']}, two runs")
    for i, (label, own) in enumerate(methods.items()):
        left = end - time.time() - 3
        limit = left / (len(methods) - i)  # what remains, shared by the runs still to go
        if limit < 10:
            out["runs"][label] = {"skipped": "section time limit"}
            continue
        rec = _slim(
            ctx.cli(
                f"paper-{label.lower()}",
                {**common, **own},
                limit,
                dry_sets=False,
                keep_output=True,
                drop_checkpoints=True,
            )
        )
        full = rec.pop("full_output", "") or ""
        rec["graphs_line"] = next((ln for ln in full.splitlines() if ln.startswith("cuda graphs:")), None)
        rec["curve"] = paper_curve(rec, plan["inner_steps"])
        s = rec.get("summary") or {}
        rec["bytes_total"] = s.get("bytes_total") or ((rec.get("rounds") or [{}])[-1].get("bytes_total"))
        rec["stopped_at_time_box"] = bool(rec.get("timed_out"))
        out["runs"][label] = rec
        ctx.say(
            f"  paper {label}: rc {rec['rc']}, {rec['wall_s']}s, {max(0, len(rec['curve']) - 1)} rounds, ppl {_ppl(rec)}, "
            f"{rec['graphs_line']}"
            + (f", error: {rec['error']}" if rec.get("error") and not rec["timed_out"] else "")
        )
    out["figure"] = draw_paper(out, ctx.out / "paper.png")
    ctx.say(f"  paper figure: {out['figure']}")
    if not any(len(r.get("curve") or []) > 1 for r in out["runs"].values()):
        raise SectionError("no round finished", out)
    return out


def paper_curve(rec: dict[str, Any], h: int) -> list[dict[str, float]]:
    """(inner steps, training seconds, validation perplexity, bytes) at the start and after each round."""
    s = rec.get("summary") or {}
    first = s.get("initial_val_ppl")
    curve = [{"steps": 0, "train_s": 0.0, "val_ppl": first, "bytes": 0}] if first else []
    t = 0.0
    for r in rec.get("rounds") or []:
        t += r.get("train_s") or 0.0
        if r.get("val_ppl") is not None:
            curve.append(
                {
                    "steps": int(r["round"]) * h,
                    "train_s": round(t, 2),
                    "val_ppl": r["val_ppl"],
                    "bytes": r.get("bytes_total"),
                }
            )
    return curve


def _bytes(n: float) -> str:
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def draw_paper(result: dict[str, Any], path: Path) -> str:
    """The paper's Figure 1 from the section's result: validation perplexity against inner steps and
    against training time, one curve per method; returns the file written (or why none)."""
    runs = {k: v for k, v in (result.get("runs") or {}).items() if len(v.get("curve") or []) > 1}
    if not runs:
        return "no figure: no run finished a round"
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return (
            "no figure: matplotlib is not installed (python benchmarks/gpu.py --draw-paper gpu.json draws it)"
        )
    plan = result.get("plan") or {}
    common = result.get("common") or {}
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    for label, rec in runs.items():
        c = rec["curve"]
        sent = rec.get("bytes_total")
        name = f"{label} ({_bytes(sent)} sent)" if isinstance(sent, (int, float)) else label
        if rec.get("stopped_at_time_box"):
            name += ", stopped at its time box"
        for ax, x in zip(axes, ("steps", "train_s"), strict=True):
            ax.plot([p[x] for p in c], [p["val_ppl"] for p in c], marker="o", markersize=3, label=name)
    ppl = [p["val_ppl"] for rec in runs.values() for p in rec["curve"]]
    axes[0].set(
        xlabel="inner steps (each worker's optimizer steps)",
        ylabel="validation perplexity",
        yscale="log" if max(ppl) > 3 * min(ppl) else "linear",
    )
    axes[1].set(xlabel="training time, s (evaluation excluded)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"{common.get('model.name')}, {common.get('algorithm.workers')} workers on one device, "
        f"{common.get('model.precision')}, {common.get('data.source')} (seq {common.get('data.seq_len')}); "
        f"{plan.get('rounds')} rounds x H={plan.get('inner_steps')}",
        fontsize=10,
    )
    fig.savefig(path, dpi=110)
    return str(path)
