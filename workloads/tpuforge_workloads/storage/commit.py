"""The commit protocol of a directory that other pods read (the merged model).

A writer stages every file, publishes them, and writes the `_COMPLETE` marker last. The marker holds a
manifest: the name, size and sha256 of every file of the output. Readers (the operator, the serving
pods' model fetch) treat a directory without the marker as absent, and check what they read against
the manifest. A writer that restarts deletes the marker first, so a half-rewritten directory is never
mistaken for a complete one.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tpuforge.api.constants import COMPLETE_MARKER
from tpuforge_workloads import storage

# Where writers stage files before publishing them (under the output directory, so that a GCS compose
# or a local rename can publish them, and one delete cleans up after a crash).
STAGING_DIR = "_staging"
_HASH_CHUNK = 16 << 20


class CommitError(RuntimeError):
    """A marker that cannot be read, or files that do not match it."""


class ManifestFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Path relative to the output directory, '/'-separated.")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = 1
    files: list[ManifestFile]
    metadata: dict[str, Any] = Field(default_factory=dict, description="What the writer wants readers to know.")

    def names(self) -> set[str]:
        return {f.name for f in self.files}

    def total_size(self) -> int:
        return sum(f.size for f in self.files)


def marker_uri(uri: str) -> str:
    return storage.join(uri, COMPLETE_MARKER)


def staging_uri(uri: str) -> str:
    return storage.join(uri, STAGING_DIR)


def read_manifest(uri: str) -> Manifest | None:
    """The manifest of a committed directory; None when it has no marker (it is absent to readers)."""
    marker = marker_uri(uri)
    if not storage.is_file(marker):
        return None
    text = storage.read_text(marker)
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as e:
        raise CommitError(f"{marker}: not a valid manifest ({e.error_count()} errors: {e.errors()[0]['msg']})") from e


def is_complete(uri: str) -> bool:
    return read_manifest(uri) is not None


def write_marker(uri: str, manifest: Manifest) -> None:
    """Commit: the last write of an output."""
    storage.write_text(marker_uri(uri), manifest.model_dump_json(indent=1) + "\n")


def remove_marker(uri: str) -> None:
    """Un-commit before changing a directory in place."""
    storage.delete(marker_uri(uri))


def sha256_of(uri: str) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := storage.read_range(uri, offset, _HASH_CHUNK):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def check_files(uri: str, manifest: Manifest, checksums: bool = True) -> list[str]:
    """What differs between the files under `uri` (a gs:// or local directory, e.g. a downloaded copy)
    and the manifest: missing files, wrong sizes and, with `checksums`, wrong contents. Empty if none."""
    problems = []
    for f in manifest.files:
        path = storage.join(uri, f.name)
        if not storage.is_file(path):
            problems.append(f"{f.name}: missing")
            continue
        got = storage.size(path)
        if got != f.size:
            problems.append(f"{f.name}: {got} bytes, manifest says {f.size}")
        elif checksums and sha256_of(path) != f.sha256:
            problems.append(f"{f.name}: sha256 differs from the manifest")
    return problems


def require_complete(uri: str, checksums: bool = False) -> Manifest:
    """The manifest of `uri` after checking its files; raises CommitError naming what is wrong."""
    manifest = read_manifest(uri)
    if manifest is None:
        raise CommitError(f"{uri}: no {COMPLETE_MARKER} marker: the output is incomplete or was never written")
    problems = check_files(uri, manifest, checksums=checksums)
    if problems:
        raise CommitError(f"{uri}: files do not match {COMPLETE_MARKER}: " + "; ".join(problems[:5]))
    return manifest


def commit_small_files(uri: str, files: dict[str, bytes], metadata: dict[str, Any] | None = None) -> Manifest:
    """Write a directory of small files (a report) and commit it: un-commit, write each file whole, drop what
    an earlier commit listed and this one does not, write the marker last. A re-run replaces it."""
    previous = None
    with contextlib.suppress(CommitError):  # unreadable: replaced below all the same
        previous = read_manifest(uri)
    remove_marker(uri)
    for name, data in files.items():
        storage.write_bytes(storage.join(uri, name), data)
    for stale in sorted((previous.names() if previous else set()) - set(files)):
        storage.delete(storage.join(uri, stale))
    manifest = Manifest(
        files=[ManifestFile(name=n, size=len(d), sha256=hashlib.sha256(d).hexdigest()) for n, d in files.items()],
        metadata=metadata or {},
    )
    write_marker(uri, manifest)
    return manifest
