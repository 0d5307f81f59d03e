"""One typed config tree: defaults, method presets, a YAML file, ``--set section.key=value`` overrides.

Resolution order (later wins): field defaults -> the preset of ``algorithm.method`` -> the YAML file ->
``--set`` overrides. A preset only fills what the user did not set, so ``method: diloco`` plus
``batch.test: norm`` is a valid experiment. Every field carries a one-line doc (``adloco config`` prints
them) and is validated once, here, with a message that names the field, the value and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import yaml

from adloco.errors import UserError
from adloco.models import sizing


def F(default: Any, doc: str) -> Any:  # noqa: N802 - reads like a declaration
    """A dataclass field with a one-line doc."""
    if isinstance(default, (list, dict)):
        return field(default_factory=partial(copy.copy, default), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass
class ModelConfig:
    name: str = F(
        "llama-tiny",
        f"a preset ({', '.join(sizing.PRESETS)}), a hub name or a local path (a checkpoint)",
    )
    task: Literal["causal_lm", "classification"] = F(
        "causal_lm", "language modelling (perplexity) or classification (accuracy; a labelled data set)"
    )
    init: Literal["same", "independent"] = F(
        "same", "trainer initialization: one seed for all trainers, or one seed per trainer (ALGORITHM.md §3)"
    )
    reinit_output: bool = F(
        False, "re-initialize the output layer of each trainer (the paper, on a checkpoint)"
    )
    precision: Literal["fp32", "bf16", "fp16"] = F(
        "fp32", "CUDA only: mixed precision (fp16 with dynamic loss scaling); parameters stay float32"
    )
    trust_remote_code: bool = F(
        False, "allow a hub model or tokenizer to run its own code (off unless asked)"
    )


@dataclass
class DataConfig:
    source: str = F(
        "stdlib", "'stdlib', a local file or folder (txt, md, jsonl, csv, parquet), or a hub dataset"
    )
    hub_config: str | None = F(None, "hub dataset configuration (C4: 'en')")
    split: str = F("train", "hub dataset split to train on")
    val_split: str | None = F(None, "hub dataset split to validate on (default: hold out val_fraction)")
    streaming: bool = F(True, "stream a hub dataset instead of downloading it whole")
    text_field: str = F("text", "field holding the text in jsonl, csv, parquet and hub rows")
    label_field: str = F("label", "field holding the label (model.task: classification)")
    tokenizer: str = F(
        "bpe:4096",
        "'bpe:<vocab size>' trained on the train split, a hub name or a local path; "
        "unset with a checkpoint model.name: the checkpoint's own",
    )
    seq_len: int = F(128, "tokens per example (LM: documents packed with EOS between; classification: cut)")
    val_fraction: float = F(
        0.05, "share of documents held out for validation, chosen by a hash of their name"
    )
    max_examples: int | None = F(None, "read at most this many documents (the paper's data_sample_size)")
    subset_fraction: float = F(
        1.0, "share of the training examples each trainer draws from (ALGORITHM.md §3)"
    )
    cache_dir: str | None = F(None, "tokenizer and token cache (default: $ADLOCO_CACHE or ~/.cache/adloco)")


@dataclass
class AlgorithmConfig:
    method: Literal["adloco", "diloco", "localsgd", "ddp"] = F(
        "adloco", "the method (ddp: gradients averaged every step); sets the other sections' defaults"
    )
    rounds: int = F(12, "outer rounds (every worker runs H inner steps, then every trainer steps)")
    inner_steps: int = F(12, "H: inner OPTIMIZER steps per round (never micro-batches)")
    workers: int = F(4, "N: compute slots that run inner steps")
    trainers: int = F(4, "K0: model instances at start (each owns >= 1 workers)")
    seed: int = F(0, "seed of every random stream, keyed by (seed, trainer, worker, round)")
    budget: int | None = F(
        None, "stop after the round in which this many training examples were processed (null: all rounds)"
    )


@dataclass
class InnerConfig:
    optimizer: Literal["adamw", "sgd"] = F("adamw", "inner optimizer of every worker")
    lr: float = F(4e-3, "peak inner learning rate")
    weight_decay: float = F(0.1, "decoupled weight decay on matrices (not on norms or biases)")
    betas: list[float] = F([0.9, 0.95], "AdamW betas")
    momentum: float = F(0.9, "SGD momentum (inner optimizer sgd)")
    warmup_fraction: float = F(0.05, "linear warmup over this share of all inner steps")
    schedule: Literal["cosine", "constant"] = F("cosine", "learning-rate decay after warmup")
    min_lr_ratio: float = F(0.1, "cosine decays to lr * min_lr_ratio")
    clip: float = F(1.0, "clip the inner gradient to this global norm (0: off)")
    state: Literal["keep", "reset"] = F(
        "keep", "inner optimizer state across rounds: keep (DiLoCo) or reset every round (reference)"
    )


@dataclass
class OuterConfig:
    optimizer: Literal["average", "sgd", "nesterov"] = F(
        "average", "outer step on the pseudo-gradient (ALGORITHM.md §1)"
    )
    lr: float = F(0.7, "outer learning rate (sgd, nesterov)")
    momentum: float = F(0.9, "outer Nesterov momentum")


@dataclass
class BatchConfig:
    test: Literal["norm", "inner_product", "augmented_inner_product", "none"] = F(
        "norm", "adaptive batch test (ALGORITHM.md §2); none keeps the request constant but logs statistics"
    )
    initial: int = F(4, "initial request b (per-worker batch size)")
    max: int = F(32, "cap on any request")
    eta: float = F(0.65, "norm test parameter η (ALGORITHM.md §2.1; the paper uses 0.8)")
    vartheta: float = F(0.01, "inner-product test parameter (ALGORITHM.md §2.2)")
    nu: float = F(0.3, "orthogonality test parameter (ALGORITHM.md §2.3)")
    estimator: Literal["pooled", "paper"] = F(
        "pooled",
        "gradient samples: pooled chunks at the round's common point, or each worker's last gradient (ALGORITHM.md §2.5)",
    )
    probe_chunks: int = F(
        8,
        "pooled estimator: chunks per step batch (k = min(e, probe_chunks), e the trainer's smallest; ALGORITHM.md §2.5)",
    )
    statistics: bool = F(
        True,
        "probe gradient statistics every round even when test is none (k small backward passes at step 1)",
    )
    exact_mean: bool = F(
        False,
        "norm test: all-reduce the trainer's mean probe gradient (P values) instead of scalars only",
    )
    formula: Literal["spec", "reference"] = F(
        "spec",
        "spec: the inner-product tests as ALGORITHM.md §2.2–2.4 writes them; reference: the reference "
        "implementation's (ν in both, no c or 1/M, per-entry variance; ALGORITHM.md §9.1)",
    )


@dataclass
class MergeConfig:
    policy: Literal["smallest", "largest_with_smallest", "none"] = F(
        "smallest", "which trainers merge (ALGORITHM.md §3); none disables merging"
    )
    every: int = F(2, "merge every f rounds while more than one trainer is alive")
    size: int = F(2, "|S|: trainers merged into one at each merge")
    survivor_batch: Literal["max", "own"] = F(
        "max", "request of the merged trainer: max over the merged, or the survivor's own"
    )
    allocation: Literal["requests", "demand"] = F(
        "requests",
        "workers shared in proportion to requests, or to workers x request (reference; ALGORITHM.md §4)",
    )


@dataclass
class SwitchConfig:
    mode: Literal["threshold", "accumulate", "cap"] = F(
        "threshold", "gradient accumulation policy (ALGORITHM.md §5)"
    )
    kappa: float = F(2.0, "threshold mode: accumulate only when b > kappa * b_max")
    schedule: Literal["fixed", "reference"] = F(
        "fixed", "fixed: always `mode`; reference: accumulate while >1 trainer lives, then threshold"
    )
    b_max: int | None = F(
        None,
        "largest micro-batch of one worker; null: on CUDA searched under memory_fraction of free memory, on CPU 8",
    )
    memory_fraction: float = F(
        0.85,
        "CUDA b_max search: share of the free memory that one micro-batch's step and every local worker's "
        "optimizer and batch-test state may fill (ALGORITHM.md §5)",
    )


@dataclass
class EvalConfig:
    every: int = F(1, "evaluate validation loss and perplexity every this many rounds")
    max_examples: int | None = F(
        128, "validation examples evaluated, spread evenly over the held-out split (null: all of it)"
    )
    batch_size: int = F(32, "validation examples per forward pass")


@dataclass
class RuntimeConfig:
    backend: Literal["auto", "inprocess", "torchdist"] = F(
        "auto",
        "inprocess: every worker in this process; torchdist: torch.distributed (auto: when launched by torchrun)",
    )
    workers_per_process: int = F(1, "torchdist: workers hosted by each process (they share its device)")
    dist_backend: Literal["auto", "nccl", "gloo"] = F(
        "auto",
        "torchdist: NCCL on CUDA, gloo on CPU (auto: gloo also when processes share a GPU, which NCCL refuses)",
    )
    device: Literal["auto", "cpu", "cuda"] = F("auto", "auto picks cuda when available")
    threads: int = F(
        0,
        "torch CPU threads per process (0: torch's default in-process; cores / local processes with torchdist)",
    )
    timeout: float = F(
        600.0, "torchdist: seconds a collective may wait before the run stops naming the silent rank"
    )
    balance: Literal["speed", "equal"] = F(
        "speed",
        "share each trainer's examples per step among its workers by measured speed (and workers among "
        "trainers by capacity; ALGORITHM.md §9.3), or equally",
    )
    emulate_speed: list[float] = F(
        [],
        "emulation of heterogeneous devices: worker w takes 1/s_w as long per step by sleeping (empty: none)",
    )


@dataclass
class CommConfig:
    dtype: Literal["float32", "bfloat16", "float16", "int8", "int4"] = F(
        "float32",
        "what is all-reduced each round (Δ, probe and DDP gradients) travels as; θ always in float32 (ALGORITHM.md §9.4)",
    )
    block: int = F(256, "int8/int4: values per absmax scale (a 4-byte scale per block)")
    error_feedback: bool = F(
        False,
        "each worker adds what quantization dropped from its Δ to its next round's Δ (ALGORITHM.md §9.4)",
    )


@dataclass
class NetworkConfig:
    bandwidth: float = F(125e6, "simulated time: bytes per second of every link (125e6: 1 Gbit/s)")
    latency: float = F(1e-3, "simulated time: seconds per message hop")


@dataclass
class CheckpointConfig:
    every: int = F(2, "write a full-state checkpoint every this many rounds (0: only at the end)")
    keep: int = F(
        2, "checkpoints kept, newest first; an older one is deleted only once a newer one is complete"
    )


@dataclass
class ElasticConfig:
    batch: Literal["per_trainer", "per_worker"] = F(
        "per_trainer",
        "when the number of workers changes: keep each trainer's examples per step (M·b) or each worker's b",
    )
    checkpoint_every: int = F(
        1,
        "in elastic runs (torchrun or adloco train --nproc with --max-restarts): checkpoint every this many rounds",
    )
    timeout: float = F(
        60.0,
        "in elastic runs: seconds a collective may wait for a silent peer before the processes exit to be "
        "restarted (runtime.timeout still bounds start-up)",
    )


@dataclass
class FaultsConfig:
    max_bad_rounds: int = F(
        3,
        "stop (with a checkpoint) after this many consecutive rounds with a non-finite worker loss or update",
    )


@dataclass
class LoggingConfig:
    out_dir: str = F("runs", "parent folder of run directories")
    name: str | None = F(None, "run name (default: the method); the folder is <name>-<timestamp>")
    progress: Literal["auto", "rich", "plain", "off"] = F(
        "auto", "live progress: rich on a terminal, one line a round otherwise"
    )
    plots: bool = F(True, "draw PNG plots into the run directory at the end")
    tensorboard: Literal["auto", "on", "off"] = F(
        "auto", "TensorBoard scalars in <run>/tensorboard: auto when the tensorboard package is installed"
    )
    save_model: bool = F(True, "save the final model and tokenizer (Hugging Face format)")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    inner: InnerConfig = field(default_factory=InnerConfig)
    outer: OuterConfig = field(default_factory=OuterConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    merge: MergeConfig = field(default_factory=MergeConfig)
    switch: SwitchConfig = field(default_factory=SwitchConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


SECTIONS: list[str] = [f.name for f in dataclasses.fields(Config)]
BENCH = "bench"  # `adloco bench`'s own section of a config file; every other command ignores it

# What ``adloco train --resume`` may change with ``--set``: how long the run goes, learning rates and
# clipping, the number of workers (ALGORITHM.md §9.2), the token cache, and whole sections that leave the
# math alone. An entry ending in "." is a whole section. Everything else (model, data, method, seed ...) is
# the checkpoint's. RESUMABLE_TEXT says the same in words for the --resume help, the refusal and the README.
RESUMABLE: tuple[str, ...] = (
    "algorithm.rounds",
    "algorithm.budget",
    "algorithm.workers",
    "inner.lr",
    "inner.clip",
    "outer.lr",
    "data.cache_dir",
    "eval.",
    "checkpoint.",
    "elastic.",
    "faults.",
    "network.",
    "logging.",
    "runtime.",
)


def _resumable_text(entries: tuple[str, ...]) -> str:
    keys = [e for e in entries if not e.endswith(".")]
    sections = [e[:-1] for e in entries if e.endswith(".")]
    return f"{', '.join(keys)} and the {', '.join(sections[:-1])} and {sections[-1]} sections"


RESUMABLE_TEXT = _resumable_text(RESUMABLE)

# Method presets (ALGORITHM.md §6). They fill only the keys the user leaves unset.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "adloco": {},
    "diloco": {
        "algorithm": {"trainers": 1},
        "outer": {"optimizer": "nesterov", "lr": 0.7, "momentum": 0.9},
        "batch": {"test": "none", "statistics": False},
        "merge": {"policy": "none"},
    },
    "ddp": {
        "algorithm": {"trainers": 1},
        "outer": {"optimizer": "average"},
        "batch": {"test": "none", "statistics": False},
        "merge": {"policy": "none"},
    },
    "localsgd": {
        "algorithm": {"trainers": 1},
        # Stich (2019): plain SGD inside, no momentum
        "inner": {"optimizer": "sgd", "lr": 0.2, "weight_decay": 0.0, "momentum": 0.0},
        "outer": {"optimizer": "average"},
        "batch": {"test": "none", "statistics": False},
        "merge": {"policy": "none"},
    },
}


# --------------------------------------------------------------------------------------------------
# Parsing and validation
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawText:
    """A ``--set`` value: the text as typed and its YAML reading."""

    text: str
    parsed: Any

    def __repr__(self) -> str:
        return repr(self.parsed)


_BOOL_WORDS = {False: {"off", "no", "false"}, True: {"on", "yes", "true"}}


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_describe(a) for a in args) + " or null"
    if origin is list:
        (inner,) = typing.get_args(tp)
        return f"a list of {_describe(inner)}s"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any) -> Any:
    """Return ``value`` as type ``tp`` or raise ValueError (the caller words the message)."""
    origin = typing.get_origin(tp)
    if isinstance(value, RawText):
        # a --set value: string fields take the text as typed, others its YAML reading
        textual = tp is str or (origin is Literal and all(isinstance(a, str) for a in typing.get_args(tp)))
        return _coerce(value.text if textual else value.parsed, tp)
    if origin is Literal:
        if isinstance(value, bool):  # YAML 1.1 reads off/on/no/yes as booleans
            spelled = [a for a in typing.get_args(tp) if str(a).lower() in _BOOL_WORDS[value]]
            if len(spelled) == 1:
                return spelled[0]
        if value in typing.get_args(tp):
            return value
        raise ValueError
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg)
            except ValueError:
                continue
        raise ValueError
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ValueError
        return [_coerce(v, inner) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ValueError
    if tp is int:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 4e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ValueError from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError
        value = float(value)
        if not math.isfinite(value):
            raise ValueError
        return value
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError
    raise TypeError(f"unsupported config type {tp}")


# Keys that were renamed or replaced: the line says where they went.
REPLACED = {
    "runtime.worker_speeds": "replaced by runtime.emulate_speed (workers really run slower; simulated time "
    "then prices their measured compute)",
}


def _unknown(kind: str, name: str, known: list[str]) -> UserError:
    if name in REPLACED:
        return UserError(f"config: {name}: {REPLACED[name]}")
    close = difflib.get_close_matches(name.split(".")[-1], known, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return UserError(f"config: unknown {kind} '{name}'{hint} (allowed: {', '.join(known)})")


def _apply(cfg: Config, raw: dict[str, Any]) -> None:
    """Set every (section, key) of ``raw`` (sections checked by :func:`_sections`), coerced and checked."""
    for section, values in raw.items():
        obj = getattr(cfg, section)
        hints = typing.get_type_hints(type(obj))
        for key, value in values.items():
            if key not in hints:
                raise _unknown("key", f"{section}.{key}", list(hints))
            try:
                setattr(obj, key, _coerce(value, hints[key]))
            except ValueError:
                raise UserError(
                    f"config: {section}.{key} = {value!r}: must be {_describe(hints[key])}"
                ) from None


def _first_key(section: str) -> tuple[str, Any]:
    """A section's first key and its default, for examples in messages."""
    obj = getattr(Config(), section)
    first = dataclasses.fields(obj)[0].name
    return first, getattr(obj, first)


def _sections(raw: Any, origin: str) -> dict[str, dict[str, Any]]:
    """The sections of a file or mapping: known names, each a mapping of keys (an empty one is none).
    ``bench`` is ``adloco bench``'s own section: other commands accept it and ignore it."""
    if not isinstance(raw, dict):
        raise UserError(
            f"{origin}: the top level must be a mapping of sections ({', '.join(SECTIONS)}), got {_kind(raw)}"
        )
    out: dict[str, dict[str, Any]] = {}
    for section, values in raw.items():
        if section == BENCH:
            continue
        if section not in SECTIONS:
            raise _unknown("section", str(section), SECTIONS)
        if values is None:
            values = {}
        if not isinstance(values, dict):
            key, default = _first_key(section)
            raise UserError(
                f"{origin}: {section} = {values!r}: a section must be a mapping of its keys, "
                f"e.g. '{section}: {{{key}: {default}}}'"
            )
        out[section] = values
    return out


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true or false"}.get(
        type(value), type(value).__name__
    )


def _check(cfg: Config, resuming: bool = False) -> None:
    """Range checks: one message per violation, naming the field, value and what is allowed."""

    def need(ok: bool, name: str, value: Any, allowed: str) -> None:
        if not ok:
            raise UserError(f"config: {name} = {value!r}: must be {allowed}")

    a, d, b, s = cfg.algorithm, cfg.data, cfg.batch, cfg.switch
    need(bool(cfg.model.name.strip()), "model.name", cfg.model.name, "a preset, a hub name or a local path")
    need(a.rounds >= 1, "algorithm.rounds", a.rounds, ">= 1")
    need(a.inner_steps >= 1, "algorithm.inner_steps", a.inner_steps, ">= 1 (H counts optimizer steps)")
    need(a.workers >= 1, "algorithm.workers", a.workers, ">= 1")
    need(a.trainers >= 1, "algorithm.trainers", a.trainers, ">= 1")
    need(0 <= a.seed < 2**31, "algorithm.seed", a.seed, "in [0, 2**31)")
    need(
        resuming or a.trainers <= a.workers,
        "algorithm.trainers",
        a.trainers,
        f"<= algorithm.workers ({a.workers}): every trainer needs at least one worker",
    )
    need(d.seq_len >= 2, "data.seq_len", d.seq_len, ">= 2")
    need(0.0 < d.val_fraction < 1.0, "data.val_fraction", d.val_fraction, "between 0 and 1 (exclusive)")
    need(0.0 < d.subset_fraction <= 1.0, "data.subset_fraction", d.subset_fraction, "in (0, 1]")
    need(d.max_examples is None or d.max_examples >= 2, "data.max_examples", d.max_examples, ">= 2 or null")
    if d.tokenizer.startswith("bpe:") and (
        not d.tokenizer[4:].isdigit() or not 260 <= int(d.tokenizer[4:]) <= 1_000_000
    ):
        raise UserError(
            f"config: data.tokenizer = {d.tokenizer!r}: must be 'bpe:<vocab size>' with a vocab size in [260, 1000000]"
        )
    need(
        bool(d.tokenizer.strip()),
        "data.tokenizer",
        d.tokenizer,
        "'bpe:<vocab size>', a hub name or a local path",
    )
    need(bool(d.text_field), "data.text_field", d.text_field, "a field name")
    i = cfg.inner
    need(i.lr > 0, "inner.lr", i.lr, "> 0")
    need(i.weight_decay >= 0, "inner.weight_decay", i.weight_decay, ">= 0")
    need(
        len(i.betas) == 2 and all(0 <= x < 1 for x in i.betas),
        "inner.betas",
        i.betas,
        "two numbers in [0, 1)",
    )
    need(0 <= i.momentum < 1, "inner.momentum", i.momentum, "in [0, 1)")
    need(0 <= i.warmup_fraction < 1, "inner.warmup_fraction", i.warmup_fraction, "in [0, 1)")
    need(0 <= i.min_lr_ratio <= 1, "inner.min_lr_ratio", i.min_lr_ratio, "in [0, 1]")
    need(i.clip >= 0, "inner.clip", i.clip, ">= 0 (0 turns clipping off)")
    o = cfg.outer
    need(o.lr > 0, "outer.lr", o.lr, "> 0")
    need(0 <= o.momentum < 1, "outer.momentum", o.momentum, "in [0, 1)")
    need(b.initial >= 1, "batch.initial", b.initial, ">= 1")
    need(b.max >= b.initial, "batch.max", b.max, f">= batch.initial ({b.initial})")
    need(b.max <= 1_048_576, "batch.max", b.max, "<= 1048576")
    need(b.eta > 0, "batch.eta", b.eta, "> 0")
    need(b.vartheta > 0, "batch.vartheta", b.vartheta, "> 0")
    need(b.nu > 0, "batch.nu", b.nu, "> 0")
    need(b.probe_chunks >= 2, "batch.probe_chunks", b.probe_chunks, ">= 2")
    m = cfg.merge
    need(m.every >= 1, "merge.every", m.every, ">= 1")
    need(m.size >= 2, "merge.size", m.size, ">= 2")
    need(s.kappa >= 1, "switch.kappa", s.kappa, ">= 1")
    need(
        s.b_max is None or 1 <= s.b_max <= 1_048_576, "switch.b_max", s.b_max, ">= 1 and <= 1048576, or null"
    )
    need(0 < s.memory_fraction <= 1, "switch.memory_fraction", s.memory_fraction, "in (0, 1]")
    need(1 <= cfg.comm.block <= 1 << 24, "comm.block", cfg.comm.block, "between 1 and 16777216 values")
    c = cfg.checkpoint
    need(0 <= c.every <= 1_000_000, "checkpoint.every", c.every, ">= 0 (0: only at the end)")
    need(1 <= c.keep <= 1000, "checkpoint.keep", c.keep, "between 1 and 1000")
    need(
        1 <= cfg.elastic.timeout <= 86400,
        "elastic.timeout",
        cfg.elastic.timeout,
        "between 1 and 86400 seconds",
    )
    need(
        1 <= cfg.elastic.checkpoint_every <= 1_000_000,
        "elastic.checkpoint_every",
        cfg.elastic.checkpoint_every,
        ">= 1 (an elastic run loses at most this many rounds)",
    )
    need(cfg.faults.max_bad_rounds >= 1, "faults.max_bad_rounds", cfg.faults.max_bad_rounds, ">= 1")
    e = cfg.eval
    need(e.every >= 1, "eval.every", e.every, ">= 1")
    need(e.max_examples is None or e.max_examples >= 1, "eval.max_examples", e.max_examples, ">= 1 or null")
    need(e.batch_size >= 1, "eval.batch_size", e.batch_size, ">= 1")
    rt = cfg.runtime
    need(0 <= rt.threads <= 4096, "runtime.threads", rt.threads, "in [0, 4096]")
    need(rt.workers_per_process >= 1, "runtime.workers_per_process", rt.workers_per_process, ">= 1")
    need(
        a.workers % rt.workers_per_process == 0,
        "runtime.workers_per_process",
        rt.workers_per_process,
        f"a divisor of algorithm.workers ({a.workers})",
    )
    need(1 <= rt.timeout <= 86400, "runtime.timeout", rt.timeout, "between 1 and 86400 seconds")
    need(a.budget is None or a.budget >= 1, "algorithm.budget", a.budget, ">= 1 or null")
    need(
        not rt.emulate_speed
        or (len(rt.emulate_speed) == a.workers and all(0 < x <= 1 for x in rt.emulate_speed)),
        "runtime.emulate_speed",
        rt.emulate_speed,
        f"empty or {a.workers} numbers in (0, 1] (one per worker: 0.5 takes twice as long)",
    )
    n = cfg.network
    need(n.bandwidth > 0, "network.bandwidth", n.bandwidth, "> 0 (bytes per second)")
    need(n.latency >= 0, "network.latency", n.latency, ">= 0 (seconds)")
    name = cfg.logging.name
    need(
        name is None or (re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) is not None and len(name) <= 100),
        "logging.name",
        name,
        "a plain name of letters, digits, '.', '_' or '-' (no '/'), at most 100 characters",
    )


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value), the value read as YAML (``3`` is an int)."""
    path, eq, raw = text.partition("=")
    path = path.strip()
    if path in SECTIONS:
        key, default = _first_key(path)
        raise UserError(
            f"--set {text!r}: {path!r} is a section; set one of its keys, e.g. --set {path}.{key}={default}"
        )
    if not eq:
        raise UserError(f"--set {text!r}: must look like section.key=value")
    parts = path.split(".")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"--set {text!r}: the key must be section.key, e.g. batch.eta=0.5")
    if parts[0] == BENCH:
        raise UserError(
            f"--set {text!r}: the bench section is read by `adloco bench` only, from its config file "
            "(or its --budget and --target options)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts[0], parts[1], RawText(raw.strip(), value)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's mapping of sections, as written (checked by :func:`resolve`)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file {str(p)!r}: " + ("a folder, not a file" if p.is_dir() else "not found"))
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise UserError(f"config file {str(p)!r}: malformed YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"config file {str(p)!r}: not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"config file {str(p)!r}: cannot be read ({exc.strerror})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(
            f"config file {str(p)!r}: the top level must be a mapping of sections ({', '.join(SECTIONS)}), "
            f"got {_kind(raw)}"
        )
    return raw


def resolve(
    file: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
    resuming: bool = False,
) -> Config:
    """Build the resolved config: defaults -> method preset -> ``base``/file -> overrides.

    ``resuming``: the config of a run that continues (its trainers may now outnumber its workers: they
    merge, ALGORITHM.md §9.2).

    With a checkpoint as ``model.name`` and ``data.tokenizer`` unset, the tokenizer is the checkpoint's.
    """
    user: dict[str, dict[str, Any]] = {}
    for raw, origin in (
        (base, "config"),
        (load_yaml(file) if file is not None else None, f"config file {str(file)!r}"),
    ):
        if raw is not None:
            for section, values in _sections(raw, origin).items():
                user.setdefault(section, {}).update(values)
    for text in overrides or []:
        section, key, value = parse_override(text)
        if section not in SECTIONS:
            raise _unknown("section", section, SECTIONS)
        user.setdefault(section, {})[key] = value

    cfg = Config()
    # The method decides the preset, so read it first (validated like any other key).
    _apply(cfg, {"algorithm": {"method": user.get("algorithm", {}).get("method", "adloco")}})
    _apply(cfg, PRESETS[cfg.algorithm.method])
    _apply(cfg, user)
    if "tokenizer" not in user.get("data", {}) and cfg.model.name not in sizing.PRESETS:
        cfg.data.tokenizer = cfg.model.name  # a checkpoint: its own tokenizer, not one trained anew
    _check(cfg, resuming)
    check_memory(cfg)
    return cfg


def field_docs() -> list[tuple[str, str, Any, str]]:
    """(section, key, default, doc) for every field, in declaration order; a choice field's doc begins
    with its allowed values (``(norm | inner_product | ...)``)."""
    out = []
    cfg = Config()
    for sec in dataclasses.fields(Config):
        obj = getattr(cfg, sec.name)
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            doc = f.metadata.get("doc", "")
            if typing.get_origin(hints[f.name]) is Literal:
                doc = f"({' | '.join(map(str, typing.get_args(hints[f.name])))}) {doc}"
            out.append((sec.name, f.name, getattr(obj, f.name), doc))
    return out


def dump_yaml(cfg: Config, with_docs: bool = False, section: str | None = None) -> str:
    """The resolved config as YAML (one ``section`` of it, if given); with ``with_docs`` every key carries
    its doc as a comment."""
    tree = cfg.to_dict()
    if section is not None:
        if section == BENCH:
            raise UserError(
                "config: bench is `adloco bench`'s own section (budget, target, methods), read from its "
                "config file; see adloco bench --help"
            )
        if section not in tree:
            raise _unknown("section", section, SECTIONS)
        tree = {section: tree[section]}
    if not with_docs:
        return yaml.safe_dump(tree, sort_keys=False)
    lines: list[str] = []
    docs = {(s, k): d for s, k, _, d in field_docs()}
    for name, values in tree.items():
        lines.append(f"{name}:")
        for key, value in values.items():
            rendered = yaml.safe_dump({key: value}, default_flow_style=True, sort_keys=False).strip()
            rendered = rendered[1:-1] if rendered.startswith("{") else rendered
            lines.append(f"  {rendered:<34} # {docs[(name, key)]}")
    return "\n".join(lines) + "\n"


def check_memory(cfg: Config) -> None:
    """Refuse a config whose preset model cannot fit where it will run (a checkpoint's size is known only
    once it is loaded): one line naming the field that makes it too large, the estimate and the memory."""
    shape = sizing.PRESETS.get(cfg.model.name)
    if shape is None:
        return
    a, d, b, s, rt = cfg.algorithm, cfg.data, cfg.batch, cfg.switch, cfg.runtime
    bpe = d.tokenizer.startswith("bpe:") and d.tokenizer[4:].isdigit()
    vocab = int(d.tokenizer[4:]) if bpe else 0  # another tokenizer's size is known once it is loaded
    logits = vocab if cfg.model.task == "causal_lm" else 0
    n_params = sizing.llama_parameters(shape, vocab)
    layers = int(shape["num_hidden_layers"])
    # Replicas where the run puts them: in-process every worker in this process; under torchrun each
    # process hosts workers_per_process (and LOCAL_WORLD_SIZE processes share this machine). An --nproc
    # parent resolves in-process, and its children all run here.
    inprocess = rt.backend == "inprocess" or (rt.backend == "auto" and "WORLD_SIZE" not in os.environ)
    per_process = a.workers if inprocess else rt.workers_per_process
    here = per_process * (1 if inprocess else int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    # The largest micro-batch the run may form: requests grow to batch.max unless the test is off, and a
    # worker runs at most b_max rows at once (null: 8 on CPU, searched to fit on CUDA).
    request = b.initial if b.test == "none" else b.max
    b_max = s.b_max if s.b_max is not None else (8 if rt.device == "cpu" else 1)
    micro = min(request, b_max)
    eval_rows = min(cfg.eval.batch_size, cfg.eval.max_examples or cfg.eval.batch_size)
    # The inner-product tests with the pooled estimator keep a gradient per probe chunk: k of them, k the
    # request's examples up to batch.probe_chunks (probe_chunks single examples when a request is 1).
    kept = b.test in ("inner_product", "augmented_inner_product") and b.estimator == "pooled"
    chunks = (min(request, b.probe_chunks) if request >= 2 else b.probe_chunks) if kept else 0

    def at(replicas: int) -> tuple[sizing.Estimate, sizing.Estimate]:
        opt = (cfg.inner.optimizer, cfg.inner.momentum, min(a.trainers, replicas), layers)
        per_token = sizing.activation_bytes_per_token(shape, logits)
        train = sizing.estimate(n_params, replicas, *opt, micro, request, d.seq_len, per_token, chunks)
        val = sizing.estimate(n_params, replicas, *opt)
        # validation keeps no activations, but a whole batch's logits and their log-softmax
        return train, sizing.Estimate(
            replicas, n_params, val.state, eval_rows * d.seq_len * 2 * sizing.FLOAT * logits
        )

    train, val = at(here)
    available, where = sizing.physical_memory(), "this machine has"
    if max(train.total, val.total) > available and rt.device != "cpu":
        gpu = sizing.cuda_memory()  # the replicas may live on a GPU with more memory than this machine
        if gpu is not None:
            (train, val), available, where = at(per_process), gpu, "the GPU has"
    name = cfg.model.name
    if train.state > available:
        if chunks > 2 + sizing.optimizer_buffers(cfg.inner.optimizer, cfg.inner.momentum):
            field, value = (
                ("batch.probe_chunks", b.probe_chunks) if chunks == b.probe_chunks else ("batch.max", b.max)
            )
        else:
            field, value = "algorithm.workers", a.workers
        sizing.refuse_if_over(train, available, where, field, value, name)
    if micro <= d.seq_len:
        field, value = "data.seq_len", d.seq_len
    elif s.b_max is not None and s.b_max < request:
        field, value = "switch.b_max", s.b_max
    else:
        field, value = ("batch.initial", b.initial) if b.test == "none" else ("batch.max", b.max)
    what = f"a micro-batch of {micro:,} x {d.seq_len:,} tokens through {name}"
    sizing.refuse_if_over(train, available, where, field, value, what)
    what = f"a validation batch of {eval_rows:,} x {d.seq_len:,} tokens through {name}"
    sizing.refuse_if_over(val, available, where, "eval.batch_size", cfg.eval.batch_size, what)
