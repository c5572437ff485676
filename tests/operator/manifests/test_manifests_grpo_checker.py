"""GRPO's checker beside the trainer: each host's training pod (a Job's, a JobSet's) gets the checker as a
native sidecar with exactly the evaluation `check` container's confinement, its CPU and memory from
spec.grpo.checker, and a spool volume shared with the trainer (whose environment names it); the samples'
scratch is on a volume of the checker's alone. Other methods, and GRPO without the checker in its reward, get
no sidecar."""

from __future__ import annotations

from typing import Any

from tests.fixtures.finetune.specs import OWNER, pod
from tests.fixtures.finetune.specs import spec as job_spec
from tpuforge.api.constants import CHECKER_SPOOL_ENV
from tpuforge.manifests import common
from tpuforge.manifests.finetune_evaluation import EVAL_CHECK_CONTAINER, eval_job
from tpuforge.manifests.finetune_training import (
    CHECKER_CONTAINER,
    RL_CHECK_VOLUME,
    SPOOL_DIR,
    SPOOL_VOLUME,
    TRAINER_CONTAINER,
    train_job,
    train_jobset,
)

GRPO: dict[str, Any] = {
    "method": "grpo",
    "training": {"maxSeqLen": 3072, "packing": False},
    "grpo": {"checker": {"cpu": "4", "memory": "128Mi", "timeoutSeconds": 5}},
}


def _checker(pod_spec: dict[str, Any]) -> dict[str, Any]:
    (checker,) = pod_spec["initContainers"]
    assert checker["name"] == CHECKER_CONTAINER
    return dict(checker)


def test_each_training_pod_of_a_grpo_job_runs_the_checker_as_a_sidecar_confined_as_the_evaluations() -> None:
    passk = job_spec(
        dataset={"uri": "gs://b/data/train.jsonl", "evalUri": "gs://b/data/eval.jsonl"},
        merge={"enabled": False, "writeAdapter": True},
        evaluation={
            "metrics": ["passAtK"],
            "code": {"checker": {"image": "tpuforge/checker-verilog:0.1.0", "command": ["python3", "-m", "x"]}},
        },
    )
    eval_check = next(c for c in pod(eval_job(OWNER, passk))["initContainers"] if c["name"] == EVAL_CHECK_CONTAINER)
    one_host = pod(train_job(OWNER, job_spec(**GRPO), 0))
    jobset = train_jobset(OWNER, job_spec(**GRPO, tpu={"slice": "v5p-16"}), 0)
    each_host = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    for pod_spec in (one_host, each_host):
        checker = _checker(pod_spec)
        assert checker["restartPolicy"] == "Always"  # a native sidecar: the pod ends with the trainer
        assert checker["securityContext"] == eval_check["securityContext"]
        assert checker["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SETUID", "SETGID"]}
        assert checker["securityContext"]["runAsUser"] == 0
        # 4 CPUs: 4 answers at once, each 128Mi, and the runner's 96Mi.
        assert checker["resources"] == {
            "requests": {"cpu": "4", "memory": "608Mi"},
            "limits": {"cpu": "4", "memory": "608Mi"},
        }
        command = checker["command"]
        assert command[:5] == ["python3", "-m", "tpuforge_workloads.evaluate.check", "--serve", SPOOL_DIR]
        assert command[command.index("--parallel") + 1] == "4"
        assert command[command.index("--memory") + 1] == str(128 << 20)
        assert command[command.index("--") + 1 :] == ["python3", "-m", "tpuforge_workloads.evaluate.verilog"]
        trainer = next(c for c in pod_spec["containers"] if c["name"] == TRAINER_CONTAINER)
        assert {"name": CHECKER_SPOOL_ENV, "value": SPOOL_DIR} in trainer["env"]
        assert {"name": SPOOL_VOLUME, "mountPath": SPOOL_DIR} in trainer["volumeMounts"]
        assert RL_CHECK_VOLUME not in {m["name"] for m in trainer["volumeMounts"]}
        assert {m["name"] for m in checker["volumeMounts"]} == {SPOOL_VOLUME, RL_CHECK_VOLUME, common.SCRATCH_VOLUME}
        # The trainer itself stays as locked down as for any method; the pod's own context is unchanged.
        assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod_spec["securityContext"]["runAsNonRoot"] is True


def test_the_checker_image_defaults_to_the_verilog_checker_and_follows_the_spec() -> None:
    assert _checker(pod(train_job(OWNER, job_spec(**GRPO), 0)))["image"] == "tpuforge/checker-verilog:0.1.0"
    own = {**GRPO, "grpo": {"checker": {"image": "r/checker:1", "cpu": "1"}}}
    checker = _checker(pod(train_job(OWNER, job_spec(**own), 0)))
    assert checker["image"] == "r/checker:1"
    assert checker["resources"]["limits"] == {"cpu": "1", "memory": "352Mi"}  # the default 256Mi + 96Mi


def test_no_sidecar_without_a_checker_in_the_reward() -> None:
    for spec in (
        job_spec(),
        job_spec(**{**GRPO, "grpo": {"reward": {"checker": 0, "exactMatch": 1}}}),
    ):
        pod_spec = pod(train_job(OWNER, spec, 0))
        assert "initContainers" not in pod_spec
        assert SPOOL_VOLUME not in {v["name"] for v in pod_spec["volumes"]}


def test_the_grpo_job_and_jobset_validate_against_the_kubernetes_and_jobset_schemas() -> None:
    import kubernetes_validate

    from tests.fixtures.upstream import jobset_validator

    kubernetes_validate.validate(train_job(OWNER, job_spec(**GRPO), 0), "1.30.0", strict=True)
    jobset_validator().validate(train_jobset(OWNER, job_spec(**GRPO, tpu={"slice": "v5p-16"}), 0))
