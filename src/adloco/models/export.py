"""The final model as a Hugging Face folder, written one file at a time from a live (possibly sharded) model.

``PreTrainedModel.save_pretrained`` takes the whole state dict in one process's memory; for a model
sharded with FSDP2 that means gathering every parameter on rank 0 first (ALGORITHM.md §12). Here the
file plan comes from the parameters' shapes alone (``huggingface_hub.split_torch_state_dict_into_shards``
on meta tensors), and each file's tensors are gathered one parameter at a time (``DTensor.full_tensor``,
a collective of the worker's ranks), written with safetensors, and let go: the writing rank holds at most
one file's tensors (``logging.model_file_mb``), every other rank one parameter. The folder is what
``save_pretrained`` writes (config, generation config, ``model.safetensors`` or numbered files with
``model.safetensors.index.json``, the tokenizer) and is loaded by ``from_pretrained``.

torch.distributed.checkpoint's ``HuggingFaceStorageWriter`` writes the same layout, but each rank writes
its shards into a folder that the consolidating rank must read: shared storage that the run directory,
rank 0's own disk, need not be; the collective per parameter needs only the network the run already uses."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

INDEX = "model.safetensors.index.json"


def plan(model: Any, max_file_bytes: int) -> Any:
    """Which tensors go to which file: Hugging Face's split of the state dict, made from shapes alone
    (meta tensors: nothing is allocated), tied weights written once, as ``save_pretrained`` does."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    live = model.state_dict(keep_vars=True)  # a sharded model's DTensors stay sharded
    meta = {
        k: torch.empty(v.shape, dtype=v.dtype, device="meta")
        for k, v in live.items()
        if isinstance(v, torch.Tensor)
    }
    kept = remove_tied_weights_from_state_dict(meta, model)
    return split_torch_state_dict_into_shards(kept, max_shard_size=max_file_bytes), live


def save(model: Any, tokenizer: Any, path: Path | None, max_file_bytes: int) -> None:
    """Write ``model`` (its current values) and ``tokenizer`` as a Hugging Face folder at ``path``. Every
    rank that holds a shard of the model calls it in the same order; the rank with ``path`` writes (the
    others pass None). The folder appears whole or not at all: it is written beside ``path`` and renamed."""
    from safetensors.torch import save_file
    from transformers.utils import logging as hf_logging

    split, live = plan(model, max_file_bytes)
    tmp = None if path is None else path.with_name(path.name + ".partial")  # None: this rank only gathers
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    for filename, names in split.filename_to_tensors.items():
        tensors: dict[str, torch.Tensor] = {}
        for name in names:
            p = live[name].detach()
            # a DTensor: all-gathered, every rank of its mesh calls it, in this order
            gather = getattr(p, "full_tensor", None)
            with torch.no_grad():
                whole = gather() if gather is not None else p
            if tmp is not None:
                # a tensor of its own on the CPU: safetensors refuses tensors that share memory (the flat
                # buffer's views); an all-gathered one is already its own
                tensors[name] = whole.to("cpu", copy=gather is None).contiguous()
            del whole
        if tmp is None:
            continue
        tensors = _original_names(model, tensors)
        weight_map.update(dict.fromkeys(tensors, filename))
        save_file(tensors, str(tmp / filename), metadata={"format": "pt"})
        del tensors
    if tmp is None or path is None:
        return
    if split.is_sharded:
        index = {
            "metadata": {"total_parameters": sum(p.numel() for p in model.parameters()), **split.metadata},
            "weight_map": weight_map,
        }
        (tmp / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    # what save_pretrained records beside the weights (a model of custom code: its code files too)
    if getattr(model, "_auto_class", None) is not None:
        from transformers.dynamic_module_utils import custom_object_save

        custom_object_save(model, tmp, config=model.config)
    model.config.architectures = [type(model).__name__.removeprefix("FSDP")]  # fully_shard's class: its base
    model.config.dtype = str(next(model.parameters()).dtype).split(".")[1]
    model.config.save_pretrained(tmp)
    if model.can_generate() and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(tmp)
    hf_logging.disable_progress_bar()
    tokenizer.save_pretrained(tmp)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)


def _original_names(model: Any, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A file's tensors under the names the checkpoint on the hub uses, where transformers renames or fuses
    weights on load (its ``revert_weight_conversion``, as ``save_pretrained`` applies it); unchanged
    otherwise."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without weight conversions
        return tensors
    return dict(revert_weight_conversion(model, tensors))
