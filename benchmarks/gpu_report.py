"""The Markdown report of ``benchmarks/gpu.py`` (``gpu.md``): ``markdown`` (the summary table and a part
per section), the ``md_*`` renderers of each section's result, ``headline`` (the one line a section gets in
the table and on the console) and their formatting helpers. It reads results only; the list of sections
and their titles comes from ``gpu.py``'s ``SECTIONS``, passed in.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from gpu_ctx import _ppl


def _fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}" if math.isfinite(x) else str(x)
    return str(x)


def _gib(x: Any) -> str:
    return f"{x / 2**30:.2f} GiB" if isinstance(x, (int, float)) and x else "—"


def _err_cell(rec: dict[str, Any]) -> str:
    e = rec.get("error") or rec.get("skipped") or ""
    if rec.get("expected") and e:
        e = f"expected: {e}"
    return str(e).replace("|", "\\|").replace("\n", " ")[:300]


def markdown(report: dict[str, Any], sections: Sequence[tuple[Any, ...]]) -> str:
    m = report["meta"]
    L = [
        "# adloco on a GPU (benchmarks/gpu.py)",
        "",
        f"Command: `{m['command']}`  ",
        f"{'Dry run (tiny sizes). ' if m['dry_run'] else ''}Device: {m.get('device', '?')}; total {m['total_s']:.0f} s of a {m['budget_s']:.0f} s budget.",
        "",
        "| section | status | seconds | headline |",
        "|---|---|---|---|",
    ]
    shown = [x for x in sections if x[0] in report["sections"]]  # the default ones and those asked for
    for name, title, *_ in shown:
        s = report["sections"].get(name, {})
        L.append(
            f"| {title} | {s.get('status', '—')} | {_fmt(s.get('seconds'))} | {headline(name, s).replace('|', '/')} |"
        )
    for name, title, *_ in sorted(shown, key=lambda s: s[1]):
        s = report["sections"].get(name, {})
        L += ["", f"## {title}", "", f"Status: **{s.get('status', '—')}** in {_fmt(s.get('seconds'))} s."]
        if s.get("error"):
            L += ["", "Error:", "", "```", str(s["error"])[-3000:], "```"]
        res = s.get("result") or {}
        if res.get("skipped"):
            L += ["", f"Skipped: {res['skipped']}"]
            continue
        try:
            L += SECTION_MD[name](res)
        except Exception as exc:  # noqa: BLE001 - a report must never fail on a half-filled section
            L += ["", f"(could not render: {type(exc).__name__}: {exc})"]
    return "\n".join(L) + "\n"


def md_env(r: dict[str, Any]) -> list[str]:
    keys = [
        "device",
        "capability",
        "memory_gib",
        "sms",
        "nvidia_smi",
        "python",
        "torch",
        "cuda_runtime",
        "cudnn",
        "nccl",
        "transformers",
        "cpu_cores",
        "packages",
        "matmul_n",
        "bf16_tflops",
        "tf32_tflops",
        "fp32_tflops",
        "copy_tb_s",
    ]
    L = ["", "| key | value |", "|---|---|"]
    L += [f"| {k} | {r[k]} |" for k in keys if k in r]
    return L


def md_precision(r: dict[str, Any]) -> list[str]:
    L = [
        "",
        f"Config: {r.get('config', '')}.",
        "",
        "| precision | exit | wall s | train s | val ppl | b_max | fp16 loss scale / skipped steps | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p, rec in (r.get("runs") or {}).items():
        s = rec.get("summary") or {}
        bm = (rec.get("b_max_search") or {}).get("b_max")
        ls = rec.get("loss_scale")
        sk = rec.get("skipped_steps")
        scale = f"{sorted(set(ls.values()))} / {sk}" if ls and p == "fp16" else "—"
        L.append(
            f"| {p} | {rec.get('rc', '—')} | {_fmt(rec.get('wall_s'))} | {_fmt(s.get('wall_s'))} | {_ppl(rec)} | {_fmt(bm)} | {scale} | {_err_cell(rec)} |"
        )
    keys = {tuple(rec.get("worker_event_keys") or []) for rec in (r.get("runs") or {}).values()}
    L += [
        "",
        f"`worker` events in metrics.jsonl carry: {', '.join(sorted({k for t in keys for k in t})) or '—'} (no skipped-step count: it is read from the final checkpoint's worker scalars).",
    ]
    return L


def md_bmax(r: dict[str, Any]) -> list[str]:
    L = [
        "",
        r.get("note", ""),
        "",
        "| run | exit | P | b_max (at most) | free GiB / workers | budget per worker | peak allocated | probe chunks k·P·4 (share of budget) | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, rec in (r.get("runs") or {}).items():
        s = rec.get("b_max_search") or {}
        pr = rec.get("probe") or {}
        peak = (rec.get("summary") or {}).get("peak_memory_bytes")
        L.append(
            f"| {label} | {rec.get('rc', '—')} | {_fmt(pr.get('P'))} | {_fmt(s.get('b_max'))} ({_fmt(s.get('hi'))}) | "
            f"{_fmt(s.get('free_gib'))} / {_fmt(s.get('workers'))} | {_gib(pr.get('budget_bytes_per_worker'))} | {_gib(peak)} | "
            f"{_gib(pr.get('chunks_bytes_per_worker'))} ({_fmt(pr.get('chunks_share_of_budget'), 2)}) | {_err_cell(rec)} |"
        )
    for label, rec in (r.get("runs") or {}).items():
        if rec.get("b_max_search"):
            L += ["", f"{label}: `{rec['b_max_search']['line']}`"]
    return L


def md_oom(r: dict[str, Any]) -> list[str]:
    if r.get("skipped"):
        return ["", f"Skipped: {r['skipped']}"]
    L = [
        "",
        f"Allocator capped at {r.get('cap_gib')} GiB (benchmarks/gpu_launch.py --mem-gib).",
        "",
        "| run | exit | b_max halvings | searched b_max | val ppl | peak allocated | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, rec in (r.get("runs") or {}).items():
        peak = (rec.get("summary") or {}).get("peak_memory_bytes")
        L.append(
            f"| {label} | {rec.get('rc', '—')} | {'; '.join(rec.get('oom_halvings', [])) or 'none'} | {_fmt((rec.get('b_max_search') or {}).get('b_max'))} | {_ppl(rec)} | {_gib(peak)} | {_err_cell(rec)} |"
        )
    return L


def md_torchrun(r: dict[str, Any]) -> list[str]:
    L = ["", r.get("note", ""), "", "| run | exit | wall s | val ppl | error |", "|---|---|---|---|---|"]
    for label, rec in (r.get("runs") or {}).items():
        L.append(
            f"| {label} | {rec.get('rc', '—')} | {_fmt(rec.get('wall_s'))} | {_ppl(rec)} | {_err_cell(rec)} |"
        )
    for label, rec in (r.get("runs") or {}).items():
        if rec.get("error_lines"):
            L += ["", f"{label}, last lines:", "", "```", *[ln[:400] for ln in rec["error_lines"]], "```"]
    return L


def md_overhead(r: dict[str, Any]) -> list[str]:
    p = r.get("plain") or {}
    L = [
        "",
        f"Plain PyTorch: Hugging Face Llama {p.get('shape')}, seq {p.get('seq')}, {p.get('precision')}; MFU = (6·N + 12·L·H·T) · tokens/s over the measured bf16 ceiling ({p.get('ceiling_tflops_measured')} TFLOP/s) and over the H100 datasheet's 989 TFLOP/s.",
        "",
        "| variant | batch | step ms | tokens/s | TFLOP/s | MFU (measured ceiling) | MFU (989) | peak GiB | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in (p.get("variants") or {}).items():
        note = (
            v.get("error")
            or v.get("skipped")
            or (f"OOM at batch {v['oom_at_batch']}" if v.get("oom_at_batch") else "")
        )
        if v.get("warmup_s") is not None:
            note = (note + "; " if note else "") + f"warm-up {v['warmup_s']} s"
        L.append(
            f"| {name} | {_fmt(v.get('batch'))} | {_fmt(v.get('step_ms'))} | {_fmt(v.get('tokens_per_s'))} | {_fmt(v.get('tflops'))} | {_fmt(v.get('mfu_measured'), 3)} | {_fmt(v.get('mfu_datasheet'), 3)} | {_fmt(v.get('peak_gib'))} | {note} |"
        )
    e = r.get("engine") or {}
    L += [
        "",
        f"Engine: {e.get('what', '')}: exit {e.get('rc')}, tokens/s by round {e.get('tokens_per_s_by_round')}; "
        f"engine / plain loop on the same shape = {_fmt(r.get('engine_vs_plain'), 3)} (parameters engine/plain {r.get('engine_params_vs_plain')}); "
        f"engine MFU {_fmt(r.get('engine_mfu_measured'), 3)} (measured ceiling) / {_fmt(r.get('engine_mfu_datasheet'), 3)} (989). "
        f"The steps alone, both under torch.profiler: plain ms a step / engine ms a step = {_fmt(r.get('step_plain_over_engine'), 3)}.",
    ]
    c = r.get("engine_compiled") or {}
    L += [
        "",
        f"Engine with runtime.compile ({(c.get('overrides') or {}).get('runtime.compile_backend', 'inductor')}): "
        + (
            str(c.get("skipped"))
            if c.get("skipped")
            else f"exit {c.get('rc')}, tokens/s by round {c.get('tokens_per_s_by_round')}, MFU {_fmt(c.get('mfu_measured'), 3)} (measured ceiling)"
        ),
    ]
    L += _traces_side_by_side((e.get("trace") or {}), ((r.get("plain_trace") or {}).get("summary") or {}))
    if e.get("error"):
        L += ["", "Engine error:", "", "```", e.get("output_tail", e["error"]), "```"]
    if p.get("error_output"):
        L += ["", "Plain-loop child output:", "", "```", p["error_output"], "```"]
    return L


def _traces_side_by_side(eng: dict[str, Any], plain: dict[str, Any]) -> list[str]:
    """The engine's traced round and the plain loop's traced steps (adloco.telemetry.trace summaries)."""
    if not eng and not plain:
        return []
    rows = [
        ("wall ms a step", "wall_ms_per_step"),
        ("device busy ms a step", "device_ms_per_step"),
        ("host reads of device values a step", "host_reads_per_step"),
        ("synchronizations a step", "syncs_per_step"),
        ("device-to-host copies a step", "dtoh_copies_per_step"),
        ("aten operators a step", "aten_ops_per_step"),
    ]
    L = ["", "Traced (torch.profiler; the engine's round includes its synchronization):", ""]
    L += ["| per step | engine | plain loop |", "|---|---|---|"]
    for label, key in rows:
        L.append(f"| {label} | {_fmt(eng.get(key))} | {_fmt(plain.get(key))} |")
    for key, what in (("top_by_host", "host"), ("top_by_device", "device")):
        L += ["", f"Costliest operators by self {what} time (ms a step): engine | plain loop", ""]
        L += ["| # | engine | plain loop |", "|---|---|---|"]
        a, b = eng.get(key) or [], plain.get(key) or []
        for i in range(min(8, max(len(a), len(b)))):
            cell = [
                f"`{x[i]['op'][:50]}` {x[i][f'{what}_ms_per_step']}".replace("|", "/") if i < len(x) else ""
                for x in (a, b)
            ]
            L.append(f"| {i + 1} | {cell[0]} | {cell[1]} |")
    return L


def md_multi(r: dict[str, Any]) -> list[str]:
    eng = r.get("engine") or {}
    ks = eng.get("ks") or []
    L = [
        "",
        f"The engine ({eng.get('what', '')}); device {eng.get('device')}, {eng.get('precision')}. "
        "Examples/s, and (×) against one worker stepping alone, sequential.",
        "",
        f"Check (2 workers, 2 rounds, the same start and batches: graphs against none): {json.dumps(eng.get('check'))}",
    ]
    for shape, rec in (eng.get("shapes") or {}).items():
        L += ["", f"### {shape}, {rec.get('rows')} x {rec.get('seq')} tokens a worker and step", ""]
        L.append("| mode | " + " | ".join(f"k={k}" for k in ks) + " |")
        L.append("|---|" + "---|" * len(ks))
        for mode, label in (("sequential", "one after another"), ("graphs", "at once (runtime.cuda_graphs)")):
            cells = []
            for k in ks:
                c = (rec.get(mode) or {}).get(str(k), {})
                if "examples_per_s" in c:
                    cells.append(f"{c['examples_per_s']:,} ({c.get('vs_one_sequential', '—')}×)")
                else:
                    cells.append(str(c.get("error") or c.get("skipped") or "—").replace("|", "/")[:120])
            L.append(f"| {label} | " + " | ".join(cells) + " |")
    cli = r.get("cli") or {}
    L += [
        "",
        f"`adloco train` with runtime.cuda_graphs, 4 workers of llama-tiny: exit {cli.get('rc')}, validation perplexity {_ppl(cli)}.",
    ]
    for graphs, rec in (r.get("cli_muon") or {}).items():
        trained = sum(x.get("train_s") or 0 for x in rec.get("rounds") or [])
        L += [
            "",
            f"The same with `inner.optimizer: muon`, runtime.cuda_graphs {graphs}: "
            + (
                str(rec["skipped"])
                if "skipped" in rec
                else f"exit {rec.get('rc')}, validation perplexity {_ppl(rec)}, {trained:.2f} s training"
                + ("; a capture failed (its steps ran eagerly)." if rec.get("capture_failed") else ".")
            ),
        ]
    for line in (r.get("summary") or {}).get("lines", []):
        L += ["", line]
    micro = r.get("micro") or {}
    mks = micro.get("ks") or []
    if micro.get("shapes"):
        L += ["", "Micro-benchmarks (standalone PyTorch, tokens/s; × one sequential worker):"]
    for shape, rec in (micro.get("shapes") or {}).items():
        L += ["", f"#### {shape} ({rec.get('params')} parameters, {rec.get('steps_timed')} steps timed)", ""]
        L.append("| approach | " + " | ".join(f"k={k}" for k in mks) + " |")
        L.append("|---|" + "---|" * len(mks))
        for key, row in (rec.get("results") or {}).items():
            cells = []
            for k in mks:
                c = row.get(str(k), {})
                if "tokens_per_s" in c:
                    cells.append(f"{c['tokens_per_s']:,} ({c.get('vs_sequential_k1', '—')}×)")
                else:
                    cells.append(str(c.get("error") or c.get("skipped") or "—").replace("|", "/")[:120])
            L.append(f"| {key}: {micro.get('approaches', {}).get(key, '')} | " + " | ".join(cells) + " |")
    for part in ("engine", "micro"):
        if (r.get(part) or {}).get("error_output"):
            L += ["", f"{part} child output:", "", "```", r[part]["error_output"], "```"]
    return L


def md_compile(r: dict[str, Any]) -> list[str]:
    L = [
        "",
        f"{r.get('what', '')}. Each compilation starts from an empty cache folder (cold) but for the warm "
        "engine run, which reads the cold run's.",
        "",
        "| run | compiled | compile s | tokens/s | MFU (measured ceiling) | FX graph cache hits / misses | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for scope, p in (r.get("plain") or {}).items():
        fx = p.get("fx_graph_cache") or {}
        cs = (
            p.get("compile_s")
            if p.get("compile_s") is not None
            else (f"> {p['compile_s_at_least']}" if p.get("compile_s_at_least") else None)
        )
        L.append(
            f"| plain loop, {scope} | {p.get('compiled', '—')} | {_fmt(cs)} | {_fmt(p.get('tokens_per_s'))} | "
            f"{_fmt(p.get('mfu_measured'), 3)} | {fx.get('hits', '—')} / {fx.get('misses', '—')} | {_err_cell(p)} |"
        )
    for label, e in (r.get("engine") or {}).items():
        c = e.get("caches") or {}
        cs = (
            e.get("compile_s")
            if e.get("compile_s") is not None
            else (f"> {e['compile_s_at_least']}" if e.get("compile_s_at_least") else None)
        )
        L.append(
            f"| engine, {label} | {label.split(',')[0]} | {_fmt(cs)} | {_fmt(e.get('tokens_per_s'))} | "
            f"{_fmt(e.get('mfu_measured'), 3)} | {c.get('fx_hits', '—')} / {c.get('fx_misses', '—')} | {_err_cell(e)} |"
        )
    if r.get("engine_vs_plain_blocks") is not None:
        L += [
            "",
            f"Engine / plain loop, both compiled by blocks: {r['engine_vs_plain_blocks']}x the tokens/s.",
        ]
    return L


def md_paper(r: dict[str, Any]) -> list[str]:
    plan = r.get("plan") or {}
    L = [
        "",
        f"{plan.get('rounds')} rounds x H={plan.get('inner_steps')} (the paper: {(plan.get('paper') or {}).get('rounds')} x "
        f"{(plan.get('paper') or {}).get('inner_steps')}); what differs from the paper:",
        "",
        *[f"- {c}" for c in plan.get("changed", [])],
        "",
        f"Figure: {r.get('figure')}",
        "",
        "| method | exit | wall s | rounds | val ppl | training s | bytes sent | cuda graphs | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, rec in (r.get("runs") or {}).items():
        c = rec.get("curve") or []
        note = "stopped at its time box" if rec.get("stopped_at_time_box") else _err_cell(rec)
        ppl = f"{c[0]['val_ppl']:.1f} -> {c[-1]['val_ppl']:.1f}" if len(c) > 1 else "—"
        graphs = (rec.get("graphs_line") or "—").removeprefix("cuda graphs: ")
        L.append(
            f"| {label} | {rec.get('rc', '—')} | {_fmt(rec.get('wall_s'))} | {max(0, len(c) - 1)} | {ppl} | "
            f"{_fmt(c[-1]['train_s'] if c else None)} | {_fmt(rec.get('bytes_total'))} | {graphs} | {note} |"
        )
    for label, rec in (r.get("runs") or {}).items():
        L += [
            "",
            f"{label}: "
            + ", ".join(
                f"{p['steps']} steps {p['train_s']} s ppl {p['val_ppl']:.1f}" for p in rec.get("curve") or []
            ),
        ]
    return L


SECTION_MD: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "env": md_env,
    "precision": md_precision,
    "b_max": md_bmax,
    "oom": md_oom,
    "torchrun": md_torchrun,
    "overhead": md_overhead,
    "multi": md_multi,
    "compile": md_compile,
    "paper": md_paper,
}


def headline(name: str, s: dict[str, Any]) -> str:
    r = s.get("result") or {}
    if r.get("skipped"):
        return f"skipped: {r['skipped']}"
    try:
        if name == "env":
            return f"{r.get('device')}, {r.get('memory_gib', '—')} GiB, torch {r.get('torch')}, bf16 {r.get('bf16_tflops')} TFLOP/s"
        if name == "precision":
            return "; ".join(
                f"{p}: {_ppl(x) if x.get('rc') == 0 else 'exit ' + str(x.get('rc', x.get('skipped')))}"
                for p, x in (r.get("runs") or {}).items()
            )
        if name == "b_max":
            return "; ".join(
                f"{k.split(' ')[0]}{'+ip' if 'inner' in k else ''}: {(x.get('b_max_search') or {}).get('b_max', 'exit ' + str(x.get('rc')))}"
                for k, x in (r.get("runs") or {}).items()
            )
        if name == "oom":
            return r.get("skipped") or "; ".join(
                f"exit {x.get('rc')}, {len(x.get('oom_halvings', []))} halvings"
                for x in (r.get("runs") or {}).values()
            )
        if name == "torchrun":
            return "; ".join(
                f"{k.split(',')[0].split(' (')[0]}: " + (f"exit {x['rc']}" if "rc" in x else "skipped")
                for k, x in (r.get("runs") or {}).items()
            )
        if name == "overhead":
            v = (r.get("plain") or {}).get("variants") or {}
            best = max((x.get("mfu_measured") or 0 for x in v.values()), default=0)
            comp = (r.get("engine_compiled") or {}).get("mfu_measured")
            return (
                f"best plain MFU {best:.3f} (measured ceiling); engine/plain {r.get('engine_vs_plain')}; "
                f"engine compiled MFU {comp}"
            )
        if name == "compile":
            pb, eb = (r.get("plain") or {}), (r.get("engine") or {})
            return (
                f"compile s plain blocks {pb.get('blocks', {}).get('compile_s')}, whole {pb.get('model', {}).get('compile_s', (pb.get('model') or {}).get('compile_s_at_least'))}; "
                f"engine blocks cold {eb.get('blocks, cold cache', {}).get('compile_s')} / warm {eb.get('blocks, warm cache', {}).get('compile_s')}; "
                f"engine MFU {eb.get('blocks, cold cache', {}).get('mfu_measured')}, plain {pb.get('blocks', {}).get('mfu_measured')}"
            )
        if name == "paper":
            return "; ".join(
                f"{k}: {max(0, len(x.get('curve') or []) - 1)} rounds, ppl "
                + (f"{x['curve'][-1]['val_ppl']:.1f}" if len(x.get("curve") or []) > 1 else "—")
                + f", {x.get('bytes_total')} B"
                for k, x in (r.get("runs") or {}).items()
            )
        if name == "multi":
            b = (r.get("summary") or {}).get("best") or {}
            return "; ".join(
                f"{k}: k={x['k']} at once "
                + (f"{x['graphs']}x" if x["graphs"] is not None else "not measured")
                + f", one after another {x['sequential']}x"
                for k, x in b.items()
            )
    except Exception as exc:  # noqa: BLE001
        return f"({type(exc).__name__})"
    return ""
