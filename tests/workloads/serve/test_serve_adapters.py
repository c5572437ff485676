"""The serving pod's adapters sidecar over HTTP, with adapters the merge exported from LoRA checkpoints of the
tiny Gemma 4, published to fake-gcs-server: committed adapters of this base are fetched and verified, anything
else is refused with the reason, replacements get a directory of their own, and removals clean up."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors.numpy import load_file, save_file

from tests.fixtures.adapters import RANK, STEP, adapter_metadata, export_adapter, publish_adapter
from tpuforge.api.constants import COMPLETE_MARKER
from tpuforge_sandbox import wait_for
from tpuforge_sandbox.gcs import free_port
from tpuforge_workloads import storage
from tpuforge_workloads.model.adapters import WEIGHTS_FILE
from tpuforge_workloads.serve import adapters as sidecar


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[int, Path]:
    work = tmp_path_factory.mktemp("adapters")
    return {seed: export_adapter(tiny_model_dir, work, seed) for seed in (1, 2)}


@pytest.fixture
def pod(tmp_path: Path, tiny_model_dir: Path) -> Iterator[str]:
    """The sidecar of a pod whose model volume holds the tiny base: its base URL."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    store = sidecar.AdapterStore(model, "gemma4-tiny", tmp_path / "adapters", max_lora_rank=RANK)
    port = free_port()
    server = sidecar.serve(store, "127.0.0.1", port)
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    store.close()


def call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def settled(base: str, name: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        state: dict[str, Any] = call("GET", f"{base}/adapters")[1]["adapters"][name]
        if state["phase"] != sidecar.FETCHING or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def test_fetches_a_committed_adapter_and_replaces_it_in_a_new_directory(
    pod: str, exported: dict[int, Path], tiny_model_dir: Path, bucket: str
) -> None:
    assert call("GET", f"{pod}/health") == (200, {"status": "ok"})
    first = publish_adapter(exported[1], f"{bucket}/jobs/a/adapter", adapter_metadata(tiny_model_dir))
    code, state = call("PUT", f"{pod}/adapters/capitals", {"uri": first})
    assert code == 202 and state["uri"] == first

    st = settled(pod, "capitals")
    assert st["phase"] == sidecar.READY, st
    assert st["step"] == STEP and st["seconds"] > 0
    path = Path(st["path"])
    assert sorted(p.name for p in path.iterdir() if not p.name.startswith(".")) == list(sidecar.ADAPTER_FILES)
    for name in sidecar.ADAPTER_FILES:
        assert (path / name).read_bytes() == (exported[1] / name).read_bytes()
    assert st["copies"] == [path.name]
    # Asking again for what it holds changes nothing.
    assert call("PUT", f"{pod}/adapters/capitals", {"uri": first + "/"})[1]["path"] == str(path)

    second = publish_adapter(exported[2], f"{bucket}/jobs/b/adapter", adapter_metadata(tiny_model_dir))
    call("PUT", f"{pod}/adapters/capitals", {"uri": second})
    st2 = settled(pod, "capitals")
    assert st2["phase"] == sidecar.READY and st2["path"] != str(path)
    # The old copy stays (vLLM may still read it) until the operator says which one to keep.
    assert sorted(st2["copies"]) == sorted([path.name, Path(st2["path"]).name])
    assert call("DELETE", f"{pod}/adapters/capitals?keep={Path(st2['path']).name}") == (200, {"removed": [path.name]})
    assert not path.exists() and Path(st2["path"]).is_dir()

    # The same URI with a new revision (its job ran again) is fetched again.
    call("PUT", f"{pod}/adapters/capitals", {"uri": second, "revision": "uid/2"})
    assert settled(pod, "capitals")["revision"] == "uid/2"

    assert call("DELETE", f"{pod}/adapters/capitals")[0] == 200
    assert call("GET", f"{pod}/adapters")[1] == {"adapters": {}}
    assert not Path(st2["path"]).parent.exists()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("uncommitted", f"has no {COMPLETE_MARKER} marker"),
        ("other-model", "was trained for model 'gemma4-e4b', but this deployment serves 'gemma4-tiny'"),
        ("other-base", "was trained on another base checkpoint"),
        ("rank", "has LoRA rank 16, above this server's --max-lora-rank 8"),
        ("not-adapter", "not an adapter; adapters live in <output>/adapter"),
        ("keys-only", "changes k_proj but not v_proj on layers [1], whose values are their keys"),
    ],
)
def test_refuses_what_it_cannot_serve_and_says_why(
    pod: str, exported: dict[int, Path], tiny_model_dir: Path, bucket: str, case: str, message: str, tmp_path: Path
) -> None:
    local = exported[1]
    if case == "keys-only":  # as exported before v_proj got k_proj's factors on the keys = values layer
        local = tmp_path / "keys-only"
        shutil.copytree(exported[1], local)
        weights = load_file(str(local / WEIGHTS_FILE))
        kept = {k: v for k, v in weights.items() if ".layers.1.self_attn.v_proj." not in k}
        save_file(kept, str(local / WEIGHTS_FILE))
    md = adapter_metadata(tiny_model_dir)
    if case == "other-model":
        md["modelName"] = "gemma4-e4b"
    elif case == "other-base":
        md["baseConfigSha256"] = "0" * 64
    elif case == "rank":
        md["rank"] = 16
    elif case == "not-adapter":
        md["kind"] = "merged"
    uri = publish_adapter(local, f"{bucket}/{case}/adapter", md, committed=case != "uncommitted")
    call("PUT", f"{pod}/adapters/bad", {"uri": uri})
    st = settled(pod, "bad")
    assert st["phase"] == sidecar.FAILED and message in st["message"], st
    assert st["path"] is None and st["copies"] == []


def test_a_failed_adapter_is_fetched_again_once_its_marker_appears(
    pod: str, exported: dict[int, Path], tiny_model_dir: Path, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sidecar, "RETRY_SECONDS", 0.0)
    uri = publish_adapter(exported[1], f"{bucket}/late/adapter", adapter_metadata(tiny_model_dir), committed=False)
    call("PUT", f"{pod}/adapters/late", {"uri": uri})
    assert settled(pod, "late")["phase"] == sidecar.FAILED
    # Tried again, it stays Failed (never Fetching) while it keeps failing: alerts on Failed hold.
    for _ in range(5):
        assert call("PUT", f"{pod}/adapters/late", {"uri": uri})[1]["phase"] == sidecar.FAILED
        assert settled(pod, "late")["phase"] == sidecar.FAILED
    publish_adapter(exported[1], uri, adapter_metadata(tiny_model_dir))
    call("PUT", f"{pod}/adapters/late", {"uri": uri})
    wait_for(lambda: settled(pod, "late")["phase"] == sidecar.READY, 30, "the retried fetch to succeed")
    assert storage.is_file(f"{uri}/{COMPLETE_MARKER}")


def test_bad_requests_are_answered_with_the_fix(pod: str) -> None:
    code, body = call("PUT", f"{pod}/adapters/x", {"url": "gs://b/a"})
    assert code == 400 and "uri" in body["error"]
    assert call("PUT", f"{pod}/adapters", {"uri": "gs://b/a"})[0] == 404
    assert call("GET", f"{pod}/nothing")[0] == 404


def test_a_streamed_base_is_read_from_gcs_to_check_adapters(
    tmp_path: Path, exported: dict[int, Path], tiny_model_dir: Path, tiny_model_gs: str, bucket: str
) -> None:
    """modelStorage.medium Stream: the pod has no copy of the base, so the sidecar checks each adapter against
    the base's config.json in GCS."""
    store = sidecar.AdapterStore(tiny_model_gs, "gemma4-tiny", tmp_path / "adapters", max_lora_rank=RANK)
    port = free_port()
    server = sidecar.serve(store, "127.0.0.1", port)
    base = f"http://127.0.0.1:{port}"
    try:
        uri = publish_adapter(exported[1], f"{bucket}/jobs/a/adapter", adapter_metadata(tiny_model_dir))
        call("PUT", f"{base}/adapters/capitals", {"uri": uri})
        assert settled(base, "capitals")["phase"] == sidecar.READY
        other = json.loads((tiny_model_dir / "config.json").read_text()) | {"note": "another checkpoint"}
        storage.write_text(f"{bucket}/other/config.json", json.dumps(other))
        elsewhere = sidecar.AdapterStore(f"{bucket}/other", "gemma4-tiny", tmp_path / "b", max_lora_rank=RANK)
        with pytest.raises(sidecar.AdapterRefused, match="another base checkpoint"):
            elsewhere.check(uri, sidecar.read_adapter_manifest(uri)[1])
        missing = sidecar.AdapterStore(f"{bucket}/nothing", "gemma4-tiny", tmp_path / "c", max_lora_rank=RANK)
        with pytest.raises(sidecar.AdapterRefused, match=r"no config\.json"):
            missing.base_config_sha256()
    finally:
        server.shutdown()
        store.close()
