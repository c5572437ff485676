"""The chart on GKE Autopilot (`gke.autopilot: true`): every pod it creates (the operator, the CRD upgrade hook,
the `helm test` pod) is Autopilot-valid by the same checker the operator's own pods pass
(tpuforge.manifests.autopilot), the operator runs with the Autopilot profile, and values Autopilot cannot
honour (a node pool selected by name, a Spot grace above Autopilot's 25 s) are refused at install, naming the
value."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.helm import CHART, NAMESPACE, RELEASE, helm, operator_container, render
from tpuforge.api.constants import GKE_NODEPOOL
from tpuforge.controllers.main import parser
from tpuforge.manifests import autopilot

Obj = dict[str, Any]


def workloads(objs: tuple[Obj, ...]) -> list[Obj]:
    return [o for o in objs if autopilot.pod_specs(o)]


def test_every_pod_of_the_chart_is_autopilot_valid() -> None:
    objs = workloads(render("autopilot"))
    assert sorted(o["kind"] for o in objs) == ["Deployment", "Job", "Pod"]
    for obj in objs:
        assert autopilot.object_problems(obj) == []


def test_the_default_chart_states_no_ephemeral_storage_which_autopilot_needs() -> None:
    # Why the setting exists: a Standard install leaves the requests Autopilot would add or raise to itself.
    problems = [p for o in workloads(render("default")) for p in autopilot.object_problems(o)]
    assert any("ephemeral-storage" in p for p in problems)


def test_the_operator_runs_with_the_autopilot_profile_only_when_asked() -> None:
    assert parser().parse_args(operator_container(render("autopilot"))["args"]).cluster_profile == "autopilot"
    assert parser().parse_args(operator_container(render("default"))["args"]).cluster_profile == "standard"


def helm_template(values: Obj) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        return subprocess.run(
            [helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )


POOL = {GKE_NODEPOOL: "system"}


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"nodeSelector": POOL}, f"nodeSelector[{GKE_NODEPOOL}]"),
        (
            {
                "kueue": {
                    "enabled": True,
                    "flavors": [
                        {"name": "v5p", "accelerator": "tpu-v5p-slice", "topology": "2x2x1", "nodeLabels": POOL}
                    ],
                }
            },
            f"kueue.flavors[v5p].nodeLabels[{GKE_NODEPOOL}]",
        ),
        (
            {"kueue": {"enabled": True, "cpuFlavor": {"nodeLabels": POOL}}},
            f"kueue.cpuFlavor.nodeLabels[{GKE_NODEPOOL}]",
        ),
        ({"tpu": {"spotGraceSeconds": 30}}, "tpu.spotGraceSeconds"),
    ],
)
def test_values_autopilot_cannot_honour_are_refused_naming_the_value(values: Obj, field: str) -> None:
    refused = helm_template({"gke": {"autopilot": True}, **values})
    assert refused.returncode != 0
    assert field in refused.stderr and "Autopilot" in refused.stderr
    assert helm_template(values).returncode == 0  # the same values are fine on a Standard cluster


def test_the_longest_spot_grace_autopilot_gives_is_accepted() -> None:
    assert helm_template({"gke": {"autopilot": True}, "tpu": {"spotGraceSeconds": 25}}).returncode == 0


def test_the_example_autopilot_values_render_autopilot_valid_pods() -> None:
    values = yaml.safe_load((CHART.parents[1] / "examples" / "values" / "gke-autopilot.yaml").read_text())
    proc = helm_template(values)
    assert proc.returncode == 0, proc.stderr
    objs = tuple(d for d in yaml.safe_load_all(proc.stdout) if d)
    assert parser().parse_args(operator_container(objs)["args"]).spot_grace_seconds == 25
    for obj in workloads(objs):
        assert autopilot.object_problems(obj) == []
