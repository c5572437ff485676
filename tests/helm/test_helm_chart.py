"""The Helm chart renders valid objects for default and non-default values, runs the operator the way its
CLI expects, grants exactly the permissions the operator's code uses, and ships the CRDs, dashboards and
alert rules the repository holds."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.fixtures import rbac_scan
from tests.fixtures.helm import (
    CHART,
    NAMESPACE,
    RELEASE,
    ROOT,
    VALUES,
    find,
    helm,
    operator_container,
    render,
    values_file,
)
from tpuforge import crds
from tpuforge.api import FineTuneJobSpec, parse
from tpuforge.api import constants as c

RULES = CHART / "rules" / "tpuforge-alerts.yaml"
# The chart's floor (Chart.yaml kubeVersion: the CRDs' validation rules name their field and reason, GA in
# 1.30) and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


# What the scan does not read: the check at start that the served CRDs are the operator's own
# (tpuforge.controllers.main.served_crd_drift lists them by name). kopf needs nothing of its own: it handles no
# resource, its scanning of CRDs and namespaces is off, and it runs standalone (no peering objects).
BESIDE_THE_SCAN = {rbac_scan.Permission("apiextensions.k8s.io", "customresourcedefinitions", "list")}


# The operator's own objects are named after the release; the CRD upgrade hook's after them, with -crds.
OPERATOR = f"{RELEASE}-tpuforge"
CRD_HOOK = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"]


def kinds(objs: tuple[dict[str, Any], ...]) -> list[str]:
    return sorted(o["kind"] for o in objs)


# --- Lint and schema validation ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUES)
def test_helm_lint_strict(name: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            helm(),
            "lint",
            "--strict",
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--values",
            str(values_file(tmp_path, name)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", VALUES)
def test_rendered_objects_are_valid_kubernetes(name: str, version: str) -> None:
    checked = 0
    for obj in render(name):
        group = obj["apiVersion"].split("/")[0]
        if group.startswith("monitoring."):
            continue  # Prometheus Operator / GMP kinds: their fields are checked by the tests below
        if group == "kueue.x-k8s.io":
            continue  # checked against Kueue's published CRDs by tests/helm/test_kueue.py
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} is invalid on Kubernetes {version}: {e.message}")
        checked += 1
    assert checked >= (3 if name == "bring-your-own" else 7)


def test_kinds_per_values() -> None:
    assert kinds(render("default")) == sorted(
        [
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Service",
            "ConfigMap",
            "Pod",
            "NetworkPolicy",
            "StorageClass",
            "Role",  # leader election's, in the release's namespace
            "RoleBinding",
            "PodDisruptionBudget",
            *CRD_HOOK,
        ]
    )
    assert kinds(render("everything-on")) == sorted(
        [
            *kinds(render("default")),
            *["Role", "RoleBinding"] * 2,  # one of each per watched namespace
            "ServiceMonitor",
            "PodMonitoring",
            "PrometheusRule",
            "PodMonitor",
            "ClusterPodMonitoring",
        ]
    )
    assert kinds(render("bring-your-own")) == sorted(
        [
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "Deployment",
            "NetworkPolicy",
            "PodDisruptionBudget",
            *CRD_HOOK,
        ]
    )
    single = set(kinds(render("default"))) - {"Role", "RoleBinding", "PodDisruptionBudget"}
    assert set(kinds(render("single-replica"))) == single


def test_serving_volumes_default_to_a_hyperdisk_class_that_tpu_v6e_attaches() -> None:
    """GKE (TPU v6e; Hyperdisk for GKE): v6e VMs attach Hyperdisk Balanced or ML, not the pd-balanced of GKE's
    default StorageClass. The chart creates a Hyperdisk Balanced class and makes it the operator's default."""
    objs = render("default")
    sc = find(objs, "StorageClass")
    assert (sc["provisioner"], sc["parameters"]["type"]) == ("pd.csi.storage.gke.io", "hyperdisk-balanced")
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"  # the disk in the TPU node's zone
    from tpuforge.controllers.main import ENV_STORAGE_CLASS

    env = {e["name"]: e.get("value") for e in operator_container(objs)["env"]}
    assert env[ENV_STORAGE_CLASS] == sc["metadata"]["name"]
    own = render("bring-your-own")
    assert {e["name"]: e.get("value") for e in operator_container(own)["env"]}[ENV_STORAGE_CLASS] == "team-hyperdisk"


def test_the_hyperdisk_classes_provision_throughput() -> None:
    """Hyperdisk Balanced gets 140 MiB/s unless the class provisions more (StorageClass parameters
    provisioned-throughput-on-create and provisioned-iops-on-create); the Hyperdisk ML class is opt-in."""
    objs = render("default")
    sc = find(objs, "StorageClass")
    assert sc["parameters"]["provisioned-throughput-on-create"] == "600Mi"
    assert sc["parameters"]["provisioned-iops-on-create"] == "3000"
    assert "tpuforge-hyperdisk-ml" not in [o["metadata"]["name"] for o in objs if o["kind"] == "StorageClass"]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump({"storage": {"hyperdiskML": {"create": True}}}))
        proc = subprocess.run(
            [helm(), "template", RELEASE, str(CHART), "--values", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    ml = find(tuple(d for d in yaml.safe_load_all(proc.stdout) if d), "StorageClass", "tpuforge-hyperdisk-ml")
    assert ml["provisioner"] == "pd.csi.storage.gke.io"
    assert ml["parameters"] == {"type": "hyperdisk-ml", "provisioned-throughput-on-create": "2400Mi"}
    assert ml["volumeBindingMode"] == "WaitForFirstConsumer"


# --- The operator Deployment ------------------------------------------------------------------------------


def test_chart_version_matches_the_project() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == c.PROJECT_VERSION
    assert operator_container(render("default"))["image"] == c.DEFAULT_OPERATOR_IMAGE


@pytest.mark.parametrize("name", VALUES)
def test_operator_runs_tpuforge_operator_with_args_its_cli_accepts(name: str) -> None:
    from tpuforge.controllers.main import parser

    objs = render(name)
    ct = operator_container(objs)
    assert ct["command"] == ["tpuforge", "operator"]
    args = parser().parse_args(ct["args"])  # exits (fails the test) on an argument the CLI does not know
    values = VALUES[name]
    assert args.namespace == values.get("operator", {}).get("watchNamespaces", [])
    assert args.tpu_run_as_root is values.get("tpu", {}).get("runAsRoot", True)
    assert args.spot_grace_seconds == values.get("tpu", {}).get("spotGraceSeconds", c.GKE_SPOT_GRACE_SECONDS)
    metrics_on = values.get("metrics", {}).get("enabled", True)
    assert args.metrics_port == (values.get("metrics", {}).get("port", 8080) if metrics_on else 0)
    health = next(p for p in ct["ports"] if p["name"] == "health")["containerPort"]
    assert args.liveness == f"http://0.0.0.0:{health}/healthz"
    assert ct["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    electing = values.get("operator", {}).get("leaderElection", {}).get("enabled", True)
    assert args.leader_elect is electing
    if electing:
        # The Lease is named after the release (two releases never wait on each other), in the pod's namespace.
        assert args.leader_election_name == find(objs, "Deployment")["metadata"]["name"]
        env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in ct["env"]}
        assert env["POD_NAMESPACE"] == "metadata.namespace" and env["POD_NAME"] == "metadata.name"
    if metrics_on:
        assert {"name": "metrics", "containerPort": args.metrics_port, "protocol": "TCP"} in ct["ports"]


def test_operator_pod_is_locked_down_and_one_replica_acts() -> None:
    """Two replicas with leader election (one acts), rolled one at a time and drained one at a time; without
    leader election, one replica, never two at once (Recreate), and more than one is refused."""
    objs = render("default")
    dep = find(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pdb = find(objs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    single = find(render("single-replica"), "Deployment")
    assert single["spec"]["replicas"] == 1 and single["spec"]["strategy"] == {"type": "Recreate"}
    two_unelected = ["--set", "replicas=2", "--set", "operator.leaderElection.enabled=false"]
    proc = subprocess.run(
        [helm(), "template", RELEASE, str(CHART), *two_unelected],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "needs operator.leaderElection.enabled" in proc.stderr
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = operator_container(render("default"))["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("name", ["default", "everything-on"])
def test_metrics_service_selects_the_operator_pod(name: str) -> None:
    objs = render(name)
    svc = find(objs, "Service")
    pod_labels = find(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"] == [
        {
            "name": "metrics",
            "port": VALUES[name].get("metrics", {}).get("port", 8080),
            "targetPort": "metrics",
            "protocol": "TCP",
        }
    ]


def test_scrape_objects_point_at_the_metrics_port() -> None:
    objs = render("everything-on")
    svc = find(objs, "Service")
    sm = find(objs, "ServiceMonitor")
    assert sm["metadata"]["namespace"] == "monitoring"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    # The per-object series carry the object's own namespace label: it must win over the target's.
    assert sm["spec"]["endpoints"][0]["port"] == "metrics" and sm["spec"]["endpoints"][0]["honorLabels"] is True
    pm = find(objs, "PodMonitoring")
    pod_labels = find(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pm["spec"]["endpoints"][0]["port"] == "metrics"


def example_finetune_spec() -> FineTuneJobSpec:
    doc = yaml.safe_load((ROOT / "examples" / "finetune.yaml").read_text())
    return parse(FineTuneJobSpec, doc["spec"])


def test_trainer_monitors_select_the_training_pods_the_operator_creates() -> None:
    from tpuforge.manifests import finetune_common, finetune_training

    job = finetune_training.train_job(finetune_common.owner("ml", "gemma-sft", "uid-1"), example_finetune_spec(), 0)
    pod = job["spec"]["template"]
    ports = [p["name"] for ct in pod["spec"]["containers"] for p in ct.get("ports", [])]
    assert "metrics" in ports
    objs = render("everything-on")
    for kind in ("PodMonitor", "ClusterPodMonitoring"):
        mon = find(objs, kind)
        assert mon["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), kind
    relabel = find(objs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["relabelings"][0]
    assert relabel["targetLabel"] == "name"
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_" + re.sub(r"\W", "_", c.LABEL_FINETUNEJOB)]
    assert pod["metadata"]["labels"][c.LABEL_FINETUNEJOB] == "gemma-sft"
    from_pod = find(objs, "ClusterPodMonitoring")["spec"]["targetLabels"]["fromPod"]
    assert from_pod == [{"from": c.LABEL_FINETUNEJOB, "to": "name"}]


# --- RBAC ---------------------------------------------------------------------------------------------------


def trainer_role_rules() -> list[dict[str, Any]]:
    """The operator creates the trainer's Role; Kubernetes lets it grant only what it holds itself."""
    from tpuforge.manifests import finetune_common, finetune_rbac

    objs = finetune_rbac.rbac_objects(finetune_common.owner("ml", "gemma-sft", "uid-1"), example_finetune_spec())
    return [rule for o in objs if o["kind"] == "Role" for rule in o["rules"]]


def test_the_permission_table_covers_every_call_and_grants_nothing_unused() -> None:
    from tpuforge.controllers import permissions

    uses = rbac_scan.Scan().uses()
    declared = rbac_scan.granted(
        permissions.cluster_role_rules(namespaced=True)
        + permissions.namespace_role_rules()
        + permissions.own_namespace_role_rules()
    )
    missing = sorted(f"{u.permission} (needed at {u.where})" for u in uses if u.permission not in declared)
    assert not missing, "tpuforge/controllers/permissions.py lacks:\n" + "\n".join(missing)
    needed = {u.permission for u in uses} | BESIDE_THE_SCAN
    needed |= rbac_scan.granted(trainer_role_rules())
    extra = sorted(str(p) for p in declared - needed)
    assert not extra, "tpuforge/controllers/permissions.py grants what no code uses:\n" + "\n".join(extra)
    own = rbac_scan.granted(permissions.own_namespace_role_rules())
    assert {(p.group, p.resource) for p in own} == {("coordination.k8s.io", "leases")}
    assert declared - own == rbac_scan.granted(permissions.cluster_role_rules(namespaced=False))


def assert_grants(rules: list[dict[str, Any]], declared: list[dict[str, Any]], where: str) -> None:
    want, granted = rbac_scan.granted(declared), rbac_scan.granted(rules)
    missing = sorted(str(p) for p in want - granted)
    assert not missing, f"{where} lacks:\n" + "\n".join(missing)
    extra = sorted(str(p) for p in granted - want)
    assert not extra, f"{where} grants what permissions.py does not:\n" + "\n".join(extra)


@pytest.mark.parametrize("name", ["default", "everything-on"])
def test_cluster_role_is_the_declared_permission_table(name: str) -> None:
    from tpuforge.controllers import permissions

    watched = VALUES[name].get("operator", {}).get("watchNamespaces", [])
    objs = render(name)
    cluster_role = find(objs, "ClusterRole", OPERATOR)["rules"]
    assert_grants(cluster_role, permissions.cluster_role_rules(bool(watched)), "templates/clusterrole.yaml")
    roles = {o["metadata"]["namespace"]: o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == OPERATOR}
    assert sorted(roles) == sorted(watched)
    for ns, role in roles.items():
        assert_grants(role["rules"], permissions.namespace_role_rules(), f"templates/roles.yaml ({ns})")
    # Leader election's Lease: a Role in the operator's own namespace only, bound to its ServiceAccount.
    election = find(objs, "Role", f"{OPERATOR}-leader-election")
    assert election["metadata"]["namespace"] == NAMESPACE
    assert_grants(election["rules"], permissions.own_namespace_role_rules(), "templates/leader-election-rbac.yaml")
    binding = find(objs, "RoleBinding", f"{OPERATOR}-leader-election")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == election["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]


def test_watching_some_namespaces_grants_jobs_and_roles_in_those_namespaces_only() -> None:
    """With watchNamespaces, nothing cluster-wide lets the operator create a pod-running object or grant a Role
    (in kube-system, say): the ClusterRole lists CRDs, the rest is per watched namespace."""
    objs = render("everything-on")
    cluster_wide = rbac_scan.granted(find(objs, "ClusterRole", OPERATOR)["rules"])
    assert cluster_wide == BESIDE_THE_SCAN
    sa = find(objs, "ServiceAccount", OPERATOR)["metadata"]["name"]
    bindings = [o for o in objs if o["kind"] == "RoleBinding" and o["metadata"]["name"] == OPERATOR]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["ml-team", "serving"]
    for b in bindings:
        assert b["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": find(objs, "ClusterRole", OPERATOR)["metadata"]["name"],
        }
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]


def test_rbac_objects_bind_the_operator_service_account() -> None:
    objs = render("default")
    sa = find(objs, "ServiceAccount", OPERATOR)["metadata"]
    binding = find(objs, "ClusterRoleBinding", OPERATOR)
    assert binding["roleRef"]["name"] == find(objs, "ClusterRole", OPERATOR)["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": NAMESPACE}]
    assert find(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]
    own = find(render("bring-your-own"), "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    assert own == "ml-operator"


def test_scan_reads_kube_calls_and_kopf_handlers(tmp_path: Path) -> None:
    src = tmp_path / "controller.py"
    src.write_text(
        "import kopf\n"
        "from tpuforge import kube_events, kube_objects\n"
        "from tpuforge.api.constants import GROUP, VERSION, FINETUNEJOB_PLURAL\n"
        "@kopf.on.create(GROUP, VERSION, FINETUNEJOB_PLURAL)\n"
        "def h(**_):\n"
        "    kube_objects.get(api, 'apps/v1', 'Deployment', 'ns', 'x')\n"
        "    kube_objects.patch(api, 'v1', 'Pod', 'ns', 'x', {}, subresource='status')\n"
        "    kube_events.post_event(api, obj, 'Normal', 'R', 'm')\n"
        "    kube_objects.patch_status(api, obj, {})\n"
    )
    got = {str(u.permission) for u in rbac_scan.Scan([src]).uses()}
    assert got == {
        "list finetunejobs.tpuforge.dev",
        "watch finetunejobs.tpuforge.dev",
        "patch finetunejobs.tpuforge.dev",
        "get deployments.apps",
        "patch pods/status",
        "create events",
        "patch finetunejobs/status.tpuforge.dev",
    }
    src.write_text("def f(core):\n    core.read_namespaced_pod('x', 'ns')\n")
    with pytest.raises(AssertionError, match=r"through tpuforge\.kube"):
        rbac_scan.Scan([src]).uses()


# --- CRDs, dashboards, alerts ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.kind)
def test_chart_crds_are_the_generated_ones(kind: crds.Kind) -> None:
    assert (CHART / "crds" / crds.filename(kind)).read_text() == crds.render(kind), (
        "helm/tpuforge/crds/ is stale: run `make crds`"
    )


def test_chart_holds_no_other_crds() -> None:
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == sorted(crds.filename(k) for k in crds.KINDS)


def test_dashboards_configmap_ships_every_dashboard_for_the_grafana_sidecar() -> None:
    cm = find(render("everything-on"), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "tpuforge"}
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert sorted(cm["data"]) == [f.name for f in files] and len(files) == 2
    for f in files:
        assert json.loads(cm["data"][f.name]) == json.loads(f.read_text())
    assert sum(len(v) for v in cm["data"].values()) < 1 << 20  # a ConfigMap holds at most 1 MiB


PANEL_TYPES = {"row", "stat", "timeseries", "table"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}


@pytest.mark.parametrize("path", sorted((CHART / "dashboards").glob("*.json")), ids=lambda p: p.stem)
def test_dashboard_is_well_formed(path: Path) -> None:
    """What Grafana needs to load and lay out the dashboard: the queries themselves run against a real
    Prometheus in tests/helm/test_prometheus_rules.py."""
    board = json.loads(path.read_text())
    assert board["uid"] == path.stem and board["title"].startswith("tpuforge / ")
    variables = {v["name"] for v in board["templating"]["list"]}
    assert "datasource" in variables
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        title = panel["title"]
        assert panel["type"] in PANEL_TYPES, title
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, f"{title} is off the grid"
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"{title} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"{title} has no description"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), title
        for target in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
            assert used <= variables | GRAFANA_BUILTINS, f"{title}: undefined variables {used - variables}"
    other = {"tpuforge-finetuning": "tpuforge-serving", "tpuforge-serving": "tpuforge-finetuning"}[path.stem]
    assert [link["url"] for link in board["links"]] == [f"/d/{other}"]


def test_prometheus_rule_is_the_rule_file_plus_the_values_labels_and_runbooks() -> None:
    rule = find(render("everything-on"), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    source = yaml.safe_load(RULES.read_text())
    expected = json.loads(json.dumps(source))
    for group in expected["groups"]:
        for r in group["rules"]:
            r["labels"] = {**r.get("labels", {}), "team": "ml-platform"}
            r["annotations"]["runbook_url"] = f"https://runbooks.example/tpuforge/sre.md#{r['alert'].lower()}"
    assert rule["spec"]["groups"] == expected["groups"]


def test_every_alert_has_a_runbook_in_the_sre_guide() -> None:
    guide = (ROOT / "docs" / "sre.md").read_text()
    anchors = set(re.findall(r"^#+ (\S+)$", guide, re.MULTILINE))
    alerts = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert alerts and not [a for a in alerts if a not in anchors], "docs/sre.md needs a `### <Alert>` section each"


def test_helm_test_pod_checks_the_metrics_service() -> None:
    objs = render("default")
    pod = find(objs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    ct = pod["spec"]["containers"][0]
    assert ct["image"] == operator_container(objs)["image"]
    script = ct["args"][0]
    compile(script, "helm-test", "exec")
    svc = find(objs, "Service")["metadata"]["name"]
    assert f"http://{svc}.{NAMESPACE}.svc:8080/metrics" in script


# --- values.yaml --------------------------------------------------------------------------------------------


def test_every_value_is_documented_helm_docs_style() -> None:
    """Each value, or the block it sits in, has a `# --` comment right above it (helm-docs renders them)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w-]*):(.*)$", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and "# --" not in lines[j]:
            j -= 1
        documented = (j >= 0 and "# --" in lines[j]) or any(d for _, d in stack)
        is_leaf = bool(m.group(3).strip())
        if is_leaf and not documented:
            undocumented.append(m.group(2))
        stack.append((indent, documented))
    assert not undocumented, f"values without a `# --` comment: {undocumented}"


def test_a_digest_pins_the_operator_image_in_every_pod() -> None:
    objs = render("pinned")
    image = f"tpuforge/operator@sha256:{'ab' * 32}"
    assert operator_container(objs)["image"] == image
    assert find(objs, "Pod")["spec"]["containers"][0]["image"] == image


def test_the_network_policy_admits_the_probes_and_the_metrics_scrape_only() -> None:
    for name, metrics_from in (("default", None), ("pinned", VALUES["pinned"]["networkPolicy"]["metricsFrom"])):
        objs = render(name)
        policy = find(objs, "NetworkPolicy")["spec"]
        pod = find(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
        assert policy["podSelector"]["matchLabels"].items() <= pod.items()
        assert policy["policyTypes"] == ["Ingress"]
        rules = {r["ports"][0]["port"]: r.get("from") for r in policy["ingress"]}
        assert rules == {"health": None, "metrics": metrics_from}
    off = render("bring-your-own")  # metrics off: only the probes get in
    assert [r["ports"][0]["port"] for r in find(off, "NetworkPolicy")["spec"]["ingress"]] == ["health"]


def test_an_upgrade_applies_the_new_operators_crds_first_with_a_role_for_just_those() -> None:
    objs = render("default")
    hook = [o for o in objs if o["metadata"]["name"] == f"{OPERATOR}-crds"]
    assert sorted(o["kind"] for o in hook) == sorted(CRD_HOOK)
    for o in hook:
        assert o["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    job = find(objs, "Job", f"{OPERATOR}-crds")["spec"]["template"]["spec"]
    (container,) = job["containers"]
    assert container["command"] == ["tpuforge", "crds", "--apply"]
    assert container["image"] == operator_container(objs)["image"]  # the new operator's own CRDs
    granted = rbac_scan.granted(find(objs, "ClusterRole", f"{OPERATOR}-crds")["rules"])
    assert {(p.resource, p.verb) for p in granted} == {
        ("customresourcedefinitions", v) for v in ("create", "get", "patch")
    }
    named = [r for r in find(objs, "ClusterRole", f"{OPERATOR}-crds")["rules"] if "patch" in r["verbs"]]
    assert named[0]["resourceNames"] == sorted(crds.crd_name(k) for k in crds.KINDS)
