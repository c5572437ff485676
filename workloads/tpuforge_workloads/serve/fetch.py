"""The serving pod's model-fetch init container: copy a committed merged model to the pod's model volume.

    python -m tpuforge_workloads.serve.fetch --config /etc/tpuforge/config.json   # a ServeConfig
    python -m tpuforge_workloads.serve.fetch --model-uri gs://b/merged --target-dir /models/model
    python -m tpuforge_workloads.serve.fetch --model-uri gs://b/merged --check-only   # a streamed model

It refuses a model directory without the `_COMPLETE` marker (the merge has not finished, or failed), copies
every file the marker's manifest lists, checking each file's size and sha256 as it streams, and leaves the
target directory holding exactly those files. A base model uploaded by hand has no marker: with
--uncommitted-base (ServeConfig.requireMarker false) every file under the directory is copied and its size
checked against the listing. A restarted init container, or a new pod on the same model disk, finds the copy
done and exits at once; a new model on that disk replaces the old one file by file. Exit codes: 0 done, 1
cannot fetch (missing marker, storage error, mismatch), EXIT_BAD_CONFIG for a bad config; the reason goes to
the termination log, where the operator reads it.

With --check-only (a model vLLM streams from GCS itself, modelStorage.medium Stream) nothing is copied: the
directory must be committed (unless --uncommitted-base), every file it lists must be there at its listed size,
and its weights must be safetensors, the only format the streamer reads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from tpuforge.api.configs import ServeConfig
from tpuforge.api.constants import COMPLETE_MARKER, EXIT_BAD_CONFIG, TERMINATION_LOG
from tpuforge_workloads import storage
from tpuforge_workloads.runtime import termination
from tpuforge_workloads.storage import commit

# Written last into the target directory: which model (by its marker) the directory holds.
FETCHED_STAMP = ".tpuforge-fetched.json"
PARTIAL_DIR = ".tpuforge-partial"
_CHUNK = 8 << 20
# Merged models come as several shards of a few GB: fetch a few at once to fill the network.
PARALLEL_FILES = 4


class FetchError(RuntimeError):
    """The model cannot be fetched; the message says what to do."""


def _safe_name(name: str) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or name.startswith(PARTIAL_DIR):
        raise FetchError(f"{COMPLETE_MARKER} lists an unsafe file name {name!r}; rewrite the model with the merger")
    return str(p)


def _marker_digest(uri: str) -> str:
    return hashlib.sha256(storage.read_bytes(commit.marker_uri(uri))).hexdigest()


def _already_fetched(uri: str, target: Path, digest: str, files: list[_File]) -> bool:
    stamp = target / FETCHED_STAMP
    try:
        seen = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    if seen != {"modelUri": uri, "marker": digest}:
        return False
    # Sizes are cheap to check; the contents were verified as they were written.
    return all((target / f.name).is_file() and (target / f.name).stat().st_size == f.size for f in files)


@dataclass(frozen=True)
class _File:
    name: str
    size: int
    sha256: str | None  # None for a base model's file: nothing recorded it


def _listing(uri: str) -> list[_File]:
    """Every file under an uncommitted model directory (a base model in HuggingFace layout)."""
    files = [_File(n, storage.size(storage.join(uri, n)), None) for n in sorted(storage.list_files(uri))]
    if not any(f.name == "config.json" for f in files):
        raise FetchError(
            f"{uri} holds no config.json, so it is not a model in HuggingFace layout; point the spec at the "
            "directory with config.json, *.safetensors and the tokenizer"
        )
    return files


def _copy_one(uri: str, f: _File, target: Path) -> None:
    src = storage.join(uri, f.name)
    partial = target / PARTIAL_DIR / f.name
    partial.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    n = 0
    with storage.open_read(src) as r, open(partial, "wb") as w:
        while chunk := r.read(_CHUNK):
            h.update(chunk)
            w.write(chunk)
            n += len(chunk)
    if n != f.size:
        raise FetchError(f"{src}: read {n} bytes, {COMPLETE_MARKER} says {f.size}; the model changed or is corrupt")
    if f.sha256 is not None and h.hexdigest() != f.sha256:
        raise FetchError(f"{src}: sha256 differs from {COMPLETE_MARKER}; the model changed or is corrupt")
    final = target / f.name
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, final)  # only verified files ever appear under their own name


def _remove_strays(target: Path, keep: set[str]) -> None:
    for p in sorted(target.rglob("*"), reverse=True):
        rel = p.relative_to(target).as_posix()
        if p.is_file() and rel not in keep:
            p.unlink()
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()


def _listing_digest(files: list[_File]) -> str:
    return hashlib.sha256(json.dumps([[f.name, f.size] for f in files]).encode()).hexdigest()


SAFETENSORS = ".safetensors"


def check(uri: str, require_marker: bool = True) -> dict[str, float]:
    """What a streamed model needs before vLLM reads it: committed (or, for an uncommitted base, in
    HuggingFace layout), every listed file present at its size, and safetensors weights. Reads listings only."""
    uri = uri.rstrip("/")
    manifest = commit.read_manifest(uri)
    if manifest is None and require_marker:
        raise FetchError(
            f"{uri} has no {COMPLETE_MARKER} marker: the merge has not finished or failed, so there is no model "
            "to serve yet; check the FineTuneJob (or spec.model.uri) and this pod retries on its own"
        )
    if manifest is not None:
        files = [_File(f.name, f.size, f.sha256) for f in manifest.files]
        for f in files:
            src = storage.join(uri, _safe_name(f.name))
            try:
                got: int | None = storage.size(src)
            except storage.StorageError:
                got = None
            if got != f.size:
                raise FetchError(
                    f"{src} is missing or not the {f.size} bytes {COMPLETE_MARKER} lists; "
                    "the model changed or is corrupt: write it again"
                )
    else:
        files = _listing(uri)
    if not any(f.name.endswith(SAFETENSORS) for f in files):
        raise FetchError(
            f"{uri} has no {SAFETENSORS} weights, and vLLM streams safetensors only (spec.modelStorage.medium "
            "Stream, the default): convert the checkpoint to safetensors, or set spec.modelStorage.medium: Disk "
            "to copy it into the pod"
        )
    return {"files": len(files), "bytes": sum(f.size for f in files)}


def fetch(cfg: ServeConfig) -> dict[str, float]:
    """Copy the model at cfg.model_uri (committed, or a base model when cfg.require_marker is false) into
    cfg.target_dir; returns what it did."""
    uri, target = cfg.model_uri.rstrip("/"), Path(cfg.target_dir)
    started = time.monotonic()
    manifest = commit.read_manifest(uri)
    if manifest is None and cfg.require_marker:
        raise FetchError(
            f"{uri} has no {COMPLETE_MARKER} marker: the merge has not finished or failed, so there is no model "
            "to serve yet; check the FineTuneJob (or spec.model.uri) and this pod retries on its own"
        )
    if manifest is not None:
        files = [_File(f.name, f.size, f.sha256) for f in manifest.files]
        digest = _marker_digest(uri)
    else:
        files = _listing(uri)
        digest = _listing_digest(files)
    for f in files:
        _safe_name(f.name)
    target.mkdir(parents=True, exist_ok=True)
    if _already_fetched(uri, target, digest, files):
        return {"files": 0, "bytes": 0, "seconds": time.monotonic() - started}
    (target / FETCHED_STAMP).unlink(missing_ok=True)
    shutil.rmtree(target / PARTIAL_DIR, ignore_errors=True)
    # On a persistent model disk the previous model is still there: drop what the new one does not list first,
    # so that the disk needs room for one model and the shards in flight, not two models.
    _remove_strays(target, {f.name for f in files})
    with ThreadPoolExecutor(max_workers=PARALLEL_FILES, thread_name_prefix="fetch") as pool:
        for fut in [pool.submit(_copy_one, uri, f, target) for f in files]:
            fut.result()
    now = _marker_digest(uri) if manifest is not None else _listing_digest(_listing(uri))
    if now != digest:
        raise FetchError(f"{uri} was rewritten while it was being fetched; the pod retries with the new model")
    shutil.rmtree(target / PARTIAL_DIR, ignore_errors=True)
    _remove_strays(target, {f.name for f in files} | {FETCHED_STAMP})
    (target / FETCHED_STAMP).write_text(json.dumps({"modelUri": uri, "marker": digest}))
    seconds = time.monotonic() - started
    return {"files": len(files), "bytes": sum(f.size for f in files), "seconds": seconds}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tpuforge_workloads.serve.fetch", description=__doc__.split("\n")[0])
    p.add_argument("--config", help="a ServeConfig JSON file (modelUri, targetDir)")
    p.add_argument("--model-uri", help="gs:// (or local) directory of a committed merged model")
    p.add_argument("--target-dir", help="local directory to copy it into (the pod's model volume)")
    p.add_argument(
        "--uncommitted-base",
        action="store_true",
        help="the URI is a base model without _COMPLETE (HuggingFace layout): copy every file under it",
    )
    p.add_argument(
        "--check-only",
        action="store_true",
        help="copy nothing: check that the model can be streamed by vLLM (committed, complete, safetensors)",
    )
    p.add_argument("--termination-log", default=TERMINATION_LOG, help="where the failure reason goes")
    return p


def _config(a: argparse.Namespace) -> ServeConfig:
    if a.config:
        if a.model_uri or a.target_dir or a.uncommitted_base:
            raise ValueError("give either --config or --model-uri and --target-dir, not both")
        try:
            text = Path(a.config).read_text()
        except OSError as e:
            raise ValueError(f"--config {a.config}: {e.strerror}") from None
        return ServeConfig.model_validate_json(text)
    if not (a.model_uri and a.target_dir):
        raise ValueError("give --config, or both --model-uri and --target-dir")
    return ServeConfig(model_uri=a.model_uri, target_dir=a.target_dir, require_marker=not a.uncommitted_base)


def _terminate(path: str, message: str) -> None:
    print(message, file=sys.stderr)
    termination.write(path, message)


def _check_main(args: argparse.Namespace) -> int:
    if args.config or args.target_dir or not args.model_uri:
        _terminate(args.termination_log, "bad serve config: --check-only takes --model-uri only")
        return EXIT_BAD_CONFIG
    try:
        done = check(args.model_uri, require_marker=not args.uncommitted_base)
    except (FetchError, commit.CommitError, storage.StorageError, OSError) as e:
        _terminate(args.termination_log, str(e))
        return 1
    print(f"{args.model_uri}: {int(done['files'])} files, {done['bytes'] / 1e6:.1f} MB, ready to stream")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.check_only:
        return _check_main(args)
    try:
        cfg = _config(args)
    except (ValueError, ValidationError) as e:
        _terminate(args.termination_log, f"bad serve config: {e}")
        return EXIT_BAD_CONFIG
    try:
        done = fetch(cfg)
    except (FetchError, commit.CommitError, storage.StorageError, OSError) as e:
        _terminate(args.termination_log, str(e))
        return 1
    if done["files"] == 0:
        print(f"{cfg.target_dir} already holds {cfg.model_uri}")
    else:
        mb = done["bytes"] / 1e6
        print(
            f"fetched {cfg.model_uri} -> {cfg.target_dir}: {int(done['files'])} files, {mb:.1f} MB in "
            f"{done['seconds']:.1f}s ({mb / max(done['seconds'], 1e-9):.1f} MB/s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
