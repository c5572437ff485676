"""The merge's building blocks on real storage: safetensors headers and shards, staged writes on a local
disk and on fake-gcs-server, and the _COMPLETE commit protocol."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tpuforge.api.constants import COMPLETE_MARKER
from tpuforge_workloads import storage
from tpuforge_workloads.merge.errors import MergeInputError
from tpuforge_workloads.merge.safetensors_io import (
    OutTensor,
    SafetensorsCheckpoint,
    encode_header,
    index_json,
    plan_shards,
    read_header,
)
from tpuforge_workloads.storage import commit
from tpuforge_workloads.storage import staged as staged_write


def test_header_locates_each_tensor(tmp_path: Path) -> None:
    arrays: dict[str, np.ndarray] = {
        "b": np.arange(6, dtype=np.float32).reshape(2, 3),
        "a": np.arange(5, dtype=np.int64),
        "c": np.ones((4,), dtype=np.float16),
    }
    save_file(arrays, str(tmp_path / "model.safetensors"))
    infos = read_header(str(tmp_path / "model.safetensors"))
    raw = (tmp_path / "model.safetensors").read_bytes()
    assert [t.start for t in infos] == sorted(t.start for t in infos)
    for t in infos:
        assert raw[t.start : t.start + t.nbytes] == arrays[t.name].tobytes()
        assert t.shape == arrays[t.name].shape


def test_truncated_file_is_rejected_naming_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": np.zeros((64, 64), np.float32)}, str(path))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(MergeInputError, match=r"tensor w ends at byte .* truncated"):
        read_header(str(path))


def test_planned_shards_are_valid_safetensors(tmp_path: Path) -> None:
    tensors = [OutTensor(f"t{i}", "F32", (10, 10)) for i in range(5)] + [OutTensor("big", "F32", (100, 10))]
    shards = plan_shards(tensors, max_shard_bytes=1000)
    # 400 bytes each: two fit under 1000; the 4000-byte tensor gets a shard of its own.
    assert [[t.name for t in s.tensors] for s in shards] == [["t0", "t1"], ["t2", "t3"], ["t4"], ["big"]]
    assert shards[0].name == "model-00001-of-00004.safetensors"
    values = {t.name: np.random.default_rng(0).standard_normal(t.shape).astype(np.float32) for t in tensors}
    for s in shards:
        data = s.header + b"".join(values[t.name].tobytes() for t in s.tensors)
        assert len(data) == s.size and len(s.header) % 8 == 0
        (tmp_path / s.name).write_bytes(data)
    (tmp_path / "model.safetensors.index.json").write_bytes(index_json(shards))
    for s in shards:
        loaded = load_file(str(tmp_path / s.name))
        for t in s.tensors:
            np.testing.assert_array_equal(loaded[t.name], values[t.name])
    base = SafetensorsCheckpoint.open(str(tmp_path))
    assert [t.name for t in base.tensors] == [t.name for t in tensors]
    assert json.loads((tmp_path / "model.safetensors.index.json").read_text())["metadata"]["total_size"] == sum(
        t.nbytes for t in tensors
    )


def test_header_is_eight_byte_aligned() -> None:
    for n in range(1, 9):
        header = encode_header([OutTensor("x" * n, "BF16", (3,))])
        assert len(header) % 8 == 0


def test_index_pointing_at_a_missing_shard_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-1.safetensors"}}))
    with pytest.raises(MergeInputError, match=r"lists model-1\.safetensors, which is missing"):
        SafetensorsCheckpoint.open(str(tmp_path))


@pytest.fixture(params=["local", "gcs"])
def out_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path)
    return str(request.getfixturevalue("bucket")) + "/out"


def test_staged_write_appears_only_on_publish(out_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Small parts and a small compose fan-in so that a 3 MB file takes 12 parts and a two-level compose.
    monkeypatch.setattr(staged_write, "_MIN_PART", 256 << 10)
    monkeypatch.setattr(staged_write, "_COMPOSE_MAX", 4)
    data = np.random.default_rng(0).bytes(3 << 20)
    uri, staging = storage.join(out_root, "model.bin"), storage.join(out_root, "_staging", "model.bin")
    with staged_write.open_staged_write(uri, staging, size_hint=1) as w:
        for i in range(0, len(data), 100_000):
            w.write(data[i : i + 100_000])
    assert not storage.exists(uri)
    w.publish()
    assert storage.read_bytes(uri) == data
    assert list(storage.list_files(storage.join(out_root, "_staging"))) == []


def test_failed_staged_write_leaves_nothing(out_root: str) -> None:
    uri, staging = storage.join(out_root, "x.bin"), storage.join(out_root, "_staging", "x.bin")
    with pytest.raises(RuntimeError, match="boom"), staged_write.open_staged_write(uri, staging) as w:
        w.write(b"x" * 1000)
        raise RuntimeError("boom")
    assert not storage.exists(uri)
    assert list(storage.list_files(storage.join(out_root, "_staging"))) == []


def test_commit_marker_and_manifest_checks(out_root: str) -> None:
    storage.write_bytes(storage.join(out_root, "a.bin"), b"hello")
    storage.write_bytes(storage.join(out_root, "sub/b.bin"), b"world!")
    assert commit.read_manifest(out_root) is None
    with pytest.raises(commit.CommitError, match=f"no {COMPLETE_MARKER} marker"):
        commit.require_complete(out_root)
    files = [
        commit.ManifestFile(name=n, size=len(d), sha256=hashlib.sha256(d).hexdigest())
        for n, d in (("a.bin", b"hello"), ("sub/b.bin", b"world!"))
    ]
    manifest = commit.Manifest(files=files, metadata={"step": 3})
    commit.write_marker(out_root, manifest)
    assert commit.require_complete(out_root, checksums=True) == manifest
    storage.write_bytes(storage.join(out_root, "a.bin"), b"HELLO")  # same size, other bytes
    assert commit.check_files(out_root, manifest, checksums=False) == []
    assert commit.check_files(out_root, manifest) == ["a.bin: sha256 differs from the manifest"]
    storage.delete(storage.join(out_root, "sub/b.bin"))
    assert "sub/b.bin: missing" in commit.check_files(out_root, manifest)
    commit.remove_marker(out_root)
    assert not commit.is_complete(out_root)


def test_unreadable_marker_is_an_error_not_absent(tmp_path: Path) -> None:
    (tmp_path / COMPLETE_MARKER).write_text("{}")
    with pytest.raises(commit.CommitError, match="not a valid manifest"):
        commit.read_manifest(str(tmp_path))
