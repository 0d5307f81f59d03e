#!/usr/bin/env bash
# Continue a finished run to a larger budget, in a copy of its folder (the original stays as published):
#   bash benchmarks/continue_run.sh NAME RUN_DIR CHECKOUT OUT BUDGET ROUNDS [--set KEY=VALUE ...]
# writes OUT/runs/NAME (and OUT/NAME.log) with the code of CHECKOUT (the one the run was made with).
# `adloco train --resume` may raise algorithm.budget and algorithm.rounds and nothing else of what trains;
# with a constant lr and no decay nothing in a run depends on its budget, so the continued run is the run
# that would have had the larger budget from the start (checked bit for bit in benchmarks/RESULTS.md, "16×
# on a second seed, and with Muon"). A finished NAME is not run again; a stopped one goes on from its
# newest checkpoint (OUT/NAME.log grows by each sitting). Run from the repository root, with adloco on PATH.
set -u
[ $# -ge 6 ] || { echo "usage: continue_run.sh NAME RUN_DIR CHECKOUT OUT BUDGET ROUNDS [--set KEY=VALUE ...]" >&2; exit 2; }
name=$1 src=$2 code=$3 out=$4 budget=$5 rounds=$6
shift 6
dst=$out/runs/$name
if [ -f "$dst/summary.json" ]; then echo "$name: finished before"; exit 0; fi
if [ ! -d "$dst" ]; then
    [ -f "$src/config.yaml" ] && [ -d "$src/checkpoints" ] || { echo "$name: $src: not a run folder with checkpoints" >&2; exit 2; }
    mkdir -p "$out/runs" && rm -rf "$dst.part" && cp -r "$src" "$dst.part" && rm -f "$dst.part/summary.json" \
        && mv "$dst.part" "$dst" || { echo "$name: copy FAILED"; exit 1; }
fi
echo "$name: started $(date -u +%H:%M)"
if PYTHONPATH=$code/src adloco train --resume "$dst" --set algorithm.budget="$budget" --set algorithm.rounds="$rounds" "$@" \
    >> "$out/$name.log" 2>&1; then
    echo "$name: done $(date -u +%H:%M)"
else
    rc=$?
    # 143 and 130: stopped by SIGTERM or Ctrl-C, its checkpoint written; the same command goes on from it
    case $rc in
        143|130) echo "$name: stopped $(date -u +%H:%M), goes on from its newest checkpoint" ;;
        *) echo "$name: FAILED (exit $rc, $out/$name.log)" ;;
    esac
    exit 1
fi
