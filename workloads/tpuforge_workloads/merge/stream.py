"""The streamed merge. Worker threads read chunks of base bytes and merge them (or pass them through), a few
chunks ahead of a writer thread that hashes and writes them in order: reading, computing and writing overlap
(numpy and hashlib release the GIL), and memory holds a few chunks whatever the size of the model or of its
largest tensor.

A LoRA target is processed in blocks of whole rows: rows [r0, r1) of the merged weight are
W[r0:r1] + (alpha / rank) * lora_B[r0:r1] @ lora_A, computed in float32 and cast to the output dtype.
Every other tensor is copied byte for byte (or cast, when the config asks for another dtype).

On a node with few cores the CPU, not the disk, is what a merge runs out of, so each merged element is touched
as few times as possible: a chunk is merged in sub-blocks of rows that stay in cache, the delta is computed
into a small per-thread float32 buffer, the base added to it and the sum converted to the output dtype once
(for bfloat16, the usual case, the add and both conversions are one compiled pass: merge/bf16.py); no
temporary is the size of a chunk. BLAS runs single-threaded while the workers run: the workers are the
parallelism, and a multi-threaded BLAS call from each of them oversubscribes the cores, its spinning threads
starving the reads, the hashing and the other worker.
"""

from __future__ import annotations

import contextlib
import functools
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
from threadpoolctl import threadpool_limits

from tpuforge_workloads import storage
from tpuforge_workloads.merge import bf16
from tpuforge_workloads.merge.mapping import peft_factors
from tpuforge_workloads.merge.plan import CONFIG_FILE, MergePlan, TensorJob
from tpuforge_workloads.merge.safetensors_io import FLOAT_DTYPES, ITEM_SIZES, index_json
from tpuforge_workloads.storage import staged as staged_write
from tpuforge_workloads.storage.commit import ManifestFile

BF16 = FLOAT_DTYPES["BF16"]
CHUNK_BYTES = 32 << 20
# One worker per core (BLAS single-threaded in each), at least two so that a read overlaps a merge.
WORKERS = max(2, min(8, os.cpu_count() or 2))
# Float32 scratch per worker for the delta of a sub-block of rows: big enough that the GEMM's packing of
# lora_A (rank x in) is amortised over many rows, small enough to stay in a core's cache.
BLOCK_BYTES = 8 << 20
WRITE_BEHIND = 3

T = TypeVar("T")
K = TypeVar("K")


@dataclass
class StagedFile:
    """An output file written under the staging directory, with the size and sha256 of what was written."""

    name: str  # relative to the output directory
    writer: staged_write.StagedWriter
    size: int = 0
    _hash: Any = field(default_factory=hashlib.sha256)

    def write(self, data: bytes | memoryview) -> None:
        self.hash(data)
        self.writer.write(data)

    def hash(self, data: bytes | memoryview) -> None:
        """Account for bytes written (or being written, in order, by another thread)."""
        self._hash.update(data)
        self.size += memoryview(data).nbytes

    def entry(self) -> ManifestFile:
        return ManifestFile(name=self.name, size=self.size, sha256=self._hash.hexdigest())


def as_bytes(array: np.ndarray) -> memoryview:
    """The bytes of an array, without a copy when it is contiguous."""
    # As uint8: buffers cannot carry dtypes such as bfloat16.
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def open_staged(output: str, staging: str, name: str, size_hint: int | None = None) -> StagedFile:
    return StagedFile(
        name, staged_write.open_staged_write(storage.join(output, name), storage.join(staging, name), size_hint)
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
    """Writes chunks in order on one thread and hashes them in order on another, at most `depth` chunks
    behind the caller; re-raises the first error. Hashing and writing both touch every byte and cannot be
    split across workers (sha256 is sequential): on one thread together they were the merge's longest path."""

    def __init__(self, depth: int = WRITE_BEHIND) -> None:
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="merge-write")
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="merge-hash")
        self._pending: deque[tuple[list[Future[None]], Callable[[], None] | None]] = deque()
        self._depth = depth

    def write(self, f: StagedFile, data: bytes | memoryview, done: Callable[[], None] | None = None) -> None:
        """Hash and write `data` to `f`; `done` runs once both are over (e.g. to reuse the buffer)."""
        self._queue([self._hasher.submit(f.hash, data), self._writer.submit(f.writer.write, data)], done)

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        """Run fn(*args) on the writing thread, after the writes submitted before it."""
        self._queue([self._writer.submit(fn, *args)], None)

    def _queue(self, futures: list[Future[None]], done: Callable[[], None] | None) -> None:
        self._pending.append((futures, done))
        while len(self._pending) > self._depth:
            self._settle()

    def _settle(self) -> None:
        futures, done = self._pending.popleft()
        for fut in futures:
            fut.result()
        if done is not None:
            done()

    def drain(self) -> None:
        while self._pending:
            self._settle()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._writer.shutdown(wait=True, cancel_futures=True)
            self._hasher.shutdown(wait=True, cancel_futures=True)


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


def add_delta(base: np.ndarray, b: np.ndarray, a: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    """out = base + b @ a, row block by row block, with the float32 sum of each block in `scratch`."""
    rows, cols = base.shape
    step = max(1, scratch.size // cols)
    fused = base.dtype == out.dtype == BF16
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        acc = scratch[: (r1 - r0) * cols].reshape(r1 - r0, cols)
        np.matmul(b[r0:r1], a, out=acc)
        if fused:  # the common case: both bfloat16 conversions and the add in one compiled pass, in place
            if out is not base:
                np.copyto(out[r0:r1], base[r0:r1])
            bf16.add_round(acc, out[r0:r1])
            continue
        np.add(acc, base[r0:r1], out=acc)  # float32 + base: converted in numpy's inner loop, not a temporary
        np.copyto(out[r0:r1], acc, casting="same_kind")


class BufferPool:
    """Chunk buffers, reused once written. A fresh 32 MiB buffer costs a page fault per 4 KiB page on first
    touch, more CPU than the read that fills it; reused, the pool holds one buffer per chunk in flight."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> bytearray:
        with self._lock:
            for i, buf in enumerate(self._free):
                if len(buf) >= nbytes:
                    return self._free.pop(i)
        return bytearray(max(nbytes, self._size))

    def put(self, buf: bytearray) -> None:
        with self._lock:
            self._free.append(buf)


@dataclass(frozen=True)
class Output:
    """A chunk's output bytes, and the pooled buffer they live in (returned to the pool once written)."""

    data: memoryview
    buffer: bytearray


class Merger:
    """Turns base chunks into output chunks, from any thread; keeps the scaled PEFT factors of the few
    targets being worked on (workers are at most a few chunks apart)."""

    _KEEP = 4

    def __init__(self, plan: MergePlan, pool: BufferPool) -> None:
        self.plan = plan
        self.pool = pool
        self._lock = threading.Lock()
        self._factors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._local = threading.local()

    def scratch(self, cols: int) -> np.ndarray:
        """This thread's float32 buffer for `add_delta`, at least one row long."""
        buf: np.ndarray | None = getattr(self._local, "scratch", None)
        size = max(BLOCK_BYTES // 4, cols)
        if buf is None or buf.size < size:
            buf = self._local.scratch = np.empty(size, np.float32)
        return buf

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

    def produce(self, chunk: Chunk) -> Output:
        """Read one chunk of the base into a pooled buffer and turn it into output bytes (in a worker)."""
        buf = self.pool.get(chunk.length)
        data = memoryview(buf)[: chunk.length]
        got = storage.read_range_into(chunk.file, chunk.start, data)
        if got != chunk.length:
            raise RuntimeError(f"{chunk.file}: {chunk.tensor}: got {got} of {chunk.length} bytes: file truncated")
        return Output(self.transform(self.plan.jobs[chunk.tensor], chunk, data), buf)

    def transform(self, job: TensorJob, chunk: Chunk, data: memoryview) -> memoryview:
        """The output bytes of one chunk, from its base bytes (`data`, writable: a merge of the same dtype
        overwrites it in place)."""
        if job.is_byte_copy:
            return data
        src = np.frombuffer(data, dtype=FLOAT_DTYPES[job.source.dtype])
        out_dtype = FLOAT_DTYPES[job.out.dtype]
        if job.target is None:
            return as_bytes(src.astype(out_dtype))
        lora_a, b_scaled = self.factors(job)
        base = src.reshape(chunk.row1 - chunk.row0, -1)
        # Row block by row block, a block's base rows are read before its output rows are written: in place
        # is safe when the dtype stays.
        out = base if out_dtype == base.dtype else np.empty(base.shape, out_dtype)
        add_delta(base, b_scaled[chunk.row0 : chunk.row1], lora_a, out, self.scratch(base.shape[1]))
        return as_bytes(out)


def write_weights(plan: MergePlan, output: str, staging: str, chunk_bytes: int = CHUNK_BYTES) -> list[StagedFile]:
    """Every output shard, staged; the caller publishes them."""
    with threadpool_limits(limits=1, user_api="blas"):
        return _write_weights(plan, output, staging, chunk_bytes)


def _write_weights(plan: MergePlan, output: str, staging: str, chunk_bytes: int) -> list[StagedFile]:
    files: list[StagedFile] = []
    pool = BufferPool(chunk_bytes)
    merger = Merger(plan, pool)
    writes = WriteBehind()
    produced = prefetch(_chunk_plan(plan, chunk_bytes), merger.produce, WORKERS, WORKERS + 2)
    try:
        for shard in plan.shards:
            f = open_staged(output, staging, shard.name, shard.size)
            files.append(f)
            writes.write(f, shard.header)
            for t in shard.tensors:
                for expected in chunks_of(plan.jobs[t.name], chunk_bytes):
                    chunk, out = next(produced)
                    assert chunk == expected, (chunk, expected)
                    writes.write(f, out.data, functools.partial(pool.put, out.buffer))
            writes.call(f.writer.close)
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
