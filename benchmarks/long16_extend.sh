#!/usr/bin/env bash
# 16x the scaling budget with Muon and with b_max 16 (benchmarks/RESULTS.md, "16× on a second seed, and
# with Muon"): each run is an 8x run continued from its last checkpoint to 65,536 examples, in a copy of
# its folder (the 8x run stays as published). `adloco train --resume` may raise algorithm.budget and
# algorithm.rounds and nothing else of what trains, and a 16x run passes through its 8x run bit for bit
# (constant lr, no decay: nothing depends on the budget), so a continued run is the 16x run. Checked
# first: AdLoCo's seed-0 8x run continued for 10 rounds, against the 16x bench's run of the same seed.
# Each run with the code it was made with: FROZEN a checkout of c10b7f5 (the 8x compression bench),
# GRID one of 1e2cb00 (the long grid). Run from the repository root; a finished run is not run again,
# a stopped one goes on from its newest checkpoint.
set -u
: "${FROZEN:?a checkout of c10b7f5}" "${GRID:?a checkout of 1e2cb00}"
R=benchmarks/out/compress-long-tiny-stdlib/runs
G=benchmarks/out/long-grid/runs
OUT=benchmarks/out/long16-extended
extend() {  # name, the 8x run, the checkout, then more --set options
  local name=$1 src=$2 code=$3
  shift 3
  local dst=$OUT/runs/$name
  if [ -f "$dst/summary.json" ]; then echo "$name: finished before"; return; fi
  if [ ! -d "$dst" ]; then
    mkdir -p "$OUT/runs" && rm -rf "$dst.part" && cp -r "$src" "$dst.part" && rm -f "$dst.part/summary.json" \
      && mv "$dst.part" "$dst" || { echo "$name: copy FAILED"; return; }
  fi
  echo "$name: started $(date -u +%H:%M)"
  PYTHONPATH=$code/src adloco train --resume "$dst" --set algorithm.budget=65536 --set algorithm.rounds=342 "$@" \
    > "$OUT/$name.log" 2>&1 && echo "$name: done $(date -u +%H:%M)" || echo "$name: FAILED"
}
extend check-adloco-s0 $R/adloco-s0-20261128-180226 "$FROZEN" --set algorithm.rounds=98
extend schedule-muon-s0 $G/schedule-muon-20261129-035459 "$GRID"
extend diloco-muon-s0 $R/diloco-muon-s0-20261128-205647 "$FROZEN"
extend adloco-muon-s0 $R/adloco-muon-s0-20261128-185123 "$FROZEN"
extend adloco-bmax16-s0 $G/adloco-bmax16-20261129-022838 "$GRID"
extend schedule-muon-s1 $G/schedule-muon-s1-20261129-041505 "$GRID"
