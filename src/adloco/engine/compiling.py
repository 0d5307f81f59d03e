"""``runtime.compile``: each worker's model compiled in place, by block or whole, with torch's compile
caches kept where a later run finds them (ALGORITHM.md §14).

A decoder-only model is one block repeated L times. Compiling each block on its own (``compile_scope:
blocks``, what torchtitan does for every TransformerBlock) gives one graph that every block of every
worker reuses: dynamo guards on the block's code and its inputs' shapes, and the parameters are inputs, not
constants, so the second block to run finds the first one's code. Compiling the whole model (``model``)
traces all L blocks, the head and the loss as one graph, forward and backward: longer to compile, one
graph to optimize across. The blocks are those a Hugging Face model names in ``_no_split_modules`` (the
units FSDP2 shards, :func:`adloco.models.shard`); a model that names none is compiled whole.

Compilation happens at the first forward pass, and the inductor backend writes what it built (the FX
graph cache, the AOT autograd cache, Triton's kernels) under ``TORCHINDUCTOR_CACHE_DIR``: a run with the
same model, shapes and torch finds it there and skips code generation. :func:`use_cache` points that
variable at ``runtime.compile_cache`` (default: ``$TORCHINDUCTOR_CACHE_DIR`` when set, else
``<adloco cache>/compile``) before anything compiles; :class:`CacheCounts` says afterwards how many
graphs were found there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from adloco.config import Config
from adloco.data.tokens import cache_root

ENV = "TORCHINDUCTOR_CACHE_DIR"


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: its modules of the classes it names in ``_no_split_modules`` (a Hugging
    Face decoder layer), outermost only; empty when it names none."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if module is model or id(module) in inside or type(module).__name__ not in names:
            continue
        found.append(module)
        inside.update(id(m) for m in module.modules())
    return found


def compile_in_place(model: nn.Module, scope: str, backend: str, mode: str) -> str:
    """Compile ``model`` in place (``nn.Module.compile``: names, parameters and the state dict stay as they
    were): each block of :func:`blocks` with ``scope`` ``blocks``, else the whole model. Returns what was
    compiled, in words ("12 blocks (LlamaDecoderLayer)", "the whole model")."""
    kw = {"backend": backend, "mode": None if mode == "default" else mode}
    parts = blocks(model) if scope == "blocks" else []
    if not parts:
        model.compile(**kw)
        if scope == "blocks":
            return f"the whole model ({type(model).__name__} names no repeated block in _no_split_modules)"
        return "the whole model"
    for block in parts:
        block.compile(**kw)
    kinds = ", ".join(sorted({type(b).__name__ for b in parts}))
    return f"{len(parts)} block{'s' if len(parts) != 1 else ''} ({kinds}), each on its own"


def _user_env() -> str | None:
    """``$TORCHINDUCTOR_CACHE_DIR`` as the user set it: torch writes its own default there (a folder under
    the system's temporary directory, gone at a reboot) the first time it asks, which is not a choice."""
    env = os.environ.get(ENV)
    if not env:
        return None
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another torch: every value counts as the user's
        return env
    return None if os.path.abspath(env) == os.path.abspath(default_cache_dir()) else env


def cache_dir(cfg: Config) -> tuple[Path, str]:
    """Where torch.compile's caches go for this run, and why there (in words)."""
    rt = cfg.runtime
    env = _user_env()
    if rt.compile_cache:
        path = Path(rt.compile_cache).expanduser()
        over = f", over ${ENV}" if env and Path(env).expanduser() != path else ""
        return path, f"runtime.compile_cache{over}"
    if env:
        return Path(env).expanduser(), f"${ENV}"
    return cache_root(cfg.data.cache_dir) / "compile", "the adloco cache"


def use_cache(cfg: Config) -> str:
    """Point torch's compile caches at :func:`cache_dir` (for this process and what it starts); returns
    the line that says where."""
    path, why = cache_dir(cfg)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = str(path)
    return f"{path} ({why})"


@dataclass(frozen=True)
class CacheCounts:
    """Graphs dynamo compiled, and how often inductor's FX graph cache and the AOT autograd cache had (hits)
    or lacked (misses) what a compilation asked for, as torch counts them in this process."""

    graphs: int = 0
    fx_hits: int = 0
    fx_misses: int = 0
    aot_hits: int = 0
    aot_misses: int = 0

    @classmethod
    def now(cls) -> CacheCounts:
        from torch._dynamo.utils import counters

        return cls(
            counters["stats"]["unique_graphs"],
            counters["inductor"]["fxgraph_cache_hit"],
            counters["inductor"]["fxgraph_cache_miss"],
            counters["aot_autograd"]["autograd_cache_hit"],
            counters["aot_autograd"]["autograd_cache_miss"],
        )

    def since(self, before: CacheCounts) -> CacheCounts:
        return CacheCounts(
            self.graphs - before.graphs,
            self.fx_hits - before.fx_hits,
            self.fx_misses - before.fx_misses,
            self.aot_hits - before.aot_hits,
            self.aot_misses - before.aot_misses,
        )

    def line(self) -> str:
        """One line for the run's output: graphs compiled, and what the caches held."""
        graphs = f"compile: {self.graphs} graph{'s' if self.graphs != 1 else ''} compiled"
        if not (self.fx_hits or self.fx_misses or self.aot_hits or self.aot_misses):
            return graphs + " (no inductor cache used by this backend)"
        return (
            f"{graphs}; FX graph cache {self.fx_hits} hits, {self.fx_misses} misses; AOT autograd cache "
            f"{self.aot_hits} hits, {self.aot_misses} misses"
        )
