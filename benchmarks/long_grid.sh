#!/usr/bin/env bash
# Each method's knobs chosen again at 8x the scaling budget, and the 16x bench beside it, two at a time on
# two cores (benchmarks/RESULTS.md, "Knobs chosen again at 8×, and 16× the budget"). Every grid point is
# the 8x run of benchmarks/out/compress-long-tiny-stdlib (seed 0, AdamW, the scaling bench's settings)
# with one setting changed, so each differs from its centre in that setting alone; the centres are the
# runs measured there (AdLoCo 69.27, DiLoCo 82.02; the schedule at D0 2,048: 66.5 in long-tiny-stdlib).
# The last three were added as results came in (b_max 32 once 16 had won; seed 1 of b_max 16 and of the
# schedule with Muon once they had won on seed 0), from the seed-1 runs' configs.
# The last line came after the compute-optimal runs (RESULTS, "The norm test's probe held AdLoCo's batch"):
# the b_max 32 run with probe_chunks 32, so that the probe counts every row of a step of up to 32.
# Run from the repository root; a run already in benchmarks/out/long-grid/runs is not run again.
set -u
R=benchmarks/out/compress-long-tiny-stdlib/runs
A=$R/adloco-s0-20261128-180226/config.yaml
D=$R/diloco-s0-20261128-185345/config.yaml
A1=$R/adloco-s1-20261128-233504/config.yaml
D1=$R/diloco-s1-20261128-235815/config.yaml
OUT=benchmarks/out/long-grid/runs
SCHED="--set batch.lr_scaling=sqrt --set batch.schedule=power"
run() {  # name, then the config and its --set options
  local name=$1; shift
  if compgen -G "$OUT/$name-2*/summary.json" > /dev/null; then echo "$name: finished before"; return; fi
  echo "$name: started $(date -u +%H:%M)"
  adloco train "$@" --set runtime.threads=1 --set logging.out_dir=$OUT --set logging.name="$name" \
    > "benchmarks/out/long-grid/$name.log" 2>&1 && echo "$name: done $(date -u +%H:%M)" || echo "$name: FAILED"
}
mkdir -p "$OUT"
export -f run; export OUT
cat <<LIST | xargs -P 2 -I{} bash -c '{}'
adloco bench --config configs/long16-tiny-stdlib.yaml --methods adloco,diloco,diloco-schedule --seeds 0 --seconds-per-example 0.02162 --set runtime.threads=1 --jobs 1 --out benchmarks/out/long16-tiny-stdlib \$( [ -d benchmarks/out/long16-tiny-stdlib ] && echo --resume ) > benchmarks/out/long16-tiny-stdlib.log 2>&1
run adloco-eta0.8 --config $A --set batch.eta=0.8
run adloco-bmax16 --config $A --set switch.b_max=16
run diloco-h24 --config $D --set algorithm.inner_steps=24
run schedule-d1024 --config $D $SCHED --set batch.schedule_examples=1024
run schedule-d4096 --config $D $SCHED --set batch.schedule_examples=4096
run adloco-lr2e-3 --config $A --set inner.lr=0.002
run schedule-muon --config $D $SCHED --set batch.schedule_examples=2048 --set inner.optimizer=muon --set inner.muon_ns_dtype=bfloat16
run adloco-bmax32 --config $A --set switch.b_max=32
run adloco-bmax16-s1 --config $A1 --set switch.b_max=16
run schedule-muon-s1 --config $D1 $SCHED --set batch.schedule_examples=2048 --set inner.optimizer=muon --set inner.muon_ns_dtype=bfloat16
run adloco-bmax32-probe32 --config $A --set switch.b_max=32 --set batch.probe_chunks=32
LIST
