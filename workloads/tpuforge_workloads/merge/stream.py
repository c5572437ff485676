"""The streamed merge. Worker threads read chunks of base bytes and merge them (or pass them through), a few
chunks ahead of a writer thread that hashes and writes them in order: reading, computing and writing overlap
(numpy and hashlib release the GIL), and memory holds a few chunks whatever the size of the model or of its
largest tensor.

A LoRA target is processed in blocks of whole rows: rows [r0, r1) of the merged weight are
W[r0:r1] + (alpha / rank) * lora_B[r0:r1] @ lora_A, computed in float32 and cast to the output dtype.
Every other tensor is copied byte for byte (or cast, when the config asks for another dtype).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from tpuforge_workloads import storage
from tpuforge_workloads.commit import ManifestFile
from tpuforge_workloads.merge.mapping import peft_factors
from tpuforge_workloads.merge.plan import CONFIG_FILE, MergePlan, TensorJob
from tpuforge_workloads.merge.safetensors_io import FLOAT_DTYPES, ITEM_SIZES, index_json

CHUNK_BYTES = 32 << 20
WORKERS = max(2, min(4, os.cpu_count() or 2))
WRITE_BEHIND = 3

T = TypeVar("T")
K = TypeVar("K")


@dataclass
class StagedFile:
    """An output file written under the staging directory, with the size and sha256 of what was written."""

    name: str  # relative to the output directory
    writer: storage.StagedWriter
    size: int = 0
    _hash: Any = field(default_factory=hashlib.sha256)

    def write(self, data: bytes | memoryview) -> None:
        self._hash.update(data)
        self.writer.write(data)
        self.size += memoryview(data).nbytes

    def entry(self) -> ManifestFile:
        return ManifestFile(name=self.name, size=self.size, sha256=self._hash.hexdigest())


def as_bytes(array: np.ndarray) -> memoryview:
    """The bytes of an array, without a copy when it is contiguous."""
    # As uint8: buffers cannot carry dtypes such as bfloat16.
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def open_staged(output: str, staging: str, name: str, size_hint: int | None = None) -> StagedFile:
    return StagedFile(
        name, storage.open_staged_write(storage.join(output, name), storage.join(staging, name), size_hint)
    )


def write_small(output: str, staging: str, name: str, data: bytes) -> StagedFile:
    f = open_staged(output, staging, name, len(data))
    try:
        f.write(data)
        f.writer.close()
    except BaseException:
        f.writer.discard()
        raise
    return f


def prefetch(
    items: Iterable[K], fetch: Callable[[K], T], workers: int, depth: int
) -> Generator[tuple[K, T], None, None]:
    """(item, fetch(item)) in the order of `items`, with up to `depth` fetches running ahead."""
    pending: deque[tuple[K, Future[T]]] = deque()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="merge-work")
    try:
        for item in items:
            pending.append((item, pool.submit(fetch, item)))
            if len(pending) >= depth:
                key, fut = pending.popleft()
                yield key, fut.result()
        while pending:
            key, fut = pending.popleft()
            yield key, fut.result()
    finally:
        for _, fut in pending:
            fut.cancel()
        pool.shutdown(wait=True)


class WriteBehind:
    """Runs writes in order on one thread, at most `depth` behind the caller; re-raises its first error."""

    def __init__(self, depth: int = WRITE_BEHIND) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="merge-write")
        self._pending: deque[Future[None]] = deque()
        self._depth = depth

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._pending.append(self._pool.submit(fn, *args))
        while len(self._pending) > self._depth:
            self._pending.popleft().result()

    def drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class Chunk:
    tensor: str
    file: str
    start: int
    length: int
    row0: int = 0
    row1: int = 0


def chunks_of(job: TensorJob, chunk_bytes: int) -> Iterator[Chunk]:
    src = job.source
    if job.target is not None:
        rows, cols = src.shape
        row_bytes = cols * ITEM_SIZES[src.dtype]
        step = max(1, chunk_bytes // row_bytes)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            yield Chunk(src.name, src.file, src.start + r0 * row_bytes, (r1 - r0) * row_bytes, r0, r1)
        return
    step = max(8, chunk_bytes - chunk_bytes % 8)  # whole elements of any dtype
    for off in range(0, src.nbytes, step):
        yield Chunk(src.name, src.file, src.start + off, min(step, src.nbytes - off))


def _chunk_plan(plan: MergePlan, chunk_bytes: int) -> Iterator[Chunk]:
    for shard in plan.shards:
        for t in shard.tensors:
            yield from chunks_of(plan.jobs[t.name], chunk_bytes)


def _read(chunk: Chunk) -> bytes:
    data = storage.read_range(chunk.file, chunk.start, chunk.length)
    if len(data) != chunk.length:
        raise RuntimeError(f"{chunk.file}: {chunk.tensor}: got {len(data)} of {chunk.length} bytes: file truncated")
    return data


class Merger:
    """Turns base chunks into output chunks, from any thread; keeps the scaled PEFT factors of the few
    targets being worked on (workers are at most a few chunks apart)."""

    _KEEP = 4

    def __init__(self, plan: MergePlan) -> None:
        self.plan = plan
        self._lock = threading.Lock()
        self._factors: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def factors(self, job: TensorJob) -> tuple[np.ndarray, np.ndarray]:
        """(lora_A, scale * lora_B) of a target, in float32."""
        target = job.target
        assert target is not None
        with self._lock:  # one Orbax restore at a time, and once per target
            if target.tensor not in self._factors:
                a, b = self.plan.lora.layer(target.layer)[target.module]
                lora_a, lora_b = peft_factors(target, a, b)
                self._factors[target.tensor] = (lora_a, lora_b * np.float32(self.plan.scale))
                while len(self._factors) > self._KEEP:
                    del self._factors[next(iter(self._factors))]
            return self._factors[target.tensor]

    def produce(self, chunk: Chunk) -> bytes | memoryview:
        """Read one chunk of the base and turn it into output bytes (runs in a worker thread)."""
        return self.transform(self.plan.jobs[chunk.tensor], chunk, _read(chunk))

    def transform(self, job: TensorJob, chunk: Chunk, data: bytes) -> bytes | memoryview:
        if job.is_byte_copy:
            return data
        src = np.frombuffer(data, dtype=FLOAT_DTYPES[job.source.dtype])
        out_dtype = FLOAT_DTYPES[job.out.dtype]
        if job.target is None:
            return as_bytes(src.astype(out_dtype))
        lora_a, b_scaled = self.factors(job)
        acc = src.reshape(chunk.row1 - chunk.row0, -1).astype(np.float32)
        acc += b_scaled[chunk.row0 : chunk.row1] @ lora_a
        return as_bytes(acc.astype(out_dtype, copy=False))


def write_weights(plan: MergePlan, output: str, staging: str, chunk_bytes: int = CHUNK_BYTES) -> list[StagedFile]:
    """Every output shard, staged; the caller publishes them."""
    files: list[StagedFile] = []
    merger = Merger(plan)
    writes = WriteBehind()
    produced = prefetch(_chunk_plan(plan, chunk_bytes), merger.produce, WORKERS, WORKERS + 2)
    try:
        for shard in plan.shards:
            f = open_staged(output, staging, shard.name, shard.size)
            files.append(f)
            writes.submit(f.write, shard.header)
            for t in shard.tensors:
                for expected in chunks_of(plan.jobs[t.name], chunk_bytes):
                    chunk, data = next(produced)
                    assert chunk == expected, (chunk, expected)
                    writes.submit(f.write, data)
            writes.submit(f.writer.close)
        writes.close()
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to report
            writes.close()
        for f in files:
            f.writer.discard()
        raise
    finally:
        produced.close()
    for f in files:
        if f.size != next(s.size for s in plan.shards if s.name == f.name):
            raise RuntimeError(f"{f.name}: wrote {f.size} bytes, planned a different size")
    return files


def config_bytes(plan: MergePlan, data: bytes) -> bytes:
    """config.json as the base has it, or with its dtype changed when the output dtype differs."""
    dtype = plan.config.dtype
    if dtype is None:
        return data
    config = json.loads(data)
    for section in (config, config.get("text_config")):
        if isinstance(section, dict):
            for key in ("dtype", "torch_dtype"):
                if key in section:
                    section[key] = dtype
    if "dtype" not in config and "torch_dtype" not in config:
        config["dtype"] = dtype
    return (json.dumps(config, indent=2) + "\n").encode()


def write_base_files(plan: MergePlan, output: str, staging: str) -> list[StagedFile]:
    """The index, and the base's config/tokenizer/generation files (config.json's dtype follows the output)."""
    files = [write_small(output, staging, "model.safetensors.index.json", index_json(plan.shards))]
    for name in plan.copied_files:
        data = storage.read_bytes(storage.join(plan.config.base_model_uri, name))
        if name == CONFIG_FILE:
            data = config_bytes(plan, data)
        files.append(write_small(output, staging, name, data))
    return files
