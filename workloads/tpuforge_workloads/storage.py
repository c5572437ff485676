"""One way to read and write gs:// and local paths. Every workload goes through here.

A URI is either `gs://bucket/key` or a local path. Directory-like URIs have no trailing-slash semantics:
`join(uri, name)` adds one separator. GCS access uses google-cloud-storage, which follows
STORAGE_EMULATOR_HOST (the sandbox's fake-gcs-server) when it is set.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


class StorageError(RuntimeError):
    """A URI that cannot be read or written, with the URI in the message."""


def is_gcs(uri: str) -> bool:
    return uri.startswith("gs://")


def split_gcs(uri: str) -> tuple[str, str]:
    rest = uri[len("gs://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StorageError(f"{uri}: no bucket in gs:// URI")
    return bucket, key


def join(uri: str, *parts: str) -> str:
    out = uri.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


@functools.cache
def _client() -> Any:
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project=os.environ.get("GOOGLE_CLOUD_PROJECT", "local"),
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        )
    return storage.Client()


def _blob(uri: str) -> Any:
    bucket, key = split_gcs(uri)
    return _client().bucket(bucket).blob(key)


def _wrap(uri: str, exc: Exception) -> StorageError:
    return StorageError(f"{uri}: {type(exc).__name__}: {exc}")


def exists(uri: str) -> bool:
    if not is_gcs(uri):
        return Path(uri).exists()
    try:
        if _blob(uri).exists():
            return True
        return any(True for _ in list_files(uri, limit=1))
    except StorageError:
        raise
    except Exception as e:
        raise _wrap(uri, e) from e


def is_file(uri: str) -> bool:
    if not is_gcs(uri):
        return Path(uri).is_file()
    try:
        return bool(_blob(uri).exists())
    except Exception as e:
        raise _wrap(uri, e) from e


def read_bytes(uri: str) -> bytes:
    try:
        if not is_gcs(uri):
            return Path(uri).read_bytes()
        return bytes(_blob(uri).download_as_bytes())
    except Exception as e:
        raise _wrap(uri, e) from e


def read_text(uri: str) -> str:
    return read_bytes(uri).decode("utf-8")


def write_bytes(uri: str, data: bytes) -> None:
    try:
        if not is_gcs(uri):
            p = Path(uri)
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(f".{p.name}.tmp")
            tmp.write_bytes(data)
            tmp.replace(p)  # a reader never sees half a file
            return
        _blob(uri).upload_from_string(data)  # a GCS object appears whole or not at all
    except Exception as e:
        raise _wrap(uri, e) from e


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def size(uri: str) -> int:
    try:
        if not is_gcs(uri):
            return Path(uri).stat().st_size
        blob = _blob(uri)
        blob.reload()
        return int(blob.size)
    except Exception as e:
        raise _wrap(uri, e) from e


def open_read(uri: str) -> IO[bytes]:
    """A seekable binary reader; on GCS it fetches ranges as it goes (no whole-object download)."""
    try:
        if not is_gcs(uri):
            return open(uri, "rb")
        return _blob(uri).open("rb", chunk_size=8 * 1024 * 1024)  # type: ignore[no-any-return]
    except Exception as e:
        raise _wrap(uri, e) from e


def list_files(uri: str, limit: int | None = None) -> Iterator[str]:
    """Paths of the files under directory `uri`, relative to it, recursively."""
    try:
        if not is_gcs(uri):
            root = Path(uri)
            if not root.is_dir():
                return
            n = 0
            for p in sorted(root.rglob("*")):
                if p.is_file():
                    yield p.relative_to(root).as_posix()
                    n += 1
                    if limit is not None and n >= limit:
                        return
            return
        bucket, key = split_gcs(uri)
        prefix = key.rstrip("/") + "/" if key else ""
        for blob in _client().list_blobs(bucket, prefix=prefix, max_results=limit):
            yield blob.name[len(prefix) :]
    except StorageError:
        raise
    except Exception as e:
        raise _wrap(uri, e) from e


def dir_bytes(uri: str) -> int:
    """Total size of the files under directory `uri`, recursively (one listing on GCS)."""
    try:
        if not is_gcs(uri):
            return sum(p.stat().st_size for p in Path(uri).rglob("*") if p.is_file())
        bucket, key = split_gcs(uri)
        return sum(int(b.size or 0) for b in _client().list_blobs(bucket, prefix=key.rstrip("/") + "/"))
    except Exception as e:
        raise _wrap(uri, e) from e


def download_file(uri: str, local: str | Path) -> None:
    local = Path(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    try:
        if not is_gcs(uri):
            shutil.copyfile(uri, local)
        else:
            _blob(uri).download_to_filename(str(local))
    except Exception as e:
        raise _wrap(uri, e) from e


def upload_file(local: str | Path, uri: str) -> None:
    try:
        if not is_gcs(uri):
            Path(uri).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, uri)
        else:
            _blob(uri).upload_from_filename(str(local))
    except Exception as e:
        raise _wrap(uri, e) from e


def download_dir(uri: str, local: str | Path) -> list[str]:
    """Copy every file under `uri` to `local`; returns the relative paths copied."""
    names = list(list_files(uri))
    for name in names:
        download_file(join(uri, name), Path(local) / name)
    return names


def delete(uri: str) -> None:
    """Delete one file (missing is fine)."""
    try:
        if not is_gcs(uri):
            Path(uri).unlink(missing_ok=True)
        else:
            from google.api_core.exceptions import NotFound

            with contextlib.suppress(NotFound):
                _blob(uri).delete()
    except Exception as e:
        raise _wrap(uri, e) from e


def delete_dir(uri: str) -> None:
    """Delete every file under directory `uri` (missing is fine)."""
    if not is_gcs(uri):
        shutil.rmtree(uri, ignore_errors=True)
        return
    for name in list(list_files(uri)):
        delete(join(uri, name))


def read_range(uri: str, start: int, length: int) -> bytes:
    """`length` bytes of file `uri` from byte `start` (fewer only at the end of the file)."""
    if length <= 0:
        return b""
    try:
        if not is_gcs(uri):
            with open(uri, "rb") as f:
                parts = []
                while length > 0:
                    part = os.pread(f.fileno(), length, start)
                    if not part:
                        break
                    parts.append(part)
                    start += len(part)
                    length -= len(part)
                return parts[0] if len(parts) == 1 else b"".join(parts)
        from google.api_core.exceptions import RequestRangeNotSatisfiable

        try:
            # No checksum: GCS checksums cover whole objects, not ranges.
            return bytes(_blob(uri).download_as_bytes(start=start, end=start + length - 1, checksum=None))
        except RequestRangeNotSatisfiable:
            return b""  # start is at or past the end, as a local read would say
    except Exception as e:
        raise _wrap(uri, e) from e


def read_range_into(uri: str, start: int, buffer: memoryview) -> int:
    """Fill `buffer` with the bytes of file `uri` from byte `start`; returns how many were read (fewer only at
    the end of the file). Reading into a buffer the caller reuses saves the page faults of a fresh
    allocation, which on a local disk cost more CPU than the read itself."""
    if not is_gcs(uri):
        try:
            with open(uri, "rb") as f:
                got = 0
                while got < len(buffer):
                    n = os.preadv(f.fileno(), [buffer[got:]], start + got)
                    if n == 0:
                        break
                    got += n
                return got
        except Exception as e:
            raise _wrap(uri, e) from e
    data = read_range(uri, start, len(buffer))
    buffer[: len(data)] = data
    return len(data)


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
        from concurrent.futures import ThreadPoolExecutor

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
        blob = _client().bucket(bucket).blob(key, chunk_size=self._part_size)
        try:
            # A part is whole or absent: safe to retry.
            blob.upload_from_string(data, retry=DEFAULT_RETRY, timeout=_PART_TIMEOUT)
        except Exception as e:
            raise _wrap(name, e) from e

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._file is not None:
            try:
                self._file.close()
            except Exception as e:
                raise _wrap(self.staging, e) from e
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
            raise _wrap(self.uri, e) from e
        self._published = True

    def _compose(self) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        bucket_name, _ = split_gcs(self.uri)
        bucket = _client().bucket(bucket_name)
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
        raise _wrap(uri, e) from e
