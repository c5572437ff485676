"""Writes that appear whole or not at all: a file is staged, then published in one step (a rename on local
disks, a GCS compose of uploaded parts). The merge's shards and every large upload go through here; small
writes use storage.write_bytes.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from tpuforge_workloads.storage import StorageError, client, delete, is_gcs, split_gcs, wrap_error

# GCS staged writes upload parts of this size range (multiples of 256 KiB, as resumable uploads require),
# at most this many at once, and compose at most this many sources per call (the GCS limit).
_MIN_PART = 16 << 20
_MAX_PART = 256 << 20
_PART_ALIGN = 256 << 10
_PARTS_IN_FLIGHT = 2
_COMPOSE_MAX = 32
# Seconds per request. A compose copies data on fake-gcs-server (~30-100 MB/s): an 8 GiB one takes minutes.
_PART_TIMEOUT = 600.0
_COMPOSE_TIMEOUT = 1800.0


class StagedWriter:
    """Streams bytes to `uri` through `staging` (a path or gs:// key prefix of the caller's choosing):
    after close(), everything is stored under `staging` and `uri` is untouched; publish() then makes
    `uri` appear whole (a rename on local disks, a GCS compose of the uploaded parts). A crash before
    publish() leaves only files under `staging`, which the caller deletes on its next run.

    On GCS the data is uploaded as parts of up to 256 MiB, two at a time, while the caller writes on:
    memory stays near three parts whatever the file's size, and no object is ever rewritten in place.
    """

    def __init__(self, uri: str, staging: str, size_hint: int | None = None) -> None:
        self.uri = uri
        self.staging = staging
        self._closed = False
        self._published = False
        if not is_gcs(uri):
            Path(staging).parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[bytes] | None = open(staging, "wb")  # noqa: SIM115 - closed in close()
            return
        if not is_gcs(staging) or split_gcs(staging)[0] != split_gcs(uri)[0]:
            raise StorageError(f"{uri}: staging {staging} must be in the same bucket")
        self._file = None
        want = -(-(size_hint or _MIN_PART) // _COMPOSE_MAX)  # one compose level when the hint allows
        self._part_size = min(_MAX_PART, max(_MIN_PART, -(-want // _PART_ALIGN) * _PART_ALIGN))
        self._buf: list[bytes] = []
        self._buffered = 0
        self._parts: list[str] = []
        self._pending: list[Any] = []
        self._pool = ThreadPoolExecutor(max_workers=_PARTS_IN_FLIGHT, thread_name_prefix="gcs-part")

    def write(self, data: bytes | memoryview) -> None:
        if self._closed:
            raise StorageError(f"{self.uri}: write after close")
        if self._file is not None:
            self._file.write(data)
            return
        if isinstance(data, bytes) and len(data) < self._part_size - self._buffered:
            self._buf.append(data)  # the common case: no copy until the part is joined
            self._buffered += len(data)
            return
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), self._part_size - self._buffered)
            self._buf.append(bytes(view[:take]))
            self._buffered += take
            view = view[take:]
            if self._buffered == self._part_size:
                self._flush_part()

    def _flush_part(self) -> None:
        data = self._buf[0] if len(self._buf) == 1 else b"".join(self._buf)
        self._buf, self._buffered = [], 0
        name = f"{self.staging}.part{len(self._parts):05d}"
        self._parts.append(name)
        # Bound memory: wait for the oldest upload before queueing past the in-flight limit.
        while len(self._pending) >= _PARTS_IN_FLIGHT:
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._upload_part, name, data))

    def _upload_part(self, name: str, data: bytes) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        bucket, key = split_gcs(name)
        blob = client().bucket(bucket).blob(key, chunk_size=self._part_size)
        try:
            # A part is whole or absent: safe to retry.
            blob.upload_from_string(data, retry=DEFAULT_RETRY, timeout=_PART_TIMEOUT)
        except Exception as e:
            raise wrap_error(name, e) from e

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._file is not None:
            try:
                self._file.close()
            except Exception as e:
                raise wrap_error(self.staging, e) from e
            return
        try:
            if self._buffered or not self._parts:
                self._flush_part()
            for fut in self._pending:
                fut.result()
        finally:
            self._pending = []
            self._pool.shutdown(wait=True)

    def publish(self) -> None:
        """Make `uri` appear with the bytes written (closes first). Idempotent."""
        self.close()
        if self._published:
            return
        try:
            if self._file is not None:
                Path(self.uri).parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.staging, self.uri)
            else:
                self._compose()
        except StorageError:
            raise
        except Exception as e:
            raise wrap_error(self.uri, e) from e
        self._published = True

    def _compose(self) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        bucket_name, _ = split_gcs(self.uri)
        bucket = client().bucket(bucket_name)
        slow: dict[str, Any] = {"retry": DEFAULT_RETRY.with_timeout(_COMPOSE_TIMEOUT), "timeout": _COMPOSE_TIMEOUT}
        sources = [split_gcs(p)[1] for p in self._parts]
        temporaries: list[str] = []
        level = 0
        while len(sources) > _COMPOSE_MAX:  # a tree of composes for files of more than 32 parts
            grouped = []
            for i in range(0, len(sources), _COMPOSE_MAX):
                key = f"{split_gcs(self.staging)[1]}.compose{level}-{i // _COMPOSE_MAX:05d}"
                bucket.blob(key).compose([bucket.blob(s) for s in sources[i : i + _COMPOSE_MAX]], **slow)
                grouped.append(key)
            temporaries += grouped
            sources = grouped
            level += 1
        bucket.blob(split_gcs(self.uri)[1]).compose([bucket.blob(s) for s in sources], **slow)
        for key in [split_gcs(p)[1] for p in self._parts] + temporaries:
            delete(f"gs://{bucket_name}/{key}")

    def discard(self) -> None:
        """Best-effort removal of what was staged (after a failure)."""
        if self._file is not None:
            with contextlib.suppress(Exception):
                self._file.close()
            Path(self.staging).unlink(missing_ok=True)
            return
        with contextlib.suppress(Exception):
            self.close()
        for part in self._parts:
            with contextlib.suppress(Exception):
                delete(part)

    def __enter__(self) -> StagedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.discard()


def open_staged_write(uri: str, staging: str, size_hint: int | None = None) -> StagedWriter:
    """A writer for `uri` that stages under `staging` until publish(); see StagedWriter."""
    try:
        return StagedWriter(uri, staging, size_hint)
    except StorageError:
        raise
    except Exception as e:
        raise wrap_error(uri, e) from e
