"""The only module that touches transformers model classes: presets, checkpoints, saving.

``model.name`` is an architecture preset (random init from a seed), a local checkpoint folder, or a hub
name (weights loaded). Checkpoints load once; trainers start from copies of them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adloco.config import ModelConfig
from adloco.errors import UserError
from adloco.models import hub
from adloco.models.sizing import SHAPES  # Llama shapes; the vocabulary comes from the tokenizer

__all__ = ["SHAPES", "ModelFactory", "count_parameters", "factory_for", "output_layer"]

MODEL_HINT = f"use a preset ({', '.join(SHAPES)}) or a local checkpoint folder"


def _auto_class(task: str) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    return AutoModelForSequenceClassification if task == "classification" else AutoModelForCausalLM


class ModelFactory:
    """Builds the models of a run: ``build(seed)`` gives a fresh model (a preset drawn from ``seed``, or a
    copy of the loaded checkpoint); ``reinit_output(model, seed)`` redraws its output layer."""

    def __init__(
        self,
        cfg: ModelConfig,
        vocab_size: int,
        seq_len: int,
        eos_id: int,
        pad_id: int,
        num_labels: int = 0,
        label_names: list[str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.task = cfg.task
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.checkpoint: nn.Module | None = None
        self.config: Any
        self._plan: Any = None  # the preset's recorded initialization (build_sharded), recorded once
        labels: dict[str, Any] = {"num_labels": num_labels} if cfg.task == "classification" else {}
        if label_names and cfg.task == "classification":
            labels["id2label"] = dict(enumerate(label_names))
            labels["label2id"] = {n: i for i, n in enumerate(label_names)}
        if cfg.name in SHAPES:
            from transformers import LlamaConfig

            shape = dict(SHAPES[cfg.name])
            shape["max_position_embeddings"] = max(shape.get("max_position_embeddings", 0), seq_len)
            # A pad token only for classification (it finds each row's last token by it): in Llama it also
            # becomes the embedding's padding_idx, a zero row that never learns, and in a language model
            # that would freeze the end-of-text token that separates packed documents.
            if cfg.task == "classification":
                labels["pad_token_id"] = pad_id
            self.config = LlamaConfig(
                vocab_size=vocab_size,
                bos_token_id=eos_id,
                eos_token_id=eos_id,
                use_cache=False,
                **shape,
                **labels,
            )
        else:
            self.checkpoint = self._load(cfg, pad_id, labels)
            self.config = self.checkpoint.config
        self.check_fits(vocab_size, seq_len)

    def _load(self, cfg: ModelConfig, pad_id: int, labels: dict[str, Any]) -> nn.Module:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our progress output is ours; a loading bar is noise in it
        path = Path(cfg.name).expanduser()
        if not path.exists():
            if not hub.looks_like_hub_name(cfg.name) or cfg.name.startswith((".", "/", "~")):
                raise UserError(
                    f"config: model.name = {cfg.name!r}: not a preset and no such folder; {MODEL_HINT}"
                )
            hub.require("model.name", cfg.name, MODEL_HINT)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)  # heads missing from the checkpoint start the same everywhere
                model = _auto_class(cfg.task).from_pretrained(
                    str(path) if path.exists() else cfg.name,
                    dtype=torch.float32,
                    trust_remote_code=cfg.trust_remote_code,
                    **labels,
                )
        except Exception as exc:  # noqa: BLE001 - transformers raises many kinds; one line for all
            if not path.exists() and hub.offline():
                raise hub.offline_error("model.name", cfg.name, MODEL_HINT) from None
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            if "custom code" in first and not cfg.trust_remote_code:
                raise UserError(
                    f"config: model.name = {cfg.name!r}: ships its own Python code, which adloco does not run "
                    "unless asked: set model.trust_remote_code=true only if you trust it"
                ) from None
            raise UserError(f"config: model.name = {cfg.name!r}: cannot be loaded ({first})") from None
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = pad_id  # sequence classification finds the last token by it
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        return model

    def check_fits(self, vocab_size: int, seq_len: int) -> None:
        """The tokenizer's vocabulary must be the embedding's (a checkpoint's own tokenizer may be smaller:
        embeddings are often padded); sequences must fit the positions."""
        rows = getattr(self.config, "vocab_size", None)
        if rows is not None and (
            vocab_size > rows or (vocab_size < rows and self._own_tokenizer_size() not in (None, vocab_size))
        ):
            raise UserError(
                f"config: data.tokenizer: its vocabulary ({vocab_size} tokens) does not match model.name = "
                f"{self.cfg.name!r}'s embedding ({rows} rows); use the model's own tokenizer (leave "
                "data.tokenizer unset)"
            )
        limit = next(
            (
                getattr(self.config, k)
                for k in ("max_position_embeddings", "n_positions", "max_seq_len")
                if isinstance(getattr(self.config, k, None), int)
            ),
            None,
        )
        if limit is not None and seq_len > limit:
            raise UserError(
                f"config: data.seq_len = {seq_len}: larger than model.name = {self.cfg.name!r}'s maximum "
                f"positions ({limit})"
            )

    def _own_tokenizer_size(self) -> int | None:
        """The vocabulary of the tokenizer shipped with the checkpoint; None for a preset, or when it ships
        none that loads (then nothing tells a padded embedding from a foreign tokenizer)."""
        if self.checkpoint is None:
            return None
        from transformers import AutoTokenizer

        path = Path(self.cfg.name).expanduser()
        try:
            tok = AutoTokenizer.from_pretrained(
                str(path) if path.exists() else self.cfg.name, trust_remote_code=self.cfg.trust_remote_code
            )
        except Exception:  # noqa: BLE001 - no tokenizer, or one that does not load: unknown
            return None
        return len(tok)

    def _model_class(self) -> Any:
        from transformers import LlamaForCausalLM, LlamaForSequenceClassification

        return LlamaForSequenceClassification if self.task == "classification" else LlamaForCausalLM

    def build(self, seed: int) -> nn.Module:
        if self.checkpoint is not None:
            return copy.deepcopy(self.checkpoint)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self._model_class()(self.config)

    def build_sharded(
        self, seed: int, mesh: Any, device: torch.device, output_seed: int | None = None
    ) -> nn.Module:
        """A replica sharded with :func:`shard` over ``mesh`` that never exists whole (ALGORITHM.md §12): built
        on the meta device, then given storage on ``device`` for this rank's rows only, holding exactly the
        values of ``build(seed)`` (with ``reinit_output(model, output_seed)`` when ``output_seed`` is given)
        at those rows. The values come from replaying the whole build's writes one parameter at a time
        (:mod:`adloco.models.meta`): host memory of about the largest parameter, not the model.

        Raises :class:`~adloco.models.meta.NotReplayable` where that does not apply (a checkpoint's weights
        are loaded whole; a model whose initialization cannot be replayed): build whole, then shard."""
        from adloco.models.meta import InitPlan, NotReplayable, materialize

        if self.checkpoint is not None:
            raise NotReplayable(f"model.name = {self.cfg.name!r} is a checkpoint, loaded whole")
        if self._plan is None:
            self._plan = InitPlan.record(lambda: self._model_class()(self.config))
        with torch.device("meta"):
            model = self._model_class()(self.config)
        after = None
        if output_seed is not None:
            layer = self._check_reinit(model)
            prefix = next(name for name, m in model.named_modules() if m is layer)
            std = self._output_std(model)

            def after(name: str, full: torch.Tensor) -> torch.Tensor:
                if name == f"{prefix}.weight":
                    return _output_draw(full.shape, output_seed, std)
                if name == f"{prefix}.bias":
                    return torch.zeros_like(full)
                return full

        shard(model, mesh)
        materialize(model, self._plan, seed, device, after)
        return model

    def _check_reinit(self, model: Any) -> Any:
        layer = output_layer(model)
        if self.task == "causal_lm" and getattr(model.config, "tie_word_embeddings", False):
            raise UserError(
                f"config: model.reinit_output = true: model.name = {self.cfg.name!r} ties its output layer to the "
                "input embeddings, which would be redrawn too"
            )
        return layer

    @staticmethod
    def _output_std(model: Any) -> float:
        return float(getattr(model.config, "initializer_range", 0.02))

    def reinit_output(self, model: Any, seed: int) -> None:
        """Redraw the output layer (LM head or classification head) from ``seed``, as the reference
        implementation does per trainer on top of a pretrained checkpoint."""
        layer = self._check_reinit(model)
        with torch.no_grad():
            w = layer.weight
            w.copy_(_output_draw(w.shape, seed, self._output_std(model)))
            if getattr(layer, "bias", None) is not None:
                layer.bias.zero_()


def _output_draw(shape: Any, seed: int, std: float) -> torch.Tensor:
    """The output layer's redrawn weight (:meth:`ModelFactory.reinit_output`): N(0, std²) from ``seed``'s
    own generator."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * std


def output_layer(model: Any) -> Any:
    """The layer that maps hidden states to outputs: the LM head, or a classification head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        for name in ("score", "classifier", "lm_head"):
            head = getattr(model, name, None)
            if head is not None:
                break
    while head is not None and not hasattr(head, "weight"):  # e.g. a classifier block: its last Linear
        children = [m for m in head.modules() if isinstance(m, nn.Linear)]
        head = children[-1] if children else None
    if head is None:
        raise UserError(
            f"config: model.reinit_output = true: no output layer found in {type(model).__name__}"
        )
    return head


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def shard(model: Any, mesh: Any) -> Any:
    """``model`` sharded in place with FSDP2 over ``mesh`` (one dimension: a worker's ranks, ALGORITHM.md
    §12): each block the model names as not to be split (Hugging Face's ``_no_split_modules``: a decoder
    layer) is its own unit, the rest (embeddings, norm, head) the root's, as torchtitan shards a model."""
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(model, "_no_split_modules", None) or [])
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def factory_for(cfg: ModelConfig, seq_len: int, data: Any) -> ModelFactory:
    """The factory of a run's models: the config's model for its data's vocabulary, special tokens and
    labels (``data``: :class:`adloco.data.tokens.Data`)."""
    return ModelFactory(
        cfg,
        data.vocab_size,
        seq_len,
        data.eos_id,
        data.pad_id,
        data.num_labels,
        getattr(data, "label_names", None),
    )
