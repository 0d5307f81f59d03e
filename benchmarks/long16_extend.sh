#!/usr/bin/env bash
# 16x the scaling budget with Muon and with b_max 16 (benchmarks/RESULTS.md, "16× on a second seed, and
# with Muon"): each run an 8x run continued to 65,536 examples (benchmarks/continue_run.sh), with the code
# it was made with: FROZEN a checkout of c10b7f5 (the 8x compression bench), GRID one of 1e2cb00 (the long
# grid). The first is the check that a continued run is the 16x run: AdLoCo's seed-0 8x run continued for
# 10 rounds, compared round for round with the 16x bench's run by benchmarks/last_evals.py --same-as (the
# command in RESULTS). Run from the repository root.
set -u
: "${FROZEN:?a checkout of c10b7f5}" "${GRID:?a checkout of 1e2cb00}"
R=benchmarks/out/compress-long-tiny-stdlib/runs
G=benchmarks/out/long-grid/runs
C="bash benchmarks/continue_run.sh"
OUT=benchmarks/out/long16-extended
$C check-adloco-s0 $R/adloco-s0-20261128-180226 "$FROZEN" $OUT 65536 98
$C schedule-muon-s0 $G/schedule-muon-20261129-035459 "$GRID" $OUT 65536 342
$C diloco-muon-s0 $R/diloco-muon-s0-20261128-205647 "$FROZEN" $OUT 65536 342
$C adloco-muon-s0 $R/adloco-muon-s0-20261128-185123 "$FROZEN" $OUT 65536 342
$C adloco-bmax16-s0 $G/adloco-bmax16-20261129-022838 "$GRID" $OUT 65536 342
