"""storage.py against a real fake-gcs-server and a local directory: the same behaviour on both."""

from __future__ import annotations

import pytest

from tpuforge_workloads import storage


@pytest.fixture(params=["gcs", "local"])
def root(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "gcs":
        return str(request.getfixturevalue("bucket")) + "/data"
    return str(tmp_path / "data")


def test_write_read_list_delete(root: str) -> None:
    storage.write_text(storage.join(root, "a/b.txt"), "hello")
    storage.write_bytes(storage.join(root, "c.bin"), b"0123456789")
    assert sorted(storage.list_files(root)) == ["a/b.txt", "c.bin"]
    assert storage.read_text(storage.join(root, "a/b.txt")) == "hello"
    assert storage.size(storage.join(root, "c.bin")) == 10
    assert storage.exists(root) and storage.is_file(storage.join(root, "c.bin"))
    assert not storage.exists(storage.join(root, "missing"))
    with storage.open_read(storage.join(root, "c.bin")) as f:
        f.seek(3)
        assert f.read(3) == b"345"
    storage.delete_dir(root)
    assert list(storage.list_files(root)) == []


def test_missing_object_names_the_uri(root: str) -> None:
    with pytest.raises(storage.StorageError, match=r"missing\.txt"):
        storage.read_bytes(storage.join(root, "missing.txt"))


def test_download_dir_copies_every_file(root: str, tmp_path) -> None:
    for name in ("x/1", "x/2", "3"):
        storage.write_text(storage.join(root, name), name)
    got = storage.download_dir(root, tmp_path / "copy")
    assert sorted(got) == ["3", "x/1", "x/2"]
    assert (tmp_path / "copy" / "x" / "2").read_text() == "x/2"
