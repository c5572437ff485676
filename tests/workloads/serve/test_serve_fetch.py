"""The serving pod's model fetch against a real fake-gcs-server: committed models only, verified copies."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tpuforge.api import ServeConfig
from tpuforge.api.constants import COMPLETE_MARKER, EXIT_BAD_CONFIG
from tpuforge_workloads import storage
from tpuforge_workloads.serve import fetch
from tpuforge_workloads.storage import commit

FILES = {
    "config.json": b'{"model_type": "gemma4_text"}',
    "model-00001-of-00002.safetensors": b"a" * 3000,
    "model-00002-of-00002.safetensors": b"b" * 5000,
    "tokenizer/tokenizer.json": b"{}",
}


def publish(uri: str, files: dict[str, bytes] = FILES, marker: bool = True) -> commit.Manifest:
    for name, data in files.items():
        storage.write_bytes(storage.join(uri, name), data)
    manifest = commit.Manifest(
        files=[commit.ManifestFile(name=n, size=len(d), sha256=hashlib.sha256(d).hexdigest()) for n, d in files.items()]
    )
    if marker:
        commit.write_marker(uri, manifest)
    return manifest


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    log = tmp_path / "termination-log"
    rc = fetch.main([*args, "--termination-log", str(log)])
    return rc, log.read_text() if log.exists() else ""


def test_fetches_every_file_of_a_committed_model(bucket: str, tmp_path: Path) -> None:
    uri = f"{bucket}/jobs/demo/merged"
    publish(uri)
    target = tmp_path / "models" / "model"
    rc, msg = run(tmp_path, "--model-uri", uri, "--target-dir", str(target))
    assert (rc, msg) == (0, "")
    for name, data in FILES.items():
        assert (target / name).read_bytes() == data
    assert not (target / fetch.PARTIAL_DIR).exists()
    assert json.loads((target / fetch.FETCHED_STAMP).read_text())["modelUri"] == uri


def test_reads_a_serve_config_file(bucket: str, tmp_path: Path) -> None:
    uri = f"{bucket}/merged"
    publish(uri)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"modelUri": uri, "targetDir": str(tmp_path / "m")}))
    assert run(tmp_path, "--config", str(cfg))[0] == 0
    assert (tmp_path / "m" / "config.json").exists()


def test_refuses_a_model_without_the_complete_marker(bucket: str, tmp_path: Path) -> None:
    uri = f"{bucket}/half-written"
    publish(uri, marker=False)
    target = tmp_path / "m"
    rc, msg = run(tmp_path, "--model-uri", uri, "--target-dir", str(target))
    assert rc == 1
    assert COMPLETE_MARKER in msg and uri in msg
    assert not any(target.glob("*.safetensors"))


def test_a_file_that_does_not_match_the_manifest_is_never_used(bucket: str, tmp_path: Path) -> None:
    uri = f"{bucket}/corrupt"
    publish(uri)
    storage.write_bytes(storage.join(uri, "model-00002-of-00002.safetensors"), b"c" * 5000)  # same size
    target = tmp_path / "m"
    rc, msg = run(tmp_path, "--model-uri", uri, "--target-dir", str(target))
    assert rc == 1 and "sha256" in msg
    assert not (target / "model-00002-of-00002.safetensors").exists()
    assert not (target / fetch.FETCHED_STAMP).exists()


def test_a_restarted_fetch_skips_a_done_copy_and_a_new_model_replaces_it(bucket: str, tmp_path: Path) -> None:
    uri = f"{bucket}/merged"
    publish(uri)
    target = tmp_path / "m"
    assert run(tmp_path, "--model-uri", uri, "--target-dir", str(target))[0] == 0
    assert fetch.fetch(ServeConfig(model_uri=uri, target_dir=str(target)))["files"] == 0

    commit.remove_marker(uri)
    storage.delete(storage.join(uri, "tokenizer/tokenizer.json"))
    v2 = {k: v for k, v in FILES.items() if k != "tokenizer/tokenizer.json"} | {"config.json": b'{"v": 2}'}
    publish(uri, v2)
    assert run(tmp_path, "--model-uri", uri, "--target-dir", str(target))[0] == 0
    assert (target / "config.json").read_bytes() == b'{"v": 2}'
    assert not (target / "tokenizer").exists()  # what the new model lacks is gone too


def test_bad_arguments_exit_with_the_bad_config_code(tmp_path: Path) -> None:
    rc, msg = run(tmp_path, "--model-uri", "gs://b/m")
    assert rc == EXIT_BAD_CONFIG and "--target-dir" in msg
    rc, msg = run(tmp_path, "--config", str(tmp_path / "missing.json"))
    assert rc == EXIT_BAD_CONFIG and "missing.json" in msg


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd"])
def test_a_manifest_naming_paths_outside_the_model_is_refused(bucket: str, tmp_path: Path, name: str) -> None:
    uri = f"{bucket}/evil"
    m = commit.Manifest(files=[commit.ManifestFile(name=name, size=1, sha256="0" * 64)])
    commit.write_marker(uri, m)
    rc, msg = run(tmp_path, "--model-uri", uri, "--target-dir", str(tmp_path / "m"))
    assert rc == 1 and "unsafe" in msg


def test_an_uncommitted_base_model_is_copied_only_when_asked(bucket: str, tmp_path: Path) -> None:
    uri = f"{bucket}/base/gemma"
    publish(uri, marker=False)
    target = tmp_path / "base"
    rc, msg = run(tmp_path, "--model-uri", uri, "--target-dir", str(target))
    assert rc == 1 and COMPLETE_MARKER in msg
    (tmp_path / "termination-log").unlink()
    rc, msg = run(tmp_path, "--model-uri", uri, "--target-dir", str(target), "--uncommitted-base")
    assert (rc, msg) == (0, "")
    assert {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()} == {
        *FILES,
        fetch.FETCHED_STAMP,
    }
    assert fetch.fetch(ServeConfig(model_uri=uri, target_dir=str(target), require_marker=False))["files"] == 0
    # A file that changes size is copied again.
    storage.write_bytes(storage.join(uri, "config.json"), b'{"model_type": "gemma4_text", "x": 1}')
    assert fetch.fetch(ServeConfig(model_uri=uri, target_dir=str(target), require_marker=False))["files"] == 4


def test_a_base_without_config_json_is_refused(bucket: str, tmp_path: Path) -> None:
    uri = f"{bucket}/base/not-a-model"
    publish(uri, {"weights.bin": b"x"}, marker=False)
    rc, msg = run(tmp_path, "--model-uri", uri, "--target-dir", str(tmp_path / "t"), "--uncommitted-base")
    assert rc == 1 and "config.json" in msg
    assert not (tmp_path / "t" / "weights.bin").exists()


def test_a_new_model_on_a_kept_disk_first_drops_the_files_it_does_not_list(bucket: str, tmp_path: Path) -> None:
    """The model disk is sized for one model plus headroom, not two: the old shards go before the new ones
    are written (seen here through a new model whose fetch fails half-way)."""
    target = tmp_path / "m"
    publish(f"{bucket}/v1")
    assert run(tmp_path, "--model-uri", f"{bucket}/v1", "--target-dir", str(target))[0] == 0
    v2 = {"config.json": b'{"v": 2}', "model-v2.safetensors": b"c" * 4000}
    manifest = publish(f"{bucket}/v2", v2)
    storage.write_bytes(f"{bucket}/v2/model-v2.safetensors", b"d" * 4000)  # no longer what the manifest says
    rc, why = run(tmp_path, "--model-uri", f"{bucket}/v2", "--target-dir", str(target))
    assert rc == 1 and "sha256 differs" in why
    assert manifest.files and not list(target.glob("model-0000*"))


def test_a_streamed_model_is_checked_and_nothing_is_copied(bucket: str, tmp_path: Path) -> None:
    """--check-only (modelStorage.medium Stream): vLLM reads the weights from GCS itself; the init container only
    refuses what vLLM's streamer could not load, with the reason in the termination log."""
    uri = f"{bucket}/jobs/demo/merged"
    publish(uri)
    assert run(tmp_path, "--model-uri", uri, "--check-only") == (0, "")
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing written, not even a termination log
    half = f"{bucket}/half-written"
    publish(half, marker=False)
    rc, msg = run(tmp_path, "--model-uri", half, "--check-only")
    assert rc == 1 and COMPLETE_MARKER in msg
    # An uncommitted base for adapters is checked as the copy would be: HuggingFace layout.
    assert run(tmp_path, "--model-uri", half, "--check-only", "--uncommitted-base")[0] == 0


def test_a_streamed_model_with_a_missing_shard_or_no_safetensors_is_refused_naming_the_fix(
    bucket: str, tmp_path: Path
) -> None:
    uri = f"{bucket}/truncated"
    publish(uri)
    storage.write_bytes(storage.join(uri, "model-00002-of-00002.safetensors"), b"b" * 10)
    rc, msg = run(tmp_path, "--model-uri", uri, "--check-only")
    assert rc == 1 and "model-00002-of-00002.safetensors" in msg and "5000 bytes" in msg
    torch_only = f"{bucket}/pytorch-bin"
    publish(torch_only, {"config.json": b"{}", "pytorch_model.bin": b"w" * 100})
    rc, msg = run(tmp_path, "--model-uri", torch_only, "--check-only")
    assert rc == 1 and ".safetensors" in msg and "spec.modelStorage.medium: Disk" in msg
    rc, msg = run(tmp_path, "--model-uri", torch_only, "--check-only", "--target-dir", str(tmp_path / "m"))
    assert rc == EXIT_BAD_CONFIG and "--check-only takes --model-uri only" in msg
