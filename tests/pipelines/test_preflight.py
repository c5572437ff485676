"""A job that cannot fit, found by its preflight on the sandbox with real pods: the operator runs `python -m
tpuforge_workloads.preflight` as a CPU Job on the sandbox's CPU node, which compiles the tiny model's train
step for the job's real TPU topology with libtpu (no TPU). A job that fits goes through it in
test_pipeline.py's first test.

The job here is a real compile that really exceeds the chip: gemma4-tiny at maxSeqLen 65000 on a v6e-4
(32 GiB per chip) needs about 72 GiB of temporaries per chip (its [T, T] attention scores), which libtpu
refuses to compile; the compile takes the same time as any tiny one. 65000 is not a multiple of splash
attention's blocks, so the step takes the masked path (attention.use_splash); at 65536 splash would need
0.7 GiB and the job would fit.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.finetunejob import Cluster
from tests.fixtures.pipelines import finish, pod_logs
from tpuforge.api.constants import LABEL_COMPONENT
from tpuforge.manifests import preflight as mp
from tpuforge_sandbox import Sandbox

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]


def test_a_job_that_cannot_fit_fails_without_a_tpu_pod(cluster: Cluster, sandbox: Sandbox, job_spec: Any) -> None:
    spec = job_spec("preflight-too-big", every=50, preflight={"enabled": True})
    spec["training"] = {**spec["training"], "maxSeqLen": 65000, "microBatchSize": 1, "packing": False}
    spec["tpu"] = {"slice": "v6e-4"}
    name = cluster.create("preflight-too-big", **spec)
    status = finish(cluster, sandbox, name)

    assert status["phase"] == "Failed", f"{status}\n{pod_logs(cluster, sandbox, name)}"
    cond = cluster.condition(name, "Failed")
    assert cond["reason"] == "DoesNotFit"
    assert "does not fit the chips: at least" in cond["message"] and "of 31.25 GiB per chip" in cond["message"]
    assert "to fit: " in cond["message"] and "spec.training.maxSeqLen" in cond["message"]
    pf = status["preflight"]
    assert pf["fits"] is False and pf["lowerBound"] is True and pf["hbmPerChipGiB"] > 32
    assert pf["topology"] == "v6e:2x2"
    # No TPU was asked for: no training Job, and one pod, the preflight's: its misfit exit code failed the Job
    # at once through the Job's podFailurePolicy, with no second try.
    components = [p["metadata"]["labels"].get(LABEL_COMPONENT) for p in cluster.children("Pod", name)]
    assert components == [mp.COMPONENT_PREFLIGHT]
    assert all(j["metadata"]["name"] == mp.preflight_job_name(name) for j in cluster.children("Job", name))
    assert "attempts" not in status or status["attempts"] == []
