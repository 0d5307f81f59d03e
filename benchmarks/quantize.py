"""Quantize + dequantize throughput on CPU: what encoding a wire dtype costs per round.

For P = 1.4M (the default model's size class) and 10M values: float32 (a copy, the baseline), the bfloat16
and float16 casts, and block-wise int8 and int4 (block 256): milliseconds per encode, per decode, and
GB/s of float32 input through the round trip; also the bytes on the wire. Medians of several repeats,
one thread unless told. Usage:  python benchmarks/quantize.py [--threads 1] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from adloco.library.comm.compressed import decode, encode, piece_bytes


def timed(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up (allocator, kernels)
    sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure(
    x: torch.Tensor, dtype: str, block: int, repeats: int, sync: Callable[[], None]
) -> tuple[float, float]:
    """(seconds to encode, seconds to decode) one vector; float32 is a copy each way (it is not encoded)."""
    if dtype == "float32":
        buf = x.clone()
        return timed(x.clone, repeats, sync), timed(buf.clone, repeats, sync)
    buf = encode(x, dtype, block)

    def enc() -> torch.Tensor:
        return encode(x, dtype, block)

    def dec() -> torch.Tensor:
        return decode(buf, x.numel(), dtype, block)

    return timed(enc, repeats, sync), timed(dec, repeats, sync)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="1400000,10000000")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"$ python benchmarks/{' '.join(['quantize.py', *sys.argv[1:]])}")
    print(
        f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s), block {args.block}"
    )
    print()
    print(
        f"| {'P':>10} | {'dtype':<8} | {'encode ms':>9} | {'decode ms':>9} | {'GB/s':>6} | {'wire MB':>8} | {'ratio':>5} |"
    )
    print(f"|{'-' * 12}|{'-' * 10}|{'-' * 11}|{'-' * 11}|{'-' * 8}|{'-' * 10}|{'-' * 7}|")
    for P in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(P, generator=torch.Generator().manual_seed(0)).to(device)
        for dtype in ("float32", "bfloat16", "float16", "int8", "int4"):
            te, td = measure(x, dtype, args.block, args.repeats, sync)
            wire = piece_bytes(P, dtype, args.block)
            print(
                f"| {P:>10,} | {dtype:<8} | {te * 1e3:>9.2f} | {td * 1e3:>9.2f} | {4 * P / (te + td) / 1e9:>6.2f} "
                f"| {wire / 1e6:>8.2f} | {4 * P / wire:>5.2f} |"
            )


if __name__ == "__main__":
    main()
