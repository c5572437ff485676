"""The compiled train step kept in GCS (or a local directory) beside the checkpoints, so that a run, a
resumed attempt or the run after a preflight loads it instead of compiling it again.

The mechanism is JAX's persistent compilation cache: JAX keys each entry by a hash of the program (HLO,
debug info stripped), the compile options (device assignment included), jaxlib's version, the backend's
platform version (libtpu's build on TPU), XLA_FLAGS / LIBTPU_INIT_ARGS and the devices' topology, and loads
an entry in place of compiling when the key matches. JAX writes that cache to a local directory here; this
module copies entries between it and the remote one:

- before the first compile, `open_cache` copies the remote entries of this run's key into the local
  directory, checking that each one decompresses (a truncated or foreign file is skipped, and compiled
  again);
- after the compile (the trainer: after its first step, and at the end; the preflight: after each
  compile), `push` uploads the entries this process wrote, each as one whole object (or write-then-rename
  locally), so no reader ever sees half an entry.

The remote directory is `<root>/<key>/`: the key (`key_inputs`) is a short hash of what shapes the step:
jax/jaxlib/libtpu versions, the devices (platform, kind, count, hosts), the mesh, the decoder's config,
the LoRA and training settings and the schedule's step count, written beside the entries as key.json.
JAX's own key already tells programs apart, so the outer key is not needed for correctness: it keeps a
run's download to the entries of its own program (JAX's key is known only after tracing, so without it a
run would download every configuration the job ever compiled), and names what a directory holds.

Any failure to read or write the remote cache is logged and the run goes on compiling: the cache only
ever saves time. The cache is trusted code (an entry is a native executable): keep it where only the job's
own service account writes, as the checkpoints are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuforge.api import TrainConfig
from tpuforge_workloads import storage
from tpuforge_workloads.families.decoder import Decoder

log = logging.getLogger(__name__)

ENTRY_SUFFIX = "-cache"  # JAX's name for an entry file: <module>-<hash>-cache
KEY_FILE = "key.json"
# JAX's monitoring events: a compile that looked in the cache, and one that found its program there.
_COUNTED = {"/jax/compilation_cache/compile_requests_use_cache": "lookups", "/jax/compilation_cache/cache_hits": "hits"}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def key_inputs(text: Decoder, config: TrainConfig, total_steps: int, devices: Any) -> dict[str, Any]:
    """Everything that changes the compiled step, as the trainer and the preflight both know it: `devices`
    are the mesh's (real, or a TPU topology's compile-only ones), `total_steps` the schedule's length the
    step is built with."""
    flat = list(getattr(devices, "flat", devices))
    return {
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "libtpu": _version("libtpu"),
        "devices": {
            "platform": flat[0].platform,
            "kind": flat[0].device_kind,
            "count": len(flat),
            "hosts": len({d.process_index for d in flat}),
        },
        "mesh": config.mesh.model_dump(by_alias=True),
        "model": {"name": config.model_name, **dataclasses.asdict(text)},  # type: ignore[call-overload]
        "lora": config.lora.model_dump(by_alias=True),
        # Early stopping decides when the loop ends, not what the step computes.
        "training": config.training.model_dump(by_alias=True, exclude={"early_stopping"}),
        "total_steps": total_steps,
    }


def key_name(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def valid_entry(data: bytes) -> bool:
    """An entry JAX can read: it decompresses, and holds an executable beside its compile time."""
    from jax._src import compilation_cache as jcc  # the pinned jax's own entry format

    try:
        return len(jcc.decompress_executable(data)) > 4
    except Exception:
        return False


def _entries(directory: Path) -> set[str]:
    return {p.name for p in directory.glob(f"*{ENTRY_SUFFIX}")} if directory.is_dir() else set()


@dataclass
class CompileCache:
    """One run's cache: JAX writes `local`; `uri` is the remote directory of this run's key."""

    uri: str
    key: str
    local: Path
    remote: set[str] = field(default_factory=set)  # valid entries known to be in `uri`
    pulled: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # remote entries that did not decompress
    pushed: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"lookups": 0, "hits": 0})
    _before: set[str] = field(default_factory=set)

    def count(self, event: str, **kwargs: Any) -> None:
        name = _COUNTED.get(event)
        if name:
            self.counts[name] += 1

    def pull(self) -> None:
        try:
            names = [n for n in storage.list_files(self.uri) if "/" not in n and n.endswith(ENTRY_SUFFIX)]
        except storage.StorageError as e:
            log.warning("compile cache %s unreadable (%s); compiling", self.uri, e)
            names = []
        for name in names:
            target = self.local / name
            if target.is_file() and valid_entry(target.read_bytes()):
                self.remote.add(name)
                continue
            try:
                data = storage.read_bytes(storage.join(self.uri, name))
            except storage.StorageError as e:
                log.warning("compile cache entry %s unreadable (%s); it will be compiled", name, e)
                continue
            if not valid_entry(data):
                log.warning("compile cache entry %s/%s is damaged; it will be compiled and replaced", self.uri, name)
                self.rejected.append(name)
                continue
            tmp = target.with_name(f".{name}.{os.getpid()}.tmp")  # hosts may share the local directory
            tmp.write_bytes(data)
            tmp.replace(target)  # JAX never reads half an entry
            self.remote.add(name)
            self.pulled.append(name)
        self._before = _entries(self.local)

    def push(self) -> list[str]:
        """Upload the entries this process added (and those replacing damaged ones); returns their names.
        Never raises: a failed upload only means the next run compiles again."""
        try:
            return self._push()
        except Exception as e:
            log.warning("compile cache %s not stored (%s)", self.uri, e)
            return []

    def _push(self) -> list[str]:
        new = sorted((_entries(self.local) - self._before) | (set(self.rejected) & _entries(self.local)))
        done = []
        for name in new:
            if name in self.remote:
                continue
            data = (self.local / name).read_bytes()
            if not valid_entry(data):
                continue  # still being written by another process sharing the local directory
            try:
                storage.write_bytes(storage.join(self.uri, name), data)
            except storage.StorageError as e:
                log.warning("compile cache entry %s not stored (%s); the next run compiles it", name, e)
                continue
            self.remote.add(name)
            done.append(name)
        self.pushed.extend(done)
        if done:
            log.info("compile cache: stored %d entries in %s", len(done), self.uri)
        return done

    def stats(self) -> dict[str, Any]:
        """What the run summary records of the cache."""
        return {
            "uri": self.uri,
            **self.counts,
            "pulled": len(self.pulled),
            "rejected": self.rejected,
            "stored": self.pushed,
        }


def _set_jax_cache_dir(path: str | None) -> None:
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    jax.config.update("jax_compilation_cache_dir", path)  # type: ignore[no-untyped-call]
    # JAX's default also points XLA's GPU autotuning cache into the cache directory, and that path is then
    # hashed into every entry's key: two runs with different local directories would never share an
    # entry. It is a GPU-only cache; off, the key holds no path.
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")  # type: ignore[no-untyped-call]
    cc.reset_cache()  # JAX opens its cache once, at the first compile: make it open this one


@contextlib.contextmanager
def open_cache(root: str | None, inputs: dict[str, Any]) -> Iterator[CompileCache | None]:
    """JAX's compilation cache for the program `inputs` describe, filled from `<root>/<key>` and stored
    back there on leaving (and by `push()` on the way). `root` None: no remote cache, JAX as configured.

    The local directory is $JAX_COMPILATION_CACHE_DIR when that is a local path (a node's cache volume,
    the tests' shared cache), else a temporary one."""
    if not root:
        yield None
        return
    import jax

    configured = os.environ.get("JAX_COMPILATION_CACHE_DIR") or ""
    shared = bool(configured) and "://" not in configured
    local = Path(configured) if shared else Path(tempfile.mkdtemp(prefix="tpuforge-compile-cache-"))
    local.mkdir(parents=True, exist_ok=True)
    key = key_name(inputs)
    cache = CompileCache(storage.join(root, key), key, local)
    previous = jax.config.values["jax_compilation_cache_dir"]
    try:
        cache.pull()
    except Exception as e:  # the cache only saves time: never fail a run on it
        log.warning("compile cache %s not loaded (%s); compiling", cache.uri, e)
    log.info("compile cache %s: %d entries loaded, %d damaged", cache.uri, len(cache.pulled), len(cache.rejected))
    with contextlib.suppress(storage.StorageError):
        if not storage.is_file(storage.join(cache.uri, KEY_FILE)):
            storage.write_text(storage.join(cache.uri, KEY_FILE), json.dumps(inputs, indent=2, sort_keys=True))
    _set_jax_cache_dir(str(local))
    listener = cache.count
    jax.monitoring.register_event_listener(listener)
    try:
        yield cache
    finally:
        with contextlib.suppress(AssertionError):  # Tunix's metrics logger clears all listeners on close
            jax.monitoring.unregister_event_listener(listener)
        cache.push()
        _set_jax_cache_dir(previous)
        if not shared:
            shutil.rmtree(local, ignore_errors=True)
