"""Every pod the operator creates runs locked down: as the images' non-root uid, without privilege escalation,
capabilities or a writable root filesystem, under the runtime's seccomp profile, with /tmp, HOME and the
caches on a scratch volume, and with a ServiceAccount token only where the pod talks to the API."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.finetune.specs import spec as job_spec
from tpuforge import api
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.manifests import common, serving, serving_inputs
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_evaluation import eval_job
from tpuforge.manifests.finetune_merge import merge_job
from tpuforge.manifests.finetune_training import train_job

ROOT = Path(__file__).resolve().parents[3]
OWNER = owner("team-a", "gemma-verilog", "uid-1")


def serving_pod() -> dict[str, Any]:
    s = api.validate_serving({"model": {"uri": "gs://r/merged"}, "serviceAccountName": "vllm"}, "gemma4-31b")
    inp = serving_inputs.ServingInputs(
        owner=serving_inputs.owner("team-a", "chat", "uid-2"),
        spec=s,
        model_uri="gs://r/merged",
        model=model_shape("gemma4-31b"),
        slice=tpu_slice(s.tpu.slice),
    )
    spec: dict[str, Any] = serving.deployment(inp)["spec"]["template"]["spec"]
    return spec


def pods() -> dict[str, dict[str, Any]]:
    spec = job_spec()
    # Both containers of the evaluation pod: the loss (init) and the scorer.
    eval_spec = job_spec(
        dataset={"uri": "gs://b/data/train.jsonl", "evalUri": "gs://b/data/eval.jsonl"},
        merge={"enabled": False, "writeAdapter": True},
        evaluation={},
    )
    return {
        "trainer": train_job(OWNER, spec, 0)["spec"]["template"]["spec"],
        "merger": merge_job(OWNER, spec)["spec"]["template"]["spec"],
        "evaluator": eval_job(OWNER, eval_spec)["spec"]["template"]["spec"],
        "serving": serving_pod(),
    }


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


@pytest.mark.parametrize("name", ["trainer", "merger", "evaluator", "serving"])
def test_pods_run_as_the_images_non_root_user_under_runtime_default_seccomp(name: str) -> None:
    pod = pods()[name]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": common.POD_UID,
        "runAsGroup": common.POD_UID,
        "fsGroup": common.POD_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")


@pytest.mark.parametrize("name", ["trainer", "merger", "evaluator", "serving"])
def test_containers_drop_everything_and_write_only_to_their_volumes(name: str) -> None:
    pod = pods()[name]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[common.SCRATCH_VOLUME] == {"name": common.SCRATCH_VOLUME, "emptyDir": {}}
    for c in containers(pod):
        assert c["securityContext"] == {
            "runAsNonRoot": True,
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }, c["name"]
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts[common.SCRATCH_DIR] == common.SCRATCH_VOLUME
        env = {e["name"]: e.get("value") for e in c["env"]} if "env" in c else {}
        # Every place the processes write lies on a volume: HOME and the caches under the scratch volume,
        # TMPDIR either the image's /tmp or (trainer) the memory-backed /dev/shm volume.
        for var in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HF_HOME"):
            assert env[var].startswith(common.SCRATCH_DIR), (c["name"], var)
        tmpdir = env.get("TMPDIR", common.SCRATCH_DIR)
        assert any(tmpdir == path or tmpdir.startswith(path + "/") for path in mounts), (c["name"], tmpdir)


def test_only_the_trainer_gets_a_service_account_token() -> None:
    got = {name: pod["automountServiceAccountToken"] for name, pod in pods().items()}
    assert got == {"trainer": True, "merger": False, "evaluator": False, "serving": False}


def test_a_containers_own_environment_wins_over_the_scratch_defaults() -> None:
    pod = common.locked_down(
        {"containers": [{"name": "x", "env": [{"name": "HOME", "value": "/data/home"}]}]}, api_access=False
    )
    env = pod["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "HOME"] == ["/data/home"]


def test_locked_down_returns_a_copy() -> None:
    pod = {"containers": [{"name": "x", "image": "i"}], "volumes": [{"name": "v", "emptyDir": {}}]}
    before = repr(pod)
    common.locked_down(pod, api_access=True)
    assert repr(pod) == before


def test_the_checker_image_starts_as_root_to_give_each_sample_a_uid_of_its_own() -> None:
    """The one exception: the runner needs root with CAP_SETUID and CAP_SETGID (and the pod grants no more)."""
    text = (ROOT / "images" / "checker-verilog.Dockerfile").read_text()
    assert re.findall(r"^USER ", text, re.MULTILINE) == []
    assert common.UID_SWITCH_CAPABILITIES == ["SETUID", "SETGID"]


@pytest.mark.parametrize("image", ["operator", "trainer", "merger", "evaluator"])
def test_each_image_creates_and_runs_as_the_pods_uid(image: str) -> None:
    text = (ROOT / "images" / f"{image}.Dockerfile").read_text()
    uid = common.POD_UID
    assert re.search(rf"useradd [^\n]*--uid {uid} [^\n]*--gid {uid}", text), "the image creates the user"
    users = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert users and users[-1] == f"{uid}:{uid}", "the image's last USER is the pods' uid:gid"
