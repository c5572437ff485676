"""The command line that `tpuforge demo`, the integration tests and the operator-at-scale benchmark start the
operator with: `tpuforge operator`'s own parser reads it as the sandbox's kubeconfig, the namespaces asked for
and /metrics on loopback, and the environment leaves it no other kubeconfig."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tpuforge import cli
from tpuforge.controllers.main import parser
from tpuforge_sandbox.operator_command import MALLOC_ARENAS, operator_argv, operator_env


def test_the_operator_runs_with_this_interpreter_against_the_kubeconfig_given() -> None:
    argv = operator_argv(Path("/sb/kubeconfig"), 18080, ["a", "b"])
    assert argv[:4] == [sys.executable, "-m", "tpuforge.cli", "operator"] and "operator" in cli.COMMANDS
    args = parser().parse_args(argv[4:])
    assert args.kubeconfig == "/sb/kubeconfig" and args.namespace == ["a", "b"]
    assert (args.metrics_address, args.metrics_port) == ("127.0.0.1", 18080)
    assert args.local_dataset_paths  # the sandbox's pods are local processes: they read local dataset files
    # One operator beside the sandbox: nothing to elect, and a demo's killed operator holds no Lease for 15 s.
    assert args.leader_elect is False


def test_no_namespaces_watches_all_and_python_options_go_before_the_module() -> None:
    argv = operator_argv(Path("k"), 1, python_options=["-m", "cProfile", "-o", "out.prof"])
    assert argv[:8] == [sys.executable, "-m", "cProfile", "-o", "out.prof", "-m", "tpuforge.cli", "operator"]
    assert parser().parse_args(argv[8:]).namespace == []


def test_the_environment_has_no_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/elsewhere")
    monkeypatch.setenv("TPUFORGE_TEST_MARK", "1")
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    env = operator_env()
    assert "KUBECONFIG" not in env and env["TPUFORGE_TEST_MARK"] == "1"


def test_the_operator_runs_with_the_images_malloc_arenas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    dockerfile = (Path(__file__).resolve().parents[2] / "images" / "operator.Dockerfile").read_text()
    assert f"ENV MALLOC_ARENA_MAX={MALLOC_ARENAS}\n" in dockerfile
    assert operator_env()["MALLOC_ARENA_MAX"] == MALLOC_ARENAS
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")  # a caller's own choice is kept
    assert operator_env()["MALLOC_ARENA_MAX"] == "8"
