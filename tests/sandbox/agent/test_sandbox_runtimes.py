"""Which local runtime the sandbox's node agent gives an image: the evaluator image (vLLM + tpuforge) runs
with the vLLM CPU environment like the vLLM images; tpuforge's other images with the project's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.builds import require_vllm_cpu
from tpuforge.api.constants import DEFAULT_EVALUATOR_IMAGE, DEFAULT_MERGER_IMAGE, DEFAULT_TRAINER_IMAGE
from tpuforge_sandbox.agent.runtimes import VLLM_CPU_ENV, project_bin, repository, runtime_for, source_path

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def vllm_venv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()
    monkeypatch.setenv("TPUFORGE_VLLM_VENV", str(tmp_path / "venv"))
    return tmp_path / "venv" / "bin"


@pytest.mark.parametrize(
    "image",
    [
        DEFAULT_EVALUATOR_IMAGE,
        "tpuforge/evaluator",
        "us-docker.pkg.dev/proj/repo/tpuforge/evaluator:0.2.0",
        "localhost:5000/tpuforge/evaluator@sha256:" + "0" * 64,
    ],
)
def test_the_evaluator_image_runs_with_the_vllm_environment_and_our_sources(image: str, vllm_venv: Path) -> None:
    runtime = runtime_for(image)
    assert runtime.bin_dir == vllm_venv and runtime.error is None
    assert runtime.env == {**VLLM_CPU_ENV, "PYTHONPATH": source_path()}
    assert source_path().split(os.pathsep)[:2] == [str(ROOT / "operator"), str(ROOT / "workloads")]


def test_vllm_images_run_with_the_vllm_environment_alone(vllm_venv: Path) -> None:
    runtime = runtime_for("vllm/vllm-tpu:v0.27.0")
    assert runtime.bin_dir == vllm_venv and runtime.env == VLLM_CPU_ENV and runtime.error is None


def test_the_evaluation_program_imports_in_the_vllm_environment() -> None:
    """What the evaluator pod runs, found through the sources the runtime puts on PYTHONPATH, not through the
    test's own environment."""
    python = require_vllm_cpu() / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(source_path().split(os.pathsep)[:2])
    out = subprocess.run(
        [str(python), "-c", "import tpuforge_workloads.evaluate.score as s; print(s.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(ROOT / "workloads"))


@pytest.mark.parametrize(
    "image", [DEFAULT_TRAINER_IMAGE, DEFAULT_MERGER_IMAGE, "tpuforge/evaluator-tools:1", "python:3.11"]
)
def test_other_images_run_with_the_project_environment(image: str, vllm_venv: Path) -> None:
    assert runtime_for(image).bin_dir == project_bin()


def test_evaluator_without_a_vllm_environment_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TPUFORGE_VLLM_VENV", str(tmp_path / "none"))
    missing = runtime_for(DEFAULT_EVALUATOR_IMAGE)
    assert missing.bin_dir is None and "make vllm" in (missing.error or "")


def test_repository_drops_registry_port_tag_and_digest() -> None:
    assert repository("localhost:5000/tpuforge/evaluator:1@sha256:ab") == "localhost:5000/tpuforge/evaluator"
    assert repository("tpuforge/evaluator:0.1.0") == "tpuforge/evaluator"
