"""Muon's Newton–Schulz on a CPU: one inner step of AdamW, of Muon orthogonalizing in bfloat16 (torch's) and
of Muon orthogonalizing in float32 (``inner.muon_ns_dtype: float32``), paired.

A CPU without native bfloat16 matmuls (no AVX512-BF16 or AMX) emulates them; ``torch.optim.Muon`` runs its
five Newton–Schulz iterations in bfloat16 on every hidden matrix at every step, whatever the batch, so at
``llama-10m``'s width (320 × 864 matrices) the iterations can cost more than the forward and backward pass.

Design. For each model and batch, the three optimizers step the same model (built once per optimizer at
seed 0, the engine's split: Muon on the hidden matrices, AdamW on the rest) on random token blocks of 128
tokens (the vocabulary of ``bpe:4096``, as the long benches). After ``--warmup`` steps each, ``--blocks``
blocks time one step of every optimizer back to back, the order rotated block to block, so that a drift of
the machine's speed hits them alike. Reported: the median seconds a step over blocks, and its ratio to
AdamW's. One thread (``torch.set_num_threads(1)``), as a bench run on one core; run it on a quiet machine.

Command (RESULTS' table; about 9 minutes on the 2-core CPU machine, most of it Muon in bfloat16 at 11M):
    .venv/bin/python benchmarks/muon_ns.py --blocks 5 --warmup 1 --json benchmarks/out/muon_ns.json
Options: ``--models``, ``--batches``, ``--blocks``, ``--warmup``; ``--quick`` for a smoke check.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from adloco.config import resolve
from adloco.library.optim import emulates_bfloat16, muon_adamw
from adloco.models.factory import ModelFactory

OPTIMIZERS = ("adamw", "muon-bfloat16", "muon-float32")
VOCAB, SEQ = 4096, 128


def optimizer(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The inner optimizer ``adloco train`` gives a worker, at lr 2e-3 (the long benches' at 11M)."""
    if kind == "adamw":
        decay = [p for p in model.parameters() if p.ndim >= 2]
        other = [p for p in model.parameters() if p.ndim < 2]
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], lr=2e-3
        )
    return muon_adamw(model, 2e-3, ns_dtype=kind.removeprefix("muon-"))  # type: ignore[arg-type]


def timed_step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> float:
    """Seconds of one inner step: forward, backward, the optimizer's step."""
    start = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama-tiny,llama-10m")
    p.add_argument("--batches", default="4,16")
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="llama-tiny, batch 4, 2 blocks, 1 warm-up step")
    p.add_argument("--json", type=Path, help="write the table's numbers here too")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.batches, args.blocks, args.warmup = "llama-tiny", "4", 2, 1
    if args.blocks < 1 or args.warmup < 0:
        print("muon_ns.py: --blocks must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    from adloco.models.sizing import SHAPES

    names = args.models.split(",")
    if bad := [n for n in names if n not in SHAPES]:
        print(f"muon_ns.py: --models {bad[0]!r}: one of {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        print(f"muon_ns.py: --batches {args.batches!r}: whole numbers >= 1, comma-separated", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    rows = []
    for name in names:
        cfg = resolve(overrides=[f"model.name={name}"])
        factory = ModelFactory(cfg.model, VOCAB, SEQ, 0, 0)
        for batch in batches:
            gen = torch.Generator().manual_seed(0)
            blocks = [torch.randint(0, VOCAB, (batch, SEQ), generator=gen) for _ in range(4)]
            runs = {}
            for kind in OPTIMIZERS:
                model = factory.build(0)
                model.train()
                runs[kind] = (model, optimizer(kind, model))

            for kind in OPTIMIZERS:
                for i in range(args.warmup):
                    timed_step(*runs[kind], blocks[i % len(blocks)])
            times: dict[str, list[float]] = {k: [] for k in OPTIMIZERS}
            for block in range(args.blocks):
                order = OPTIMIZERS[block % 3 :] + OPTIMIZERS[: block % 3]
                for kind in order:
                    times[kind].append(timed_step(*runs[kind], blocks[block % len(blocks)]))
            median = {k: statistics.median(v) for k, v in times.items()}
            row = {"model": name, "batch": batch, **{f"{k}_s": median[k] for k in OPTIMIZERS}}
            rows.append(row)
            print(
                f"{name} batch {batch}: "
                + ", ".join(
                    f"{k} {median[k]:.3f} s ({median[k] / median['adamw']:.2f}x)" for k in OPTIMIZERS
                ),
                flush=True,
            )
    print()
    print("| model | batch | AdamW, s a step | Muon, bfloat16 | Muon, float32 | bfloat16 ÷ float32 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        a, b, f = r["adamw_s"], r["muon-bfloat16_s"], r["muon-float32_s"]
        print(
            f"| `{r['model']}` | {r['batch']} | {a:.3f} | {b:.3f} ({b / a:.1f}× AdamW) | {f:.3f} "
            f"({f / a:.1f}× AdamW) | {b / f:.1f} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "torch": torch.__version__,
            "machine": platform.machine(),
            "emulates_bfloat16": emulates_bfloat16(),
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
