"""GRPO through the operator, for real: a FineTuneJob with spec.method grpo on the sandbox's v5p-8 node, its
training pod running the checker as a native sidecar (evaluate.check --serve, the evaluation `check`
container's confinement; the sandbox's agent runs it as root with every capability, so samples also get
read-only mounts and no network). Each step's answers go through the spool to the sidecar and every reward
comes from its verdicts; the job succeeds and the sidecar is stopped when the trainer ends.

The checker command is the protocol's simplest honest one, so that the random tiny model earns rewards of
both kinds in a few steps: an answer passes when its code has an even number of bytes (and, as for every
checker, when it ended by itself within maxTokens). A random model over 512 tokens ends an answer by itself
(end of turn or of text) within 120 tokens about a third of the time, so each answer passes with a chance near
0.18 and fails on the checker's word (mismatch) as often (8 tokens an answer gave a pass in about one run of
three). (The Verilog checker on a model that writes Verilog is the demo's:
`make demo METHOD=grpo`.)
"""

from __future__ import annotations

import re
import time

import pytest

from tests.fixtures.finetunejob import Cluster
from tests.fixtures.models import read_summary
from tests.fixtures.pipelines import finish, pod_logs
from tpuforge.manifests.finetune_training import CHECKER_CONTAINER
from tpuforge_sandbox import Sandbox
from tpuforge_workloads import storage
from tpuforge_workloads.data import demo, verilog_tasks

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.e2e]

STEPS = 3
GROUP = 8
MAX_TOKENS = 120
EVEN_BYTES = ["sh", "-c", 'test $(( $(wc -c < sample.txt) % 2 )) -eq 0 || { echo "odd length"; exit 1; }']


def test_a_grpo_job_is_rewarded_by_its_checker_sidecar_and_succeeds(
    cluster: Cluster, sandbox: Sandbox, job_spec: object, runs_bucket: str, tiny_verilog_model_gs: str
) -> None:
    root = f"gs://{runs_bucket}/{cluster.ns}/grpo"
    storage.write_text(f"{root}/problems.jsonl", demo.jsonl(verilog_tasks.records(names=verilog_tasks.SHORT)))
    spec = job_spec("grpo", every=STEPS)  # type: ignore[operator]
    spec["model"] = {"name": "gemma4-tiny", "uri": tiny_verilog_model_gs}
    spec["dataset"] = {"uri": f"{root}/problems.jsonl", "evalFraction": 0.25}
    spec["method"] = "grpo"
    spec["grpo"] = {
        "groupSize": GROUP,
        "maxTokens": MAX_TOKENS,
        "temperature": 1.0,
        "checker": {"command": EVEN_BYTES, "timeoutSeconds": 5, "cpu": "2", "memory": "64Mi"},
    }
    spec["training"] = {**spec["training"], "maxSeqLen": 256, "microBatchSize": 1, "maxSteps": STEPS,
                        "packing": False}  # fmt: skip
    started = time.monotonic()
    cluster.create("grpo", **spec)
    status = finish(cluster, sandbox, "grpo", 600)
    took = time.monotonic() - started
    assert status["phase"] == "Succeeded", f"{status}\n{pod_logs(cluster, sandbox, 'grpo')}"

    rl = {int(k): v for a in read_summary(spec["checkpoint"]["uri"])["attempts"] for k, v in a["train_rl"].items()}
    assert sorted(rl) == list(range(1, STEPS + 1)), rl
    # Every answer judged by the sidecar: some pass (an answer that ended by itself with an even length), the
    # others fail as the checker said (mismatch: its exit 1) or as cut at maxTokens (truncated, whatever the
    # checker said); none for the checker's own failure ("error": it could not run them).
    failures = {k for v in rl.values() for k in v["failures"]}
    assert failures and failures <= {"mismatch", "truncated"}, rl
    # At least one answer ended by itself and so was decided by the checker's word: passed (even) or mismatch
    # (odd). Each of the two alone misses about once in a hundred runs; both together about once in 60,000.
    assert sum(v["pass_rate"] for v in rl.values()) > 0 or "mismatch" in failures, rl
    assert all(v["reward"] == pytest.approx(v["pass_rate"]) for v in rl.values()), rl
    assert all(v["checker_seconds"] > 0 for v in rl.values()), rl
    progress = status["progress"]["rl"]
    assert progress["passRate"] == pytest.approx(rl[STEPS]["pass_rate"]), progress

    (pod,) = [p for p in cluster.children("Pod", "grpo") if p["metadata"]["name"].startswith("grpo-train-")]
    name = pod["metadata"]["name"]
    checker_log = sandbox.pod_log(cluster.ns, name, CHECKER_CONTAINER).read_text()
    # One batch a step, each answer under a uid of its own, with the sandbox's namespaces as well.
    assert len(re.findall(r"\.jsonl: \d+ samples in", checker_log)) == STEPS, checker_log
    assert "own-uid" in checker_log and "read-only-mounts" in checker_log, checker_log
    (sidecar,) = pod["status"]["initContainerStatuses"]
    assert sidecar["name"] == CHECKER_CONTAINER and sidecar["state"]["terminated"] is not None, sidecar
    print(f"GRPO job of {STEPS} steps: {took:.0f} s; pass rate by step", [rl[s]["pass_rate"] for s in rl])
