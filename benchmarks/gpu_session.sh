#!/usr/bin/env bash
# One GPU session in one command, inside a wall-clock budget: what a CPU cannot measure of CUDA graphs by
# default, compiled blocks and their cache, and the paper's setting (docs/ALGORITHM.md §14).
#
#   bash benchmarks/gpu_session.sh OUT 500         # on the GPU machine (one GPU, python3 with torch + transformers)
#   DRY=1 bash benchmarks/gpu_session.sh OUT       # anywhere, tiny sizes: every part starts and writes its files
#
# Parts, in order; each has a time box (`timeout`) and is isolated: a part that fails or runs out of time
# is recorded with its exit code and the next one runs. Boxes on a 500 s budget (a part that ends early
# leaves its time to the paper's runs):
#   1. env      versions, the device, adloco importable (from src/ on PYTHONPATH: no install)   box  30 s (~10)
#   2. unit     the CUDA tests: pytest -n 8 -k "cuda or gpu_paths" tests/unit                box 110 s (~70)
#   3. default  adloco train with the default config on CUDA; its first line says cuda graphs: on (auto ...)
#                                                                                             box  75 s (~35)
#   4. compile  benchmarks/gpu.py --sections compile: compile time (cold cache) by blocks against the whole
#               model, the engine compiled by blocks (cold, then warm cache) against the plain loop compiled
#               the same way, tokens/s and MFU (microllama-300m preset, bf16)                  ~160 s
#   5. paper    benchmarks/gpu.py --sections paper: the paper's Figure 1 offline (microllama-300m, 4 workers on
#               the GPU, AdLoCo against DiLoCo, bf16), rounds x H from the time that remains     the rest
#   (4 and 5 are one call of benchmarks/gpu.py, which boxes and isolates its sections the same way.)
#
# What comes back, all in OUT (7 files, no folders): session.log (everything printed), session.json and
# session.md (each part's status, time and findings; session.md includes benchmarks/gpu.py's report),
# unit-cuda.txt (pytest's output), gpu.json (benchmarks/gpu.py's results), paper.png (the figure),
# rest.tgz (gpu.py's subprocess log, the default run's config, metrics and summary).
#
# Environment: PYTHON (default python3), DRY=1 (tiny sizes), UNIT_WORKERS (pytest -n; default 8, dry 2),
# UNIT_SELECT (pytest -k; default "cuda or gpu_paths").
#
# Python packages the machine lacks travel as wheels in .whl/ beside this checkout (ignored by git), installed
# into a temporary folder on PYTHONPATH before anything runs. The tests that read a text corpus need
# Hugging Face datasets, which a bare GPU image may lack (seen on one: 18 of the CUDA tests failed so); on a
# machine with pip's access to PyPI, for Python 3.12 (datasets 4.x needs dill < 0.4.1, multiprocess < 0.70.19):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#       datasets==4.4.1 dill==0.4.0 multiprocess==0.70.18
set -u
if [ $# -lt 1 ] || [ $# -gt 2 ] || { [ $# -eq 2 ] && ! [[ $2 =~ ^[0-9]+$ ]]; }; then
  echo "usage: [DRY=1] bash benchmarks/gpu_session.sh OUT [BUDGET_S=500]" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
export out
budget=${2:-500}
dry=${DRY:-0}
py=${PYTHON:-python3}
if [ "$dry" = 1 ]; then unit_n=${UNIT_WORKERS:-2}; else unit_n=${UNIT_WORKERS:-8}; fi
unit_select=${UNIT_SELECT:-cuda or gpu_paths}
export py unit_n unit_select
work=$(mktemp -d "${TMPDIR:-/tmp}/adloco-session.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$root" || exit 2
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
if [ "$dry" != 1 ] && compgen -G "$root/.whl/*.whl" >/dev/null; then # wheels the machine lacks
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$root"/.whl/*.whl &&
    export PYTHONPATH="$work/site:$PYTHONPATH"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export HF_HOME="$work/hf" ADLOCO_CACHE="$work/adloco-cache" # one tokenizer cache for every part
rm -f "$out"/session.log "$out"/session.json "$out"/session.md "$out"/unit-cuda.txt "$out"/gpu.json \
  "$out"/paper.png "$out"/rest.tgz
parts="$work/parts.tsv"
: >"$parts"
t0=$SECONDS
log() { echo "[$((SECONDS - t0))s] $*" | tee -a "$out/session.log"; }
left() { echo $((budget - (SECONDS - t0))); }
box() { # box NOMINAL RESERVE: NOMINAL seconds, or what is left after RESERVE for the parts after it
  local b=$(($(left) - $2))
  [ "$b" -gt "$1" ] && b=$1
  [ "$b" -lt 5 ] && b=5
  echo "$b"
}
part() { # part NAME BOX CMD...: run CMD under BOX seconds, its output into the log; record how it ended
  local name=$1 limit=$2 start=$SECONDS rc status
  shift 2
  log "== $name (up to ${limit}s): $*"
  timeout -k 10 "$limit" bash -c '"$@"' part "$@" 2>&1 | tee -a "$out/session.log"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) status=ok ;;
    124 | 137) status="timed out" ;;
    *) status="failed (exit $rc)" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - start))" "$limit" >>"$parts"
  log "== $name: $status in $((SECONDS - start))s"
}

log "adloco GPU session$([ "$dry" = 1 ] && echo ' (dry run: tiny sizes)'): budget ${budget}s, results in $out"

# 1. env
env_part() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$py" -c "
import sys, torch, transformers, adloco
cuda = torch.cuda.is_available()
print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', cuda,
      torch.cuda.get_device_name(0) if cuda else '-', '| transformers', transformers.__version__,
      '| adloco', adloco.__version__, 'from', adloco.__file__)"
}
export -f env_part
part env "$(box 30 400)" env_part

# 2. the CUDA tests (and every CPU test of the GPU paths: test_gpu_paths.py, the cuda-graphs choice)
unit_part() {
  "$py" -m pytest -q -n "$unit_n" -p no:cacheprovider -k "$unit_select" tests/unit >"$out/unit-cuda.txt" 2>&1
  local rc=$?
  grep -E "^(FAILED|ERROR)|passed|failed|skipped" "$out/unit-cuda.txt" | tail -25
  return $rc
}
export -f unit_part
part unit "$(box 110 320)" unit_part

# 3. the default config on CUDA (dry: the tiny sizes)
default_sets=(--set "logging.out_dir=$work/runs/default" --set logging.progress=plain --set logging.plots=false
  --set logging.save_model=false)
if [ "$dry" = 1 ]; then
  default_sets+=(--set model.name=llama-micro --set data.max_examples=60 --set data.tokenizer=bpe:300
    --set data.seq_len=32 --set algorithm.rounds=1 --set algorithm.inner_steps=2 --set eval.max_examples=8)
fi
part default "$(box 75 240)" "$py" -m adloco train "${default_sets[@]}"

# 4 and 5. compile, then the paper's setting with what remains (benchmarks/gpu.py boxes each section)
gbox=$(box 100000 5)
gpu_args=(--out "$work/gpu" --work-dir "$work/gpu-work" --sections compile,paper --budget "$((gbox - 15))")
[ "$dry" = 1 ] && gpu_args+=(--dry-run)
part "compile+paper" "$gbox" "$py" benchmarks/gpu.py "${gpu_args[@]}"

# what comes back
cp "$work/gpu/gpu.json" "$out/gpu.json" 2>/dev/null
cp "$work/gpu/paper.png" "$out/paper.png" 2>/dev/null
"$py" - "$out" "$parts" "$work" "$budget" "$dry" "$((SECONDS - t0))" <<'EOF' 2>&1 | tee -a "$out/session.log"
import json, re, sys
from pathlib import Path

out, parts, work = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
budget, dry, total = int(sys.argv[4]), sys.argv[5] == "1", int(sys.argv[6])
log = (out / "session.log").read_text(errors="replace")
rows = [ln.split("\t") for ln in parts.read_text().splitlines() if ln.strip()]
report = {"budget_s": budget, "dry_run": dry, "total_s": total, "parts": {}}
for name, status, seconds, limit in rows:
    report["parts"][name] = {"status": status, "seconds": int(seconds), "box_s": int(limit)}
unit = (out / "unit-cuda.txt").read_text(errors="replace") if (out / "unit-cuda.txt").is_file() else ""
counts = re.findall(r"^=*\s*(.*(?:passed|failed|error).*?) in [\d.]+s", unit, re.M)
if "unit" in report["parts"]:
    report["parts"]["unit"]["result"] = counts[-1].strip("= ") if counts else None
    report["parts"]["unit"]["failed"] = re.findall(r"^(?:FAILED|ERROR) (\S+)", unit, re.M)
graphs = re.findall(r"^cuda graphs: .*$", log, re.M)
if "default" in report["parts"]:
    report["parts"]["default"]["cuda_graphs_line"] = graphs[0] if graphs else None
    done = re.findall(r"^done: .*$", log, re.M)
    report["parts"]["default"]["done_line"] = done[0] if done else None
gpu = json.loads((out / "gpu.json").read_text()) if (out / "gpu.json").is_file() else {}
for name in ("compile", "paper"):
    sec = (gpu.get("sections") or {}).get(name)
    if sec is not None:
        report["parts"].setdefault("compile+paper", {})[name] = {
            "status": sec.get("status"),
            "seconds": sec.get("seconds"),
            "error": (str(sec.get("error")).strip().splitlines() or [""])[-1][:300] if sec.get("error") else None,
        }
(out / "session.json").write_text(json.dumps(report, indent=1) + "\n")
md = [
    "# adloco GPU session (benchmarks/gpu_session.sh)",
    "",
    f"{'Dry run (tiny sizes). ' if dry else ''}Total {total} s of a {budget} s budget.",
    "",
    "| part | status | seconds | box | finding |",
    "|---|---|---|---|---|",
]
for name, p in report["parts"].items():
    finding = p.get("result") or p.get("cuda_graphs_line") or ""
    if name == "compile+paper":
        finding = "; ".join(f"{k}: {v['status']}" for k, v in p.items() if isinstance(v, dict))
    md.append(f"| {name} | {p.get('status')} | {p.get('seconds')} | {p.get('box_s')} | {finding} |")
if report["parts"].get("unit", {}).get("failed"):
    md += ["", "Unit tests that failed:", ""] + [f"- `{t}`" for t in report["parts"]["unit"]["failed"]]
gmd = work / "gpu" / "gpu.md"
if gmd.is_file():
    md += ["", "---", ""] + ("\n" + gmd.read_text()).replace("\n# ", "\n## ").splitlines()[1:]
(out / "session.md").write_text("\n".join(md) + "\n")
print("session.json, session.md written: " + ", ".join(f"{k} {v.get('status')}" for k, v in report["parts"].items()))
EOF
rest=()
[ -f "$work/gpu/gpu.log" ] && rest+=(-C "$work/gpu" gpu.log)
for f in config.yaml metrics.jsonl summary.json; do
  for d in "$work"/runs/default/*/; do [ -f "$d$f" ] && rest+=(-C "$d" "$f"); done
done
[ ${#rest[@]} -gt 0 ] && tar czf "$out/rest.tgz" "${rest[@]}"
log "done in $((SECONDS - t0))s: $(cd "$out" && ls | tr '\n' ' ')"
