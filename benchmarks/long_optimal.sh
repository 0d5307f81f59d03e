#!/usr/bin/env bash
# llama-tiny at its compute-optimal budget on Python's source (benchmarks/RESULTS.md, "At the
# compute-optimal budget"): 20 tokens a parameter, 1,377,408 x 20 = 27.5M tokens = 215,220 examples of
# 128 tokens (3.1 passes over the corpus's 69,293 training examples). Each run is a 16x run (65,536
# examples) continued to that budget (benchmarks/continue_run.sh), with the code it was made with: GRID, a
# checkout of 1e2cb00. SEED=1 runs seed 1's DiLoCo and schedule (GRID) and AdLoCo with the norm test
# counting the rows requested (REQUESTED: 1e2cb00 with the commit that adds batch.noise_rows). In the
# order below (the longest first, so that with JOBS=2 the others run beside it), JOBS at a time (default
# 1); stopped and started again, a run goes on from its newest checkpoint (every 10 rounds), so the bench
# may span several sittings. Run from the repository root.
set -u
bad() { echo "long_optimal.sh: $1" >&2; exit 2; }
[ -n "${GRID:-}" ] || bad "GRID: unset; a checkout of 1e2cb00"
SEED=${SEED:-0}
case $SEED in 0|1) ;; *) bad "SEED=$SEED: 0 or 1" ;; esac
[ "$SEED" = 0 ] || [ -n "${REQUESTED:-}" ] || bad "REQUESTED: unset; with SEED=1, a checkout of 1e2cb00 with the batch.noise_rows commit"
B=benchmarks/out/long16-tiny-stdlib/runs
E=benchmarks/out/long16-extended/runs
OUT=benchmarks/out/optimal-tiny-stdlib
# name, the 16x run it continues, the code it was made with
runs() {
    if [ "$SEED" = 1 ]; then
        echo "diloco-s1 $B/diloco-s1-20261129-055410 $GRID"
        echo "adloco-requested-s1 $E/adloco-requested-s1 $REQUESTED"
        echo "diloco-schedule-s1 $B/diloco-schedule-s1-20261129-062727 $GRID"
    else
        echo "diloco-s0 $B/diloco-s0-20261129-024124 $GRID"
        echo "adloco-s0 $B/adloco-s0-20261129-021241 $GRID"
        echo "diloco-schedule-s0 $B/diloco-schedule-s0-20261129-033135 $GRID"
        echo "schedule-muon-s0 $E/schedule-muon-s0 $GRID"
    fi
}
runs | xargs -P "${JOBS:-1}" -I{} bash -c "bash benchmarks/continue_run.sh {} $OUT 215220 1200"
