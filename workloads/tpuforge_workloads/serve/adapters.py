"""The serving pod's adapters sidecar: fetch LoRA adapters into the pod's adapter volume when the operator asks.

    python -m tpuforge_workloads.serve.adapters --model-dir /models/model --model-name gemma4-31b \
        --adapters-dir /adapters --max-lora-rank 64 --host $(POD_IP) --port 8001

The operator drives it over HTTP and then loads the local copy into vLLM (/v1/load_lora_adapter):
    GET    /health                          200 once it serves
    GET    /adapters                        {"adapters": {name: state}}
    PUT    /adapters/<name> {uri, revision} fetch it in the background unless held already; returns the state
    DELETE /adapters/<name>[?keep=d]        remove the local copies of <name> (all but directory d with keep)
A state is {uri, revision, phase: Fetching|Ready|Failed, message, step, path, seconds, copies}. A copy lives in
<adapters-dir>/<name>/<first 12 hex of the marker's sha256>, so a replacement never overwrites the files vLLM
may still read: the operator removes the old copy once vLLM serves the new one.

An adapter is refused (Failed, with what to do) when its directory has no `_COMPLETE` marker, when the manifest
says it is not an adapter, when it was trained for another model (modelName) or another base checkpoint
(baseConfigSha256 against this pod's config.json), when its rank exceeds the server's --max-lora-rank, or
when, once copied, it changes k_proj without v_proj on a layer whose values are its keys (vLLM would apply it
to the keys only; see tpuforge_workloads.merge.peft).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tpuforge.api.configs import ServeConfig
from tpuforge_workloads import storage
from tpuforge_workloads.merge.errors import MergeInputError
from tpuforge_workloads.merge.safetensors_io import read_header
from tpuforge_workloads.model.adapters import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterError,
    AdapterInfo,
    read_adapter_manifest,
    values_without_lora,
)
from tpuforge_workloads.serve import fetch
from tpuforge_workloads.storage import commit

ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)
DIGEST_CHARS = 12
# A failed fetch is tried again when asked after this long (a marker may appear; GCS may come back).
RETRY_SECONDS = 15.0
PARALLEL_ADAPTERS = 2

FETCHING, READY, FAILED = "Fetching", "Ready", "Failed"


class AdapterRefused(RuntimeError):
    """The adapter cannot be served here; the message says why and what to do."""


@dataclass
class AdapterState:
    uri: str
    revision: str = ""  # the same URI rewritten by a rerun of its FineTuneJob comes with a new revision
    phase: str = FETCHING
    message: str = ""
    step: int | None = None
    path: str | None = None
    seconds: float | None = None
    since: float = 0.0  # monotonic time of the last change, for retries
    busy: bool = False  # a fetch is running for it


class AdapterStore:
    """The adapters of one pod: what was asked, what is on disk, and the fetches in flight."""

    def __init__(self, model_dir: Path | str, model_name: str, adapters_dir: Path, max_lora_rank: int) -> None:
        # The base's local copy, or its gs:// directory when vLLM streams it (no copy in the pod).
        self.model_dir = str(model_dir)
        self.model_name = model_name
        self.adapters_dir = adapters_dir
        self.max_lora_rank = max_lora_rank
        self._states: dict[str, AdapterState] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(PARALLEL_ADAPTERS, thread_name_prefix="adapter-fetch")
        self._base_sha: str | None = None

    def states(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            out = {n: _public(s) for n, s in self._states.items()}
        for name, st in out.items():
            root = self.adapters_dir / name
            st["copies"] = sorted(d.name for d in root.iterdir()) if root.is_dir() else []
        return out

    def request(self, name: str, uri: str, revision: str = "") -> dict[str, Any]:
        """Fetch `uri` as `name` unless it is held or being fetched already (or failed only just now)."""
        uri = uri.rstrip("/")
        with self._lock:
            st = self._states.get(name)
            if st is None or (st.uri, st.revision) != (uri, revision):
                st = AdapterState(uri=uri, revision=revision, since=time.monotonic(), busy=True)
                self._states[name] = st
                self._pool.submit(self._fetch, name, st)
            elif st.phase == FAILED and not st.busy and time.monotonic() - st.since >= RETRY_SECONDS:
                # It stays Failed while it is tried again: an adapter that keeps failing never looks Fetching.
                st.busy, st.since = True, time.monotonic()
                self._pool.submit(self._fetch, name, st)
            return _public(st)

    def remove(self, name: str, keep: str | None = None) -> list[str]:
        """Delete the copies of `name` except the directory `keep`; without `keep`, forget it too."""
        with self._lock:
            if keep is None:
                self._states.pop(name, None)
        root = self.adapters_dir / name
        removed = []
        if root.is_dir():
            for d in sorted(root.iterdir()):
                if d.name != keep:
                    shutil.rmtree(d, ignore_errors=True)
                    removed.append(d.name)
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
        return removed

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- the fetch -------------------------------------------------------------------------------------

    def _fetch(self, name: str, st: AdapterState) -> None:
        started = time.monotonic()
        try:
            path, step = self._copy(st.uri, name)
        except (AdapterRefused, fetch.FetchError, commit.CommitError, storage.StorageError, OSError) as e:
            self._finish(name, st, FAILED, str(e), None, None, started)
            return
        except Exception as e:  # a bug must not leave the adapter Fetching for ever
            traceback.print_exc()
            self._finish(name, st, FAILED, f"{type(e).__name__}: {e}", None, None, started)
            return
        self._finish(name, st, READY, f"fetched {st.uri}", path, step, started)

    def _finish(
        self, name: str, st: AdapterState, phase: str, message: str, path: str | None, step: int | None, t0: float
    ) -> None:
        with self._lock:
            if self._states.get(name) is not st:
                return  # replaced or removed meanwhile: that request's state stands
            st.phase, st.message, st.path, st.step = phase, message, path, step
            st.seconds = time.monotonic() - t0
            st.since, st.busy = time.monotonic(), False
        print(f"adapter {name}: {phase}: {message}", file=sys.stderr if phase == FAILED else sys.stdout)

    def base_config_sha256(self) -> str:
        if self._base_sha is None:
            self._base_sha = hashlib.sha256(self._base_config()).hexdigest()
        return self._base_sha

    def _base_config(self) -> bytes:
        config = storage.join(self.model_dir, "config.json")
        try:
            return storage.read_bytes(config)
        except storage.StorageError as e:
            raise AdapterRefused(
                f"the base model has no config.json at {config}; the model fetch did not finish"
            ) from e

    def check(self, uri: str, info: AdapterInfo) -> int:
        """Refuse an adapter this server cannot serve; returns its step."""
        if info.model_name != self.model_name:
            raise AdapterRefused(
                f"{uri} was trained for model {info.model_name!r}, but this deployment serves {self.model_name!r}; "
                "serve it from a ServingDeployment of that base"
            )
        if info.base_config_sha256 != self.base_config_sha256():
            raise AdapterRefused(
                f"{uri} was trained on another base checkpoint ({info.base_model_uri}): its config.json differs "
                "from this deployment's base model; serve it on the base it was trained on"
            )
        if info.rank > self.max_lora_rank:
            raise AdapterRefused(
                f"{uri} has LoRA rank {info.rank}, above this server's --max-lora-rank {self.max_lora_rank}; raise "
                "spec.vllm.lora.maxLoraRank (this restarts the pods)"
            )
        return info.step

    def _copy(self, uri: str, name: str) -> tuple[str, int | None]:
        try:
            _, info = read_adapter_manifest(uri)
        except AdapterError as e:
            raise AdapterRefused(str(e)) from e
        step = self.check(uri, info)
        digest = hashlib.sha256(storage.read_bytes(commit.marker_uri(uri))).hexdigest()
        target = self.adapters_dir / name / digest[:DIGEST_CHARS]
        fetch.fetch(ServeConfig(model_uri=uri, target_dir=str(target)))
        # fetch checks the marker did not change while it copied; this checks it is the one checked above.
        stamp = json.loads((target / fetch.FETCHED_STAMP).read_text())
        if stamp.get("marker") != digest:
            shutil.rmtree(target, ignore_errors=True)
            raise fetch.FetchError(f"{uri} was rewritten while it was being fetched; it is fetched again")
        try:
            self.check_tensors(uri, target)
        except AdapterRefused:
            shutil.rmtree(target, ignore_errors=True)
            raise
        return str(target), step

    def check_tensors(self, uri: str, copy: Path) -> None:
        """Refuse an adapter that vLLM would apply otherwise than it was trained: one that changes k_proj but
        not v_proj where the base's values are its keys (an export from before tpuforge wrote both)."""
        try:
            names = [t.name for t in read_header(str(copy / WEIGHTS_FILE))]
        except MergeInputError as e:
            raise AdapterRefused(str(e)) from e
        base = json.loads(self._base_config())
        if layers := values_without_lora(names, base):
            raise AdapterRefused(
                f"{uri} changes k_proj but not v_proj on layers {layers}, whose values are their keys: vLLM would "
                "apply it to the keys only and answer otherwise than the adapter was trained; export it again "
                "with this version of tpuforge, which writes k_proj's factors under v_proj too (or add them)"
            )


def _public(st: AdapterState) -> dict[str, Any]:
    out = asdict(st)
    del out["since"], out["busy"]
    return out


def _handler(store: AdapterStore) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _name(self) -> str | None:
            parts = urlsplit(self.path).path.strip("/").split("/")
            if len(parts) == 2 and parts[0] == "adapters" and parts[1] not in ("", ".", ".."):
                return parts[1]
            return None

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path == "/health":
                self._reply(200, {"status": "ok"})
            elif path == "/adapters":
                self._reply(200, {"adapters": store.states()})
            else:
                self._reply(404, {"error": f"no such path {path}"})

        def do_PUT(self) -> None:
            name = self._name()
            if name is None:
                self._reply(404, {"error": "PUT /adapters/<name>"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                uri, revision = body["uri"], body.get("revision") or ""
                if not isinstance(uri, str) or not uri or not isinstance(revision, str):
                    raise ValueError("uri must be a non-empty string, revision a string")
            except (ValueError, KeyError, TypeError) as e:
                self._reply(400, {"error": f'body must be {{"uri": ..., "revision": ...}}: {e}'})
                return
            self._reply(202, store.request(name, uri, revision))

        def do_DELETE(self) -> None:
            name = self._name()
            if name is None:
                self._reply(404, {"error": "DELETE /adapters/<name>"})
                return
            keep = parse_qs(urlsplit(self.path).query).get("keep", [None])[0]
            self._reply(200, {"removed": store.remove(name, keep)})

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the operator polls; its requests would flood the log

    return Handler


def serve(store: AdapterStore, host: str, port: int) -> ThreadingHTTPServer:
    """A started server (in a daemon thread); `shutdown()` stops it."""
    server = ThreadingHTTPServer((host, port), _handler(store))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="adapters-http", daemon=True).start()
    return server


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tpuforge_workloads.serve.adapters", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model-dir",
        required=True,
        help="the base model's local copy, or its gs:// directory when streamed (its config.json is checked)",
    )
    p.add_argument("--model-name", required=True, help="the base model's catalog id (adapters name theirs)")
    p.add_argument("--adapters-dir", required=True, help="the volume the adapters are copied into")
    p.add_argument("--max-lora-rank", type=int, required=True, help="vLLM's --max-lora-rank")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8001)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    adapters_dir = Path(a.adapters_dir)
    adapters_dir.mkdir(parents=True, exist_ok=True)
    store = AdapterStore(a.model_dir, a.model_name, adapters_dir, a.max_lora_rank)
    server = serve(store, a.host, a.port)
    print(f"adapters sidecar on {a.host}:{a.port}, copies in {adapters_dir}")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
