"""Model shapes and what a run of them costs in memory, known before anything is built.

The presets are Llama shapes (the vocabulary comes from the tokenizer). :func:`estimate` is a pure
function of the parameter count, the replicas, the optimizer and the micro-batch, and a lower bound:
float32 parameters, gradients and optimizer state of every worker's replica, one θ per trainer, the
Python objects of each replica, the outer optimizer's state of every trainer (:func:`outer_buffers`), and,
when the shape is known, the activations one micro-batch keeps
for its backward pass. A run whose lower bound exceeds the memory it will run in cannot fit, so it is
refused before a single replica is built (building a million of them would otherwise run for hours
and end in the kernel's out-of-memory killer). ``adloco.config`` applies it to a preset at config
time; the engine can call :func:`estimate` and :func:`refuse_if_over` once the model is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adloco.errors import UserError


def _llama(hidden: int, layers: int, heads: int, kv_heads: int, inter: int, **extra: Any) -> dict[str, Any]:
    """A Llama shape: the transformers config keys of one preset (tied embeddings unless ``extra`` says)."""
    return dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        **{"tie_word_embeddings": True, **extra},
    )


# Llama shapes built from a config only (model.name values that are shapes, not checkpoints); the
# vocabulary comes from the tokenizer. Columns: hidden size, layers, heads, key-value heads, MLP width.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-tiny": _llama(128, 4, 4, 4, 384),  # ~1.4M parameters at 4,096 tokens: ~12k tokens/s on 2 cores
    "llama-10m": _llama(320, 8, 5, 5, 864),  # ~11M parameters at 4,096 tokens
    "llama-30m": _llama(512, 8, 8, 8, 1408),  # ~28M parameters at 4,096 tokens
    # MicroLlama's shape (the paper's model): ~305M parameters with its 32,000-token vocabulary
    "microllama-300m": _llama(
        1024, 12, 16, 4, 5632, tie_word_embeddings=False, rms_norm_eps=1e-5, max_position_embeddings=2048
    ),
    "llama-micro": _llama(16, 1, 2, 2, 32),  # a few thousand parameters: tests and smoke runs only
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
    """Per-parameter state buffers of the inner optimizer: AdamW two, SGD one with momentum (``momentum``),
    Muon one (its momentum on the hidden matrices; the AdamW beside it keeps two on the embeddings, head,
    norms and biases, not counted: a lower bound); ``auto``, before its device decides, the lower of its
    two choices, Muon's."""
    if optimizer == "adamw":
        return 2
    if optimizer in ("muon", "auto"):
        return 1
    return 1 if momentum > 0 else 0


def outer_buffers(optimizer: str) -> int:
    """Per-parameter state buffers of a preset outer step, each trainer's (ALGORITHM.md §1): ``nesterov`` its
    float32 momentum, one; ``sgd`` and ``average`` none. (A factory's is measured by a probe of it:
    :func:`adloco.library.algorithms.outer.state_bytes`.)"""
    return 1 if optimizer == "nesterov" else 0


@dataclass(frozen=True)
class Estimate:
    """A lower bound on the memory of one machine's (or one device's) share of a run, in bytes."""

    replicas: int
    n_params: int
    # parameters, gradients, optimizer state (and error feedback) of every replica; θ and outer state of
    # every trainer
    state: int
    step: int  # one micro-batch's activations and one inner step's token ids
    probe_gradients: int = 0  # gradients each replica keeps for a batch test, counted in ``state``
    uncounted: str = ""  # what the bound leaves out that it would count if it could (said with a refusal)

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
    feedback: bool = False,
    outer_state: float = 0.0,
    uncounted: str = "",
) -> Estimate:
    """The lower bound for ``replicas`` worker replicas of an ``n_params`` model and ``trainers`` θ, each
    with ``outer_state`` bytes of outer optimizer state per value (a preset's :func:`outer_buffers` floats).

    ``per_token``: activation bytes one token keeps (:func:`activation_bytes_per_token`; 0 when the shape
    is unknown); ``micro_batch`` rows of ``seq_len`` tokens run at once; ``step_rows`` rows are read per
    inner step (token ids, int64); ``probe_gradients``: gradients each replica keeps for a batch test
    (the inner-product tests keep every probe chunk's); ``feedback``: each replica keeps its error
    feedback, one more P-vector (``comm.error_feedback``, on for topk).
    """
    buffers = 2 + optimizer_buffers(optimizer, momentum) + probe_gradients + int(feedback)
    objects = REPLICA_OBJECTS_PER_LAYER * (layers + 1)
    state = replicas * (buffers * FLOAT * n_params + objects) + int(
        trainers * (FLOAT + outer_state) * n_params
    )
    step = micro_batch * seq_len * per_token + step_rows * seq_len * 8
    return Estimate(replicas, n_params, state, step, probe_gradients, uncounted)


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
    have = f"{where} {gib(available)} of memory" + (f" ({est.uncounted})" if est.uncounted else "")
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
