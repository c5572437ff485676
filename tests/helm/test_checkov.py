"""checkov, a scanner this team did not write, finds nothing to fix in what tpuforge puts on a cluster: the
Helm chart as `helm template` renders it, and the objects the operator creates for examples/finetune.yaml,
examples/finetune-adapter.yaml (its export and evaluation Jobs) and examples/serving.yaml. Every failure
checkov reports must be accepted, with its reason, in security/checkov-skips.yaml, and every entry there must
still match a failure (no stale skips)."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.helm import CHART, NAMESPACE, RELEASE, helm
from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec, parse
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.manifests import serving, serving_inputs
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_evaluation import eval_objects
from tpuforge.manifests.finetune_merge import merge_objects
from tpuforge.manifests.finetune_training import attempt_objects

ROOT = Path(__file__).resolve().parents[2]
SKIPS = ROOT / "security" / "checkov-skips.yaml"
# The examples carry no namespace; a platform team applies them in its own (checkov flags `default`).
EXAMPLES_NAMESPACE = "ml-team"
OWNER_UID = "00000000-0000-0000-0000-000000000000"


@cache
def checkov() -> str:
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "get-checkov.sh")], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"scripts/get-checkov.sh failed (run `make checkov`): {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def chart_objects() -> str:
    proc = subprocess.run(
        [helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def example_spec(name: str, model: type[Any]) -> tuple[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / name).read_text())
    return doc["metadata"]["name"], parse(model, doc["spec"], root="spec")


def operator_objects() -> list[dict[str, Any]]:
    """What the operator creates for the examples: the first training attempt, the merge, the adapter-only
    export and the evaluation, and the serving children once the job's merged model exists."""
    job_name, job = example_spec("finetune.yaml", FineTuneJobSpec)
    assert isinstance(job, FineTuneJobSpec)
    o = owner(EXAMPLES_NAMESPACE, job_name, OWNER_UID)
    objs = [*attempt_objects(o, job, 0), *merge_objects(o, job)]
    # The adapter-only job with an evaluation: its export and its evaluation Job on a TPU slice.
    adapter_name, adapter_job = example_spec("finetune-adapter.yaml", FineTuneJobSpec)
    assert isinstance(adapter_job, FineTuneJobSpec) and adapter_job.evaluation is not None
    a = owner(EXAMPLES_NAMESPACE, adapter_name, OWNER_UID)
    objs += [*merge_objects(a, adapter_job), *eval_objects(a, adapter_job)]

    sdep_name, sdep = example_spec("serving.yaml", ServingDeploymentSpec)
    assert isinstance(sdep, ServingDeploymentSpec)
    inp = serving_inputs.ServingInputs(
        owner=serving_inputs.owner(EXAMPLES_NAMESPACE, sdep_name, OWNER_UID),
        spec=sdep,
        model_uri=job.output.uri,
        model=model_shape(job.model.name),
        slice=tpu_slice(sdep.tpu.slice),
    )
    objs += [serving.xla_cache_pvc(inp), serving.service(inp), serving.deployment(inp)]
    objs += [kind.build(inp) for kind in serving.MONITOR_KINDS]
    return objs


@dataclass(frozen=True)
class Skip:
    check: str
    resources: tuple[str, ...]  # fnmatch patterns on checkov's resource id: Kind.namespace.name
    reason: str

    def matches(self, check: str, resource: str) -> bool:
        return check == self.check and any(fnmatch.fnmatchcase(resource, p) for p in self.resources)


def load_skips() -> list[Skip]:
    doc = yaml.safe_load(SKIPS.read_text())
    skips = [Skip(s["check"], tuple(s["resources"]), s["reason"].strip()) for s in doc["skips"]]
    for s in skips:
        assert len(s.reason) >= 30, f"{SKIPS.name}: {s.check} needs a reason a reviewer can judge"
    return skips


@dataclass(frozen=True)
class Failure:
    source: str
    check: str
    name: str
    resource: str


@cache
def scan() -> tuple[dict[str, dict[str, int]], tuple[Failure, ...]]:
    """checkov over both sources: its summary per source and every failed check."""
    import tempfile

    summaries: dict[str, dict[str, int]] = {}
    failures: list[Failure] = []
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"chart": chart_objects(), "operator": yaml.safe_dump_all(operator_objects(), sort_keys=False)}
        for source, text in sources.items():
            folder = Path(tmp) / source
            folder.mkdir()
            (folder / f"{source}.yaml").write_text(text)
            # No network here: checkov must not try to fetch its guideline links or a newer version.
            env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
            args = ["--directory", str(folder), "--framework", "kubernetes", "--output", "json", "--skip-download"]
            proc = subprocess.run(
                [checkov(), *args, "--quiet", "--compact"],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            # Exit code 1 means "some checks failed": the skips below decide whether that is fine.
            assert proc.returncode in (0, 1), proc.stderr[-3000:]
            report = json.loads(proc.stdout)
            summaries[source] = report["summary"]
            failures += [
                Failure(source, f["check_id"], f["check_name"], f["resource"])
                for f in report["results"]["failed_checks"]
            ]
    return summaries, tuple(failures)


def test_checkov_scans_the_chart_and_the_operators_objects() -> None:
    summaries, _ = scan()
    for source, summary in summaries.items():
        # A scan that parsed nothing would pass every check.
        assert summary["resource_count"] >= 5, f"{source}: checkov saw {summary}"
        assert summary["parsing_errors"] == 0, f"{source}: {summary}"
        assert summary["passed"] > 0, f"{source}: {summary}"


def test_every_failed_check_is_accepted_with_a_reason() -> None:
    summaries, failures = scan()
    skips = load_skips()
    unaccepted = [f for f in failures if not any(s.matches(f.check, f.resource) for s in skips)]
    listing = "\n".join(f"  {f.source}: {f.check} {f.name}: {f.resource}" for f in unaccepted)
    assert not unaccepted, f"checkov failed checks that {SKIPS.name} does not accept:\n{listing}"
    stale = [s for s in skips if not any(s.matches(f.check, f.resource) for f in failures)]
    assert not stale, f"{SKIPS.name} accepts failures checkov no longer reports: {[s.check for s in stale]}"
    counts = {k: sum(s[k] for s in summaries.values()) for k in ("passed", "failed")}
    print(f"checkov: {counts['passed']} passed, {counts['failed']} failed, all {counts['failed']} accepted")


def test_the_generated_pods_pass_the_pod_hardening_checks() -> None:
    """The checks that make a pod locked down are never among the accepted ones for tpuforge's own pods."""
    hardening = {
        "CKV_K8S_16": "privileged",
        "CKV_K8S_20": "allowPrivilegeEscalation",
        "CKV_K8S_22": "readOnlyRootFilesystem",
        "CKV_K8S_23": "hostPID",
        "CKV_K8S_28": "NET_RAW",
        "CKV_K8S_29": "pod securityContext",
        "CKV_K8S_30": "container securityContext",
        "CKV_K8S_31": "seccomp",
        "CKV_K8S_37": "capabilities",
        "CKV_K8S_40": "high uid",
    }
    _, failures = scan()
    found = [f for f in failures if f.check in hardening]
    assert not found, found
