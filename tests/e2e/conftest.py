"""Fixtures of the e2e tests: the operator as a process, a GCS bucket for the runs, and FineTuneJob specs for
the tiny model."""

from __future__ import annotations

from typing import Any

import pytest

from tpuforge_sandbox.gcs import GcsServer, create_bucket

BUCKET = "tpuforge-test-e2e"
# Every job takes the same number of steps: the step count is compiled into the learning-rate schedule, so
# one count means one XLA program, compiled by the first training pod and taken from the cache by the rest.
# A hundred steps of this size take seconds, which leaves the preemption tests a margin to act mid-run.
STEPS = 100


@pytest.fixture(scope="module")
def runs_bucket(gcs: GcsServer) -> str:
    create_bucket(gcs.url, BUCKET)
    return BUCKET


@pytest.fixture
def job_spec(tiny_model_gs: str, chat_dataset_gs: str, runs_bucket: str, namespace: str) -> Any:
    """A FineTuneJob spec for the tiny model on the sandbox's Spot v5p-8 node, writing under the test's
    own GCS prefix; STEPS optimizer steps of 2 packed rows of 64 tokens."""

    def make(name: str, every: int, merge: bool = False, **extra: Any) -> dict[str, Any]:
        root = f"gs://{runs_bucket}/{namespace}/{name}"
        return {
            "model": {"name": "gemma4-tiny", "uri": tiny_model_gs},
            "dataset": {"uri": chat_dataset_gs},
            "lora": {"rank": 8, "alpha": 16, "dropout": 0.0},
            "training": {
                "maxSeqLen": 64,
                "microBatchSize": 2,
                "gradientAccumulationSteps": 1,
                "maxSteps": STEPS,
                "learningRate": 3e-3,
                "warmupSteps": 2,
                "packing": True,
            },
            "tpu": {"slice": "v5p-8", "spot": True},
            "checkpoint": {"uri": f"{root}/checkpoints", "everySteps": every, "keep": 2},
            "output": {"uri": f"{root}/merged"},
            "merge": {"enabled": merge, "verify": merge, "shardSizeMB": 1},
            "preflight": {"enabled": False},  # its own test: test_preflight.py
            "serviceAccountName": "default",  # the sandbox's GCS needs no identity
            **extra,
        }

    return make
