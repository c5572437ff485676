"""The command line that runs `tpuforge operator` beside a sandbox, as `tpuforge demo`, the integration tests and
the operator-at-scale benchmark start it: this interpreter, the sandbox's kubeconfig as the only source of
credentials, and /metrics on loopback (which is also how each of them sees that it is up)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path


def operator_argv(
    kubeconfig: Path, metrics_port: int, namespaces: Sequence[str] = (), python_options: Sequence[str] = ()
) -> list[str]:
    """`tpuforge operator` against `kubeconfig`, watching `namespaces` (all of them where none), with /metrics
    on 127.0.0.1:`metrics_port` and local dataset paths allowed; `python_options` go to the interpreter (e.g.
    `-m cProfile -o FILE`)."""
    return [
        sys.executable,
        *python_options,
        "-m",
        "tpuforge.cli",
        "operator",
        "--kubeconfig",
        str(kubeconfig),
        *(arg for ns in namespaces for arg in ("--namespace", ns)),
        "--metrics-address",
        "127.0.0.1",
        "--metrics-port",
        str(metrics_port),
        # The sandbox's pods are processes on this machine: they read local dataset files.
        "--local-dataset-paths",
    ]


# What the operator's image sets (images/operator.Dockerfile): glibc's malloc keeps at most two arenas. The
# informers parse watch events in a thread per kind, and an arena per thread held what they had freed: the
# operator at scale peaked at 261 MB with 1600 FineTuneJobs live, 227 MB with this (docs/performance.md, run J).
MALLOC_ARENAS = "2"


def operator_env() -> dict[str, str]:
    """This process's environment without KUBECONFIG (the operator's --kubeconfig is its only source), with the
    image's malloc setting unless the environment gives one."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENAS)
    return env
