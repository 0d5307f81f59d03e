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
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SRC = ROOT / "src"

# The settings every engine run shares: no plots or saved model (time), plain progress lines (parsed).
BASE_SETS = {"logging.progress": "plain", "logging.plots": "false", "logging.save_model": "false"}
# --dry-run: a few-thousand-parameter model on 60 documents, one short round.
DRY_SETS = {
    "model.name": "llama-micro",
    "data.max_examples": "60",
    "data.tokenizer": "bpe:300",
    "data.seq_len": "32",
    "algorithm.rounds": "1",
    "algorithm.inner_steps": "2",
    "eval.max_examples": "8",
}

B_MAX_LINE = re.compile(
    r"b_max (\d+): the largest micro-batch under ([\d.]+) of free CUDA memory \(([\d.]+) GiB\) shared by "
    r"(\d+) worker\(s\) \(at most (\d+)\)"
)
OOM_LINE = re.compile(r"round (\d+): worker (\d+) ran out of memory; b_max (\d+) -> (\d+)")


class Ctx:
    """What every section shares: mode, folders, the deadline, the subprocess runner and the log."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.dry: bool = args.dry_run
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work_dir or tempfile.mkdtemp(prefix="adloco-gpu-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.keep_work = args.keep_work or args.work_dir is not None
        self.t0 = time.time()
        self.deadline = self.t0 + args.budget
        self.cuda = False
        self.ceiling: float | None = None  # measured bf16 TFLOP/s
        self.logf = (self.out / "gpu.log").open("w", encoding="utf-8")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
        env["PYTHONUNBUFFERED"] = "1"
        # one tokenizer and token cache for every run (the caller's, when it gives one: benchmarks/gpu_session.sh
        # shares it between its parts)
        env["ADLOCO_CACHE"] = env.get("ADLOCO_CACHE") or str(self.work / "cache")
        env.setdefault("TOKENIZERS_PARALLELISM", "true")
        env.setdefault("HF_HUB_OFFLINE", "1")
        self.env = env

    def elapsed(self) -> float:
        return time.time() - self.t0

    def remaining(self) -> float:
        return self.deadline - time.time()

    def say(self, msg: str) -> None:
        line = f"[{self.elapsed():6.1f}s] {msg}"
        print(line, flush=True)
        self.logf.write(line + "\n")
        self.logf.flush()

    # -- subprocesses ------------------------------------------------------------------------------
    def spawn(
        self, name: str, cmd: list[str], timeout: float, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Run ``cmd`` in its own process group; kill the group at ``timeout``. Output goes to the log."""
        t0 = time.time()
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env or self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        wall = time.time() - t0
        shown = " ".join(c if len(c) < 80 else c[:77] + "..." for c in cmd[1:])
        self.logf.write(
            f"\n===== {name}: {shown}\n===== rc {proc.returncode}, {wall:.1f}s{', TIMED OUT' if timed_out else ''}\n"
        )
        self.logf.write(output if len(output) < 40000 else output[:10000] + "\n[...]\n" + output[-30000:])
        self.logf.flush()
        return {"rc": proc.returncode, "wall_s": round(wall, 1), "timed_out": timed_out, "output": output}

    def child(
        self, kind: str, timeout: float, *extra: str, env: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """A torch-heavy part in a child process of this script; it saves results as it goes."""
        path = self.work / f"child-{kind}.json"
        path.unlink(missing_ok=True)
        deadline = time.time() + timeout - 8  # the child stops measuring before it is killed
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--child-out", str(path)]
        cmd += ["--deadline", f"{deadline:.1f}", *extra] + (["--dry-run"] if self.dry else [])
        if self.ceiling:
            cmd += ["--ceiling", str(self.ceiling)]
        p = self.spawn(f"child {kind}", cmd, timeout, env=env)
        result: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        if p["rc"] != 0:
            result["error"] = (
                "timed out (partial results above)" if p["timed_out"] else f"exit code {p['rc']}"
            )
            result["error_output"] = _tail(p["output"], 40)
        return result

    def cli(
        self,
        name: str,
        sets: dict[str, Any],
        timeout: float,
        launcher: list[str] | None = None,
        dry_sets: bool = True,
        keep_output: bool = False,
        drop_checkpoints: bool = False,
    ) -> dict[str, Any]:
        """``adloco train`` with these overrides (plus BASE_SETS, DRY_SETS in a dry run); the run directory
        read back. ``launcher`` replaces ``python -m adloco`` (torchrun, the memory-cap wrapper);
        ``drop_checkpoints``: its checkpoints deleted once read (a 300M model's are gigabytes a run)."""
        out_dir = self.work / "runs" / name
        shutil.rmtree(out_dir, ignore_errors=True)
        merged = {
            **BASE_SETS,
            **(DRY_SETS if self.dry and dry_sets else {}),
            **sets,
            "logging.out_dir": str(out_dir),
        }
        args = ["train"]
        for k, v in merged.items():
            args += ["--set", f"{k}={v}"]
        cmd = (launcher or [sys.executable, "-m", "adloco"]) + args
        p = self.spawn(name, cmd, timeout)
        rec = read_run(out_dir, p)
        if drop_checkpoints:
            for ck in out_dir.glob("*/checkpoints"):
                shutil.rmtree(ck, ignore_errors=True)
        rec["overrides"] = {k: v for k, v in sets.items()}
        if keep_output:
            rec["full_output"] = p["output"]
        else:
            rec.pop("full_output", None)
        return rec


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def read_run(out_dir: Path, p: dict[str, Any]) -> dict[str, Any]:
    """What a finished (or failed) engine run left: summary, per-round metrics, log lines, checkpoint."""
    out = p["output"]
    rec: dict[str, Any] = {"rc": p["rc"], "wall_s": p["wall_s"], "timed_out": p["timed_out"]}
    runs = sorted(d for d in out_dir.glob("*") if d.is_dir()) if out_dir.is_dir() else []
    if runs:
        run = runs[-1]
        if (run / "summary.json").is_file():
            rec["summary"] = json.loads((run / "summary.json").read_text())
        events = []
        if (run / "metrics.jsonl").is_file():
            for line in (run / "metrics.jsonl").read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    events.append(json.loads(line))
        rec["rounds"] = [
            {
                k: e.get(k)
                for k in ("round", "val_ppl", "loss", "train_s", "examples", "max_compute_s", "requests")
            }
            for e in events
            if e.get("event") == "round"
        ]
        workers = [e for e in events if e.get("event") == "worker"]
        rec["worker_event_keys"] = sorted({k for e in workers for k in e})
        rec["worker_events_skipped"] = [e.get("skipped") for e in workers if "skipped" in e]
        faults = [e for e in events if e.get("event") == "fault"]
        if faults:
            rec["faults"] = faults[:8]
        cks = (
            sorted((run / "checkpoints").glob("round-*/state.json")) if (run / "checkpoints").is_dir() else []
        )
        if cks:
            st = json.loads(cks[-1].read_text())
            algo = st.get("algorithm") or {}
            rec["checkpoint"] = {
                "round": st.get("round"),
                "parameters": algo.get("parameters"),
                "b_max": algo.get("b_max"),
                # per worker: [fp16 loss scale, good steps since the last change, skipped steps, b_max]
                "worker_scalars": dict(algo.get("replicas") or {}),
            }
    m = B_MAX_LINE.search(out)
    if m:
        rec["b_max_search"] = {
            "line": m.group(0),
            "b_max": int(m.group(1)),
            "memory_fraction": float(m.group(2)),
            "free_gib": float(m.group(3)),
            "workers": int(m.group(4)),
            "hi": int(m.group(5)),
        }
    ooms = OOM_LINE.findall(out)
    if ooms:
        rec["oom_halvings"] = [f"round {r}: worker {w}: {a} -> {b}" for r, w, a, b in ooms]
    params = re.search(r": \S+, ([\d.]+)M parameters", out)
    if params:
        rec["params_m"] = float(params.group(1))
    if p["rc"] != 0 or p["timed_out"]:
        errors = [ln for ln in out.splitlines() if "error" in ln.lower() or "Error" in ln]
        rec["error_lines"] = errors[-12:]
        rec["error"] = "timed out" if p["timed_out"] else (errors[-1] if errors else f"exit code {p['rc']}")
        rec["output_tail"] = _tail(out, 60)
        rec["full_output"] = out  # for callers that look further back; dropped before the report
    return rec


def rank_errors(out: str) -> list[str]:
    """The ranks' own error lines in a torchrun log (not the launcher's summary), each once, in order:
    exception lines, NCCL's 'Last error' detail, gloo's 'what():' and adloco's one-line errors."""
    found: list[str] = []
    lines = out.splitlines()
    for i, ln in enumerate(lines):
        t = ln.strip()
        pick = None
        own = t.startswith(("adloco: error", "what():", "terminate called"))
        if own or (re.match(r"^[\w.]+(Error|Exception): ", t) and "ChildFailedError" not in t):
            pick = t
        elif t == "Last error:" and i + 1 < len(lines):
            pick = "Last error: " + lines[i + 1].strip()
        if pick and pick[:400] not in found:
            found.append(pick[:400])
    return found[:8]


def _ppl(rec: dict[str, Any]) -> str:
    s = rec.get("summary") or {}
    a, b = s.get("initial_val_ppl"), s.get("final_val_ppl")
    return f"{a:.1f} -> {b:.1f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) else "—"


# --------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------


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


def _slim(rec: dict[str, Any]) -> dict[str, Any]:
    """A run record without the bulky parts the Markdown never shows (the summary keeps its scalars)."""
    s = rec.get("summary")
    if isinstance(s, dict):
        rec["summary"] = {
            k: v for k, v in s.items() if not isinstance(v, (dict, list)) or k in ("requests_final",)
        }
    return rec


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


class SectionError(Exception):
    def __init__(self, msg: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(msg)
        self.partial = partial or {}


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
    "compile": 90,
    "paper": 90,
}
DEFAULT_SECTIONS = ["env", "overhead", "multi", "precision", "b_max", "oom", "torchrun"]


# --------------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------------


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


def markdown(report: dict[str, Any]) -> str:
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
    shown = [x for x in SECTIONS if x[0] in report["sections"]]  # the default ones and those asked for
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
        (ctx.out / "gpu.md").write_text(markdown(report))

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
