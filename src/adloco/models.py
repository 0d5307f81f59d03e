"""The only module that touches transformers model classes: presets, construction, saving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from adloco.errors import UserError

# Architecture presets built from a config only (random init).
PRESETS: dict[str, dict[str, Any]] = {
    # ~1.4M parameters with a 4096-token vocabulary: trains at ~12k tokens/s on 2 CPU cores.
    "llama-tiny": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=384,
        tie_word_embeddings=True,
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


def build(name: str, vocab_size: int, seq_len: int, eos_id: int, seed: int) -> nn.Module:
    """A causal LM of preset ``name`` with weights drawn from ``seed`` (the global RNG is untouched)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if name not in PRESETS:
        raise UserError(f"config: model.name = {name!r}: must be one of {', '.join(sorted(PRESETS))}")
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=seq_len,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        use_cache=False,
        **PRESETS[name],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save(model: Any, state: dict[str, torch.Tensor], tokenizer: Any, path: Path) -> None:
    """Write ``state`` as a Hugging Face checkpoint (safetensors) plus the tokenizer into ``path``."""
    from transformers.utils import logging as hf_logging

    path.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()  # a bar for one small shard is noise in our progress output
    model.save_pretrained(path, state_dict={k: v.detach().cpu().contiguous() for k, v in state.items()})
    tokenizer.save_pretrained(path)
