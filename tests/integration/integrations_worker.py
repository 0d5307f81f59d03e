"""One process of tests/integration/test_integrations_dist.py, under torchrun (2 processes): a Hugging Face
Trainer and then a Lightning Trainer, each as its library runs under torchrun (accelerate and Lightning
join the process group, shard the data and wrap the model in DistributedDataParallel), each trained
with DiLoCo, with checkpoints, and again resumed from its middle checkpoint. Rank 0 prints one line a
trainer with what the test checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.integrations_common import STEPS, H, hf_run, lightning_run  # noqa: E402


def gathered(x: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(out, x)
    return out


def report(name: str, full, resumed) -> None:  # type: ignore[no-untyped-def]
    ends = gathered(full.theta)
    assert full.mid is not None
    mids = gathered(full.mid)
    line = {
        "trainer": name,
        "world": dist.get_world_size(),
        "rounds": full.algo.round,
        "bytes": full.algo.totals.bytes,
        # DDP's all-reduce (left on) or the same data on both processes would keep them equal
        "apart_before_last_sync": max(float((m - mids[0]).abs().max()) for m in mids),
        "replicas_equal_at_end": all(torch.equal(e, ends[0]) for e in ends),
        "resumed_equal": bool(torch.equal(resumed.theta, full.theta)),
        "resumed_equal_everywhere": all(
            bool(x) for x in gathered(torch.tensor([torch.equal(resumed.theta, full.theta)]))
        ),
        "trained": not torch.equal(full.theta, full.start),
    }
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(line), flush=True)


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    full = hf_run(out / "hf")  # TrainingArguments joins torchrun's process group (accelerate)
    assert dist.is_initialized() and dist.get_world_size() == 2
    resumed = hf_run(out / "hf", resume=f"checkpoint-{H}")
    report("hf", full, resumed)
    full = lightning_run(out / "lightning")  # Lightning uses the group already joined
    ckpt = out / "lightning" / "ckpt" / f"step={H}.ckpt"
    resumed = lightning_run(out / "lightning-again", resume=ckpt)
    report("lightning", full, resumed)
    assert full.algo.round == STEPS // H


if __name__ == "__main__":
    main()
