"""The CUDA paths of adloco, exercised and timed on one GPU in one command (issue 14).

    python benchmarks/gpu.py [--out benchmarks/out/gpu] [--budget 510] [--sections env,multi,...]
    python benchmarks/gpu.py --dry-run        # tiny sizes, whatever device is there (CPU: seconds)

Sections, each time-boxed and isolated (a failing section records its error and the next one runs):

1. env        device, memory, versions; bf16/TF32/fp32 matmul TFLOP/s (8192^3, median, CUDA events)
2. precision  the default run (AdLoCo, 4 workers, 4 trainers, llama-tiny on the stdlib) in fp32/bf16/fp16
3. b_max      the CUDA b_max search on llama-10m, llama-30m, microllama-300m; memory the probe keeps
4. oom        a fixed too-large b_max under a memory cap: does the run recover by halving b_max?
5. torchrun   2 NCCL ranks on one GPU, the same with gloo forced, 1 rank x 2 workers
6. overhead   the engine 1x1 on the microllama-300m preset against plain PyTorch at the same shape
              (tokens/s, MFU), both traced with torch.profiler (host and device ms a step, host reads,
              costliest operators), and the engine with runtime.compile
7. multi      the engine with k = 1, 2, 4 workers of llama-tiny and llama-10m on one GPU, one after
              another and at once (runtime.cuda_graphs); `adloco train` with runtime.cuda_graphs; then
              micro-benchmarks (sequential, graphs, processes, vmap, streams, threads) as time allows

and, run only when named (--sections compile,paper; benchmarks/gpu_session.sh does):

8. compile    compile time on a cold cache, the decoder blocks each on their own against the whole model
              (plain loop); the engine compiled by blocks on a cold and then a warm cache, its tokens/s
              and MFU against the plain loop compiled the same way (microllama-300m preset, bf16)
9. paper      the paper's Figure 1 offline: microllama-300m, 4 workers on one GPU, AdLoCo against DiLoCo
              at the paper's settings (configs/paper-microllama-c4.yaml), bf16, Python's source, rounds x H
              from the time left; paper.png (perplexity against steps and time) and the bytes each sent

The engine is driven through its CLI (``python -m adloco train --set ...``) and read back from the run
directory's ``summary.json``, ``metrics.jsonl`` and checkpoint, so this script does not depend on the
engine's internals; the throughput micro-benchmarks are standalone PyTorch (``gpu_micro.py``). Results:
``gpu.json`` and ``gpu.md`` in ``--out`` (and ``paper.png``), with ``gpu.log`` holding every subprocess's
output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, however it is started
from gpu_ctx import HERE, ROOT, Ctx, SectionError  # noqa: E402
from gpu_paper import draw_paper, sec_compile, sec_paper  # noqa: E402
from gpu_report import headline, markdown  # noqa: E402
from gpu_sections import (  # noqa: E402
    sec_bmax,
    sec_env,
    sec_multi,
    sec_oom,
    sec_overhead,
    sec_precision,
    sec_torchrun,
)

SECTIONS: list[tuple[str, str, Callable[[Ctx, float], dict[str, Any]], float, float]] = [
    # name, title, function, nominal time box (s), least time kept for it when earlier ones run long;
    # the overhead and multi-instance sections first: they are what a short GPU loan is for
    ("env", "1. Environment and matmul ceiling", sec_env, 45, 20),
    ("overhead", "6. Engine overhead and MFU", sec_overhead, 230, 90),
    ("multi", "7. Multi-instance throughput", sec_multi, 150, 60),
    ("precision", "2. Mixed precision (default run)", sec_precision, 60, 30),
    ("b_max", "3. b_max search", sec_bmax, 45, 20),
    ("oom", "4. Out-of-memory recovery", sec_oom, 30, 15),
    ("torchrun", "5. torchrun on one GPU", sec_torchrun, 45, 20),
    # asked for by name (--sections compile,paper): benchmarks/gpu_session.sh gives them their own budget
    ("compile", "8. Compile time and compiled MFU", sec_compile, 240, 60),
    ("paper", "9. The paper's setting (Figure 1)", sec_paper, 600, 60),  # what remains of the budget
]
DRY_BOXES = {
    "env": 40,
    "multi": 90,
    "precision": 60,
    "b_max": 40,
    "oom": 40,
    "torchrun": 40,
    "overhead": 120,
    # four compiles of the tiny model take ~65 s alone on 2 cores; CI runs this beside another test, where
    # 90 s killed the engine's cold-cache run (rc -9): the session's 500 s budget has room for 200
    "compile": 200,
    "paper": 90,
}
DEFAULT_SECTIONS = ["env", "overhead", "multi", "precision", "b_max", "oom", "torchrun"]


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def run_child(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE))
    import gpu_micro

    path = Path(args.child_out)

    def save(result: dict[str, Any]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, default=str))
        os.replace(tmp, path)

    if args.child == "env":
        save(gpu_micro.env(args.dry_run, save))
    elif args.child == "overhead":
        save(gpu_micro.overhead(args.dry_run, args.ceiling, save))
    elif args.child == "multi":
        save(gpu_micro.multi(args.dry_run, save, args.deadline))
    elif args.child == "engine":
        import gpu_engine

        save(gpu_engine.multi(args.dry_run, save, args.deadline))
    elif args.child == "compile_plain":
        save(gpu_micro.compile_plain(args.dry_run, args.ceiling, save, args.scope, args.backend))
    elif args.child == "plain_trace":
        import gpu_engine

        save(gpu_engine.plain_trace(args.dry_run, save))
    else:
        raise SystemExit(f"unknown child {args.child!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "out" / "gpu"), help="folder for gpu.json, gpu.md, gpu.log"
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="tiny sizes: seconds on a CPU, checks that every section runs"
    )
    ap.add_argument("--budget", type=float, help="seconds for everything (default 510; dry run 200)")
    ap.add_argument(
        "--sections", help=f"comma-separated subset of {','.join(s[0] for s in SECTIONS)} (env always runs)"
    )
    ap.add_argument(
        "--work-dir", help="run directories and caches (default: a temporary folder, deleted at the end)"
    )
    ap.add_argument("--keep-work", action="store_true", help="keep the temporary work folder")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--ceiling", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--scope", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument(
        "--draw-paper",
        metavar="GPU_JSON",
        help="draw the paper section's figure again from a gpu.json (into --out), on any machine",
    )
    args = ap.parse_args(argv)
    if args.child:
        return run_child(args)
    if args.draw_paper:
        rec = (
            (json.loads(Path(args.draw_paper).read_text())["sections"].get("paper") or {}).get("result")
        ) or {}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        print(draw_paper(rec, Path(args.out) / "paper.png"))
        return 0
    if args.budget is None:
        args.budget = 200.0 if args.dry_run else 510.0
    wanted = {"env", *(args.sections.split(",") if args.sections else DEFAULT_SECTIONS)}
    unknown = wanted - {s[0] for s in SECTIONS}
    if unknown:
        ap.error(f"--sections: unknown {sorted(unknown)}")
    ctx = Ctx(args)
    report: dict[str, Any] = {
        "meta": {
            "command": "python benchmarks/gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "dry_run": ctx.dry,
            "budget_s": args.budget,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "sections": {},
    }

    def write() -> None:
        report["meta"]["total_s"] = round(ctx.elapsed(), 1)
        (ctx.out / "gpu.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (ctx.out / "gpu.md").write_text(markdown(report, SECTIONS))

    ctx.say(
        f"adloco GPU benchmark{' (dry run)' if ctx.dry else ''}: budget {args.budget:.0f} s, results in {ctx.out}"
    )
    todo = [s for s in SECTIONS if s[0] in wanted]
    try:
        for i, (name, title, fn, nominal, _least) in enumerate(todo):
            later = sum(s[4] for s in todo[i + 1 :])
            if ctx.dry:
                later, box = 5.0 * (len(todo) - i - 1), DRY_BOXES[name]
            else:
                box = nominal
            box = max(5.0, min(box, ctx.remaining() - later))
            ctx.say(f"{title}: up to {box:.0f} s")
            t0 = time.time()
            entry: dict[str, Any] = {"title": title}
            try:
                entry["result"] = fn(ctx, box)
                entry["status"] = "skipped" if entry["result"].get("skipped") else "ok"
            except SectionError as exc:
                entry["status"], entry["error"], entry["result"] = "error", str(exc), exc.partial
            except Exception as exc:  # noqa: BLE001 - the next section runs whatever this one did
                entry["status"], entry["error"] = "error", "".join(traceback.format_exception(exc))[-4000:]
            entry["seconds"] = round(time.time() - t0, 1)
            if name == "env":
                report["meta"]["device"] = (entry.get("result") or {}).get("device", "?")
            report["sections"][name] = entry
            ctx.say(
                f"{title}: {entry['status']} in {entry['seconds']:.0f} s"
                + (
                    f": {str(entry.get('error')).strip().splitlines()[-1][:200]}"
                    if entry.get("error")
                    else ""
                )
            )
            write()
        for name, title, *_ in SECTIONS:
            if name in wanted:
                report["sections"].setdefault(name, {"title": title, "status": "not run", "seconds": 0})
        write()
    finally:
        ctx.logf.close()
        if not ctx.keep_work:
            shutil.rmtree(ctx.work, ignore_errors=True)
    print()
    print(f"{'section':40} {'status':8} {'s':>6}  headline")
    for name, title, *_ in SECTIONS:
        s = report["sections"].get(name)
        if s is not None:
            print(f"{title:40} {s['status']:8} {s.get('seconds', 0):6.0f}  {headline(name, s)[:160]}")
    summary = ((report["sections"].get("multi") or {}).get("result") or {}).get("summary") or {}
    for line in summary.get("lines", []):
        print("multi: " + line)
    print(f"total {ctx.elapsed():.0f} s; {ctx.out / 'gpu.json'}, {ctx.out / 'gpu.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
