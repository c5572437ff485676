"""The FineTuneJob's condition types, their reasons, and the messages the controller writes into them: the long
form of what its Events (controllers/finetune/events) say in one `kubectl describe` line. What the API shows,
so kept in api/, in one place, as JobSet keeps its reasons. Every reason the controller matches on or writes is
a name here, never a literal elsewhere.
"""

from __future__ import annotations

from tpuforge.api import FineTunePhase
from tpuforge.api.constants import JOBSET_API_VERSION
from tpuforge.api.finetune_status import CONDITION_EVALUATED, CONDITION_EVALUATION_PASSED, REASON_EVALUATION_FAILED

TERMINAL = (FineTunePhase.SUCCEEDED, FineTunePhase.FAILED)

# Condition types.
TRAINING = "Training"
MERGED = "Merged"
EVALUATED = CONDITION_EVALUATED
EVALUATION_PASSED = CONDITION_EVALUATION_PASSED
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
SPEC_CHANGE_NOT_APPLIED = "SpecChangeNotApplied"
PREFLIGHT = "Preflight"
CHECKPOINT_WITHIN_GRACE = "CheckpointWithinGrace"
QUEUED = "Queued"

# Reasons of the Training condition.
PENDING = "Pending"
JOBSET_NOT_INSTALLED = "JobSetNotInstalled"
WAITING_FOR_PREVIOUS_ATTEMPT = "WaitingForPreviousAttempt"
WAITING_FOR_MODEL = "WaitingForModel"  # spec.model.fineTuneJobRef's job has no merged model yet
RUNNING = "Running"
UNSCHEDULABLE = "Unschedulable"
COMPLETED = "Completed"
STOPPED_EARLY = "StoppedEarly"
RETRYING = "Retrying"
PREEMPTED = "Preempted"
# How an attempt (or a one-pod Job's pod) ended: status.attempts[].reason, beside COMPLETED and the pod's own
# reasons; INVALID_CONFIG (exit code 2: the pod refused its config) also ends the job as the Failed reason.
EVICTED = "Evicted"
DISRUPTION_TARGET = "DisruptionTarget"
TRAINER_CHECKPOINTED = "TrainerCheckpointed"
POD_FAILED = "PodFailed"
INVALID_CONFIG = "InvalidConfig"
JOB_FAILED = "JobFailed"
JOBSET_FAILED = "JobSetFailed"
POD_DELETED = "PodDeleted"  # a pod the attempt recorded disappeared before it ended: taken away
CONTAINER_ERROR = "Error"  # the kubelet's reason for a container that exited non-zero, where it gives none
# Of the Preflight condition (DoesNotFit and PreflightFailed also end the job as the Failed condition's reason).
COMPILING = "Compiling"
FITS = "Fits"
DOES_NOT_FIT = "DoesNotFit"
PREFLIGHT_FAILED = "PreflightFailed"
PREFLIGHT_SKIPPED = "Skipped"
# Of the Queued condition: while True, Kueue's own reason for holding the Job (Pending, Inadmissible, ...),
# or WAITING_FOR_ADMISSION where it gave none.
WAITING_FOR_ADMISSION = "WaitingForAdmission"
ADMITTED = "Admitted"
NOT_QUEUED = "NotQueued"
# Of the Suspended condition (and of Training, while suspended).
SUSPENDED_REASON = SUSPENDED
RESUMED = "Resumed"
# Of the Merged condition.
MERGING = "Merging"
EXPORTING = "Exporting"
MERGED_REASON = MERGED
ADAPTER_EXPORTED = "AdapterExported"
MERGE_FAILED = "MergeFailed"
# Of the Evaluated and EvaluationPassed conditions.
EVALUATING = "Evaluating"
EVALUATED_REASON = "Evaluated"
NOT_EVALUATED = "NotEvaluated"
EVALUATION_FAILED = REASON_EVALUATION_FAILED
PASSED = "Passed"
BELOW_THRESHOLD = "BelowThreshold"
# Of the CheckpointWithinGrace condition.
SAVE_FITS_GRACE = "SaveFitsGracePeriod"
SAVE_EXCEEDS_GRACE = "SaveExceedsGracePeriod"
# Of the SpecChangeNotApplied condition.
FROZEN_FIELDS_CHANGED = "FrozenFieldsChanged"
SPEC_MATCHES = "SpecMatches"
# Of the Succeeded and Failed conditions (a failed attempt's own reason, e.g. a rejected config, also ends there).
SUCCEEDED_REASON = SUCCEEDED
INVALID_SPEC = "InvalidSpec"
DEADLINE_EXCEEDED = "DeadlineExceeded"
TRAINING_FAILED = "TrainingFailed"
TOO_MANY_PREEMPTIONS = "TooManyPreemptions"
# spec.model.fineTuneJobRef names a job that will give no model to start from.
MODEL_JOB_FAILED = "ModelJobFailed"
NO_MERGED_MODEL = "NoMergedModel"
MODEL_MISMATCH = "ModelMismatch"
EVALUATION_RESULT_MISSING = "EvaluationResultMissing"
EVALUATION_RESULT_UNREADABLE = "EvaluationResultUnreadable"

JOBSET_INSTALL_URL = "https://jobset.sigs.k8s.io/docs/installation/"


def _on_node(node: str | None) -> str:
    return f" on node {node}" if node else ""


# --- Spec changes ----------------------------------------------------------------------------------------------


def checkpoint_grace(step: int, seconds: float, grace: int, every_steps: int) -> str:
    took = f"the checkpoint of step {step} took {seconds:.1f} s to save"
    if seconds <= grace:
        return f"{took}, within the training pods' {grace} s grace period"
    return (
        f"{took}, more than the training pods' {grace} s grace period: the checkpoint a SIGTERM starts may not "
        f"finish, and a preemption then loses up to checkpoint.everySteps={every_steps} steps (lower it, or raise "
        "tpu.spotGraceSeconds where the node pools allow)"
    )


def invalid_spec(error: object) -> str:
    return f"invalid spec: {error}"


def invalid_edit(error: object) -> str:
    return f"the edited spec is invalid ({error}); the job keeps the spec it started with"


def frozen(changed: list[str]) -> str:
    return (
        f"{', '.join(changed)} changed after the job started; these fields change the training maths, so "
        "the run keeps the values it started with (create a new FineTuneJob to train with them)"
    )


SPEC_MATCHES_MESSAGE = "the spec matches the running job"


# --- Training attempts -------------------------------------------------------------------------------------------


def waiting_for_pod(attempt: int) -> str:
    return f"attempt {attempt}: waiting for the training pod to start"


def created_job(attempt: int, what: str, job_name: str) -> str:
    return f"attempt {attempt}: created {what} {job_name}"


def no_jobset(slice_id: str, hosts: int) -> str:
    return (
        f"{slice_id} spans {hosts} hosts, and multi-host training runs as a JobSet "
        f"({JOBSET_API_VERSION}), which this cluster does not serve: install JobSet ({JOBSET_INSTALL_URL}); "
        "the job starts once it is installed"
    )


def model_job_missing(job: str) -> str:
    return (
        f"waiting for FineTuneJob {job!r} (spec.model.fineTuneJobRef), which does not exist in this namespace: "
        "the job starts from its merged model once it has Succeeded"
    )


def waiting_for_model(job: str, phase: str | None) -> str:
    return (
        f"waiting for FineTuneJob {job!r} (spec.model.fineTuneJobRef, now {phase or 'not started'}) to succeed: "
        "the job starts from its merged model"
    )


def model_job_failed(job: str) -> str:
    return f"FineTuneJob {job!r} (spec.model.fineTuneJobRef) failed: there is no model to start from"


def no_merged_model(job: str) -> str:
    return (
        f"FineTuneJob {job!r} (spec.model.fineTuneJobRef) succeeded without a merged model (its spec.merge.enabled "
        "is false): there is no model to start from"
    )


def model_mismatch(job: str, theirs: str, ours: str) -> str:
    return (
        f"spec.model.name is {ours!r} but FineTuneJob {job!r} (spec.model.fineTuneJobRef) has spec.model.name "
        f"{theirs!r}: they must be equal, its merged model is a {theirs} model"
    )


def previous_attempt_running(attempt: int, pod: str) -> str:
    return f"attempt {attempt} starts when pod {pod} has stopped (it checkpoints on SIGTERM)"


def training_on_pod(attempt: int, pod: str, node: str | None) -> str:
    where = _on_node(node)
    return f"attempt {attempt}: pod {pod} is training{where}"


def training_on_hosts(attempt: int, pods: list[str], nodes: list[str]) -> str:
    where = f" on nodes {', '.join(nodes)}" if nodes else ""
    return f"attempt {attempt}: {len(pods)} pods ({', '.join(pods)}) are training{where}"


def unschedulable(attempt: int, pod: str, since: str, why: str) -> str:
    return f"attempt {attempt}: pod {pod} has waited for a node since {since}: {why}"


def training_finished(step: int | None) -> str:
    return "training finished" + (f" at step {step}" if step is not None else "")


def _step_loss(step: int, loss: float | None) -> str:
    return f"step {step}" + (f" (loss {loss:.4g})" if loss is not None else "")


def stopped_early(step: int, evals: int, min_delta: float, best: int | None, best_loss: float | None) -> str:
    """spec.training.earlyStopping ended training."""
    by = f" by more than {min_delta:g}" if min_delta else ""
    said = f"stopped early at step {step}: eval loss did not improve{by} for {evals} evals"
    return said + (f"; best {_step_loss(best, best_loss)}" if best is not None else "")


def checkpoint_selected(select: str, step: int | None, loss: float | None, last: int | None) -> str:
    """Which checkpoint step the merge and the evaluation use."""
    if step is None and select == "best":
        return (
            "select best: the trainer reported no best step; the merge takes the finished step with the lowest "
            "loss in the checkpoints' eval record"
        )
    if step is None:
        return "select last: the merge takes the latest checkpoint step"
    why = "the lowest eval loss" if select == "best" else "where training ended"
    other = f"; training ended at step {last}" if select == "best" and last is not None and last != step else ""
    return f"select {select}: merging {_step_loss(step, loss)}, {why}{other}"


def preempted(attempt: int, why: str, resume: str) -> str:
    return f"attempt {attempt} was preempted{why}; attempt {attempt + 1} resumes {resume}"


def retrying(attempt: int) -> str:
    return f"attempt {attempt} failed; retrying as attempt {attempt + 1}"


def rejected(attempt: int, message: str) -> str:
    return f"attempt {attempt}: {message}; not retried: fix the spec and create the job again"


def gave_up(attempt: int, message: str, failures: int, limit: int) -> str:
    return f"attempt {attempt}: {message}; gave up after {failures} failures (spec.runPolicy.maxRestarts={limit})"


def preemptions_exhausted(attempt: int, message: str, preemptions: int, limit: int) -> str:
    return (
        f"attempt {attempt} was preempted ({message}); gave up after {preemptions} preemptions "
        f"(spec.runPolicy.maxPreemptions={limit}): raise it to keep resuming, or find what keeps taking the "
        "pods away (a Spot pool short of capacity, repeated drains or upgrades)"
    )


# --- How an attempt ended (status.attempts[].message; the long form of its Retrying or Failed condition) ----------


def pod_completed(pod: str) -> str:
    return f"pod {pod} completed"


def evicted_over_requests(pod: str, detail: str) -> str:
    return f"pod {pod} was evicted for using more than it asked for: {detail}"


def pod_disrupted(pod: str, detail: str) -> str:
    return f"pod {pod} was disrupted: {detail}"


def pod_being_disrupted(pod: str, detail: str | None) -> str:
    return f"pod {pod} is being disrupted: {detail}"


def pod_stopped(pod: str, detail: str) -> str:
    return f"pod {pod} was stopped: {detail}"


def pod_failed(pod: str, why: str) -> str:
    return f"pod {pod} failed: {why}"


def trainer_checkpointed(pod: str, said: str) -> str:
    """The trainer checkpointed on SIGTERM and said so (`said`: its termination message)."""
    return f"pod {pod}: {said or 'preempted'}"


def exit_detail(reason: str, code: int | None, said: str) -> str:
    return f"{reason}, exit code {code}" + (f": {said}" if said else "")


def config_rejected(pod: str, detail: str) -> str:
    return f"pod {pod} rejected its config ({detail})"


def pod_exited(pod: str, detail: str) -> str:
    return f"pod {pod} failed ({detail})"


def job_completed(job: str) -> str:
    return f"Job {job} completed"


def job_failed(job: str, failure: str | None) -> str:
    return f"Job {job} failed: {failure}"


def pod_gone(pod: str) -> str:
    return f"pod {pod} disappeared before it finished (node loss, eviction or deletion)"


def hosts_completed(hosts: int, jobset: str) -> str:
    return f"all {hosts} hosts of JobSet {jobset} completed"


def jobset_failed(jobset: str, failure: str | None) -> str:
    return f"JobSet {jobset} failed: {failure}"


def a_host_of(hosts: int) -> str:
    """A host of a multi-host slice whose index is not known."""
    return f"a host of {hosts}"


def from_host(host: int | None, hosts: int, pod: str, node: str | None, message: str) -> str:
    """An ending said as the host it came from: its index in the slice, its pod and node."""
    index = f"host {host} of {hosts}" if host is not None else a_host_of(hosts)
    return f"{index} (pod {pod}" + (f"{_on_node(node)})" if node else ")") + f": {message}"


# --- Preflight ---------------------------------------------------------------------------------------------------


def preflight_compiling(slice_id: str, topology: str) -> str:
    return f"compiling the train step for {slice_id} (TPU topology {topology}) on a CPU node; no TPU is used yet"


def preflight_on(pod: str, node: str | None) -> str:
    where = _on_node(node)
    return f"pod {pod} is compiling the train step{where}"


def preflight_fits(headline: str, topology: str | None, seconds: float | None) -> str:
    how = f" (compiled for {topology or 'the slice'}" + (f" in {seconds:.0f} s)" if seconds is not None else ")")
    return f"{headline}{how}; tokens/s, time and cost are estimates at the stated MFU"


def does_not_fit(headline: str, fixes: list[str]) -> str:
    to_fit = f"; to fit: {'; or '.join(fixes)}" if fixes else ""
    said = headline.replace("does not fit: ", "does not fit the chips: ", 1)
    return f"the train step {said}{to_fit}; no TPU was used"


def preflight_rejected(job: str, message: str) -> str:
    return f"the preflight Job {job} rejected the config: {message}; fix the spec and create the job again"


def preflight_failed(job: str, tries: str, detail: str) -> str:
    return (
        f"the preflight Job {job} failed {tries}; last: {detail}; delete the Job to run it again, or set "
        "spec.preflight.enabled: false to train without it"
    )


def preflight_result_missing(job: str) -> str:
    return (
        f"the preflight Job {job} completed but its pod is gone, and with it the report (its termination "
        "message); delete the Job to run the preflight again"
    )


def preflight_unreadable(job: str, error: object) -> str:
    return f"the preflight Job {job} finished, but its report cannot be read: {error}"


PREFLIGHT_SWITCHED_OFF = "spec.preflight.enabled was set to false: the preflight was stopped"


# --- Kueue -------------------------------------------------------------------------------------------------------


def _in(queue: str) -> str:
    # None: a Workload without a LocalQueue (Kueue managing Jobs that carry no queue label).
    return f" (LocalQueue {queue})" if queue else ""


def queued(job: str, queue: str, said: str) -> str:
    """`job` (e.g. "the training Job x") waits in Kueue; `said`: Kueue's message for its Workload."""
    why = f": {said}" if said else ""
    return f"{job} waits for Kueue to admit it{_in(queue)}{why}; nothing runs until then"


def admitted(job: str, queue: str) -> str:
    return f"Kueue admitted {job}{_in(queue)}"


def not_queued(phase: str) -> str:
    return f"no Job of this FineTuneJob waits for Kueue (phase {phase})"


# --- Suspend ------------------------------------------------------------------------------------------------------

SUSPEND_SET = "spec.runPolicy.suspend was set"
SUSPENDED_MESSAGE = (
    "spec.runPolicy.suspend is true: the training Job was removed and the checkpoints stay; set it to false to resume"
)


RESUMED_TO_PREFLIGHT = "resumed: the preflight runs first"


def attempt_stopped(attempt: int) -> str:
    return f"attempt {attempt} was stopped"


def resumed(attempt: int) -> str:
    return f"resumed as attempt {attempt}"


# --- Policies -----------------------------------------------------------------------------------------------------


def deadline(ran: float, limit: int) -> str:
    return (
        f"the job ran for {int(ran)}s, past spec.runPolicy.activeDeadlineSeconds={limit}; "
        "its Jobs were stopped (checkpoints stay)"
    )


# --- Merge --------------------------------------------------------------------------------------------------------


def trained_only(checkpoint_uri: str) -> str:
    return (
        f"training finished; the LoRA checkpoint is in {checkpoint_uri} "
        "(spec.merge.enabled and spec.merge.writeAdapter are false, so nothing was exported)"
    )


def merging(output_uri: str, adapter_uri: str | None) -> str:
    said = f"merging the LoRA weights into {output_uri}"
    return said + (f"; exporting the adapter to {adapter_uri}" if adapter_uri else "")


def exporting(adapter_uri: str) -> str:
    return f"exporting the LoRA adapter to {adapter_uri} (spec.merge.enabled is false: no merged model)"


def merged(output_uri: str, adapter_uri: str | None) -> str:
    return f"merged model in {output_uri}" + (f"; adapter in {adapter_uri}" if adapter_uri else "")


def adapter_exported(adapter_uri: str) -> str:
    return f"adapter exported to {adapter_uri}"


def merge_failed(job: str, tries: int, detail: str) -> str:
    return f"the merge Job {job} failed after {tries} tries; last: {detail}"


def outputs(output_uri: str | None, adapter_uri: str | None) -> str:
    """What the job left, for the Succeeded condition: the merged model (`output_uri` None: merge off)."""
    if output_uri is not None:
        said = f"merged model written to {output_uri}"
        return said + (f"; adapter to {adapter_uri}" if adapter_uri else "")
    return f"adapter exported to {adapter_uri} (spec.merge.enabled is false: no merged model)"


# --- Evaluation ---------------------------------------------------------------------------------------------------


def evaluating(metrics: list[str], max_examples: int, dataset: str, slice_id: str) -> str:
    return (
        f"scoring the adapter and the base model ({', '.join(metrics)}) on up to {max_examples} records "
        f"of {dataset} on {slice_id}"
    )


def evaluating_on(pod: str, node: str | None) -> str:
    where = _on_node(node)
    return f"pod {pod} is evaluating{where}"


# A child could not be created because an admission webhook (JobSet's, Kueue's) did not answer the apiserver.
WEBHOOKS_REACHABLE = "WebhooksReachable"
WEBHOOK_UNREACHABLE = "WebhookUnreachable"
WEBHOOKS_ANSWER = "WebhooksAnswer"


def webhook_unreachable(kind: str, name: str, webhook: str, why: str) -> str:
    return (
        f"creating {kind} {name} failed: the apiserver could not call admission webhook {webhook!r} ({why}); on a "
        "private GKE cluster, allow the control plane to reach the nodes on TCP 9443 (a firewall rule from the "
        "master CIDR; docs/platform-team.md, Private clusters: webhooks); retried until it answers"
    )


WEBHOOKS_ANSWER_MESSAGE = "the children were created: every admission webhook answered"
EVALUATION_REMOVED = "spec.evaluation was removed before it finished"
RERUN_FIELD = "spec.evaluation.rerun"
EVALUATING_AGAIN = "EvaluatingAgain"


def evaluation_error(message: str) -> str:
    """status.evaluation.message after an evaluation that gave no verdict."""
    return f"{message}; the outputs are kept: raise {RERUN_FIELD} to evaluate them again"


def evaluation_failed_note(reason: str) -> str:
    """What the Succeeded condition adds when the evaluation gave no verdict."""
    return f"; evaluation failed ({reason}, see the Evaluated condition): raise {RERUN_FIELD} to run it again"


def no_verdict(detail: str) -> str:
    """The EvaluationPassed condition's message when the evaluation gave no verdict."""
    return f"no verdict: {detail}"


def evaluating_again(run: int) -> str:
    return f"evaluating the exported model again ({RERUN_FIELD}={run}); training is not repeated"


def evaluation_deadline(ran: float, limit: int) -> str:
    return (
        f"spec.runPolicy.activeDeadlineSeconds={limit} passed ({ran:.0f}s since the start) while evaluating; the "
        "evaluation is stopped"
    )


NOT_EVALUATED_SUFFIX = "; not evaluated (spec.evaluation was removed)"


def evaluation_rejected(job: str, message: str) -> str:
    return f"the evaluation Job {job} failed: {message}; not retried: fix spec.evaluation and raise {RERUN_FIELD}"


def evaluation_job_failed(job: str, tries: str, detail: str) -> str:
    return f"the evaluation Job {job} failed {tries}; last: {detail}"


def evaluation_evicted(job: str, message: str) -> str:
    return (
        f"the evaluation Job {job}: {message}; not retried: raise spec.evaluation.resources.memory or "
        "spec.evaluation.modelStorage.size"
    )


def evaluation_result_missing(job: str) -> str:
    return (
        f"the evaluation Job {job} completed but its pod is gone, and with it the result (its "
        f"termination message); raise {RERUN_FIELD} to run the evaluation again"
    )


EVALUATION_POD_GONE = "the evaluation pod is gone"


def evaluation_unreadable(job: str, error: object) -> str:
    return f"the evaluation Job {job} finished, but its result cannot be read: {error}"


def scored(examples: int | None, report: str) -> str:
    what = f"{examples} records" if examples is not None else "the records"
    return f"{what} scored; report in {report}"
