"""The sandbox is a package of its own: no image's build context holds it, and the `tpuforge` command reaches it by
name, running `sandbox` and `demo` when it is installed and saying how to get it when it is not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tpuforge import cli

ROOT = Path(__file__).resolve().parents[2]


def test_no_image_carries_the_sandbox() -> None:
    # `make images` builds from the repository root with .dockerignore letting in only what images copy.
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    allowed = [line[1:].strip("/") for line in lines if line.startswith("!")]
    assert "operator" in allowed and not any(a.startswith("sandbox") for a in allowed)
    assert not (ROOT / "operator" / "tpuforge" / "sandbox").exists()
    for dockerfile in (ROOT / "images").glob("*.Dockerfile"):
        copies = [line for line in dockerfile.read_text().splitlines() if line.startswith("COPY")]
        assert not any("sandbox" in line for line in copies), dockerfile.name


def test_sandbox_and_demo_run_from_the_sandbox_package(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("sandbox", "demo"):
        with pytest.raises(SystemExit) as exited:
            cli.main([cmd, "--help"])
        assert exited.value.code == 0
        assert f"usage: tpuforge {cmd}" in capsys.readouterr().out


def test_without_the_sandbox_package_they_say_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # None in sys.modules: Python finds no such package, as where it is not installed.
    monkeypatch.setitem(sys.modules, cli.SANDBOX_PACKAGE, None)
    for cmd in ("sandbox", "demo"):
        assert cli.main([cmd, "up"]) == 2
        err = capsys.readouterr().err
        assert f"tpuforge {cmd}: the sandbox is a package of its own" in err
        assert "pip install -e ./sandbox" in err
