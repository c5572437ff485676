"""Safetensors without loading tensors: headers read with two range reads, tensors located by byte range
(so they can be streamed from gs:// or a local disk), and headers of output shards planned up front.

The format: an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}
(offsets relative to the end of the header), then the tensors' bytes back to back.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from tpuforge_workloads import storage
from tpuforge_workloads.merge.errors import MergeInputError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_MAX_HEADER = 100_000_000  # the safetensors library's own limit

ITEM_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# The dtypes a merge computes with or casts to.
FLOAT_DTYPES: dict[str, np.dtype] = {
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
}
# tpuforge.api.catalog.Dtype -> safetensors dtype.
API_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes are: `file`, bytes [start, start + nbytes)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    start: int
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(uri: str) -> list[TensorInfo]:
    """The tensors of one safetensors file, in the order of their bytes; checks the file is whole."""
    file_size = storage.size(uri)
    head = storage.read_range(uri, 0, 8)
    if len(head) < 8:
        raise MergeInputError(f"{uri}: {file_size} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", head)
    if n > _MAX_HEADER or 8 + n > file_size:
        raise MergeInputError(f"{uri}: header length {n} does not fit the file ({file_size} bytes): not safetensors")
    try:
        header = json.loads(storage.read_range(uri, 8, n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MergeInputError(f"{uri}: unreadable safetensors header: {e}") from e
    data_start = 8 + n
    out = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = meta["dtype"], tuple(meta["shape"]), meta["data_offsets"]
        if dtype not in ITEM_SIZES:
            raise MergeInputError(f"{uri}: tensor {name} has unsupported dtype {dtype}")
        if end - begin != math.prod(shape) * ITEM_SIZES[dtype]:
            raise MergeInputError(f"{uri}: tensor {name} {dtype}{list(shape)} has {end - begin} bytes")
        if data_start + end > file_size:
            raise MergeInputError(
                f"{uri}: tensor {name} ends at byte {data_start + end} but the file has {file_size}: truncated"
            )
        out.append(TensorInfo(name, dtype, shape, uri, data_start + begin, end - begin))
    out.sort(key=lambda t: t.start)
    return out


@dataclass(frozen=True)
class SafetensorsCheckpoint:
    """A HuggingFace checkpoint directory: `model.safetensors`, or shards listed by the index."""

    uri: str
    files: tuple[str, ...]  # names relative to uri
    tensors: tuple[TensorInfo, ...]  # file by file, in byte order: the order that reads sequentially

    @classmethod
    def open(cls, uri: str) -> SafetensorsCheckpoint:
        index_uri = storage.join(uri, INDEX_FILE)
        if storage.is_file(index_uri):
            try:
                weight_map: dict[str, str] = json.loads(storage.read_text(index_uri))["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise MergeInputError(f"{index_uri}: not a safetensors index (no weight_map): {e}") from e
            files = tuple(sorted(set(weight_map.values())))
        elif storage.is_file(storage.join(uri, SINGLE_FILE)):
            weight_map, files = {}, (SINGLE_FILE,)
        else:
            raise MergeInputError(
                f"{uri}: no {INDEX_FILE} or {SINGLE_FILE}: set the base model URI to a HuggingFace "
                "safetensors checkpoint directory"
            )
        tensors: list[TensorInfo] = []
        for name in files:
            path = storage.join(uri, name)
            if not storage.is_file(path):
                raise MergeInputError(f"{index_uri} lists {name}, which is missing")
            infos = read_header(path)
            for t in infos:
                if weight_map and weight_map.get(t.name) != name:
                    raise MergeInputError(f"{path}: tensor {t.name} is not mapped to this file by {INDEX_FILE}")
            tensors += infos
        if weight_map:
            missing = set(weight_map) - {t.name for t in tensors}
            if missing:
                raise MergeInputError(
                    f"{index_uri} maps {len(missing)} tensors that no shard holds, e.g. {min(missing)}"
                )
        names = [t.name for t in tensors]
        if len(set(names)) != len(names):
            raise MergeInputError(f"{uri}: a tensor name appears in more than one shard")
        return cls(uri, files, tuple(tensors))

    def by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}


@dataclass(frozen=True)
class OutTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEM_SIZES[self.dtype]


@dataclass(frozen=True)
class ShardPlan:
    """One output file: its header is known before any tensor is computed, so it streams."""

    name: str
    tensors: tuple[OutTensor, ...]
    header: bytes  # length prefix + JSON, padded to 8 bytes

    @property
    def size(self) -> int:
        return len(self.header) + sum(t.nbytes for t in self.tensors)


def encode_header(tensors: Iterable[OutTensor], metadata: dict[str, str] | None = None) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)  # keeps tensor data 8-byte aligned, as the safetensors writer does
    return struct.pack("<Q", len(body)) + body


def plan_shards(tensors: Iterable[OutTensor], max_shard_bytes: int) -> list[ShardPlan]:
    """Greedy, in order: a shard closes before the tensor that would take it past `max_shard_bytes`
    (a tensor larger than that gets a shard of its own). Names follow transformers' model-0000i-of-0000n."""
    groups: list[list[OutTensor]] = [[]]
    size = 0
    for t in tensors:
        if groups[-1] and size + t.nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t.nbytes
    n = len(groups)
    return [
        ShardPlan(f"model-{i + 1:05d}-of-{n:05d}.safetensors", tuple(g), encode_header(g)) for i, g in enumerate(groups)
    ]


def index_json(shards: Iterable[ShardPlan]) -> bytes:
    shards = list(shards)
    weight_map = {t.name: s.name for s in shards for t in s.tensors}
    total = sum(t.nbytes for s in shards for t in s.tensors)
    return (json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n").encode()
