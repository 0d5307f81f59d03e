"""A checkpoint's tensors through torch.distributed.checkpoint (DCP): every rank writes and reads only its own.

DCP writes each rank's tensors into its own files (``__<rank>_<n>.distcp``) in parallel, with a
``.metadata`` file that says which chunk of which tensor lies where, and reads back any layout: a rank
asks for the chunks it needs, whatever ranks wrote them. Here:

- :class:`Pieces` is a sharded worker's P/k values of a flat vector (ALGORITHM.md §12) as chunks of the
  whole model's flat vector (fully_shard cuts every parameter into row ranges, so a rank's values are one
  piece per parameter). Written so, a checkpoint resumes with any ``runtime.shards`` (an unsharded rank
  reads the whole vector, a sharded one its pieces).
- A tensor several ranks hold alike (a trainer's θ on every process that hosts it, an optimizer's step
  count on every rank of a worker) is written once (DCP's de-duplication by key and offset).
- ``.metadata`` is a pickle: it is read with an unpickler that builds only DCP's metadata classes
  (:class:`SafeReader`), and tensors with ``torch.load(weights_only=True)``, so loading a checkpoint runs
  no code from it.
- ``checkpoint.async_save``: :func:`write` hands DCP's ``async_save`` a copy of the tensors in host memory
  (:class:`_HostCopy`, its staging step) and returns the future of the write; training goes on.

A location is a local path or an fsspec URL (``file://``, ``memory://``, ``s3://`` with s3fs installed):
local paths go through DCP's FileSystemWriter (fsynced), URLs through its FsspecWriter.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as md
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager

from adloco.errors import UserError


class Pieces:
    """This rank's pieces of a 1-D vector of ``numel`` values: ``parts`` = (values, offset in the whole)."""

    def __init__(self, numel: int, parts: list[tuple[torch.Tensor, int]]) -> None:
        self.numel, self.parts = numel, [(t, int(o)) for t, o in parts if t.numel() > 0]

    def size(self) -> torch.Size:  # DCP checks it against the saved tensor's
        return torch.Size([self.numel])

    def __create_chunk_list__(self) -> list[md.ChunkStorageMetadata]:
        return [
            md.ChunkStorageMetadata(offsets=torch.Size([o]), sizes=torch.Size([t.numel()]))
            for t, o in self.parts
        ]

    def __create_write_items__(self, fqn: str, obj: object) -> list[WriteItem]:
        return [
            WriteItem(
                index=md.MetadataIndex(fqn, torch.Size([o])),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=md.ChunkStorageMetadata(offsets=torch.Size([o]), sizes=torch.Size([t.numel()])),
                    properties=md.TensorProperties.create_from_tensor(t),
                    size=self.size(),
                ),
            )
            for t, o in self.parts
        ]

    def __get_tensor_shard__(self, index: md.MetadataIndex) -> torch.Tensor:
        want = None if index.offset is None else int(index.offset[0])
        for t, o in self.parts:
            if o == want:
                return t
        raise ValueError(f"{index.fqn}: no piece at offset {want}")

    def copy(self) -> Pieces:
        return Pieces(self.numel, [(_host(t), o) for t, o in self.parts])


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


class _SavePlanner(DefaultSavePlanner):
    def lookup_object(self, index: md.MetadataIndex) -> Any:
        obj = self.state_dict.get(index.fqn)
        if isinstance(obj, Pieces):
            return obj.__get_tensor_shard__(index)
        return super().lookup_object(index)


class _LoadPlanner(DefaultLoadPlanner):
    def set_up_planner(self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False) -> None:
        pieces = {k: v for k, v in state_dict.items() if isinstance(v, Pieces)}
        super().set_up_planner(state_dict, metadata, is_coordinator)  # it sets what it does not know to None
        state_dict.update(pieces)
        self.state_dict.update(pieces)

    def lookup_tensor(self, index: md.MetadataIndex) -> torch.Tensor:
        obj = self.state_dict.get(index.fqn)
        if isinstance(obj, Pieces):
            return obj.__get_tensor_shard__(index)
        return super().lookup_tensor(index)


class _HostCopy(AsyncStager):
    """DCP's staging step for ``async_save``: every tensor copied into host memory, so that the next round
    may change the originals while the copy is written."""

    _synchronize_after_execute = False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return {k: v.copy() if isinstance(v, Pieces) else _host(v) for k, v in state_dict.items()}

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


# what a DCP ``.metadata`` pickle may build: DCP's metadata classes and torch's sizes, dtypes and layouts
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "ChunkStorageMetadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout by its name
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},  # the checkpoint id
    "torch": {"Size", "strided", "contiguous_format", "preserve_format", "channels_last"}
    | {str(d).removeprefix("torch.") for d in vars(torch).values() if isinstance(d, torch.dtype)},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "tuple", "list", "dict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to build {module}.{name}")


def _safe_metadata(data: bytes, where: str) -> md.Metadata:
    try:
        got = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - any malformed pickle
        raise UserError(f"checkpoint {where!r}: .metadata is not DCP's metadata ({exc})") from None
    if not isinstance(got, md.Metadata):
        raise UserError(f"checkpoint {where!r}: .metadata is not DCP's metadata")
    return got


def _is_url(location: str) -> bool:
    return "://" in location


def _writer(location: str) -> dcp.StorageWriter:
    if _is_url(location):
        return FsspecWriter(location, sync_files=True)
    return dcp.FileSystemWriter(location, sync_files=True)


def _reader(location: str) -> dcp.StorageReader:
    base = FsspecReader if _is_url(location) else dcp.FileSystemReader

    class SafeReader(base):  # type: ignore[valid-type, misc]
        """DCP's reader with ``.metadata`` read by an unpickler that builds only metadata classes."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> md.Metadata:
            path = self.fs.concat_path(self.path, ".metadata")
            with self.fs.create_stream(path, "rb") as f:
                meta = _safe_metadata(f.read(), location)
            storage_meta = meta.storage_meta or md.StorageMeta()
            storage_meta.load_id = self.load_id
            meta.storage_meta = storage_meta
            return meta

    return SafeReader(location)


# DCP warns that it works in one process when no process group is up (here that is meant), on the
# caller's thread or, behind training, on its own: a filter for that one message.
_SINGLE = "torch.distributed is disabled, unavailable or uninitialized"
warnings.filterwarnings("ignore", message=_SINGLE, category=UserWarning)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():  # where the filters were reset since (a test runner)
        warnings.filterwarnings("ignore", message=_SINGLE, category=UserWarning)
        yield


def write(state: Mapping[str, Any], location: str, group: Any, background: bool) -> Future[Any] | None:
    """Every rank's ``state`` (flat keys; tensors and :class:`Pieces`) into ``location`` as one DCP
    checkpoint; every rank calls it. ``group``: the process group of the checkpoint's collectives (None:
    this process alone). ``background``: staged into host memory now, written behind (the future of it)."""
    kw: dict[str, Any] = {
        "storage_writer": _writer(location),
        "planner": _SavePlanner(),
        "process_group": group,
        "no_dist": group is None,
    }
    with _quiet():
        if background:
            got = dcp.async_save(dict(state), async_stager=_HostCopy(), **kw)
            return got if isinstance(got, Future) else got.upload_completion  # type: ignore[return-value]
        dcp.save(dict(state), **kw)
    return None


def metadata(location: str) -> md.Metadata:
    """The checkpoint's table of tensors (read safely)."""
    return _reader(location).read_metadata()


def tensors(meta: md.Metadata) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Every tensor a checkpoint holds: its shape and dtype."""
    return {
        k: (v.size, v.properties.dtype)
        for k, v in meta.state_dict_metadata.items()
        if isinstance(v, md.TensorStorageMetadata)
    }


def read(state: dict[str, Any], location: str, group: Any) -> None:
    """Fill ``state`` (this rank's keys: tensors and :class:`Pieces`, of the saved shapes) from the DCP
    checkpoint at ``location``; every rank calls it, each with its own keys."""
    with _quiet():
        dcp.load(
            state,
            storage_reader=_reader(location),
            planner=_LoadPlanner(),
            process_group=group,
            no_dist=group is None,
        )
