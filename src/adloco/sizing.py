"""Model shapes and what a run of them costs in memory, known before anything is built.

The presets are Llama shapes (the vocabulary comes from the tokenizer). :func:`estimate` is a pure
function of the parameter count, the replicas, the optimizer and the micro-batch, and a lower bound:
float32 parameters, gradients and optimizer state of every worker's replica, one θ per trainer, the
Python objects of each replica, and, when the shape is known, the activations one micro-batch keeps
for its backward pass. A run whose lower bound exceeds the memory it will run in cannot fit, so it is
refused before a single replica is built (building a million of them would otherwise run for hours
and end in the kernel's out-of-memory killer). :func:`check_config` applies it to a preset at config
time; the engine can call :func:`estimate` and :func:`refuse_if_over` once the model is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adloco.errors import UserError

if TYPE_CHECKING:
    from adloco.config import Config

# Llama shapes built from a config only. Vocabulary size comes from the tokenizer.
PRESETS: dict[str, dict[str, Any]] = {
    # ~1.4M parameters with a 4096-token vocabulary: ~12k tokens/s on 2 CPU cores.
    "llama-tiny": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=384,
        tie_word_embeddings=True,
    ),
    # ~11M parameters with a 4096-token vocabulary.
    "llama-10m": dict(
        hidden_size=320,
        num_hidden_layers=8,
        num_attention_heads=5,
        num_key_value_heads=5,
        intermediate_size=864,
        tie_word_embeddings=True,
    ),
    # ~28M parameters with a 4096-token vocabulary.
    "llama-30m": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        intermediate_size=1408,
        tie_word_embeddings=True,
    ),
    # The shape of MicroLlama (the paper's model): ~305M parameters with its 32000-token vocabulary.
    "microllama-300m": dict(
        hidden_size=1024,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=4,
        intermediate_size=5632,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        max_position_embeddings=2048,
    ),
    # A few thousand parameters: for tests and smoke runs only.
    "llama-micro": dict(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=32,
        tie_word_embeddings=True,
    ),
}

FLOAT = 4  # bytes: parameters, gradients, optimizer state and activations are float32
REPLICA_OBJECTS_PER_LAYER = 64 * 1024  # bytes of Python objects (modules, views) per layer of a replica


def llama_parameters(shape: Mapping[str, Any], vocab_size: int) -> int:
    """Parameters of a Llama of ``shape`` (a preset's keys) with ``vocab_size`` embedding rows."""
    h, inter = int(shape["hidden_size"]), int(shape["intermediate_size"])
    heads, kv = int(shape["num_attention_heads"]), int(shape["num_key_value_heads"])
    head_dim = int(shape.get("head_dim") or h // heads)
    attention = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o and k, v projections
    layer = attention + 3 * h * inter + 2 * h  # gate, up, down; two norms
    embeddings = vocab_size * h * (1 if shape.get("tie_word_embeddings", True) else 2)
    return int(shape["num_hidden_layers"]) * layer + embeddings + h  # final norm


def activation_bytes_per_token(shape: Mapping[str, Any], vocab_size: int) -> int:
    """A lower bound on what one token keeps for the backward pass: per layer the norms' outputs, the
    attention projections and the MLP's hidden units; the logits and their log-softmax."""
    h, inter, layers = (
        int(shape["hidden_size"]),
        int(shape["intermediate_size"]),
        int(shape["num_hidden_layers"]),
    )
    return FLOAT * (layers * (4 * h + 3 * inter) + h + 2 * vocab_size)


def optimizer_buffers(optimizer: str, momentum: float = 0.0) -> int:
    """Per-parameter state buffers of the inner optimizer: AdamW two, SGD one with momentum."""
    if optimizer == "adamw":
        return 2
    return 1 if momentum > 0 else 0


@dataclass(frozen=True)
class Estimate:
    """A lower bound on the memory of one machine's (or one device's) share of a run, in bytes."""

    replicas: int
    n_params: int
    state: int  # parameters, gradients and optimizer state of every replica, θ of every trainer
    step: int  # one micro-batch's activations and one inner step's token ids
    probe_gradients: int = 0  # gradients each replica keeps for a batch test, counted in ``state``

    @property
    def total(self) -> int:
        return self.state + self.step


def estimate(
    n_params: int,
    replicas: int,
    optimizer: str = "adamw",
    momentum: float = 0.0,
    trainers: int = 0,
    layers: int = 0,
    micro_batch: int = 0,
    step_rows: int = 0,
    seq_len: int = 0,
    per_token: int = 0,
    probe_gradients: int = 0,
) -> Estimate:
    """The lower bound for ``replicas`` worker replicas of an ``n_params`` model and ``trainers`` θ.

    ``per_token``: activation bytes one token keeps (:func:`activation_bytes_per_token`; 0 when the shape
    is unknown); ``micro_batch`` rows of ``seq_len`` tokens run at once; ``step_rows`` rows are read per
    inner step (token ids, int64); ``probe_gradients``: gradients each replica keeps for a batch test
    (the inner-product tests keep every probe chunk's).
    """
    buffers = 2 + optimizer_buffers(optimizer, momentum) + probe_gradients
    objects = REPLICA_OBJECTS_PER_LAYER * (layers + 1)
    state = replicas * (buffers * FLOAT * n_params + objects) + trainers * FLOAT * n_params
    step = micro_batch * seq_len * per_token + step_rows * seq_len * 8
    return Estimate(replicas, n_params, state, step, probe_gradients)


def physical_memory() -> int:
    """Bytes of memory this machine has (psutil when installed, else sysconf)."""
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.virtual_memory().total)
    except ImportError:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cuda_memory() -> int | None:
    """Bytes of the largest visible CUDA device, or None without one (imports torch: call it rarely)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return max(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def gib(n: float) -> str:
    """Bytes for people: '~1.2 GiB', '~3,456 GiB'."""
    g = n / 2**30
    return f"{g:,.1f} GiB" if g < 100 else f"{g:,.0f} GiB"


def count(n: int) -> str:
    """A parameter count for people: 7.4k, 1.4M, 305M."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            v = n / div
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return str(n)


def refuse_if_over(est: Estimate, available: int, where: str, field: str, value: Any, what: str) -> None:
    """One line naming ``field`` when the lower bound ``est`` exceeds ``available`` bytes.

    ``where`` says whose memory it is ("this machine has"); ``what`` names the model ("llama-tiny").
    """
    have = f"{where} {gib(available)} of memory"
    if est.state > available:
        replicas = f"{est.replicas:,} replica{'s' if est.replicas != 1 else ''}"
        probes = f" ({est.probe_gradients:,} probe gradients kept by each)" if est.probe_gradients else ""
        raise UserError(
            f"config: {field} = {value!r}: {replicas} of {what} ({count(est.n_params)} parameters) need "
            f"~{gib(est.state)} of parameters, gradients and optimizer state{probes}; {have}"
        )
    if est.total > available:
        raise UserError(
            f"config: {field} = {value!r}: {what} needs ~{gib(est.step)} on top of ~{gib(est.state)} for "
            f"the replicas; {have}"
        )


def check_config(cfg: Config) -> None:
    """Refuse a config whose preset model cannot fit where it will run (a checkpoint's size is known only
    once it is loaded): one line naming the field that makes it too large, the estimate and the memory."""
    shape = PRESETS.get(cfg.model.name)
    if shape is None:
        return
    a, d, b, s, rt = cfg.algorithm, cfg.data, cfg.batch, cfg.switch, cfg.runtime
    bpe = d.tokenizer.startswith("bpe:") and d.tokenizer[4:].isdigit()
    vocab = int(d.tokenizer[4:]) if bpe else 0  # another tokenizer's size is known once it is loaded
    logits = vocab if cfg.model.task == "causal_lm" else 0
    n_params = llama_parameters(shape, vocab)
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

    def at(replicas: int) -> tuple[Estimate, Estimate]:
        opt = (cfg.inner.optimizer, cfg.inner.momentum, min(a.trainers, replicas), layers)
        per_token = activation_bytes_per_token(shape, logits)
        train = estimate(n_params, replicas, *opt, micro, request, d.seq_len, per_token, chunks)
        val = estimate(n_params, replicas, *opt)
        # validation keeps no activations, but a whole batch's logits and their log-softmax
        return train, Estimate(replicas, n_params, val.state, eval_rows * d.seq_len * 2 * FLOAT * logits)

    train, val = at(here)
    available, where = physical_memory(), "this machine has"
    if max(train.total, val.total) > available and rt.device != "cpu":
        gpu = cuda_memory()  # the replicas may live on a GPU with more memory than this machine
        if gpu is not None:
            (train, val), available, where = at(per_process), gpu, "the GPU has"
    name = cfg.model.name
    if train.state > available:
        if chunks > 2 + optimizer_buffers(cfg.inner.optimizer, cfg.inner.momentum):
            field, value = (
                ("batch.probe_chunks", b.probe_chunks) if chunks == b.probe_chunks else ("batch.max", b.max)
            )
        else:
            field, value = "algorithm.workers", a.workers
        refuse_if_over(train, available, where, field, value, name)
    if micro <= d.seq_len:
        field, value = "data.seq_len", d.seq_len
    elif s.b_max is not None and s.b_max < request:
        field, value = "switch.b_max", s.b_max
    else:
        field, value = ("batch.initial", b.initial) if b.test == "none" else ("batch.max", b.max)
    what = f"a micro-batch of {micro:,} x {d.seq_len:,} tokens through {name}"
    refuse_if_over(train, available, where, field, value, what)
    what = f"a validation batch of {eval_rows:,} x {d.seq_len:,} tokens through {name}"
    refuse_if_over(val, available, where, "eval.batch_size", cfg.eval.batch_size, what)
