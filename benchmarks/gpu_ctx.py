"""The shared part of ``benchmarks/gpu.py``: the paths, the settings every engine run shares (``BASE_SETS``,
``DRY_SETS``), the patterns read from a run's output, ``Ctx`` (mode, folders, deadline, the subprocess
runner and the log every section uses), the readers of a finished run (``read_run``, ``rank_errors``,
``_tail``, ``_ppl``, ``_slim``) and ``SectionError``. It imports nothing of the other ``gpu*`` modules.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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
        cmd = [sys.executable, str(HERE / "gpu.py"), "--child", kind, "--child-out", str(path)]
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


def _slim(rec: dict[str, Any]) -> dict[str, Any]:
    """A run record without the bulky parts the Markdown never shows (the summary keeps its scalars)."""
    s = rec.get("summary")
    if isinstance(s, dict):
        rec["summary"] = {
            k: v for k, v in s.items() if not isinstance(v, (dict, list)) or k in ("requests_final",)
        }
    return rec


class SectionError(Exception):
    def __init__(self, msg: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(msg)
        self.partial = partial or {}
