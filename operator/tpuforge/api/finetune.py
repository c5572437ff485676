"""FineTuneJob: the spec (what a user writes). Its status is in finetune_status.py."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, PrivateAttr, model_validator

from tpuforge.api.base import ApiModel, FineTuneJobRef, PodResources
from tpuforge.api.catalog import GEMMA4_LORA_TARGETS, MODELS, Dtype
from tpuforge.api.code_eval import CHECK_RUNNER_MEMORY, CodeEvalSpec, quantity_bytes
from tpuforge.api.constants import (
    DEFAULT_EVALUATOR_IMAGE,
    DEFAULT_MAX_PREEMPTIONS,
    DEFAULT_MERGER_IMAGE,
    DEFAULT_TRAINER_IMAGE,
    EVAL_ACTIVE_DEADLINE_SECONDS,
    EVAL_SAMPLE_MAX_NEW_TOKENS,
    JOIN_TIMEOUT_SECONDS,
)
from tpuforge.api.images import MAX_PULL_SECRETS, PULL_SECRETS_HELP, SecretName
from tpuforge.api.preflight import PreflightSpec, PreflightStatus
from tpuforge.api.resources import quantity
from tpuforge.api.scheduling import PodScheduling


class ModelRef(ApiModel):
    name: str = Field(
        default="gemma4-31b",
        description="Model catalog id (gemma4-31b, or gemma4-tiny and gemma4-tiny-mm for tests; the catalog in "
        "docs/api.md lists each model's stages): fixes the head counts and the default LoRA targets. With "
        "fineTuneJobRef it must equal that job's spec.model.name.",
    )
    uri: str | None = Field(
        default=None,
        description="gs:// directory of the base model in HuggingFace layout: *.safetensors (+ index), "
        "config.json, tokenizer.",
    )
    fine_tune_job_ref: FineTuneJobRef | None = Field(
        default=None,
        description="Start from this FineTuneJob's merged model instead of a uri, once that job has Succeeded "
        "(it is also the reference model of the DPO and GRPO terms). The job waits until then; the URI it "
        "resolved to is kept in status.model.",
    )
    _resolved_uri: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelRef:
        if (self.uri is None) == (self.fine_tune_job_ref is None):
            raise ValueError("set exactly one of spec.model.uri and spec.model.fineTuneJobRef")
        return self

    def resolved(self, uri: str) -> ModelRef:
        """This reference with fineTuneJobRef's merged model found at `uri` (the operator's, from status.model)."""
        copy = self.model_copy()
        copy._resolved_uri = uri
        return copy

    @property
    def location(self) -> str:
        """Where the base model is read from: uri, or the merged model fineTuneJobRef resolved to."""
        found = self.uri or self._resolved_uri
        if found is None:
            assert self.fine_tune_job_ref is not None
            raise ValueError(f"spec.model.fineTuneJobRef {self.fine_tune_job_ref.name!r} is not resolved yet")
        return found


DatasetFormat = Literal["jsonl", "parquet"]
DATASET_FORMATS: tuple[str, ...] = get_args(DatasetFormat)


class DataOptions(ApiModel):
    """How the dataset's files are read and split; the trainer and the evaluation Job read them alike."""

    format: DatasetFormat | None = Field(
        default=None,
        description="jsonl or parquet, for every file of the job's data; unset: by each file's extension "
        "(.parquet or .pq is Parquet, anything else JSONL).",
    )
    eval_fraction: float = Field(
        default=0.0,
        ge=0,
        le=0.5,
        description="Hold out this fraction of the records of uri (at least one record) for evaluation when evalUri "
        "is unset: the trainer's eval loss and spec.evaluation use them, training the rest. 0 (the default) holds "
        "nothing out, so an existing job trains on the same records as before.",
    )
    split_seed: int = Field(
        default=0,
        ge=0,
        description="Seed of the held-out split: the same file and seed hold out the same records in every attempt "
        "and in the evaluation Job.",
    )
    keep_thinking: bool = Field(
        default=False,
        description="Train on the assistant's thinking (a thinking, reasoning_content or reasoning field, or "
        "<|channel>thought ... <channel|> in the content), rendered in the chat template's thought channel as with "
        "thinking on. False drops it, as the template does with thinking off.",
    )
    skip_invalid: bool = Field(
        default=False,
        description="Skip malformed records and count them (status.progress.skippedRecords) instead of failing "
        "the job on the first one.",
    )


class DatasetRef(DataOptions):
    uri: str = Field(
        description="gs:// file of records, JSONL (one per line) or Parquet (one per row): chat records "
        '{"messages": [{"role": ..., "content": ...}, ...]} or {"prompt": ..., "completion": ...}. In the sandbox '
        "also a local path (file:// or absolute)."
    )
    eval_uri: str | None = Field(
        default=None, description="Optional file of records held out for evaluation (the same formats as uri)."
    )

    def options(self) -> DataOptions:
        return DataOptions.model_validate(self.model_dump(include=set(DataOptions.model_fields)))


RematPolicy = Literal["full", "saveAttention", "saveMatmuls"]
REMAT_POLICIES: tuple[str, ...] = get_args(RematPolicy)

BaseQuantization = Literal["none", "int8", "int4"]
BASE_QUANTIZATIONS: tuple[str, ...] = get_args(BaseQuantization)


class LoraSpec(ApiModel):
    rank: int = Field(default=64, ge=1, le=4096, description="LoRA rank r.")
    alpha: float = Field(default=64.0, gt=0, description="LoRA alpha; the update is scaled by alpha/rank.")
    dropout: float = Field(default=0.05, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(GEMMA4_LORA_TARGETS),
        min_length=1,
        description="Modules that get a LoRA adapter, by the model's Tunix names. The default is Gemma 4's; on a "
        "model of another family it stands for that model's own (docs/api.md's model catalog lists them).",
    )
    base_quantization: BaseQuantization = Field(
        default="none",
        # Left out of the configs when none, so that a job without it writes the bytes it always did.
        exclude_if=lambda v: v == "none",
        description="QLoRA: the frozen base's targeted weights are quantized (Qwix, weight-only, absmax) while "
        "the adapters train in float32 against the quantized forward. int8: per output channel; int4: in tiles "
        "of the contracted axis. none (the default) keeps the base in its own dtype. Only the training forward "
        "changes: the merge adds the adapters to the full-precision base, and evaluation and serving run the "
        "adapter on it too (docs/training.md, QLoRA).",
    )


Method = Literal["sft", "dpo", "orpo", "grpo"]
METHODS: tuple[str, ...] = get_args(Method)
PREFERENCE_METHODS = ("dpo", "orpo")
# Reinforcement learning from a verifiable reward: the answers are the policy's own, sampled during training.
RL_METHODS = ("grpo",)
CheckerScore = Literal["pass", "fraction"]


class PreferenceSpec(ApiModel):
    """The preference losses' settings (spec.method dpo or orpo). Their records are
    {"prompt": ..., "chosen": ..., "rejected": ...} (docs/training.md, Preference tuning)."""

    beta: float = Field(
        default=0.1,
        gt=0,
        description="DPO's beta: how far the tuned model may move from the reference, which is the base itself "
        "with the LoRA adapters off (no second copy of the weights is held). Each answer's reward is beta x "
        "(its log-probability under the tuned model - under the reference); larger keeps closer to the base.",
    )
    label_smoothing: float = Field(
        default=0.0,
        ge=0,
        le=0.4,
        description="DPO only: the assumed fraction of pairs whose labels are flipped (conservative DPO), at most "
        "0.4 (at 0.5 the loss no longer prefers either answer); 0 is plain DPO's sigmoid loss.",
    )
    orpo_lambda: float = Field(
        default=0.1,
        gt=0,
        alias="lambda",
        description="ORPO only: the weight of the odds-ratio term beside the chosen answer's NLL (the paper's "
        "lambda). ORPO uses no reference model.",
    )


class RewardSpec(ApiModel):
    """What an answer sampled during spec.method grpo earns: a weighted sum of the checker's verdict on the code
    taken from it, its exact match with the record's own answer, and a format reward."""

    checker: float = Field(
        default=1.0,
        ge=0,
        description="Weight of the checker's verdict: every answer's code is run against its record's test by the "
        "same confined checker as the evaluation's (spec.evaluation.code.checker's command, limits and refusal "
        "rules).",
    )
    checker_score: CheckerScore = Field(
        default="pass",
        description="pass: 1 when the checker passes the answer, else 0. fraction: the share of the test's samples "
        "that match, where the checker reports it (the Verilog checker's mismatch counters), else pass.",
    )
    exact_match: float = Field(
        default=0.0,
        ge=0,
        description="Weight of an exact match (whitespace trimmed) with the record's own last assistant turn.",
    )
    format: float = Field(
        default=0.0,
        ge=0,
        description="Weight of the format reward: 1 when the answer holds a code block of the test's language "
        "(what the checker is handed), and ended by itself within maxTokens.",
    )

    @model_validator(mode="after")
    def _some_weight(self) -> RewardSpec:
        if self.checker + self.exact_match + self.format <= 0:
            raise ValueError("every reward weight is 0: set checker, exactMatch or format above 0")
        return self


class RlCheckerSpec(ApiModel):
    """The checker that judges rollouts: a sidecar container beside the trainer on each host (the evaluation's
    `check` container's confinement: root with CAP_SETUID and CAP_SETGID only), each answer in a scratch
    directory of its own under a uid of its own (evaluate.check)."""

    image: str | None = Field(
        default=None,
        description="Container image of the checker sidecar; unset: tpuforge/checker-verilog (Debian's iverilog) "
        "of this release.",
    )
    cpu: str = Field(
        default="2",
        description="CPU request and limit of the checker sidecar; answers are checked one per whole CPU at once "
        "unless parallel says otherwise.",
    )
    command: list[str] = Field(
        default_factory=lambda: ["python3", "-m", "tpuforge_workloads.evaluate.verilog"],
        min_length=1,
        description="The checker protocol's command (docs/ml-engineer.md); the default is the Verilog checker.",
    )
    timeout_seconds: float = Field(default=10.0, gt=0, le=600, description="Per-answer limit; past it it fails.")
    memory: str = Field(
        default="256Mi",
        description="Memory of each answer's processes together; the sidecar's memory request and limit is this "
        "times parallel, plus the runner's own.",
    )
    parallel: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="Answers checked at once; unset: one per whole CPU of the sidecar (cpu); where the checker runs "
        "in the trainer's process (a CPU run), one per CPU of the machine.",
    )

    def parallelism(self) -> int:
        """Answers the sidecar checks at once."""
        return self.parallel or max(1, int(quantity(self.cpu)))

    def container_memory(self) -> int:
        """The sidecar's memory request and limit, bytes: each answer checked at once, and the runner's own."""
        return quantity_bytes(self.memory) * self.parallelism() + CHECK_RUNNER_MEMORY


class GrpoSpec(ApiModel):
    """Group Relative Policy Optimization (spec.method grpo): each step samples groupSize answers to each of its
    prompts from the model as trained so far, rewards each (spec.grpo.reward), and raises the probability of
    the answers that did better than their group's mean. The reference of the KL term is the base (the adapters
    off); training.microBatchSize counts prompts (groupSize rows each)."""

    group_size: int = Field(
        default=8, ge=2, le=256, description="Answers sampled per prompt; advantages are relative to the group."
    )
    temperature: float = Field(default=1.0, gt=0, le=2, description="Sampling temperature of the rollouts.")
    max_tokens: int = Field(
        default=256, ge=1, description="Longest answer sampled; the prompt and answer must fit in training.maxSeqLen."
    )
    kl_coefficient: float = Field(
        default=0.04, ge=0, description="Weight of the KL penalty to the reference (the base: adapters off)."
    )
    clip_epsilon: float = Field(
        default=0.2, gt=0, lt=1, description="PPO's clip of the probability ratio to [1 - eps, 1 + eps]."
    )
    iterations: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Optimizer steps on each rollout (GRPO's mu): a rollout's answers are sampled and judged once, "
        "then trained on for this many steps, the probability ratio taken against the policy that sampled them "
        "(where clipEpsilon bounds it; at 1 the ratio is 1 and the clip bounds nothing). Each step counts toward "
        "training.maxSteps; a checkpoint inside a rollout's steps keeps the rollout, so a resume trains on it.",
    )
    scale_rewards: bool = Field(
        default=True,
        description="Divide each advantage by its group's reward standard deviation (GRPO); false keeps the "
        "centred reward alone (Dr. GRPO).",
    )
    reward: RewardSpec = Field(default_factory=RewardSpec, description="What an answer earns.")
    checker: RlCheckerSpec = Field(default_factory=RlCheckerSpec, description="The checker of the rollouts.")


class EarlyStoppingSpec(ApiModel):
    patience: int = Field(
        ge=1,
        description="Stop after this many evaluations in a row (one every checkpoint.everySteps) that did not "
        "improve the best eval loss by more than minDelta. The job then merges and evaluates as after a full run.",
    )
    min_delta: float = Field(
        default=0.0, ge=0, description="How much lower than the best so far an eval loss must be to count as better."
    )


class TrainingSpec(ApiModel):
    max_seq_len: int = Field(ge=1, description="Tokens per example (required: it sets memory use).")
    micro_batch_size: int = Field(default=1, ge=1, description="Examples per device step.")
    gradient_accumulation_steps: int = Field(default=8, ge=1, description="Micro-batches per optimizer step.")
    epochs: int = Field(default=1, ge=1, description="Passes over the dataset (when maxSteps is unset).")
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many optimizer steps.")
    learning_rate: float = Field(default=1e-4, gt=0, description="Peak learning rate (warmup-cosine).")
    warmup_steps: int = Field(default=100, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(default=0.001, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(
        default=1.0,
        gt=0,
        description="Clip each optimizer step's gradient (accumulated over its micro-batches) to this global "
        "L2 norm before AdamW. No value turns clipping off; a very large one makes it a no-op.",
    )
    loss_on: Literal["assistant", "all"] = Field(
        default="assistant", description="Which tokens carry loss: assistant turns only, or every token."
    )
    over_length: Literal["drop", "truncate"] = Field(
        default="drop", description="What to do with a record longer than maxSeqLen."
    )
    packing: bool = Field(default=False, description="Pack several records per row (block-diagonal mask).")
    remat: bool | None = Field(
        default=None,
        description="Rematerialise decoder layers (recompute each layer's activations in the backward pass) to "
        "save memory, at the cost of speed. Unset: the preflight chooses: off where the step without remat fits "
        "the slice (the attempt and the model build), on otherwise; on without a preflight (spec.preflight."
        "enabled false). true and false are kept as written.",
    )
    remat_policy: RematPolicy = Field(
        default="full",
        description="What remat keeps from the forward pass (with remat on): full (each layer's input only; the "
        "backward pass recomputes the layer), saveAttention (also the attention's q, k, v and output: the four "
        "projections are not recomputed; on TPU), saveMatmuls (every matmul's output: the most HBM, the least "
        "recomputation). The preflight says whether the choice fits; docs/performance.md has the measured speeds.",
    )
    seed: int = Field(default=0, ge=0, description="Seed for shuffling, LoRA init and dropout.")
    eval_samples: int = Field(
        default=2,
        ge=0,
        le=8,
        description="Held-out prompts (the first records of dataset.evalUri) answered greedily with the current "
        f"LoRA weights at each in-training evaluation, up to {EVAL_SAMPLE_MAX_NEW_TOKENS} new tokens each, written "
        "as TensorBoard text and to the run summary. 0 turns them off; without evalUri there are none.",
    )
    early_stopping: EarlyStoppingSpec | None = Field(
        default=None,
        description="Stop when the eval loss on spec.dataset.evalUri stops improving (unset: train to the end). "
        "Needs spec.dataset.evalUri.",
    )


def resolved_remat(training: TrainingSpec, preflight: PreflightStatus | None) -> bool:
    """Whether the trainer rematerialises: spec.training.remat where set, else the preflight's choice
    (status.preflight.remat), else on (no preflight ran)."""
    if training.remat is not None:
        return training.remat
    if preflight is not None and preflight.remat is not None:
        return preflight.remat
    return True


class MeshSpec(ApiModel):
    fsdp: int = Field(ge=1, description="Data/FSDP axis size.")
    tp: int = Field(ge=1, description="Tensor-parallel axis size; must divide every head count.")


class TpuSpec(ApiModel):
    slice: str = Field(
        default="v5p-8",
        description="TPU slice catalog id: one host (v5p-8, v6e-4, v6e-8) or several, run as a JobSet "
        "(v5p-16, v5p-32, v5p-64, v5p-128, v6e-16, v6e-32).",
    )
    spot: bool = Field(default=False, description="Schedule on Spot capacity; preemptions resume from checkpoints.")
    mesh: MeshSpec | None = Field(
        default=None, description="Device mesh; defaults from the slice catalog (v5p-8: fsdp 1, tp 4)."
    )
    resources: PodResources = Field(
        default_factory=PodResources,
        description="CPU and memory the training pod requests on each host; unset: 8 CPUs and memory for the "
        "host's share of the model while it loads, its /dev/shm and the JAX runtime.",
    )
    join_timeout_seconds: int = Field(
        default=JOIN_TIMEOUT_SECONDS,
        ge=10,
        le=86400,
        description="Multi-host slices: how long each host waits for all the others to join the slice (image "
        "pulls and node start-ups differ between hosts); then the pods fail, naming the hosts that never came.",
    )
    spot_grace_seconds: int | None = Field(
        default=None,
        ge=1,
        le=120,
        description="On Spot, the training pods' terminationGracePeriodSeconds: what a reclaim gives non-system pods "
        "(15 s on GKE, up to 120 s where the node pools lengthen their Spot shutdown); unset: the operator's "
        "default (Helm value tpu.spotGraceSeconds, 15).",
    )
    run_as_root: bool | None = Field(
        default=None,
        description="Run the TPU containers (trainer, evaluation) as root, still without privileges or "
        "capabilities (GKE's TPU device files are root's unless the node hands them to the pod's user); false: "
        "uid 65532; unset: the operator's default (Helm value tpu.runAsRoot, true unless set).",
    )
    scheduling: PodScheduling = Field(
        default_factory=PodScheduling,
        description="Where the training pods may run beyond the slice: a reservation, flex-start, a dedicated "
        "pool's node labels and tolerations, pod annotations, a PriorityClass (docs/platform-team.md).",
    )


CheckpointSelect = Literal["last", "best"]


class CheckpointSpec(ApiModel):
    uri: str = Field(description="gs:// directory for Orbax checkpoints; training resumes from the latest.")
    every_steps: int = Field(default=100, ge=1, description="Checkpoint interval in optimizer steps.")
    keep: int = Field(default=3, ge=1, description="Checkpoints to keep (the latest ones).")
    select: CheckpointSelect = Field(
        default="last",
        description="The step the merge exports and the evaluation scores: last (where training ended) or best "
        "(the lowest eval loss on spec.dataset.evalUri, evaluated every everySteps and at the end; that step is "
        "kept besides the latest `keep`). status.checkpoint says which step was taken.",
    )
    compile_cache: bool = Field(
        default=True,
        description="Keep the compiled train step in <uri>/compile-cache (JAX's compilation cache, one directory "
        "per program key), so that resumed attempts and the run after a preflight load it instead of compiling.",
    )


class OutputSpec(ApiModel):
    uri: str = Field(description="gs:// directory for the merged HuggingFace model.")


class MergeSpec(ApiModel):
    enabled: bool = Field(
        default=True,
        description="Merge the LoRA weights into the base after training. false with writeAdapter: true exports "
        "the adapter only (no merged copy of the base).",
    )
    dtype: Dtype | None = Field(default=None, description="Output dtype; defaults to the base model's.")
    shard_size_mb: int = Field(
        default=4096, ge=1, alias="shardSizeMB", description="Maximum size of one safetensors shard in MB."
    )
    write_adapter: bool = Field(
        default=False,
        description="Write the unmerged adapter in PEFT format to <output.uri>/adapter, committed on its own "
        "(status.outputs.adapterUri), for ServingDeployment spec.adapters.",
    )
    verify: bool = Field(
        default=False, description="Reload the merged model with transformers and compare logits (slow)."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node selector for the merge pod (a CPU node pool)."
    )
    resources: PodResources = Field(
        default_factory=PodResources,
        description="CPU and memory the merge pod requests; unset: 2 CPUs and the streamed merge's measured peak "
        "(its memory limit is twice the request).",
    )


EvalMetric = Literal["loss", "exactMatch", "passAtK", "preferenceAccuracy"]
# The held-out preference pairs' metric (spec.method dpo and orpo).
PREFERENCE_ACCURACY: EvalMetric = "preferenceAccuracy"
# The default metrics; passAtK is asked for by name, with spec.evaluation.code.
EVAL_METRICS: tuple[EvalMetric, ...] = ("loss", "exactMatch")


class EvalThresholds(ApiModel):
    max_loss: float | None = Field(
        default=None, gt=0, description="The adapter passes only if its held-out loss is at most this."
    )
    min_exact_match: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="The adapter passes only if this fraction of greedy answers equals the reference answer.",
    )
    min_preference_accuracy: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="The adapter passes only if this fraction of the held-out preference pairs has the chosen "
        "answer's mean log-probability per token above the rejected one's (metric preferenceAccuracy).",
    )
    min_pass_at: dict[str, float] = Field(
        default_factory=dict,
        description='pass@k the adapter must reach, by k (each one of spec.evaluation.code.k), e.g. {"1": 0.6}.',
    )


class EvalModelStorage(ApiModel):
    """Where the evaluation keeps its copies of the base model and the adapter: never the node's boot disk."""

    size: str | None = Field(
        default=None,
        description="Volume size; default: the base model's checkpoint bytes plus 25%, in GiB.",
    )
    storage_class_name: str | None = Field(
        default=None,
        description="StorageClass of the volume on a TPU slice (a generic ephemeral volume, deleted with the pod); "
        "default: the operator's --storage-class (the chart's Hyperdisk Balanced class, which TPU v6e VMs can "
        "attach), else the cluster's default class. On slice cpu the copies go to an emptyDir of that size.",
    )


class EvaluationSpec(ApiModel):
    dataset_uri: str | None = Field(
        default=None,
        description="File of records to evaluate on (the formats of spec.dataset.uri); defaults to "
        "spec.dataset.evalUri, else the records spec.dataset.evalFraction holds out.",
    )
    metrics: list[EvalMetric] = Field(
        default_factory=lambda: list(EVAL_METRICS),
        min_length=1,
        max_length=len(get_args(EvalMetric)),
        description="loss: teacher-forced loss on the assistant tokens; exactMatch: greedy answers equal to the "
        "records' last assistant turn; passAtK: sampled answers run by a checker against each record's test "
        "(spec.evaluation.code); preferenceAccuracy (spec.method dpo or orpo): the share of the job's held-out "
        "preference pairs (spec.dataset.evalUri, else those spec.dataset.evalFraction holds out) whose chosen "
        "answer has the higher mean log-probability per token, with preferenceMargin beside it.",
    )
    max_examples: int = Field(default=200, ge=1, description="Evaluate at most this many records (the first ones).")
    max_new_tokens: int = Field(default=256, ge=1, description="Longest greedy answer generated for exactMatch.")
    code: CodeEvalSpec | None = Field(
        default=None, description="Sampling and the checker for the passAtK metric (functional evaluation of code)."
    )
    thresholds: EvalThresholds = Field(
        default_factory=EvalThresholds, description="What the adapter must reach to pass (unset: always passes)."
    )
    slice: str = Field(
        default="v6e-8",
        description="TPU slice the evaluation runs on (the serving slice kind), or cpu for a CPU node (tests).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Extra node selector for the evaluation pod (e.g. a CPU node pool); merged with "
        "scheduling.nodeSelector, which may not give a key another value.",
    )
    scheduling: PodScheduling = Field(
        default_factory=PodScheduling,
        description="Where the evaluation pod may run beyond its slice (the same settings as spec.tpu.scheduling, "
        "for the evaluation's own node pool).",
    )
    resources: PodResources = Field(
        default_factory=PodResources,
        description="CPU and memory the evaluation pod requests; unset: derived from the model and the slice.",
    )
    model_storage: EvalModelStorage = Field(
        default_factory=EvalModelStorage,
        description="The volume the evaluation pod copies the base model and the adapter to.",
    )
    active_deadline_seconds: int = Field(
        default=EVAL_ACTIVE_DEADLINE_SECONDS,
        ge=60,
        description="The evaluation Job's activeDeadlineSeconds: past it (model downloads, compiles and scoring "
        "of every try together) the Job is stopped and the evaluation fails, naming this field; the FineTuneJob "
        "keeps its outputs and succeeds.",
    )
    rerun: int = Field(
        default=0,
        ge=0,
        description="Raise it (e.g. to 1, then 2) to run the evaluation again on the exported model after the job "
        "has ended, without retraining: after an EvaluationFailed, or with changed thresholds or metrics. Each "
        "run has a Job of its own (<job>-eval, then <job>-eval-<rerun>); status.evaluation.run says which run "
        "the result is from.",
    )


class ImagesSpec(ApiModel):
    trainer: str | None = Field(
        default=None,
        description="Training and preflight image; unset: the operator's (<registry>/trainer:<tag>, "
        f"{DEFAULT_TRAINER_IMAGE} with no registry).",
    )
    merger: str | None = Field(
        default=None,
        description=f"Merge image; unset: the operator's (<registry>/merger:<tag>, {DEFAULT_MERGER_IMAGE} with no "
        "registry).",
    )
    evaluator: str | None = Field(
        default=None,
        description="Evaluation image (vLLM-TPU + tpuforge); unset: the operator's (<registry>/evaluator:<tag>, "
        f"{DEFAULT_EVALUATOR_IMAGE} with no registry).",
    )
    pull_secrets: list[SecretName] = Field(
        default_factory=list, max_length=MAX_PULL_SECRETS, description=PULL_SECRETS_HELP
    )


class RunPolicy(ApiModel):
    suspend: bool = Field(default=False, description="Stop training (checkpoints stay); false resumes.")
    max_restarts: int = Field(
        default=3,
        ge=0,
        description="Retries after failures (a trainer's error, an OOM kill, an eviction for using more memory or "
        "disk than the pod asked for); preemptions are counted apart, under maxPreemptions.",
    )
    max_preemptions: int = Field(
        default=DEFAULT_MAX_PREEMPTIONS,
        ge=0,
        description="Preemptions (a Spot reclaim, a node shutdown or drain, the scheduler making room) after "
        "which the job fails instead of resuming again; each resumes from the last checkpoint.",
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, description="Fail the job when it has run this long."
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the job this long after it succeeds or fails."
    )


class FineTuneJobSpec(ApiModel):
    model: ModelRef = Field(description="The base model.")
    dataset: DatasetRef = Field(description="The training data.")
    lora: LoraSpec = Field(default_factory=LoraSpec, description="The LoRA adapter.")
    method: Method = Field(
        default="sft",
        exclude_if=lambda v: v == "sft",
        description="sft (the default): supervised fine-tuning on chat or prompt/completion records. dpo: Direct "
        "Preference Optimization, orpo: Odds Ratio Preference Optimization, both on preference records "
        '{"prompt": ..., "chosen": ..., "rejected": ...} in spec.dataset.uri (training.microBatchSize counts '
        "pairs). DPO's reference model is the base with the adapters off; ORPO needs none. grpo: reinforcement "
        "learning on chat records with a test (as functional evaluation reads them), rewarded by the checker's "
        "verdict on answers the model samples during training (spec.grpo).",
    )
    preference: PreferenceSpec | None = Field(
        default=None, description="Settings of the dpo and orpo losses (unset: their defaults)."
    )
    grpo: GrpoSpec | None = Field(
        default=None, description="Rollouts, reward and loss of spec.method grpo (unset: their defaults)."
    )
    training: TrainingSpec = Field(description="Sequence length, batch, schedule and loss.")
    tpu: TpuSpec = Field(default_factory=TpuSpec, description="Where training runs.")
    preflight: PreflightSpec = Field(
        default_factory=PreflightSpec,
        description="The train step compiled for the slice on a CPU node before any TPU is used: fit, speed, cost.",
    )
    checkpoint: CheckpointSpec = Field(description="Where and how often training checkpoints.")
    output: OutputSpec = Field(description="Where the merged model goes.")
    merge: MergeSpec = Field(default_factory=MergeSpec, description="The merge that follows training.")
    evaluation: EvaluationSpec | None = Field(
        default=None,
        description="Score the adapter (and the base, for comparison) on held-out data after the export; "
        "ServingDeployments promote the adapter only when it passes.",
    )
    images: ImagesSpec = Field(default_factory=ImagesSpec, description="Container images.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Suspension, retries, deadlines.")
    queue_name: str | None = Field(default=None, description="Kueue LocalQueue (label kueue.x-k8s.io/queue-name).")
    priority_class_name: str | None = Field(
        default=None,
        description="PriorityClass of the training pod; spec.tpu.scheduling.priorityClassName also sets it.",
    )
    service_account_name: str | None = Field(
        default=None,
        description="Required: the ServiceAccount every pod of the job runs as (preflight, trainer, merge, "
        "evaluation), bound (Workload Identity) to an identity that may read the model and dataset and write the "
        "checkpoint and output buckets. `default` cannot, on GKE.",
    )

    @model_validator(mode="after")
    def _model_lora_targets(self) -> FineTuneJobSpec:
        """The default targets (the CRD's, Gemma 4's names, which the apiserver fills in) on a model of another
        family are that model's targets: no model but Gemma 4 has modules by those names."""
        shape = MODELS.get(self.model.name)
        default = list(GEMMA4_LORA_TARGETS)
        if shape is not None and self.lora.target_modules == default and list(shape.lora_targets) != default:
            self.lora = self.lora.model_copy(update={"target_modules": list(shape.lora_targets)})
        return self
