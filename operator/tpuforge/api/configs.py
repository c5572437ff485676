"""What the pods read: TrainConfig, MergeConfig, ServeConfig, and the pure functions that derive them
from a FineTuneJob / ServingDeployment. Workload URIs may be gs:// or local paths (tests, laptops)."""

from __future__ import annotations

from pydantic import Field

from tpuforge.api.base import ApiModel
from tpuforge.api.catalog import Dtype, tpu_slice
from tpuforge.api.code_eval import CodeEvalSpec
from tpuforge.api.constants import ADAPTER_SUBDIR, COMPILE_CACHE_SUBDIR, CPU_SLICE, EVALUATION_SUBDIR
from tpuforge.api.finetune import (
    PREFERENCE_ACCURACY,
    PREFERENCE_METHODS,
    RL_METHODS,
    CheckpointSelect,
    CheckpointSpec,
    DataOptions,
    EvalMetric,
    FineTuneJobSpec,
    GrpoSpec,
    LoraSpec,
    MeshSpec,
    Method,
    PreferenceSpec,
    TrainingSpec,
    resolved_remat,
)
from tpuforge.api.preflight import PreflightStatus
from tpuforge.api.validation import resolved_mesh


class JobRef(ApiModel):
    """The FineTuneJob a pod reports progress to."""

    namespace: str
    name: str


class TrainConfig(ApiModel):
    job: JobRef | None = Field(default=None, description="Where to report progress; None reports nowhere.")
    attempt: int = Field(default=0, ge=0)
    model_name: str
    model_uri: str
    dataset_uri: str
    eval_uri: str | None = None
    data: DataOptions = Field(
        default_factory=DataOptions, description="spec.dataset's format, held-out split, thinking and skip settings."
    )
    lora: LoraSpec = Field(default_factory=LoraSpec)
    # Left out when sft / unset, so that an SFT job's config is written as before.
    method: Method = Field(default="sft", exclude_if=lambda v: v == "sft")
    preference: PreferenceSpec | None = Field(default=None, exclude_if=lambda v: v is None)
    grpo: GrpoSpec | None = Field(default=None, exclude_if=lambda v: v is None)
    training: TrainingSpec
    mesh: MeshSpec
    checkpoint: CheckpointSpec
    compile_cache_uri: str | None = Field(
        default=None,
        description="Where the compiled train step is kept (JAX's compilation cache, one directory per key); "
        "None compiles every attempt afresh.",
    )
    metrics_port: int = Field(default=9090, ge=0, description="Prometheus port; 0 disables it.")
    progress_interval_seconds: float = Field(default=5.0, gt=0)


class StepLoss(ApiModel):
    step: int = Field(ge=0)
    loss: float


class EarlyStop(ApiModel):
    step: int = Field(ge=0, description="The step training stopped at (checkpointed).")
    evals: int = Field(ge=1, description="Evaluations in a row without improvement (the patience).")
    min_delta: float = Field(ge=0)


class TrainResult(ApiModel):
    """What a trainer that finished (exit 0) writes as its termination message, as JSON: the operator reads the
    step to merge from it."""

    message: str = Field(description="The outcome in words.")
    step: int = Field(ge=0, description="The last step trained (and checkpointed).")
    total_steps: int = Field(ge=0)
    loss: float | None = Field(default=None, description="Training loss of the last step.")
    best: StepLoss | None = Field(default=None, description="The evaluated step with the lowest eval loss.")
    last_eval: StepLoss | None = Field(default=None, description="The last evaluation.")
    stopped_early: EarlyStop | None = None


class MergeConfig(ApiModel):
    job: JobRef | None = None
    model_name: str
    base_model_uri: str
    checkpoint_uri: str
    step: int | None = Field(default=None, description="Checkpoint step to merge; None: per `select`.")
    select: CheckpointSelect = Field(
        default="last",
        description="With no step: last takes the latest step, best the finished step with the lowest loss in "
        "the trainer's eval record beside the checkpoints.",
    )
    output_uri: str
    dtype: Dtype | None = None
    shard_size_mb: int = Field(default=4096, ge=1, alias="shardSizeMB")
    lora: LoraSpec = Field(default_factory=LoraSpec)
    write_adapter: bool = False
    write_merged: bool = Field(default=True, description="False: export the adapter only (no merged model).")
    verify: bool = False


class EvalConfig(ApiModel):
    """What the evaluation pod reads: the base, the adapter (PEFT, for vLLM) and the checkpoint (for the
    trainer's own loss), the records, and where the report goes."""

    job: JobRef | None = None
    model_name: str
    base_model_uri: str
    adapter_uri: str = Field(description="The committed PEFT adapter directory.")
    checkpoint_uri: str = Field(description="The Orbax checkpoints; the loss uses the adapter's step.")
    dataset_uri: str
    held_out: bool = Field(
        default=False,
        description="dataset_uri is the training file: evaluate on the records data.evalFraction holds out of it, "
        "the ones the trainer left out.",
    )
    data: DataOptions = Field(default_factory=DataOptions, description="How the records are read (spec.dataset).")
    metrics: list[EvalMetric]
    max_examples: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    code: CodeEvalSpec | None = Field(default=None, description="Sampling and the checker, for passAtK.")
    # Both left out unless preferenceAccuracy is asked for, so that other configs are written as before.
    pairs_uri: str | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="For preferenceAccuracy: the job's file of preference pairs (spec.dataset.evalUri, all of it, "
        "else spec.dataset.uri, the pairs data.evalFraction holds out of it).",
    )
    pairs_held_out: bool = Field(
        default=False,
        exclude_if=lambda v: not v,
        description="pairs_uri is the training file: score the pairs data.evalFraction holds out of it.",
    )
    lora: LoraSpec
    training: TrainingSpec = Field(description="maxSeqLen, lossOn and overLength shape the records as in training.")
    mesh: MeshSpec = Field(description="Device mesh for the loss.")
    report_uri: str = Field(
        description="The report directory (<output.uri>/evaluation), committed with _COMPLETE: report.jsonl "
        "(one line per example) and summary.json (the scores)."
    )
    work_dir: str | None = Field(
        default=None,
        description="Local scratch for the model copies; unset: tpuforge-eval under the process's temporary "
        "directory (TMPDIR, else the pod's /tmp volume), so that two evaluations never share one.",
    )


class ServeConfig(ApiModel):
    """What the serving pod's model-fetch init container reads."""

    model_uri: str
    target_dir: str
    require_marker: bool = Field(
        default=True,
        description="Refuse a directory without _COMPLETE (a tpuforge output). False for a base model uploaded "
        "in HuggingFace layout: every file under it is copied, sizes checked as listed.",
    )


def compile_cache_uri(spec: FineTuneJobSpec) -> str | None:
    """Where the job's compiled steps are kept (the trainer's and its preflight's), or None when
    spec.checkpoint.compileCache is off."""
    if not spec.checkpoint.compile_cache:
        return None
    return f"{spec.checkpoint.uri.rstrip('/')}/{COMPILE_CACHE_SUBDIR}"


def train_config(namespace: str, name: str, spec: FineTuneJobSpec, attempt: int = 0) -> TrainConfig:
    """The job's TrainConfig with spec.training as written (remat unset: the preflight's config, which
    chooses it); trainer_config is the training pod's."""
    return TrainConfig(
        job=JobRef(namespace=namespace, name=name),
        attempt=attempt,
        model_name=spec.model.name,
        model_uri=spec.model.location,
        dataset_uri=spec.dataset.uri,
        eval_uri=spec.dataset.eval_uri,
        data=spec.dataset.options(),
        lora=spec.lora,
        method=spec.method,
        preference=(spec.preference or PreferenceSpec()) if spec.method in PREFERENCE_METHODS else None,
        grpo=(spec.grpo or GrpoSpec()) if spec.method in RL_METHODS else None,
        training=spec.training,
        mesh=resolved_mesh(spec),
        checkpoint=spec.checkpoint,
        compile_cache_uri=compile_cache_uri(spec),
    )


def trainer_config(
    namespace: str, name: str, spec: FineTuneJobSpec, attempt: int, preflight: PreflightStatus | None
) -> TrainConfig:
    """The training pod's TrainConfig: train_config with remat decided (resolved_remat)."""
    cfg = train_config(namespace, name, spec, attempt)
    training = cfg.training.model_copy(update={"remat": resolved_remat(spec.training, preflight)})
    return cfg.model_copy(update={"training": training})


def merge_config(namespace: str, name: str, spec: FineTuneJobSpec, step: int | None = None) -> MergeConfig:
    """`step`: the one to merge, as the operator chose it (None: per spec.checkpoint.select, in the merge)."""
    return MergeConfig(
        job=JobRef(namespace=namespace, name=name),
        model_name=spec.model.name,
        base_model_uri=spec.model.location,
        checkpoint_uri=spec.checkpoint.uri,
        step=step,
        select=spec.checkpoint.select,
        output_uri=spec.output.uri,
        dtype=spec.merge.dtype,
        shard_size_mb=spec.merge.shard_size_mb,
        lora=spec.lora,
        write_adapter=spec.merge.write_adapter,
        write_merged=spec.merge.enabled,
        verify=spec.merge.verify,
    )


def output_subdir(spec: FineTuneJobSpec, subdir: str) -> str:
    return f"{spec.output.uri.rstrip('/')}/{subdir}"


def adapter_uri(spec: FineTuneJobSpec) -> str:
    """Where the merge Job commits the PEFT adapter."""
    return output_subdir(spec, ADAPTER_SUBDIR)


def evaluation_mesh(slice_id: str) -> MeshSpec:
    """The loss's device mesh on the evaluation slice: its catalog default, or one device on a CPU node."""
    if slice_id == CPU_SLICE:
        return MeshSpec(fsdp=1, tp=1)
    s = tpu_slice(slice_id)
    return MeshSpec(fsdp=s.default_fsdp, tp=s.default_tp)


def eval_dataset(spec: FineTuneJobSpec) -> tuple[str, bool]:
    """The file the evaluation reads, and whether it takes the held-out records of it (the training file's
    spec.dataset.evalFraction split) rather than all of them."""
    ev = spec.evaluation
    own = ev.dataset_uri if ev is not None else None
    if own or spec.dataset.eval_uri:
        return str(own or spec.dataset.eval_uri), False
    if spec.dataset.eval_fraction > 0:
        return spec.dataset.uri, True
    raise ValueError("none of spec.evaluation.datasetUri, spec.dataset.evalUri, spec.dataset.evalFraction is set")


def eval_config(namespace: str, name: str, spec: FineTuneJobSpec) -> EvalConfig:
    """The evaluation pod's config. Needs spec.evaluation (validation guarantees its dataset resolves)."""
    ev = spec.evaluation
    if ev is None:
        raise ValueError("spec.evaluation is unset: there is nothing to evaluate")
    dataset, held_out = eval_dataset(spec)
    return EvalConfig(
        job=JobRef(namespace=namespace, name=name),
        model_name=spec.model.name,
        base_model_uri=spec.model.location,
        adapter_uri=adapter_uri(spec),
        checkpoint_uri=spec.checkpoint.uri,
        dataset_uri=dataset,
        held_out=held_out,
        data=spec.dataset.options(),
        metrics=list(ev.metrics),
        max_examples=ev.max_examples,
        max_new_tokens=ev.max_new_tokens,
        code=ev.code,
        pairs_uri=(spec.dataset.eval_uri or spec.dataset.uri) if PREFERENCE_ACCURACY in ev.metrics else None,
        pairs_held_out=PREFERENCE_ACCURACY in ev.metrics and spec.dataset.eval_uri is None,
        lora=spec.lora,
        training=spec.training,
        mesh=evaluation_mesh(ev.slice),
        report_uri=output_subdir(spec, EVALUATION_SUBDIR),
    )
