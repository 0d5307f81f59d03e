#!/usr/bin/env bash
# On a machine with a GPU, in one command: the unit tier, then benchmarks/gpu.py's sections, all output
# under one folder (gpu_check.log, unit-tier.txt, gpu/gpu.json, gpu/gpu.md, gpu/gpu.log, gpu.tgz).
#
#   bash benchmarks/gpu_check.sh OUT [SECTIONS=overhead,multi] [BUDGET_S=380] [UNIT=1]
#
# Uses the machine's own python3 and packages; run `pip install -e . --no-deps` first where adloco is
# not installed (the script does so itself when `import adloco` fails).
set -u
if [ $# -lt 1 ] || [ $# -gt 4 ] || { [ $# -ge 4 ] && [ "$4" != 0 ] && [ "$4" != 1 ]; }; then
  echo "usage: gpu_check.sh OUT [SECTIONS=overhead,multi] [BUDGET_S=380] [UNIT=1|0]" >&2
  exit 2
fi
out=$1
sections=${2:-overhead,multi}
budget=${3:-380}
unit=${4:-1}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
HF_HOME=$(mktemp -d)
export HF_HOME
t0=$SECONDS
say() { echo "[$((SECONDS - t0))s] == $*"; }
{
  say env
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import adloco" 2>/dev/null ||
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 ||
    echo "pip install -e . failed: adloco runs from src/ on PYTHONPATH"
  python3 -c "import sys, torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-', 'transformers', transformers.__version__, 'py', sys.version.split()[0])"
  if [ "$unit" = 1 ]; then
    say "unit tier (pytest -n 12 tests/unit)"
    python3 -m pytest -q -n 12 -p no:cacheprovider tests/unit >"$out/unit-tier.txt" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$out/unit-tier.txt" | tail -25
  fi
  say "benchmarks/gpu.py --sections $sections --budget $budget"
  python3 benchmarks/gpu.py --out "$out/gpu" --sections "$sections" --budget "$budget"
  say done
} 2>&1 | tee "$out/gpu_check.log"
tar czf "$out/gpu.tgz" -C "$out" gpu 2>/dev/null
