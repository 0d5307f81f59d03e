"""What the standalone PyTorch measurements of ``benchmarks/gpu_micro.py`` share: the ``Save`` callback
type, the device helpers (``_device``, ``_sync``, ``_free``, ``_err``) and the models they time: Hugging
Face's Llama (``hf_llama``, what the engine trains), a small pure-PyTorch Llama (``MiniLlama``, for vmap and
CUDA graphs), ``n_params`` and ``_adamw``. Imports torch, never adloco.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Save = Callable[[dict[str, Any]], None]


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"


def hf_llama(shape: dict[str, Any], seq: int, attn: str | None = None) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape.get("kv_heads", shape["heads"]),
        intermediate_size=shape["inter"],
        max_position_embeddings=max(seq, 128),
        tie_word_embeddings=shape.get("tied", True),
        use_cache=False,
    )
    if attn is not None:
        cfg._attn_implementation = attn  # "sdpa" is the default in transformers 5
    return LlamaForCausalLM(cfg)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Block(nn.Module):
    """A Llama decoder layer with the same projections as Hugging Face's (q, k, v, o, gate, up, down)."""

    def __init__(self, hidden: int, heads: int, inter: int) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.n1(x)
        q, k, v = (
            m(h).view(b, t, self.heads, c // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class MiniLlama(nn.Module):
    """Llama-shaped causal LM in plain PyTorch (tied embeddings); ``forward(ids)`` returns the mean loss.

    The rotary tables are plain attributes, not buffers, so ``torch.func`` stacking sees parameters only.
    """

    def __init__(self, shape: dict[str, Any], seq: int, device: torch.device) -> None:
        super().__init__()
        hidden, heads = shape["hidden"], shape["heads"]
        self.embed = nn.Embedding(shape["vocab"], hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, shape["inter"]) for _ in range(shape["layers"]))
        self.norm = RMSNorm(hidden)
        for p in self.parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, std=0.02)
        d = hidden // heads
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        f = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        emb = torch.cat([f, f], dim=-1)
        self.cos, self.sin = emb.cos().to(device), emb.sin().to(device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        t = ids.shape[-1]
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = F.linear(self.norm(x), self.embed.weight)
        v = logits.shape[-1]
        return F.cross_entropy(logits[..., :-1, :].reshape(-1, v), ids[..., 1:].reshape(-1))


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _adamw(params: list[torch.Tensor], ndim_offset: int = 0, **kw: Any) -> torch.optim.Optimizer:
    decay = [p for p in params if p.ndim - ndim_offset >= 2]
    other = [p for p in params if p.ndim - ndim_offset < 2]
    groups = [{"params": decay, "weight_decay": 0.1}]
    if other:
        groups.append({"params": other, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), **kw)
