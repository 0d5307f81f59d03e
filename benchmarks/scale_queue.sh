#!/usr/bin/env bash
# The benches of "Does AdLoCo pay as models grow" (benchmarks/RESULTS.md), one after another, one run at
# a time, each at its model's quiet compute price (seconds per example on one idle core). Run from the
# repository root of a frozen checkout (its own .venv); outputs go under benchmarks/out/. A bench whose
# folder exists goes on with --resume (its finished runs kept, a run stopped part-way continued from its
# checkpoint), so the script can simply be started again after a lost machine or a stop:
#   setsid nohup nice -n 5 bash benchmarks/scale_queue.sh > benchmarks/out/queue.log 2>&1 &
# Stop it with `kill -TERM -<its process group>`: each running run writes a checkpoint first.
# Progress: benchmarks/out/queue.log (a line per bench) and benchmarks/out/scale-*.log (a line per run).
# Benches named as arguments run instead of the whole list, in that order: two queues, one per core, e.g.
#   ... bash benchmarks/scale_queue.sh 10m-fortunes 30m-fortunes > benchmarks/out/queue-a.log 2>&1 &
#   ... bash benchmarks/scale_queue.sh 10m-stdlib 30m-stdlib > benchmarks/out/queue-b.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
mkdir -p benchmarks/out
ADLOCO=${ADLOCO:-.venv/bin/adloco}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# One thread per process, as the cores are shared with other work. Seconds per example of one worker's step on one idle core (RESULTS.md:
# 21.6 and 118.1 ms; llama-30m scaled from llama-10m by their CPU-time ratio).
declare -A SPE=([tiny]=0.02162 [10m]=0.1181 [30m]=0.2543)
# The open question first: prose at every size (llama-10m, where AdLoCo lost before), then stdlib.
ALL=(10m-fortunes tiny-fortunes 30m-fortunes 10m-stdlib tiny-stdlib 30m-stdlib)
[ $# -gt 0 ] && ALL=("$@")
for bench in "${ALL[@]}"; do
    [ -f "configs/scale-$bench.yaml" ] || { echo "scale_queue.sh: $bench: no configs/scale-$bench.yaml" >&2; exit 2; }
done
for bench in "${ALL[@]}"; do
    size=${bench%%-*}
    out=benchmarks/out/scale-$bench
    cmd=("$ADLOCO" bench --config "configs/scale-$bench.yaml" --methods adloco,diloco,diloco-schedule
         --seconds-per-example "${SPE[$size]}" --set runtime.threads=1 --jobs 1 --out "$out")
    [ -f "$out/shared.yaml" ] && cmd+=(--resume)
    [ -f "$out/results.json" ] && { echo "$(date -Is) $bench: done before, skipped"; continue; }
    echo "$(date -Is) $bench: ${cmd[*]}"
    "${cmd[@]}" >> "benchmarks/out/scale-$bench.log" 2>&1  # appended: an earlier go's log is kept
    echo "$(date -Is) $bench: exit code $?"
done
echo "$(date -Is) queue: done"
