"""ServingDeployment manifests: vllm serve arguments, probes, scheduling, volumes, and the child objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.fixtures.serving import URI, inputs
from tpuforge import api
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.api.constants import DEFAULT_VLLM_IMAGE
from tpuforge.manifests import serving, serving_inputs, vllm_server

# The model copied to a disk of the ServingDeployment (the default before streaming; still an option).
DISK = {"modelStorage": {"medium": "Disk"}}


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_vllm_args_follow_the_spec_with_extra_args_last() -> None:
    inp = inputs(
        vllm={
            "tensorParallelSize": 4,
            "maxModelLen": 8192,
            "kvCacheDtype": "fp8",
            "maxNumSeqs": 256,
            "servedModelName": "gemma-verilog",
            "extraArgs": ["--max-num-batched-tokens", "4096", "--data-parallel-size", "2"],
        },
        **DISK,
    )
    args = vllm_server.vllm_args(inp)
    assert args[0] == "/models/model" and "--load-format" not in args
    assert flag(args, "--tensor-parallel-size") == "4"
    assert flag(args, "--max-model-len") == "8192"
    assert flag(args, "--kv-cache-dtype") == "fp8"
    assert flag(args, "--max-num-seqs") == "256"
    assert flag(args, "--served-model-name") == "gemma-verilog"
    assert flag(args, "--port") == "8000"
    assert flag(args, "--host") == "0.0.0.0"
    assert args[-4:] == ["--max-num-batched-tokens", "4096", "--data-parallel-size", "2"]


def test_multimodal_gemma4_disables_chunked_mm_input_and_text_models_do_not() -> None:
    assert "--disable_chunked_mm_input" in vllm_server.vllm_args(inputs("gemma4-31b"))
    tiny = vllm_server.vllm_args(inputs("gemma4-tiny", vllm={"tensorParallelSize": 1}))
    assert "--disable_chunked_mm_input" not in tiny


def test_a_multimodal_server_batches_a_whole_video_by_default() -> None:
    """Each image or video is then batched whole, and vLLM refuses to start when its largest (2496 tokens for
    Gemma 4) exceeds --max-num-batched-tokens, whose own default is lower."""
    assert flag(vllm_server.vllm_args(inputs("gemma4-31b")), "--max-num-batched-tokens") == "4096"
    mm = vllm_server.vllm_args(inputs("gemma4-31b", vllm={"maxNumBatchedTokens": 8192}))
    assert flag(mm, "--max-num-batched-tokens") == "8192"
    tiny = inputs("gemma4-tiny", vllm={"tensorParallelSize": 1})
    assert "--max-num-batched-tokens" not in vllm_server.vllm_args(tiny)
    tiny = inputs("gemma4-tiny", vllm={"tensorParallelSize": 1, "maxNumBatchedTokens": 1024})
    assert flag(vllm_server.vllm_args(tiny), "--max-num-batched-tokens") == "1024"


def test_defaults_serve_under_the_objects_name_with_tp8_and_no_max_num_seqs() -> None:
    args = vllm_server.vllm_args(inputs(name="chat"))
    assert flag(args, "--served-model-name") == "chat"
    assert flag(args, "--tensor-parallel-size") == "8"
    assert flag(args, "--max-model-len") == "16384"
    assert "--max-num-seqs" not in args


def test_model_path_is_configurable_for_both_containers() -> None:
    inp = inputs(vllm={"modelPath": "/data/gemma"}, **DISK)
    pod = serving.pod_template(inp)["spec"]
    fetch, vllm = pod["initContainers"][0], pod["containers"][0]
    assert vllm["args"][0] == "/data/gemma"
    assert fetch["args"][:4] == ["--model-uri", URI, "--target-dir", "/data/gemma"]
    mounts = {c["name"]: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (fetch, vllm)}
    assert mounts["fetch-model"]["model"] == mounts["vllm"]["model"] == "/data/gemma"


def test_startup_probe_allows_the_compile_budget_and_the_engine_waits_as_long() -> None:
    p = vllm_server.probes()
    startup = p["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert p[kind]["httpGet"] == {"path": "/health", "port": 8000}
    env = {e["name"]: e["value"] for e in vllm_server.vllm_env()}
    assert int(env["VLLM_ENGINE_READY_TIMEOUT_S"]) == startup["periodSeconds"] * startup["failureThreshold"]
    assert env["VLLM_XLA_CACHE_PATH"] == vllm_server.XLA_CACHE_MOUNT


def test_pod_runs_on_the_v6e8_pool_with_all_its_chips() -> None:
    """GKE (TPUs in GKE, v6e machine types): topology 2x4 exists as one ct6e-standard-8t VM (8 chips) and as
    two ct6e-standard-4t VMs (4 each); a pod asking for 8 chips must select the machine type."""
    pod = serving.pod_template(inputs())["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "2x4",
        "node.kubernetes.io/instance-type": "ct6e-standard-8t",
    }
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    vllm = pod["containers"][0]
    assert vllm["resources"]["limits"] == {"google.com/tpu": "8"}
    assert vllm["command"] == ["vllm", "serve"]
    assert vllm["image"] == DEFAULT_VLLM_IMAGE


def test_spot_adds_the_spot_selector_and_toleration() -> None:
    pod = serving.pod_template(inputs(tpu={"slice": "v6e-4", "spot": True}, vllm={"tensorParallelSize": 4}))
    spec = pod["spec"]
    assert spec["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x2"
    assert any(t["key"] == "cloud.google.com/gke-spot" for t in spec["tolerations"])
    assert spec["containers"][0]["resources"]["limits"] == {"google.com/tpu": "4"}


def test_volumes_shm_in_memory_cache_and_model_on_their_own_disks() -> None:
    pod = serving.pod_template(inputs(name="chat", **DISK))["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert vols["xla-cache"]["persistentVolumeClaim"]["claimName"] == "chat-xla-cache"
    assert vols["model"]["persistentVolumeClaim"]["claimName"] == "chat-model"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    assert mounts["model"]["readOnly"] is True


def test_the_model_lives_off_the_boot_disk_on_a_claim_sized_from_its_bytes() -> None:
    """GKE: a TPU VM's boot disk (100 GiB by default) also holds the images, and a pod that fills it without an
    ephemeral-storage request is evicted first. A 62 GB bf16 Gemma 4 31B copied into the pod goes on its own
    disk (medium Disk)."""
    inp = inputs(name="chat", **DISK)
    claim = serving.model_pvc(inp)
    assert claim is not None
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "73Gi"  # 62e9 B x 1.25, in GiB, rounded up
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "0000-1111"  # collected with the object
    local = inputs(name="chat", modelStorage={"medium": "NodeLocal", "size": "150Gi"})
    assert serving.model_pvc(local) is None
    pod = serving.pod_template(local)["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["model"] == {"name": "model", "emptyDir": {"sizeLimit": "150Gi"}}
    requests = pod["containers"][0]["resources"]["requests"]
    assert requests["ephemeral-storage"] == "150Gi" and requests["google.com/tpu"] == "8"


def test_claims_use_the_operators_hyperdisk_class_unless_the_spec_names_one() -> None:
    """GKE (TPU v6e): v6e VMs attach Hyperdisk (Balanced, ML) only, not the pd-balanced of GKE's default
    StorageClass; the chart's class (TPUFORGE_STORAGE_CLASS) is used wherever the spec names none."""
    base = inputs(name="chat", **DISK)
    inp = serving_inputs.ServingInputs(**{**base.__dict__, "storage_class": "tpuforge-hyperdisk-balanced"})
    model = serving.model_pvc(inp)
    assert model is not None and model["spec"]["storageClassName"] == "tpuforge-hyperdisk-balanced"
    assert serving.xla_cache_pvc(inp)["spec"]["storageClassName"] == "tpuforge-hyperdisk-balanced"
    assert "storageClassName" not in serving.xla_cache_pvc(base)["spec"]
    own = inputs(name="chat", xlaCache={"storageClassName": "mine"}, **DISK)
    own = serving_inputs.ServingInputs(**{**own.__dict__, "storage_class": "tpuforge-hyperdisk-balanced"})
    assert serving.xla_cache_pvc(own)["spec"]["storageClassName"] == "mine"


def test_a_rollout_replaces_the_pod_while_it_holds_a_read_write_once_disk() -> None:
    """Kubernetes/GKE: a ReadWriteOnce disk attaches to one node at a time. The old pod holds all 8 chips of
    its VM, so a surge pod lands on another node and waits for the disk (Multi-Attach error) while the old pod
    is never removed: the rollout stalls. With the model on a ReadWriteOnce disk the Deployment recreates
    instead."""
    assert serving.deployment(inputs(**DISK))["spec"]["strategy"] == {"type": "Recreate"}
    shared = inputs(
        replicas=2,
        xlaCache={"accessMode": "ReadWriteMany", "storageClassName": "standard-rwx"},
        modelStorage={"medium": "NodeLocal"},
    )
    dep = serving.deployment(shared)
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert serving.xla_cache_pvc(shared)["spec"]["accessModes"] == ["ReadWriteMany"]


def test_a_new_model_uri_changes_the_pod_template_so_the_deployment_rolls() -> None:
    a = inputs()
    b = serving_inputs.ServingInputs(**{**a.__dict__, "model_uri": "gs://bucket/jobs/demo/merged-v2"})
    ta, tb = serving.pod_template(a), serving.pod_template(b)
    assert ta != tb
    assert tb["metadata"]["annotations"][serving.ANNOTATION_MODEL_URI] == "gs://bucket/jobs/demo/merged-v2"
    assert serving.deployment(a)["spec"]["selector"] == serving.deployment(b)["spec"]["selector"]


def test_children_carry_the_labels_the_operator_watches_by() -> None:
    inp = inputs(name="chat")
    pod_labels = serving.pod_template(inp)["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/managed-by"] == "tpuforge"
    assert pod_labels["tpuforge.dev/servingdeployment"] == "chat"
    assert pod_labels["tpuforge.dev/owner-uid"] == "0000-1111"
    selector = serving.deployment(inp)["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()


def test_children_are_owned_and_the_cache_is_kept_unless_asked() -> None:
    inp = inputs(
        name="chat",
        replicas=2,
        xlaCache={"accessMode": "ReadWriteMany", "storageClassName": "standard-rwx"},
        modelStorage={"medium": "NodeLocal"},
    )
    dep, svc = serving.deployment(inp), serving.service(inp)
    for obj in (dep, svc, serving.pod_monitoring(inp), serving.service_monitor(inp)):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "ServingDeployment",
            "chat",
            "0000-1111",
            True,
        )
        assert obj["metadata"]["namespace"] == "team-a"
    assert dep["spec"]["replicas"] == 2
    assert "ownerReferences" not in serving.xla_cache_pvc(inp)["metadata"]
    dropped = serving.xla_cache_pvc(
        inputs(xlaCache={"retainOnDelete": False, "size": "50Gi", "storageClassName": "premium-rwo"}, **DISK)
    )
    assert dropped["metadata"]["ownerReferences"][0]["uid"] == "0000-1111"
    assert dropped["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert dropped["spec"]["storageClassName"] == "premium-rwo"


def test_service_and_endpoint() -> None:
    svc = serving.service(inputs(name="chat"))
    assert svc["metadata"]["name"] == "chat"
    assert svc["spec"]["ports"][0]["port"] == 8000
    assert svc["spec"]["selector"] == serving_inputs.selector_labels("chat")
    assert svc["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    assert serving.endpoint("chat", "team-a") == "http://chat.team-a.svc:8000/v1"


def test_monitors_select_the_serving_pods_metrics() -> None:
    inp = inputs(name="chat")
    for kind in serving.MONITOR_KINDS:
        obj = kind.build(inp)
        assert obj["apiVersion"] == f"{kind.group}/{kind.version}"
        assert obj["spec"]["selector"]["matchLabels"] == serving_inputs.selector_labels("chat")
        assert obj["spec"]["endpoints"][0]["path"] == "/metrics"


def test_builders_are_pure() -> None:
    assert serving.deployment(inputs()) == serving.deployment(inputs())


@pytest.mark.parametrize(
    ("model", "tp", "slice_", "message"),
    [
        ("gemma4-31b", 16, "v6e-8", "must divide the 8 chips"),
        ("gemma4-31b", 3, "v6e-8", "must divide gemma4-31b's 32 query heads"),
        ("gemma4-31b", 8, "v6e-4", "must divide the 4 chips"),
    ],
)
def test_tensor_parallelism_must_fit_the_slice_and_the_heads(model: str, tp: int, slice_: str, message: str) -> None:
    with pytest.raises(api.SpecError) as info:
        api.validate_serving(
            {
                "model": {"uri": URI},
                "serviceAccountName": "vllm",
                "tpu": {"slice": slice_},
                "vllm": {"tensorParallelSize": tp},
            },
            model,
        )
    assert set(info.value.fields) == {"spec.vllm.tensorParallelSize"}
    assert message in str(info.value)


def test_model_revision_rolls_the_pods_when_the_uri_stays() -> None:
    a = inputs()
    b = serving_inputs.ServingInputs(**{**a.__dict__, "model_revision": "uid:2026-01-01T00:00:00Z"})
    assert serving.pod_template(a) != serving.pod_template(b)
    assert serving.ANNOTATION_MODEL_REVISION not in serving.pod_template(a)["metadata"]["annotations"]


@pytest.mark.parametrize("name", ["1chat", "chat.v2", "Chat", "chat-", "c" * 64])
def test_names_that_cannot_name_a_service_are_rejected(name: str) -> None:
    (err,) = serving_inputs.name_errors(name)
    assert err.field == "metadata.name"


def test_a_dns_label_name_is_accepted_and_long_ones_get_short_children() -> None:
    assert serving_inputs.name_errors("gemma4-31b-verilog") == []
    long = "g" * 63
    assert serving_inputs.name_errors(long) == []
    n = serving_inputs.names(long)
    assert n.service == long
    assert all(len(x) <= 63 for x in (n.deployment, n.xla_cache, n.monitor))
    assert n.deployment != n.xla_cache


def test_a_multi_host_slice_cannot_be_served_by_one_pod() -> None:
    with pytest.raises(api.SpecError) as info:
        api.validate_serving(
            {
                "model": {"uri": URI},
                "serviceAccountName": "vllm",
                "tpu": {"slice": "v5p-16"},
                "vllm": {"tensorParallelSize": 4},
            }
        )
    assert info.value.fields == ["spec.tpu.slice"]


@pytest.mark.parametrize("path", ["models/model", "/", "/dev/shm/model", "/etc/model"])
def test_the_model_path_must_be_a_directory_of_its_own(path: str) -> None:
    with pytest.raises(api.SpecError) as info:
        api.validate_serving({"model": {"uri": URI}, "serviceAccountName": "vllm", "vllm": {"modelPath": path}})
    assert info.value.fields == ["spec.vllm.modelPath"]


# --- LoRA adapters ----------------------------------------------------------------------------------------


ADAPTERS = [{"name": "support", "fineTuneJobRef": {"name": "ft"}}, {"name": "sql", "uri": "gs://b/sql/adapter"}]


def adapter_inputs(
    adapters: list[dict[str, Any]], job_rank: int | None = None, **spec: Any
) -> serving_inputs.ServingInputs:
    inp = inputs(adapters=adapters, **spec)
    return serving_inputs.ServingInputs(**{**inp.__dict__, "adapter_job_rank": job_rank})


def test_adapters_enable_runtime_lora_with_a_rank_vllm_accepts() -> None:
    inp = adapter_inputs(ADAPTERS[:1], job_rank=12, vllm={"lora": {"maxLoras": 2, "maxCpuLoras": 6}})
    args = vllm_server.vllm_args(inp)
    assert "--enable-lora" in args
    assert (flag(args, "--max-loras"), flag(args, "--max-lora-rank"), flag(args, "--max-cpu-loras")) == ("2", "16", "6")
    assert args.index("--enable-lora") < args.index("--host")  # extra args still come last
    vllm = serving.pod_template(inp)["spec"]["containers"][0]
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in vllm["env"]
    # A URI adapter's rank is unknown ahead: 64 covers the usual ones; an explicit rank wins over both.
    assert flag(vllm_server.vllm_args(adapter_inputs(ADAPTERS, job_rank=8)), "--max-lora-rank") == "64"
    assert flag(vllm_server.vllm_args(adapter_inputs(ADAPTERS, job_rank=128)), "--max-lora-rank") == "128"
    explicit = adapter_inputs(ADAPTERS, job_rank=128, vllm={"lora": {"maxLoraRank": 200}})
    assert flag(vllm_server.vllm_args(explicit), "--max-lora-rank") == "256"
    assert [vllm_server.vllm_lora_rank(r) for r in (1, 2, 8, 300, 512)] == [1, 8, 8, 320, 512]


def test_without_adapters_the_pod_is_what_it_was() -> None:
    pod = serving.pod_template(inputs())["spec"]
    assert [c["name"] for c in pod["containers"]] == ["vllm"]
    assert "--enable-lora" not in pod["containers"][0]["args"]
    assert "--uncommitted-base" not in pod["initContainers"][0]["args"]
    assert all(e["name"] != "VLLM_ALLOW_RUNTIME_LORA_UPDATING" for e in pod["containers"][0]["env"])
    # A maxLoraRank alone enables LoRA, so that the first adapter added later does not restart the pods.
    pre = serving.pod_template(inputs(vllm={"lora": {"maxLoraRank": 8}}))["spec"]
    assert [c["name"] for c in pre["containers"]] == ["vllm", "adapters"]


def test_the_sidecar_shares_the_adapter_volume_at_the_same_path_and_reads_the_base() -> None:
    inp = adapter_inputs(ADAPTERS, vllm={"modelPath": "/data/gemma"}, **DISK)
    pod = serving.pod_template(inp)["spec"]
    vllm, side = pod["containers"]
    assert side["name"] == "adapters" and side["command"] == ["python", "-m", "tpuforge_workloads.serve.adapters"]
    assert flag(side["args"], "--model-dir") == "/data/gemma" and flag(side["args"], "--adapters-dir") == "/adapters"
    assert flag(side["args"], "--model-name") == "gemma4-31b" and flag(side["args"], "--max-lora-rank") == "64"
    assert flag(side["args"], "--port") == "8001" and flag(side["args"], "--host") == "$(POD_IP)"
    assert side["env"][0] == {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    mounts = {
        c["name"]: {m["name"]: (m["mountPath"], m.get("readOnly", False)) for m in c["volumeMounts"]}
        for c in (vllm, side)
    }
    assert mounts["vllm"]["adapters"] == ("/adapters", True) and mounts["adapters"]["adapters"] == ("/adapters", False)
    assert mounts["adapters"]["model"] == ("/data/gemma", True)
    assert {"name": "adapters", "emptyDir": {}} in pod["volumes"]
    assert side["securityContext"]["readOnlyRootFilesystem"] is True  # locked down like the rest
    assert side["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8001}


def test_a_base_for_adapters_named_by_uri_may_be_uncommitted_and_a_job_output_may_not() -> None:
    assert serving.fetch_args(adapter_inputs(ADAPTERS))[-1] == "--uncommitted-base"
    by_job = api.validate_serving(
        {"model": {"fineTuneJobRef": {"name": "base"}}, "serviceAccountName": "vllm", "adapters": ADAPTERS},
        "gemma4-31b",
    )
    assert not serving.uncommitted_base(by_job)


def test_adding_replacing_or_removing_adapters_leaves_the_pod_template_alone() -> None:
    pin = {"vllm": {"lora": {"maxLoraRank": 16}}}
    one = serving.deployment(adapter_inputs(ADAPTERS[:1], job_rank=16, **pin))
    two = serving.deployment(adapter_inputs(ADAPTERS, job_rank=16, **pin))
    swapped = serving.deployment(adapter_inputs([{"name": "support", "uri": "gs://b/v2/adapter"}], **pin))
    assert one["spec"]["template"] == two["spec"]["template"] == swapped["spec"]["template"]
    # Without a pinned rank, the same holds while the derived rank stays.
    assert serving.pod_template(adapter_inputs(ADAPTERS, job_rank=8)) == serving.pod_template(
        adapter_inputs([ADAPTERS[1]])
    )


def test_adapter_objects_validate_against_the_gke_kubernetes_schema() -> None:
    inp = adapter_inputs(ADAPTERS, job_rank=16, vllm={"lora": {"maxCpuLoras": 8}})
    for obj in (serving.deployment(inp), serving.service(inp)):
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


def test_the_adapters_example_is_valid_and_pins_its_rank() -> None:
    raw = yaml.safe_load((Path(__file__).resolve().parents[3] / "examples" / "serving-adapters.yaml").read_text())
    spec = api.validate_serving(raw["spec"])
    assert api.check_serving(spec, None, serving_inputs.served_model_name(raw["metadata"]["name"], spec)) == []
    inp = serving_inputs.ServingInputs(
        owner=serving_inputs.owner("ml", raw["metadata"]["name"], "u"),
        spec=spec,
        model_uri=spec.model.uri or "",
        model=model_shape("gemma4-31b"),
        slice=tpu_slice("v6e-8"),
        adapter_job_rank=16,
    )
    assert flag(vllm_server.vllm_args(inp), "--max-lora-rank") == "64"
    assert serving.uncommitted_base(spec)


def test_the_disruption_budget_lets_one_pod_go_at_a_time_unless_the_spec_holds_more() -> None:
    inp = inputs()
    pdb = serving.disruption_budget(inp)
    pod_labels = serving.pod_template(inp)["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["selector"] == serving.deployment(inp)["spec"]["selector"]
    # One replica by default: a node upgrade may evict it (the endpoint is down until it is back).
    assert (pdb["spec"]["maxUnavailable"], "minAvailable" in pdb["spec"]) == (1, False)
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"  # a pod still compiling serves nothing
    held = serving.disruption_budget(inputs(disruption={"minAvailable": 1}))["spec"]
    assert (held["minAvailable"], "maxUnavailable" in held) == (1, False)
    kubernetes_validate.validate(pdb, "1.30.0", strict=True)


def test_an_hpa_finds_the_pods_by_the_status_selector() -> None:
    selector = serving.selector("chat")
    labels = serving.pod_template(inputs())["metadata"]["labels"]
    assert dict(kv.split("=") for kv in selector.split(",")).items() <= labels.items()


def test_by_default_vllm_streams_the_weights_from_gcs_with_no_model_volume() -> None:
    """vLLM's Run:ai model streamer (`--load-format runai_streamer`) reads a gs:// directory's safetensors
    itself: the pod has no model volume and the init container only checks the model, copying nothing."""
    inp = inputs(name="chat")
    assert inp.spec.model_storage.medium == "Stream"
    pod = serving.pod_template(inp)["spec"]
    vllm, (check,) = pod["containers"][0], pod["initContainers"]
    assert vllm["args"][0] == URI and flag(vllm["args"], "--load-format") == "runai_streamer"
    assert check["name"] == serving.FETCH_CONTAINER
    assert check["args"] == ["--model-uri", URI, "--check-only", "--termination-log", "/dev/termination-log"]
    assert all(m["name"] != "model" for m in check["volumeMounts"])
    assert "model" not in {v["name"] for v in pod["volumes"]}
    assert all(m["name"] != "model" for m in vllm["volumeMounts"])
    assert serving.model_pvc(inp) is None
    kubernetes_validate.validate(serving.deployment(inp), "1.30.0", strict=True)


def test_a_streamed_model_pins_no_zone_and_rolls_with_an_endpoint_up() -> None:
    """No ReadWriteOnce claim is left in the pod (the cache is the node's), so nothing binds it to a disk's
    zone, and a new pod may start on another TPU VM while the old one serves: maxSurge 1, maxUnavailable 0."""
    inp = inputs(name="chat", xlaCache={"size": "30Gi"})
    pod = serving.pod_template(inp)["spec"]
    claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == []
    assert {v["name"]: v for v in pod["volumes"]}["xla-cache"] == {
        "name": "xla-cache",
        "emptyDir": {"sizeLimit": "30Gi"},
    }
    assert pod["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "30Gi"
    assert serving.xla_cache_pvc(inp) is None
    assert serving.deployment(inp)["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    # A shared cache stays a claim every replica mounts; the rollout still surges.
    shared = inputs(replicas=2, xlaCache={"accessMode": "ReadWriteMany", "storageClassName": "standard-rwx"})
    assert {v["name"]: v for v in serving.pod_template(shared)["spec"]["volumes"]}["xla-cache"] == {
        "name": "xla-cache",
        "persistentVolumeClaim": {"claimName": "chat-xla-cache"},
    }
    assert serving.xla_cache_pvc(shared)["spec"]["accessModes"] == ["ReadWriteMany"]
    assert serving.deployment(shared)["spec"]["strategy"]["type"] == "RollingUpdate"
    # Several replicas need no shared storage at all.
    assert serving.deployment(inputs(replicas=3))["spec"]["replicas"] == 3


def test_the_disk_cache_keeps_its_rules_when_chosen() -> None:
    for medium, strategy in (("Disk", "Recreate"), ("NodeLocal", "Recreate"), ("HyperdiskML", "Recreate")):
        extra = {"storageClassName": "hdml", "dataSource": "gemma"} if medium == "HyperdiskML" else {}
        inp = inputs(modelStorage={"medium": medium, **extra})
        pod = serving.pod_template(inp)["spec"]
        assert "--load-format" not in pod["containers"][0]["args"]
        assert "model" in {v["name"] for v in pod["volumes"]}
        assert serving.xla_cache_pvc(inp) is not None
        assert serving.deployment(inp)["spec"]["strategy"]["type"] == strategy


def test_a_streamed_base_is_checked_uncommitted_and_the_sidecar_reads_its_config_from_gcs() -> None:
    inp = adapter_inputs(ADAPTERS)
    pod = serving.pod_template(inp)["spec"]
    assert pod["initContainers"][0]["args"][-1] == "--uncommitted-base"
    vllm, side = pod["containers"]
    assert flag(side["args"], "--model-dir") == URI
    assert all(m["name"] != "model" for m in side["volumeMounts"])
    assert "--enable-lora" in vllm["args"] and flag(vllm["args"], "--load-format") == "runai_streamer"
