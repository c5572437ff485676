"""The `tpuforge` command reaches the sandbox package by name: it runs `sandbox` and `demo` when the package is
installed, and says how to get it when it is not (the operator's image leaves it out)."""

from __future__ import annotations

import sys

import pytest

from tpuforge import cli


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
