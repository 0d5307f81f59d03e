"""The tiny language model the inner-optimizer tests share (Muon's hidden matrices, AdamW's rest): an
embedding, one residual MLP block with a norm and an output head, on token sequences with structure that
are reproducible for any worker, round and step; DiLoCo over it, with Muon and AdamW as one optimizer; and
the one-layer Hugging Face Llama of the integration and export tests."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from adloco import AdLoCo, DiLoCo
from adloco.library.optim import muon_adamw

VOCAB, WIDTH, T = 16, 8, 6


class TinyLM(nn.Module):
    """Embedding, one residual MLP block with a norm, an output head: (B, T) tokens -> (B, T, VOCAB)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.norm = nn.LayerNorm(2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH, bias=False)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def get_output_embeddings(self) -> nn.Module:  # as a Hugging Face model says where its head is
        return self.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h + self.down(torch.relu(self.norm(self.up(h))))
        return self.head(h)


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def tokens(w: int, r: int, h: int, rows: int) -> torch.Tensor:
    """A reproducible batch of a sequence with structure (each token follows from the previous)."""
    g = torch.Generator().manual_seed(1000 * w + 100 * r + h)
    start = torch.randint(0, VOCAB, (rows, 1), generator=g)
    steps = torch.randint(1, 3, (rows, T - 1), generator=g)
    return torch.cat([start, start + steps.cumsum(1)], 1) % VOCAB


def tiny(n: int, seed: int = 0) -> list[TinyLM]:
    torch.manual_seed(seed)
    first = TinyLM()
    return [copy.deepcopy(first) for _ in range(n)]


def run(algo: AdLoCo, rounds: int, first: int = 0) -> None:
    for r in range(first, first + rounds):
        for h in range(algo.H):
            algo.step_all({w: tokens(w, r, h, algo.batch_size(w)) for w in algo.local_workers})


def diloco(ms: list[TinyLM], opts: Any, **kw: Any) -> DiLoCo:
    return DiLoCo(ms, opts, inner_steps=3, batch_size=4, loss_fn=lm_loss, **kw)


def muon_diloco(ms: list[TinyLM], **kw: Any) -> DiLoCo:
    return diloco(ms, [muon_adamw(m, 3e-3) for m in ms], **kw)


def tiny_llama(tie: bool = False, positions: int = 16) -> nn.Module:
    """A one-layer Hugging Face Llama (vocabulary 64, width 32), seeded: the Trainer integrations' model
    and the exported one; ``tie``: the output head shares the embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=positions,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)
