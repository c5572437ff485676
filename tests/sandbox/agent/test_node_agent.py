"""The node agent as scheduler and kubelet: real pods through the real apiserver, run as local processes."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.constants import GKE_TPU_ACCELERATOR, GKE_TPU_TOPOLOGY, TPU_RESOURCE
from tpuforge.manifests.common import locked_down
from tpuforge_sandbox import Sandbox, wait_for

pytestmark = pytest.mark.cluster

TPU_TOLERATION = {"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# Prints a line and exits 7 on SIGTERM; otherwise sleeps.
TRAP_SIGTERM = (
    "import signal, sys, time\n"
    "def bye(*_):\n"
    "    print('got SIGTERM', flush=True)\n"
    "    sys.exit(7)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('started', flush=True)\n"
    "time.sleep(300)\n"
)


def pod(
    name: str, code: str, *, restart: str = "Never", slice_: str | None = None, tpu: int = 0, **spec: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "python:3.11", "command": ["python", "-c", code]}
    container.update(spec.pop("container", {}))
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 5, "containers": [container], **spec},
    }
    if slice_:  # as the operator selects a slice's node pool
        tpu_slice = TPU_SLICES[slice_]
        body["spec"]["nodeSelector"] = {
            GKE_TPU_ACCELERATOR: tpu_slice.accelerator,
            GKE_TPU_TOPOLOGY: tpu_slice.topology,
        }
        body["spec"]["tolerations"] = [TPU_TOLERATION]
    if tpu:
        container["resources"] = {"limits": {TPU_RESOURCE: str(tpu)}}
    return body


def read(core: client.CoreV1Api, ns: str, name: str) -> client.V1Pod:
    return core.read_namespaced_pod(name, ns)


def wait_phase(
    core: client.CoreV1Api, ns: str, name: str, phases: tuple[str, ...], timeout: float = 60
) -> client.V1Pod:
    return wait_for(
        lambda: (p := read(core, ns, name)).status.phase in phases and p,
        timeout,
        f"pod {ns}/{name} to reach {'/'.join(phases)}",
    )


def terminated(p: client.V1Pod) -> client.V1ContainerStateTerminated:
    return p.status.container_statuses[0].state.terminated


def gone(core: client.CoreV1Api, ns: str, name: str) -> bool:
    try:
        read(core, ns, name)
    except ApiException as e:
        return e.status == 404
    return False


def log_of(core: client.CoreV1Api, ns: str, name: str) -> str:
    """The pod's log so far ("" before its container has written anything)."""
    try:
        return core.read_namespaced_pod_log(name, ns) or ""
    except ApiException:
        return ""


def condition(p: client.V1Pod, type_: str) -> client.V1PodCondition | None:
    return next((c for c in p.status.conditions or [] if c.type == type_), None)


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def test_a_pod_runs_to_succeeded_and_its_log_reaches_kubectl_logs(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, pod("hello", "print('hello from the sandbox')"))
    p = wait_phase(core, namespace, "hello", ("Succeeded", "Failed"))
    assert p.status.phase == "Succeeded"
    assert terminated(p).exit_code == 0 and terminated(p).reason == "Completed"
    assert p.spec.node_name == "cpu-0"  # the only node without the TPU taint
    assert p.status.pod_ip == "127.0.0.1"
    # through the apiserver, which asks the node agent like a kubelet
    assert core.read_namespaced_pod_log("hello", namespace) == "hello from the sandbox\n"


def test_a_failing_pod_ends_failed_with_exit_code_and_termination_message(
    core: client.CoreV1Api, namespace: str
) -> None:
    code = "import sys; open(sys.argv[1], 'w').write('dataset not found'); sys.exit(3)"
    core.create_namespaced_pod(namespace, pod("fails", code, container={"args": ["/dev/termination-log"]}))
    code_logs = "import sys; print('line 1'); print('Traceback: boom', flush=True); sys.exit(2)"
    core.create_namespaced_pod(
        namespace, pod("fallback", code_logs, container={"terminationMessagePolicy": "FallbackToLogsOnError"})
    )
    p = wait_phase(core, namespace, "fails", ("Succeeded", "Failed"))
    assert p.status.phase == "Failed"
    assert terminated(p).exit_code == 3 and terminated(p).reason == "Error"
    assert terminated(p).message == "dataset not found"
    p = wait_phase(core, namespace, "fallback", ("Succeeded", "Failed"))
    assert terminated(p).exit_code == 2
    assert terminated(p).message == "line 1\nTraceback: boom"


def test_configmap_volume_env_sources_and_path_mapping(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "cfg"}, "data": {"config.json": '{"steps": 3}', "MODE": "sft"}}
    )
    core.create_namespaced_secret(namespace, {"metadata": {"name": "sec"}, "stringData": {"token": "s3cret"}})
    code = (
        "import json, os, sys\n"
        "cfg = json.load(open(sys.argv[1]))\n"
        "print(json.dumps({'cfg': cfg, 'arg': sys.argv[1], 'env': {k: os.environ.get(k) for k in\n"
        "  ['POD', 'NS', 'MODE', 'CM_MODE', 'TOKEN', 'CONFIG', 'GREETING', 'STORAGE_EMULATOR_HOST']},\n"
        "  'scratch_exists': os.path.isdir(os.environ['SCRATCH'])}))\n"
    )
    body = pod(
        "env",
        code,
        container={
            "args": ["/etc/tpuforge/config.json"],
            "env": [
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "CM_MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "MODE"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
                {"name": "CONFIG", "value": "--config=/etc/tpuforge/config.json"},
                {"name": "GREETING", "value": "hello $(POD)"},
                {"name": "SCRATCH", "value": "/scratch"},
            ],
            "envFrom": [{"configMapRef": {"name": "cfg"}}],
            "volumeMounts": [
                {"name": "cfg", "mountPath": "/etc/tpuforge", "readOnly": True},
                {"name": "scratch", "mountPath": "/scratch"},
            ],
        },
        volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}, {"name": "scratch", "emptyDir": {}}],
    )
    core.create_namespaced_pod(namespace, body)
    p = wait_phase(core, namespace, "env", ("Succeeded", "Failed"))
    log = core.read_namespaced_pod_log("env", namespace)
    assert p.status.phase == "Succeeded", log
    out = json.loads(log)
    assert out["cfg"] == {"steps": 3}
    assert out["arg"].endswith(f"/pods/{namespace}/env/volumes/cfg/config.json")
    env = out["env"]
    assert env["POD"] == "env" and env["NS"] == namespace
    assert env["MODE"] == "sft" and env["CM_MODE"] == "sft" and env["TOKEN"] == "s3cret"
    assert env["CONFIG"] == f"--config={out['arg']}"
    assert env["GREETING"] == "hello env"
    assert env["STORAGE_EMULATOR_HOST"].startswith("http://127.0.0.1:")
    assert out["scratch_exists"]


def test_a_missing_configmap_keeps_the_pod_waiting_until_it_exists(core: client.CoreV1Api, namespace: str) -> None:
    body = pod(
        "late",
        "print(open('/cfg/x').read())",
        container={"volumeMounts": [{"name": "c", "mountPath": "/cfg"}]},
        volumes=[{"name": "c", "configMap": {"name": "later"}}],
    )
    core.create_namespaced_pod(namespace, body)

    def waiting_reason() -> str | None:
        cs = read(core, namespace, "late").status.container_statuses
        return cs and cs[0].state.waiting and cs[0].state.waiting.reason

    # It reports PodInitializing first, then the mount failure.
    assert wait_for(lambda: waiting_reason() == "FailedMount", 30, "the pod to report FailedMount")
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "later"}, "data": {"x": "arrived"}})
    p = wait_phase(core, namespace, "late", ("Succeeded", "Failed"))
    assert p.status.phase == "Succeeded"
    assert core.read_namespaced_pod_log("late", namespace) == "arrived\n"


def test_a_pod_reaches_the_apiserver_with_its_service_account(
    core: client.CoreV1Api, api_client: client.ApiClient, namespace: str
) -> None:
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "read-pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader-reads-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    code = (
        "import os\n"
        "from kubernetes import client, config\n"
        "from kubernetes.client.exceptions import ApiException\n"
        "config.load_kube_config()\n"
        "core = client.CoreV1Api()\n"
        "me = core.read_namespaced_pod(os.environ['HOSTNAME'], os.environ['NS'])\n"
        "print('read myself:', me.metadata.name)\n"
        "try:\n"
        "    core.list_namespaced_secret(os.environ['NS'])\n"
        "except ApiException as e:\n"
        "    print('secrets:', e.status)\n"
    )
    body = pod(
        "whoami",
        code,
        serviceAccountName="reader",
        container={"env": [{"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]},
    )
    core.create_namespaced_pod(namespace, body)
    p = wait_phase(core, namespace, "whoami", ("Succeeded", "Failed"))
    log = core.read_namespaced_pod_log("whoami", namespace)
    assert p.status.phase == "Succeeded", log
    assert "read myself: whoami" in log
    assert "secrets: 403" in log  # it is the ServiceAccount, not the admin


def test_a_locked_down_pod_runs_with_home_on_its_scratch_volume(core: client.CoreV1Api, namespace: str) -> None:
    """The operator's pods mount a scratch volume at /tmp and point HOME and the caches into it. Here that is
    a directory of the pod; the agent's own host paths (its TMPDIR, which lies under the host's /tmp) stay
    as they are. runAsUser is not emulated: the process runs as the agent's user."""
    code = (
        "import json, os, pathlib, tempfile\n"
        "cache = pathlib.Path(os.environ['XDG_CACHE_HOME']) / 'x'\n"
        "cache.mkdir(parents=True)\n"
        "(cache / 'f').write_text('ok')\n"
        "with tempfile.NamedTemporaryFile() as t: tmp = t.name\n"
        "print(json.dumps({'home': os.environ['HOME'], 'cache': str(cache), 'tmp': tmp,\n"
        "  'kubeconfig': os.environ.get('KUBECONFIG')}))\n"
    )
    body = pod("locked", code)
    body["spec"] = locked_down(body["spec"], api_access=False)
    core.create_namespaced_pod(namespace, body)
    p = wait_phase(core, namespace, "locked", ("Succeeded", "Failed"))
    log = core.read_namespaced_pod_log("locked", namespace)
    assert p.status.phase == "Succeeded", log
    out = json.loads(log)
    assert out["home"].endswith(f"/pods/{namespace}/locked/volumes/tmp")
    assert out["cache"].startswith(out["home"] + "/")
    assert not out["tmp"].startswith(out["home"])  # the agent's short TMPDIR, not remapped into the volume
    assert out["kubeconfig"] is None  # no API access asked for, no token


def test_two_pods_wanting_all_chips_of_one_v5p8_node_run_one_after_the_other(
    core: client.CoreV1Api, namespace: str
) -> None:
    code = (
        "import json, os, time\n"
        "t0 = time.time(); time.sleep(1.5)\n"
        "print(json.dumps({'start': t0, 'end': time.time(), 'xla': os.environ['XLA_FLAGS'],\n"
        "                  'jax': os.environ['JAX_PLATFORMS']}))\n"
    )
    for name in ("first", "second"):
        body = pod(
            name,
            code,
            slice_="v5p-8",
            tpu=4,
            container={"env": [{"name": "XLA_FLAGS", "value": "--xla_dump_to=/tmp/x"}]},
        )
        core.create_namespaced_pod(namespace, body)
        time.sleep(0.05)  # creation order decides who goes first
    p2 = wait_for(lambda: condition(read(core, namespace, "second"), "PodScheduled"), 30, "a scheduling verdict")
    if p2.status == "False":
        assert p2.reason == "Unschedulable" and f"Insufficient {TPU_RESOURCE}" in p2.message
    runs = {}
    for name in ("first", "second"):
        p = wait_phase(core, namespace, name, ("Succeeded", "Failed"))
        assert p.status.phase == "Succeeded"
        assert p.spec.node_name == "v5p-8-spot-0"
        runs[name] = json.loads(core.read_namespaced_pod_log(name, namespace))
    assert runs["first"]["end"] <= runs["second"]["start"]
    assert runs["first"]["xla"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4"
    assert runs["first"]["jax"] == "cpu"


def test_a_pod_no_node_fits_stays_pending_with_the_reason(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, pod("greedy", "pass", slice_="v5p-8", tpu=8))
    cond = wait_for(lambda: condition(read(core, namespace, "greedy"), "PodScheduled"), 30, "FailedScheduling")
    assert cond.status == "False" and cond.reason == "Unschedulable"
    assert cond.message == (
        f"0/6 nodes are available: 1 Insufficient {TPU_RESOURCE}, 5 node(s) didn't match node selector."
    )
    assert read(core, namespace, "greedy").status.phase == "Pending"


def claim(name: str, mode: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}},
    }


def on_node(node: str, name: str, code: str, claim_name: str) -> dict[str, Any]:
    return pod(
        name,
        code,
        nodeSelector={"kubernetes.io/hostname": node},
        tolerations=[TPU_TOLERATION],
        volumes=[{"name": "disk", "persistentVolumeClaim": {"claimName": claim_name}}],
        container={"volumeMounts": [{"name": "disk", "mountPath": "/disk"}]},
    )


def test_a_read_write_once_claim_is_refused_on_a_second_node_until_the_first_lets_go(
    core: client.CoreV1Api, namespace: str
) -> None:
    """GKE (Persistent Disk/Hyperdisk, ReadWriteOnce): a disk attached to one node cannot be attached to another;
    the second pod waits with `Multi-Attach error` until the first pod has ended and the disk is detached."""
    core.create_namespaced_persistent_volume_claim(namespace, claim("cache", "ReadWriteOnce"))
    core.create_namespaced_pod(namespace, on_node("cpu-0", "holder", TRAP_SIGTERM, "cache"))
    wait_for(lambda: "started" in log_of(core, namespace, "holder"), 30, "the first pod to run")
    core.create_namespaced_pod(namespace, on_node("v6e-8-0", "second", "open('/disk/x', 'w').write('2')", "cache"))

    def refused() -> str | None:
        items = core.list_namespaced_event(namespace, field_selector="involvedObject.name=second").items
        return next((e.message for e in items if e.reason == "FailedAttachVolume"), None)

    message = wait_for(refused, 30, "a FailedAttachVolume event")
    assert message == 'Multi-Attach error for volume "cache" Volume is already used by pod(s) holder'
    waiting = read(core, namespace, "second")
    assert waiting.status.phase == "Pending"
    assert waiting.status.container_statuses[0].state.waiting.reason == "ContainerCreating"
    core.delete_namespaced_pod("holder", namespace)
    assert wait_phase(core, namespace, "second", ("Succeeded", "Failed")).status.phase == "Succeeded"


def test_init_containers_run_first_in_order_then_the_app(core: client.CoreV1Api, namespace: str) -> None:
    def step(name: str) -> dict[str, Any]:
        code = f"open('/shared/order', 'a').write('{name} ')"
        return {
            "name": name,
            "image": "busybox",
            "command": ["python", "-c", code],
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        }

    body = pod(
        "inits",
        "print(open('/shared/order').read().strip())",
        initContainers=[step("one"), step("two")],
        volumes=[{"name": "shared", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "shared", "mountPath": "/shared"}]},
    )
    core.create_namespaced_pod(namespace, body)
    p = wait_phase(core, namespace, "inits", ("Succeeded", "Failed"))
    assert p.status.phase == "Succeeded"
    assert [s.state.terminated.exit_code for s in p.status.init_container_statuses] == [0, 0]
    assert core.read_namespaced_pod_log("inits", namespace) == "one two\n"


def test_a_native_sidecar_runs_beside_the_app_and_is_stopped_when_it_ends(
    core: client.CoreV1Api, namespace: str
) -> None:
    # The sidecar answers the app through a shared directory, exits 7 on SIGTERM (kubelet's stop after the
    # app), and the pod still succeeds: a sidecar's exit does not decide the phase.
    sidecar_code = TRAP_SIGTERM.replace("print('started', flush=True)", "open('/shared/up', 'w').write('yes')")
    body = pod(
        "sidecar",
        "import os, time\nwhile not os.path.exists('/shared/up'): time.sleep(0.05)\nprint('sidecar up')",
        initContainers=[
            {
                "name": "helper",
                "image": "busybox",
                "restartPolicy": "Always",
                "command": ["python", "-c", sidecar_code],
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
            }
        ],
        volumes=[{"name": "shared", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "shared", "mountPath": "/shared"}]},
    )
    core.create_namespaced_pod(namespace, body)
    p = wait_phase(core, namespace, "sidecar", ("Succeeded", "Failed"))
    assert p.status.phase == "Succeeded"
    assert core.read_namespaced_pod_log("sidecar", namespace) == "sidecar up\n"
    (helper,) = p.status.init_container_statuses
    assert helper.state.terminated.exit_code == 7 and helper.restart_count == 0
    assert "got SIGTERM" in core.read_namespaced_pod_log("sidecar", namespace, container="helper")


def test_restart_policy_on_failure_restarts_the_container(core: client.CoreV1Api, namespace: str) -> None:
    code = (
        "import os, sys\n"
        "path = '/state/n'\n"
        "n = int(open(path).read()) + 1 if os.path.exists(path) else 1\n"
        "open(path, 'w').write(str(n)); print('attempt', n)\n"
        "sys.exit(0 if n >= 2 else 1)\n"
    )
    body = pod(
        "retry",
        code,
        restart="OnFailure",
        volumes=[{"name": "s", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "s", "mountPath": "/state"}]},
    )
    core.create_namespaced_pod(namespace, body)
    p = wait_phase(core, namespace, "retry", ("Succeeded", "Failed"))
    assert p.status.phase == "Succeeded"
    cs = p.status.container_statuses[0]
    assert cs.restart_count == 1 and cs.last_state.terminated.exit_code == 1
    assert core.read_namespaced_pod_log("retry", namespace) == "attempt 1\nattempt 2\n"


def test_readiness_probe_gates_the_ready_condition(core: client.CoreV1Api, namespace: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import time, http.server as h; time.sleep(1.5)\n"
        f"h.test(h.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')"
    )
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
    body = pod(
        "web",
        code,
        restart="Always",
        container={"ports": [{"name": "http", "containerPort": port}], "readinessProbe": probe},
    )
    core.create_namespaced_pod(namespace, body)
    wait_phase(core, namespace, "web", ("Running",))
    assert condition(read(core, namespace, "web"), "Ready").status == "False"  # the server sleeps first
    wait_for(lambda: condition(read(core, namespace, "web"), "Ready").status == "True", 30, "Ready")
    assert read(core, namespace, "web").status.container_statuses[0].ready


def test_delete_sends_sigterm_then_the_pod_is_gone(core: client.CoreV1Api, sandbox: Sandbox, namespace: str) -> None:
    core.create_namespaced_pod(namespace, pod("polite", TRAP_SIGTERM))
    ignore = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('started', flush=True); time.sleep(300)"
    )
    core.create_namespaced_pod(namespace, pod("stubborn", ignore, terminationGracePeriodSeconds=1))
    for name in ("polite", "stubborn"):
        wait_for(lambda n=name: "started" in log_of(core, namespace, n), 30, f"{name} to start")
    t0 = time.monotonic()
    core.delete_namespaced_pod("polite", namespace)
    core.delete_namespaced_pod("stubborn", namespace)
    wait_for(lambda: gone(core, namespace, "polite") and gone(core, namespace, "stubborn"), 30, "both pods gone")
    assert time.monotonic() - t0 < 15  # the stubborn one was killed after its 1 s grace, not 30 s
    assert sandbox.pod_log(namespace, "polite", "main").read_text() == "started\ngot SIGTERM\n"


def test_preempt_marks_disruption_and_fails_the_pods_on_the_node(
    core: client.CoreV1Api, sandbox: Sandbox, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, pod("spot", TRAP_SIGTERM, slice_="v5p-8", tpu=4))
    wait_for(lambda: "started" in log_of(core, namespace, "spot"), 30, "the pod to start")
    sandbox.preempt("v5p-8-spot-0")
    p = read(core, namespace, "spot")
    assert p.status.phase == "Failed"
    assert p.status.reason == "Terminated"
    assert p.status.message == "Pod was terminated in response to imminent node shutdown."
    disruption = condition(p, "DisruptionTarget")
    assert disruption is not None and disruption.status == "True" and disruption.reason == "TerminationByKubelet"
    assert terminated(p).exit_code == 7  # it saw SIGTERM and exited on its own
    assert core.read_namespaced_pod_log("spot", namespace).endswith("got SIGTERM\n")
    node = core.read_node("v5p-8-spot-0")
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def test_a_job_completes_through_the_job_controller(api_client: client.ApiClient, namespace: str) -> None:
    batch = client.BatchV1Api(api_client)
    job = {
        "metadata": {"name": "job"},
        "spec": {"backoffLimit": 0, "template": pod("unused", "print('job ran')", restart="Never")},
    }
    job["spec"]["template"].pop("apiVersion"), job["spec"]["template"].pop("kind")
    job["spec"]["template"]["metadata"] = {}
    batch.create_namespaced_job(namespace, job)
    status = wait_for(
        lambda: (s := batch.read_namespaced_job("job", namespace).status).succeeded and s, 60, "the Job to succeed"
    )
    assert status.succeeded == 1
    assert any(c.type == "Complete" and c.status == "True" for c in status.conditions)


def test_a_container_without_command_fails_saying_why(core: client.CoreV1Api, namespace: str) -> None:
    body = pod("entrypoint", "unused")
    body["spec"]["containers"][0].pop("command")
    core.create_namespaced_pod(namespace, body)
    p = wait_phase(core, namespace, "entrypoint", ("Failed", "Succeeded"))
    assert p.status.phase == "Failed" and p.status.reason == "StartError"
    assert "set `command`" in p.status.message
