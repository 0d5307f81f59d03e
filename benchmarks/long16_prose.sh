#!/usr/bin/env bash
# 16x the scaling budget on English prose (benchmarks/RESULTS.md, "16× on prose"): llama-tiny on the fortune
# files for 65,536 examples (11 passes over their 5,935 training examples), AdLoCo and DiLoCo continued
# from their 8x runs of the long compression bench (benchmarks/continue_run.sh), the schedule run whole
# from DiLoCo's 8x config with the schedule's settings and the 16x budget (no 8x run of it has
# checkpoints). Seed 0; the code of FROZEN, a checkout of c10b7f5, which made the 8x runs. Two at a time.
set -u
: "${FROZEN:?a checkout of c10b7f5}"
F=benchmarks/out/compress-long-tiny-fortunes/runs
OUT=benchmarks/out/long16-prose
D=$F/diloco-s0-20261128-195516
schedule() {
    if compgen -G "$OUT/runs/diloco-schedule-s0-2*/summary.json" > /dev/null; then echo "diloco-schedule-s0: finished before"; return; fi
    local stopped; stopped=$(ls -d "$OUT"/runs/diloco-schedule-s0-2* 2>/dev/null | tail -1)
    echo "diloco-schedule-s0: started $(date -u +%H:%M)"
    if [ -n "$stopped" ]; then set -- --resume "$stopped"; else
        set -- --config "$D/config.yaml" --set batch.lr_scaling=sqrt --set batch.schedule=power \
            --set batch.schedule_examples=2048 --set algorithm.budget=65536 --set algorithm.rounds=342 \
            --set logging.out_dir="$OUT/runs" --set logging.name=diloco-schedule-s0
    fi
    PYTHONPATH=$FROZEN/src adloco train "$@" > "$OUT/diloco-schedule-s0.log" 2>&1 \
        && echo "diloco-schedule-s0: done $(date -u +%H:%M)" || echo "diloco-schedule-s0: FAILED"
}
mkdir -p "$OUT/runs"
export -f schedule; export OUT D FROZEN
cat <<LIST | xargs -P "${JOBS:-2}" -I{} bash -c '{}'
bash benchmarks/continue_run.sh diloco-s0 $D $FROZEN $OUT 65536 342
bash benchmarks/continue_run.sh adloco-s0 $F/adloco-s0-20261128-185747 $FROZEN $OUT 65536 342
schedule
LIST
