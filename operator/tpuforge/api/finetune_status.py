"""FineTuneJob: the status (what the operator reports: phase, progress, attempts, outputs, evaluation, cost)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from tpuforge.api import display
from tpuforge.api.base import StatusModel
from tpuforge.api.code_eval import ConfidenceInterval
from tpuforge.api.conditions import Condition
from tpuforge.api.images import ResolvedImages
from tpuforge.api.preflight import PreflightStatus


class FineTunePhase(StrEnum):
    PENDING = "Pending"
    # A Job or JobSet of the job (training, preflight, merge or evaluation) waits for Kueue to admit it.
    QUEUED = "Queued"
    PREFLIGHT = "Preflight"
    TRAINING = "Training"
    MERGING = "Merging"
    EVALUATING = "Evaluating"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class CheckpointSave(StatusModel):
    """One checkpoint save, as the trainer measured it."""

    step: int
    seconds: float = Field(description="From the save's start until the checkpoint was durable.")
    bytes: int = Field(description="Size of the step's files (adapters, optimizer state, data position).")


class PreferenceProgress(StatusModel):
    """Preference tuning's figures (spec.method dpo or orpo), means over pairs: a pair is ranked right when its
    chosen answer's reward is above its rejected one's; DPO's reward is beta x (the answer's log-probability
    under the model - under the base), ORPO's its mean per-token log-probability."""

    accuracy: float | None = Field(default=None, description="Pairs ranked right in the last step (0 to 1).")
    reward_margin: float | None = Field(default=None, description="Chosen minus rejected reward, last step.")
    chosen_reward: float | None = Field(default=None, description="The chosen answers' reward, last step.")
    rejected_reward: float | None = Field(default=None, description="The rejected answers' reward, last step.")
    eval_step: int | None = Field(default=None, description="The step of the last held-out evaluation.")
    eval_accuracy: float | None = Field(default=None, description="Held-out pairs ranked right, last evaluation.")
    eval_reward_margin: float | None = Field(default=None, description="Held-out reward margin, last evaluation.")
    eval_loss: float | None = Field(default=None, description="Held-out preference loss, last evaluation.")


class RlProgress(StatusModel):
    """Reinforcement learning's figures (spec.method grpo), over the last step's sampled answers."""

    reward: float | None = Field(default=None, description="Mean reward of the last step's answers.")
    pass_rate: float | None = Field(default=None, description="Share of the last step's answers the checker passed.")
    kl: float | None = Field(default=None, description="Mean per-token KL of the model to the base, last step.")
    response_tokens: float | None = Field(default=None, description="Mean answer length in tokens, last step.")
    refused: int | None = Field(
        default=None,
        description="Answers of the last step the checker refused (its rules against gaming the test): a rising "
        "count is a model learning to game the checker.",
    )
    refused_total: int | None = Field(default=None, description="Refused answers over the run so far.")
    checker_share: float | None = Field(
        default=None, description="Share of the last step's time spent in the checker (0 to 1)."
    )


class Progress(StatusModel):
    """Training progress. The trainer writes it; the operator derives percent and the ETA when the trainer is
    silent (between attempts, after training). Each `...Display` field is its number formatted for
    `kubectl get` (printer columns can only show fields); machines read the numbers."""

    step: int | None = None
    total_steps: int | None = None
    percent: float | None = None
    percent_display: str | None = Field(default=None, description="percent for display, e.g. 45%.")
    loss: float | None = None
    loss_display: str | None = Field(default=None, description="loss to 4 significant digits, e.g. 2.346.")
    tokens_per_second: float | None = Field(
        default=None,
        description="Real (non-padding) tokens trained per second over the last 30 s or 20 steps, whichever is longer.",
    )
    eta_seconds: int | None = Field(default=None, description="Seconds until training ends, at the same rate.")
    eta_display: str | None = Field(default=None, description="etaSeconds as a duration, e.g. 1m41s or 3h12m.")
    last_checkpoint_step: int | None = None
    last_checkpoint: CheckpointSave | None = Field(
        default=None, description="The last durable checkpoint's save: step, duration and size."
    )
    examples_per_step: int | None = Field(
        default=None,
        description="Rows of maxSeqLen tokens in one optimizer step: training.microBatchSize x mesh.fsdp x "
        "gradientAccumulationSteps. Each data-parallel (fsdp) replica takes microBatchSize, so the same spec on "
        "a mesh of another fsdp trains on another batch (docs/training.md, Batches).",
    )
    skipped_records: int | None = Field(
        default=None,
        description="Malformed records left out of the training and eval files (spec.dataset.skipInvalid); the "
        "trainer's log names the first ones.",
    )
    preference: PreferenceProgress | None = Field(
        default=None, description="DPO and ORPO: preference accuracy and reward margin, last step and held out."
    )
    rl: RlProgress | None = Field(
        default=None, description="GRPO: the last step's mean reward, pass rate, KL to the base and refusals."
    )
    updated_at: str | None = None

    def displayed(self) -> Progress:
        """This progress with each display string formatted from its number (unset where the number is)."""
        return self.model_copy(
            update={
                "percent_display": display.percent(self.percent) if self.percent is not None else None,
                "loss_display": display.significant(self.loss) if self.loss is not None else None,
                "eta_display": display.duration(self.eta_seconds) if self.eta_seconds is not None else None,
            }
        )


class CheckpointStatus(StatusModel):
    """Which checkpoint step the merge and the evaluation use (spec.checkpoint.select), and the in-training
    evaluation behind that choice, as the trainer reported it when training finished."""

    select: str | None = Field(default=None, description="spec.checkpoint.select the job ran with: last or best.")
    last_step: int | None = Field(default=None, description="The step training ended at.")
    best_step: int | None = Field(default=None, description="The evaluated step with the lowest eval loss.")
    best_eval_loss: float | None = Field(default=None, description="That step's eval loss.")
    selected_step: int | None = Field(
        default=None,
        description="The step the merge exports (and the evaluation scores); unset: the merge takes the latest "
        "step, or with select best, the best one it finds in the checkpoints' eval record.",
    )
    selected_eval_loss: float | None = Field(default=None, description="The selected step's eval loss, when evaluated.")
    stopped_early_at: int | None = Field(
        default=None, description="The step where early stopping (spec.training.earlyStopping) ended training."
    )
    message: str | None = Field(default=None, description="The choice, in words.")


class Restarts(StatusModel):
    failures: int = 0
    preemptions: int = 0


class ModelStatus(StatusModel):
    """The model spec.model.fineTuneJobRef resolved to, kept for the job's life: every attempt, the merge and the
    evaluation read this base even if that job is deleted or runs again."""

    fine_tune_job: str = Field(description="The FineTuneJob whose merged model this job starts from.")
    uri: str = Field(description="That job's merged model (status.outputs.mergedModelUri) when it was resolved.")


class Outputs(StatusModel):
    checkpoint_uri: str | None = None
    merged_model_uri: str | None = None
    adapter_uri: str | None = Field(
        default=None, description="The committed PEFT adapter (<output.uri>/adapter), when one was written."
    )


# The evaluation's conditions on a FineTuneJob: Evaluated (False while it runs; False with reason
# EVALUATION_FAILED when its Job failed or its result is unreadable) and EvaluationPassed (the verdict).
CONDITION_EVALUATED = "Evaluated"
CONDITION_EVALUATION_PASSED = "EvaluationPassed"
REASON_EVALUATION_FAILED = "EvaluationFailed"


class EvaluationStatus(StatusModel):
    """The evaluation's result: the adapter's scores beside the base model's on the same records."""

    metrics: dict[str, float] = Field(default_factory=dict, description="The adapter's scores, by metric.")
    base_metrics: dict[str, float] = Field(default_factory=dict, description="The base model's scores.")
    intervals: dict[str, ConfidenceInterval] | None = Field(
        default=None,
        description="The adapter's 95% confidence interval of each pass@k, by metric (an exact binomial interval "
        "over the problems, its method named in each); minPassAt is held against its low bound.",
    )
    base_intervals: dict[str, ConfidenceInterval] | None = Field(
        default=None, description="The base model's intervals, as intervals."
    )
    failures: dict[str, int] | None = Field(
        default=None,
        description="The adapter's failed samples by why they failed (syntax, compile, mismatch, timeout, refused, "
        "limit, truncated, task, error); only the categories seen.",
    )
    base_failures: dict[str, int] | None = Field(default=None, description="The base model's, as failures.")
    standard_errors: dict[str, float] | None = Field(
        default=None,
        description="The standard error of each of the adapter's pass@k over the problems: how far a rerun on "
        "other samples or problems would move it (the sampling temperature and samplesPerProblem set it).",
    )
    sampling: str | None = Field(
        default=None,
        description="How the code answers were drawn, which sets what pass@k means and how much it varies: "
        "greedy (one sample per problem at temperature 0, as VerilogEval v2 reports pass@1) or n samples at a "
        "temperature.",
    )
    excluded_problems: int | None = Field(
        default=None,
        description="Problems kept out of pass@k because the checker found the problem itself broken (failure "
        "task: its reference does not compile with the checker's simulator); the report names them.",
    )
    examples: int | None = Field(default=None, description="Records evaluated.")
    run: int | None = Field(default=None, description="The spec.evaluation.rerun this result is from (0: the first).")
    passed: bool | None = Field(default=None, description="Whether every threshold was met (unset after an Error).")
    result: str | None = Field(
        default=None,
        description="Passed, Failed (below a threshold), or Error (no verdict: the evaluation itself failed, the "
        "Evaluated condition says why; raise spec.evaluation.rerun to run it again).",
    )
    result_display: str | None = Field(
        default=None, description="result for kubectl get, with pass@1 when code was run: Passed (pass@1 0.83)."
    )
    message: str | None = Field(default=None, description="The headline, or why it failed the thresholds.")
    report_uri: str | None = Field(
        default=None,
        description="The report in GCS (<output.uri>/evaluation, committed with _COMPLETE): report.jsonl, one line "
        "per example, and summary.json.",
    )


class Cost(StatusModel):
    tpu_hours: float | None = None
    estimated_usd: float | None = Field(default=None, alias="estimatedUSD")
    estimated_usd_display: str | None = Field(
        default=None, alias="estimatedUSDDisplay", description="estimatedUSD for display, e.g. $1.23."
    )

    @classmethod
    def estimate(cls, tpu_hours: float, usd_per_hour: float) -> Cost:
        usd = round(tpu_hours * usd_per_hour, 2)
        return cls(tpu_hours=tpu_hours, estimated_usd=usd, estimated_usd_display=display.usd(usd))


class AttemptStatus(StatusModel):
    """One training attempt (one training Job, or JobSet on a multi-host slice). A preemption, a retried failure
    or a resume starts a new one."""

    attempt: int = Field(description="Attempt number (0 first); the training Job (or JobSet) is <job>-train-<attempt>.")
    job_name: str
    pod_name: str | None = Field(default=None, description="The trainer pod, once it ran.")
    node_name: str | None = Field(default=None, description="The node the trainer pod ran on.")
    pods: list[str] | None = Field(
        default=None, description="On a multi-host slice: every host's trainer pod, in host order, once they ran."
    )
    start_step: int | None = Field(
        default=None, description="Latest checkpoint step reported when the attempt began (it resumes there)."
    )
    start_time: str | None = Field(default=None, description="When the trainer started running (TPU time starts).")
    end_time: str | None = None
    outcome: str | None = Field(
        default=None, description="Succeeded, Preempted, Failed or Suspended; unset while the attempt is live."
    )
    reason: str | None = None
    message: str | None = None


class FineTuneJobStatus(StatusModel):
    phase: FineTunePhase | None = None
    queued_stage: FineTunePhase | None = Field(
        default=None,
        description="While Queued: the stage whose Job waits for Kueue (Preflight, Pending, Merging or "
        "Evaluating); the job is back in it once admitted.",
    )
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    progress: Progress | None = None
    restarts: Restarts | None = None
    attempt: int | None = Field(default=None, description="Number of the current training attempt (0 first).")
    attempts: list[AttemptStatus] = Field(
        default_factory=list, description="Every training attempt so far, oldest first (TPU time, outcomes)."
    )
    start_time: str | None = None
    completion_time: str | None = None
    model: ModelStatus | None = Field(
        default=None, description="With spec.model.fineTuneJobRef: the merged model that job resolved to."
    )
    outputs: Outputs | None = None
    checkpoint: CheckpointStatus | None = Field(
        default=None, description="The checkpoint step the merge and the evaluation use, and why (once trained)."
    )
    evaluation: EvaluationStatus | None = None
    preflight: PreflightStatus | None = Field(
        default=None, description="What the preflight found: HBM per chip against the chip's, speed and cost estimates."
    )
    cost: Cost | None = None
    images: ResolvedImages | None = Field(
        default=None, description="The default images this job runs where its spec names none, kept for its life."
    )
