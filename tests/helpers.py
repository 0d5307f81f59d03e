"""Shared test helpers: synthetic token data, tiny configs, the driver on the in-process backend, processes
as threads, the command in this process and in its own, the tiny runs' settings, and what a run directory
holds. Test files import what they share from here (and from tests/toy.py, tests/toy_lm.py and
tests/recorded.py), never from one another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adloco import models
from adloco.config import Config, resolve
from adloco.data.tokens import LMData
from adloco.engine.driver import Driver
from adloco.library.comm.inprocess import InProcessComm

VOCAB = 64


def synthetic_data(
    seq_len: int = 8, n_train_blocks: int = 400, n_val_blocks: int = 8, seed: int = 0
) -> LMData:
    """Token streams with some structure (a noisy counter) so that a model can learn something."""
    rng = np.random.default_rng(seed)

    def stream(n: int) -> np.ndarray:
        base = np.arange(n) % (VOCAB - 1) + 1
        noise = rng.integers(1, VOCAB, size=n)
        keep = rng.random(n) < 0.8
        return np.where(keep, base, noise).astype(np.uint16)

    meta = {"eos_id": 0, "pad_id": 0, "vocab_size": VOCAB, "max_token_id": VOCAB - 1, "documents": [1, 1]}
    return LMData(stream(n_train_blocks * seq_len), stream(n_val_blocks * seq_len), None, seq_len, meta)


def tiny_config(*overrides: str, **sections: dict[str, Any]) -> Config:
    base = {
        "model": {"name": "llama-micro"},
        "data": {"seq_len": 8},
        "algorithm": {"rounds": 3, "inner_steps": 2, "workers": 4, "trainers": 4},
        "batch": {"initial": 2, "max": 16},
        "switch": {"b_max": 4},
        "merge": {"every": 1},
        "eval": {"max_examples": 4, "batch_size": 4},
        "logging": {"progress": "off"},
    }
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    return resolve(base=base, overrides=list(overrides))


def build_fn(data: LMData, cfg: Config) -> models.ModelFactory:
    return models.ModelFactory(cfg.model, data.vocab_size, cfg.data.seq_len, data.eos_id, data.pad_id)


def driver(cfg: Config, data: LMData | None = None) -> Driver:
    """``adloco train``'s driver on the in-process backend, without a run directory."""
    data = data or synthetic_data(seq_len=cfg.data.seq_len)
    return Driver(
        cfg,
        InProcessComm(cfg.algorithm.workers),
        data,
        build_fn(data, cfg),
        torch.device("cpu"),
        log=lambda s: None,
    )


def run_round(d: Driver) -> dict[str, Any]:
    """One round; its events as the dicts of their JSON lines, and the round summary."""
    evs = [e.to_dict() for e in d.run_round()]
    return {"events": evs, "summary": evs[-1]}


def tiny_checkpoint(folder: Path, corpus: Path, hidden: int = 16, cache_dir: Path | None = None) -> Path:
    """A one-layer Llama (2 heads, ``hidden`` wide, 64 positions, seeded) and a 300-token BPE trained on
    ``corpus``, saved the Hugging Face way into ``folder``; ``cache_dir``: the BPE's own cache, else
    adloco's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from adloco.config import DataConfig
    from adloco.data.tokens import prepare

    cache = {} if cache_dir is None else {"cache_dir": str(cache_dir)}
    data = prepare(
        DataConfig(source=str(corpus), tokenizer="bpe:300", seq_len=16, **cache), log=lambda s: None
    )
    cfg = LlamaConfig(
        vocab_size=len(data.tokenizer),
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        eos_token_id=data.eos_id,
        bos_token_id=data.eos_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    data.tokenizer.save_pretrained(folder)
    return folder


# -- several processes as threads, against one process ------------------------------------------------


def on_threads(hub: Any, work: Callable[[int], None]) -> None:
    """``work(rank)`` in a thread of its own for every rank of ``hub`` (an :class:`adloco.library.comm.threads.Hub`);
    the first error of any thread aborts the hub, so that no thread waits for the one that failed, and is
    raised here once every thread has ended."""
    import threading

    errors: list[BaseException] = []

    def guarded(rank: int) -> None:
        try:
            work(rank)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the test's thread
            errors.append(exc)
            hub.abort()

    threads = [threading.Thread(target=guarded, args=(r,)) for r in range(hub.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def run_threaded(make: Any, owner: dict[int, int], rounds: int) -> list[Any]:
    """Build one driver per rank (``make(comm)``) on a :class:`adloco.library.comm.ThreadComm` and run ``rounds``
    rounds in threads; returns the drivers in rank order and re-raises the first error of any thread."""
    import threading

    from adloco.library.comm.threads import Hub, ThreadComm

    world = max(owner.values()) + 1
    hub = Hub(world, timeout=60)
    # Model initialization seeds torch's process-global generator, which threads share (separate
    # processes do not): builds run one at a time. Construction runs collectives, so each driver is
    # built in its own thread.
    drivers: list[Any] = [None] * world
    lock = threading.Lock()
    build = models.ModelFactory.build

    def locked_build(self: models.ModelFactory, seed: int) -> Any:
        with lock:
            return build(self, seed)

    def work(rank: int) -> None:
        drivers[rank] = make(ThreadComm(hub, rank, owner))
        for _ in range(rounds):
            drivers[rank].run_round()

    models.ModelFactory.build = locked_build  # type: ignore[method-assign]
    try:
        on_threads(hub, work)
    finally:
        models.ModelFactory.build = build  # type: ignore[method-assign]
    return drivers


def reference_and_threaded(
    cfg: Config, owner: dict[int, int], rounds: int, prepare: Callable[[Driver], None] | None = None
) -> tuple[Any, list[Any]]:
    """``rounds`` rounds of ``cfg`` in one process (the in-process backend) and in threads standing for
    processes (:func:`run_threaded`; ``owner``: worker -> process): the reference's algorithm and each
    thread's, in rank order. ``prepare`` is given every driver once built (to inject a fault)."""
    data = synthetic_data(seq_len=cfg.data.seq_len)

    def make(comm: Any) -> Driver:
        d = Driver(cfg, comm, data, build_fn(data, cfg), torch.device("cpu"), log=lambda s: None)
        if prepare is not None:
            prepare(d)
        return d

    ref = make(InProcessComm(cfg.algorithm.workers))
    for _ in range(rounds):
        ref.run_round()
    return ref.algo, [d.algo for d in run_threaded(make, owner, rounds)]


def assert_copies_agree(ref: Any, copies: list[Any]) -> None:
    """Every thread's algorithm (:func:`reference_and_threaded`) holds the one process's run bit for bit:
    requests, allocation and bytes by kind, θ of each trainer it hosts, its workers' parameters and error
    feedback."""
    for c in copies:
        assert c.requests == ref.requests and c.allocation == ref.allocation
        assert c.totals.by_kind == ref.totals.by_kind
        for t, tr in c.trainers.items():
            if tr.hosted:
                assert torch.equal(tr.theta, ref.theta(t))
        for w, rep in c.replicas.items():
            assert torch.equal(rep.flat.param, ref.replicas[w].flat.param)
        assert (c.feedback is None) == (ref.feedback is None)
        for w, fb in (c.feedback or {}).items():  # kept where each thread's own workers encoded
            mine, theirs = fb.error, ref.feedback[w].error
            assert (mine is None and theirs is None) or (mine is not None and torch.equal(mine, theirs))


def slow_link_rounds(emulate: bool, rounds: int) -> list[dict[str, Any]]:
    """The round summaries of AdLoCo on 4 workers with ``network.emulate`` on or off: merges, moves, Δ
    all-reduces and the statistics' gathers every round, on a tiny model (3,632 parameters, 14.5 kB) over a
    100 kB/s link, so communication dominates; each summary adds the workers' summed compute time."""
    cfg = tiny_config(
        f"network.emulate={str(emulate).lower()}", "network.bandwidth=1e5", "network.latency=1e-3"
    )
    d = driver(cfg)
    out = []
    for _ in range(rounds):
        evs = d.run_round()
        compute = [e.compute_s for e in evs if e.event == "worker"]
        out.append({**evs[-1].to_dict(), "compute_sum_s": sum(compute)})
    return out


# -- the command in this process ------------------------------------------------------------------------


def train_once(out: Path, settings: dict[str, str]) -> Path:
    """``adloco train`` in this process with ``--set`` for every setting and ``logging.out_dir=out``; asserts
    exit 0 and returns the one run directory it wrote."""
    return train_with_output(out, settings)[0]


def train_with_output(out: Path, settings: dict[str, str]) -> tuple[Path, str]:
    """:func:`train_once`, with what the run printed."""
    args = [a for k, v in {**settings, "logging.out_dir": str(out)}.items() for a in ("--set", f"{k}={v}")]
    ran = run_main("train", *args)
    assert ran.returncode == 0, ran.stderr
    (run,) = list(out.iterdir())
    return run, ran.stdout


@dataclass
class Ran:
    """What a command did in this process: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def run_main(*args: str) -> Ran:
    """``adloco ARGS`` in this process (no interpreter or torch import to pay for), its output captured."""
    import contextlib
    import io

    from adloco.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return Ran(code, out.getvalue(), err.getvalue())


# -- faults injected in this process (tests/faultinject does the same in subprocesses) -------------------


def poison(monkeypatch: Any, worker: int, rounds: tuple[int, int]) -> None:
    """Worker ``worker``'s parameters become non-finite at the end of every round in ``rounds`` (first and
    last, 1-based), before the round synchronizes."""
    from adloco.library.method import AdLoCo

    sync = AdLoCo.sync

    def poisoned(self: AdLoCo, abort: bool = False) -> Any:
        if worker in self.replicas and rounds[0] <= self.round + 1 <= rounds[1]:
            self.replicas[worker].flat.param.data.fill_(float("nan"))
        return sync(self, abort)

    monkeypatch.setattr(AdLoCo, "sync", poisoned)


def out_of_memory(monkeypatch: Any, worker: int, rows: int) -> None:
    """Worker ``worker`` runs out of memory on any micro-batch of more than ``rows`` rows."""
    from adloco.library import replica
    from adloco.library.method import AdLoCo

    init, fb = AdLoCo.__init__, replica.Replica.forward_backward

    def tagged(self: AdLoCo, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        for w, rep in self.replicas.items():
            rep._test_worker = w  # type: ignore[attr-defined]

    def forward_backward(self: replica.Replica, batch: Any, scale: float) -> Any:
        if getattr(self, "_test_worker", None) == worker and replica.n_rows(batch) > rows:
            raise torch.OutOfMemoryError(f"test fault: more than {rows} rows")
        return fb(self, batch, scale)

    monkeypatch.setattr(AdLoCo, "__init__", tagged)
    monkeypatch.setattr(replica.Replica, "forward_backward", forward_backward)


def disk_full(monkeypatch: Any, round_: int) -> None:
    """The checkpoint of round ``round_`` meets a full disk."""
    import errno

    from torch.distributed.checkpoint import filesystem

    from adloco.engine.checkpoint import files

    create = filesystem.FileSystem.create_stream

    def full(self: Any, path: Any, mode: str) -> Any:
        if "w" in mode and files.name(round_) in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return create(self, path, mode)

    monkeypatch.setattr(filesystem.FileSystem, "create_stream", full)


# -- the README's programs ------------------------------------------------------------------------------

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_programs() -> list[str]:
    """The README's Python programs: every ``python`` block of its section on the library in your loop
    (each runs as written, in one process and under torchrun)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Use it in your own loop") :]
    section = section[: section.index("\n## ", 1)]
    blocks = section.split("```python\n")[1:]
    return [b[: b.index("```")] for b in blocks]


# -- the tiny `adloco train` that the command-line tests of every tier run, and its variants -------------

TINY_RUN = {  # 3 rounds of 2 inner steps of llama-micro on a 300-token BPE, merging every round
    "model.name": "llama-micro",
    "data.tokenizer": "bpe:300",
    "data.seq_len": "16",
    "data.val_fraction": "0.2",
    "algorithm.rounds": "3",
    "algorithm.inner_steps": "2",
    "merge.every": "1",
    "batch.initial": "2",
    "switch.b_max": "2",
    "eval.max_examples": "4",
    "batch.eta": "0.3",
}
# progress as lines, and no plots (drawn after a run from its directory: tests/e2e, tests/unit/test_reporting.py)
PLAIN = {"logging.progress": "plain", "logging.plots": "false"}
# what a resume must reproduce: 5 rounds of 3 steps, merging and checkpointed every 2
RESUME_RUN = {
    **TINY_RUN,
    "algorithm.rounds": "5",
    "algorithm.inner_steps": "3",
    "merge.every": "2",
    "eval.max_examples": "8",
    "checkpoint.every": "2",
    **PLAIN,
}
# resized and elastic runs: rounds (and workers and trainers) are each test's, merges at their default
ELASTIC_RUN = {
    **{k: v for k, v in TINY_RUN.items() if k not in ("algorithm.rounds", "merge.every")},
    "eval.max_examples": "8",
    **PLAIN,
    "runtime.timeout": "60",
}


def set_args(settings: dict[str, str], **extra: str) -> list[str]:
    """``--set K=V`` for every setting, ``extra`` keys written with ``__`` for ``.`` winning."""
    merged = {**settings, **{k.replace("__", "."): v for k, v in extra.items()}}
    return [a for k, v in merged.items() for a in ("--set", f"{k}={v}")]


# TINY_RUN in this process, as `K=V` for S(): 2 rounds, nothing printed, drawn or saved beside the records
TINY_QUIET = [
    f"{k}={v}"
    for k, v in {
        **TINY_RUN,
        "algorithm.rounds": "2",
        "logging.progress": "off",
        "logging.plots": "false",
        "logging.save_model": "false",
    }.items()
]
# TINY_RUN in several processes, compared with the same run in one process
TINY_DIST = set_args(
    {**TINY_RUN, **PLAIN},
    runtime__balance="equal",  # bit for bit: shares must not follow timings
    outer__optimizer="nesterov",  # momentum must travel with θ
    logging__tensorboard="off",  # its scalars: tests/e2e/test_cli.py
)


def S(*kv: str) -> list[str]:  # noqa: N802 - reads like the command line
    """``--set`` before every ``K=V``."""
    return [a for x in kv for a in ("--set", x)]


# -- the command in processes of its own, and the run directory it writes ---------------------------------


def process_env() -> dict[str, str]:
    """This environment for an adloco process of its own: one thread a process."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def adloco_process(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``adloco ARGS`` in a process of its own (``python -m adloco``), as a shell runs it; output captured."""
    return subprocess.run(
        [sys.executable, "-m", "adloco", *args],
        capture_output=True,
        text=True,
        env=process_env(),
        timeout=timeout,
    )


FAULTS = Path(__file__).parent / "faultinject"


def with_faults(env: dict[str, str], fault: str | None) -> dict[str, str]:
    """``env`` for a subprocess, with test-only fault injection when ``fault`` is given (the grammar is in
    tests/faultinject/sitecustomize.py)."""
    env = dict(env)
    env.pop("ADLOCO_TEST_FAULT", None)
    if fault:
        env["ADLOCO_TEST_FAULT"] = fault
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(FAULTS), env.get("PYTHONPATH", "")) if x)
    return env


def load_run(out: Path) -> dict[str, Any]:
    """The one run directory in ``out`` (with several processes rank 0 alone writes one), as the tests
    across processes compare it: each round's requests and allocation, the merges, which worker ran in
    which round, the start and summary events, and the saved model's tensors."""
    from safetensors.torch import load_file

    (run,) = list(out.iterdir())
    events = run_events(run)
    return {
        "rounds": [(e["round"], e["requests"], e["allocation"]) for e in events if e["event"] == "round"],
        "merges": [(e["round"], e["merged"], e["survivor"]) for e in events if e["event"] == "merge"],
        "workers": [(e["round"], e["worker"]) for e in events if e["event"] == "worker"],
        "start": next(e for e in events if e["event"] == "start"),
        "summary": json.loads((run / "summary.json").read_text()),
        "params": load_file(run / "model" / "model.safetensors"),
    }


def run_events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def only_run(out: Path) -> Path:
    """The one run directory ``out`` holds."""
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def rounds_logged(run: Path) -> list[int]:
    return [e["round"] for e in run_events(run) if e["event"] == "round"]


def weights(run: Path) -> bytes:
    """The saved model's bytes (equal bytes: a bitwise equal model)."""
    return (run / "model" / "model.safetensors").read_bytes()


def check_whole(run: Path, rounds: int) -> list[dict[str, Any]]:
    """Every round logged once, in order; the run ended; perplexity fell."""
    evs = run_events(run)
    assert [e["round"] for e in evs if e["event"] == "round"] == list(range(1, rounds + 1))
    end = next(e for e in evs if e["event"] == "end")
    assert end["final_val_ppl"] < end["initial_val_ppl"]
    return evs
