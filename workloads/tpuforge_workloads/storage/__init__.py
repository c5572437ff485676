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
def client() -> Any:
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
    return client().bucket(bucket).blob(key)


def wrap_error(uri: str, exc: Exception) -> StorageError:
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
        raise wrap_error(uri, e) from e


def is_file(uri: str) -> bool:
    if not is_gcs(uri):
        return Path(uri).is_file()
    try:
        return bool(_blob(uri).exists())
    except Exception as e:
        raise wrap_error(uri, e) from e


def read_bytes(uri: str) -> bytes:
    try:
        if not is_gcs(uri):
            return Path(uri).read_bytes()
        return bytes(_blob(uri).download_as_bytes())
    except Exception as e:
        raise wrap_error(uri, e) from e


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
        raise wrap_error(uri, e) from e


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
        raise wrap_error(uri, e) from e


def open_read(uri: str) -> IO[bytes]:
    """A seekable binary reader; on GCS it fetches ranges as it goes (no whole-object download)."""
    try:
        if not is_gcs(uri):
            return open(uri, "rb")
        return _blob(uri).open("rb", chunk_size=8 * 1024 * 1024)  # type: ignore[no-any-return]
    except Exception as e:
        raise wrap_error(uri, e) from e


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
        for blob in client().list_blobs(bucket, prefix=prefix, max_results=limit):
            yield blob.name[len(prefix) :]
    except StorageError:
        raise
    except Exception as e:
        raise wrap_error(uri, e) from e


def dir_bytes(uri: str) -> int:
    """Total size of the files under directory `uri`, recursively (one listing on GCS)."""
    try:
        if not is_gcs(uri):
            return sum(p.stat().st_size for p in Path(uri).rglob("*") if p.is_file())
        bucket, key = split_gcs(uri)
        return sum(int(b.size or 0) for b in client().list_blobs(bucket, prefix=key.rstrip("/") + "/"))
    except Exception as e:
        raise wrap_error(uri, e) from e


def download_file(uri: str, local: str | Path) -> None:
    local = Path(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    try:
        if not is_gcs(uri):
            shutil.copyfile(uri, local)
        else:
            _blob(uri).download_to_filename(str(local))
    except Exception as e:
        raise wrap_error(uri, e) from e


def upload_file(local: str | Path, uri: str) -> None:
    try:
        if not is_gcs(uri):
            Path(uri).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, uri)
        else:
            _blob(uri).upload_from_filename(str(local))
    except Exception as e:
        raise wrap_error(uri, e) from e


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
        raise wrap_error(uri, e) from e


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
        raise wrap_error(uri, e) from e


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
            raise wrap_error(uri, e) from e
    data = read_range(uri, start, len(buffer))
    buffer[: len(data)] = data
    return len(data)
