"""CPU seconds per training example of each Llama preset: one worker's step (4 rows of 128 tokens,
AdamW) on one thread, timed by the process's CPU clock, so that other work on the machine changes it
little (the wall time is printed beside it). Used to scale a quiet price measured for one size to
another (benchmarks/RESULTS.md, "Does AdLoCo pay as models grow").

Usage:  OMP_NUM_THREADS=1 python benchmarks/cpu_price.py llama-tiny llama-10m llama-30m
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from adloco.models.sizing import SHAPES


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(input_ids=x, labels=x).loss.backward()
    opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", choices=sorted(SHAPES), help="Llama presets")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per model, after 2 warm-up steps")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.models:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=4096, max_position_embeddings=128, **SHAPES[name]))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, 4096, (4, 128))

        for _ in range(2):
            step(model, opt, x)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(args.steps):
            step(model, opt, x)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        n = 4 * args.steps
        params = sum(p.numel() for p in model.parameters())
        print(
            f"{name}: {params / 1e6:.2f} M parameters, {cpu / n * 1e3:.1f} ms of CPU per example "
            f"({wall / n * 1e3:.1f} ms of wall time)",
            flush=True,
        )


if __name__ == "__main__":
    main()
