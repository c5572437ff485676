"""Shared manifest helpers: child names, label values, standard labels, owned RBAC objects."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tpuforge.api.constants import LABEL_FINETUNEJOB, LABEL_MANAGED_BY
from tpuforge.manifests import common

OWNER = common.Owner("tpuforge.dev/v1alpha1", "FineTuneJob", "team-a", "gemma-verilog", "uid-1")


def test_child_name_is_owner_dash_suffix_when_it_fits() -> None:
    assert common.child_name("gemma-verilog", "train-0") == "gemma-verilog-train-0"


def test_long_child_names_fit_a_dns_label_and_stay_distinct_and_stable() -> None:
    a, b = "x" * 80 + "-a", "x" * 80 + "-b"
    na, nb = common.child_name(a, "train-12"), common.child_name(b, "train-12")
    assert len(na) <= 63 and len(nb) <= 63
    assert na != nb
    assert na == common.child_name(a, "train-12")
    assert na.endswith("-train-12")


@pytest.mark.parametrize("value", ["short", "y" * 63, "z" * 200])
def test_label_values_fit(value: str) -> None:
    out = common.label_value(value)
    assert len(out) <= 63
    assert out == value if len(value) <= 63 else out != value[:63]


def test_standard_labels_name_the_owner_and_the_manager() -> None:
    labels = common.standard_labels(OWNER, LABEL_FINETUNEJOB, "tpuforge-trainer", "trainer")
    assert labels[LABEL_FINETUNEJOB] == "gemma-verilog"
    assert labels[common.LABEL_OWNER_UID] == "uid-1"
    assert labels[LABEL_MANAGED_BY] == common.MANAGED_BY
    assert labels["app.kubernetes.io/instance"] == "gemma-verilog"
    assert labels["app.kubernetes.io/component"] == "trainer"


def test_owner_reference_blocks_owner_deletion_and_marks_the_controller() -> None:
    ref = common.metadata(OWNER, "child", {})["ownerReferences"][0]
    assert ref == {
        "apiVersion": "tpuforge.dev/v1alpha1",
        "kind": "FineTuneJob",
        "name": "gemma-verilog",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_status_role_grants_only_the_owners_status() -> None:
    role = common.own_status_role(OWNER, "gemma-verilog-progress", {}, "finetunejobs", ("get", "patch"))
    assert role["rules"] == [
        {
            "apiGroups": ["tpuforge.dev"],
            "resources": ["finetunejobs/status"],
            "resourceNames": ["gemma-verilog"],
            "verbs": ["get", "patch"],
        }
    ]
    binding = common.role_binding(OWNER, "gemma-verilog-progress", {}, "gemma-verilog-progress", "trainer-sa")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer-sa", "namespace": "team-a"}]
    for obj in (role, binding, common.service_account(OWNER, "sa", {}), common.config_map(OWNER, "c", {}, {})):
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
