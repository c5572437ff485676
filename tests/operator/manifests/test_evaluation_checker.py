"""The evaluation's `check` container as the operator writes it, run by the sandbox's node agent: samples in
the pod's work volume, the runner confining each one under a uid of its own, verdicts out in the checker's own
volume. Verilog through the Verilog checker (Debian's iverilog, its version in each verdict); a wrong
solution, one that cheats and a run-time loop fail beside a good one that passes."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.finetune.specs import OWNER, spec
from tpuforge.api.constants import CPU_SLICE
from tpuforge.manifests.finetune_evaluation import (
    CHECK_DIR,
    CHECK_VOLUME,
    EVAL_CHECK_CONTAINER,
    SAMPLES_FILE,
    VERDICTS_FILE,
    WORK_DIR,
    WORK_VOLUME,
    eval_job,
)
from tpuforge_sandbox import wait_for
from tpuforge_workloads.data.verilog_tasks import PROBLEMS, VERILOG_CHECK_COMMAND

pytestmark = [pytest.mark.cluster, pytest.mark.skipif(shutil.which("iverilog") is None, reason="needs iverilog")]


def evaluation_pod() -> dict[str, Any]:
    """The evaluation Job's pod for a passAtK spec with the Verilog checker (a 3 s timeout per sample)."""
    checker = {"image": "tpuforge/checker-verilog:0.1.0", "command": VERILOG_CHECK_COMMAND, "timeoutSeconds": 3}
    s = spec(
        dataset={"uri": "gs://b/data/train.jsonl", "evalUri": "gs://b/data/eval.jsonl"},
        merge={"enabled": False, "writeAdapter": True},
        evaluation={"metrics": ["passAtK"], "code": {"checker": checker}, "slice": CPU_SLICE},
    )
    return dict(eval_job(OWNER, s)["spec"]["template"]["spec"])


def test_the_check_container_runs_each_sample_confined_in_the_sandbox(
    api_client: client.ApiClient, namespace: str
) -> None:
    mux = PROBLEMS[0]
    test = {"files": {"tb.v": mux.testbench}}
    samples = [
        {"id": "good", "code": mux.solution, "test": test},
        {"id": "broken", "code": mux.broken, "test": test},
        {"id": "cheat", "code": mux.broken.replace("endmodule", "initial force tb.errors = 0;\nendmodule"),
         "test": test},
        {"id": "loop", "code": mux.solution.replace("endmodule", "reg r = 0;\ninitial while (1) r = ~r;\nendmodule"),
         "test": test},
    ]  # fmt: skip
    text = "".join(json.dumps(x) + "\n" for x in samples)
    work = {"name": WORK_VOLUME, "mountPath": WORK_DIR}
    writer = {"name": "write", "image": "python:3.11", "volumeMounts": [work],
              "command": ["python", "-c", f"open('{SAMPLES_FILE}', 'w').write({text!r})"]}  # fmt: skip
    checked = {"name": CHECK_VOLUME, "mountPath": CHECK_DIR, "readOnly": True}
    reader = {"name": "main", "image": "python:3.11", "volumeMounts": [checked],
              "command": ["python", "-c", f"print(open('{VERDICTS_FILE}').read(), end='')"]}  # fmt: skip
    # The operator's pod, its containers around `check` replaced: one writes the samples, one prints the
    # verdicts. No config volume (the check container does not mount it) and the namespace's own account.
    pod_spec = evaluation_pod()
    check = next(c for c in pod_spec["initContainers"] if c["name"] == EVAL_CHECK_CONTAINER)
    pod_spec["initContainers"] = [writer, check]
    pod_spec["containers"] = [reader]
    pod_spec["volumes"] = [v for v in pod_spec["volumes"] if v["name"] != "config"]
    pod_spec.pop("serviceAccountName")
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": pod_spec}
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, body)
    p = wait_for(
        lambda: (x := core.read_namespaced_pod("check", namespace)).status.phase in ("Succeeded", "Failed") and x,
        120,
        "the checker pod to finish",
    )
    ended = [s for s in p.status.init_container_statuses if s.state.terminated]
    assert p.status.phase == "Succeeded", [(s.name, s.state.terminated.message) for s in ended]
    log = core.read_namespaced_pod_log("check", namespace)
    verdicts = {v["id"]: v for v in map(json.loads, log.splitlines())}
    assert verdicts["good"]["verdict"] == "passed" and "PASS" in verdicts["good"]["stdout"]
    assert verdicts["broken"]["verdict"] == "failed (exit 1)"
    assert verdicts["loop"]["verdict"] == "timed out after 3 s"
    assert (
        verdicts["cheat"]["failure"] == "refused"
        and "tb.errors: a reference to what is not in its own design" in (verdicts["cheat"]["stderr"])
    )
    assert all(v["simulator"].startswith("Icarus Verilog version") for v in verdicts.values())
    checked = core.read_namespaced_pod_log("check", namespace, container=EVAL_CHECK_CONTAINER)
    assert "1/4 samples passed" in checked and "no-sockets" in checked
