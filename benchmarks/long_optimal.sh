#!/usr/bin/env bash
# llama-tiny at its compute-optimal budget on Python's source (benchmarks/RESULTS.md, "At the
# compute-optimal budget"): 20 tokens a parameter, 1,377,408 x 20 = 27.5M tokens = 215,220 examples of
# 128 tokens (3.1 passes over the corpus's 69,293 training examples). Each run is a 16x run (65,536
# examples) continued to that budget (benchmarks/continue_run.sh), with the code it was made with: GRID, a
# checkout of 1e2cb00. In the order below (the longest first, so that with JOBS=2 the others run beside
# it), JOBS at a time (default 1); stopped and started again, a run goes on from its newest checkpoint (every 10 rounds), so the bench
# may span several sittings. Run from the repository root.
set -u
: "${GRID:?a checkout of 1e2cb00}"
B=benchmarks/out/long16-tiny-stdlib/runs
E=benchmarks/out/long16-extended/runs
OUT=benchmarks/out/optimal-tiny-stdlib
C="bash benchmarks/continue_run.sh"
cat <<LIST | xargs -P "${JOBS:-1}" -I{} bash -c '{}'
$C diloco-s0 $B/diloco-s0-20261129-024124 $GRID $OUT 215220 1200
$C adloco-s0 $B/adloco-s0-20261129-021241 $GRID $OUT 215220 1200
$C diloco-schedule-s0 $B/diloco-schedule-s0-20261129-033135 $GRID $OUT 215220 1200
$C schedule-muon-s0 $E/schedule-muon-s0 $GRID $OUT 215220 1200
LIST
