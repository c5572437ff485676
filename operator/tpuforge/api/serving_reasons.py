"""The ServingDeployment's condition types, their reasons and messages, its Events (reasons and one-line texts)
and what status.adapters says of each adapter: what the API shows, kept in one place beside the FineTuneJob's
(finetune_reasons). Every reason the serving controller matches on or writes is a name here, never a literal
elsewhere.
"""

from __future__ import annotations

from tpuforge.api.constants import DEFAULT_VLLM_IMAGE
from tpuforge.api.describe import DescribeLine
from tpuforge.api.finetune_status import REASON_EVALUATION_FAILED
from tpuforge.api.serving import ServingPhase

# Condition types.
READY = "Ready"
MODEL_AVAILABLE = "ModelAvailable"
ROLLED_OUT = "RolledOut"
ADAPTERS_READY = "AdaptersReady"
ADAPTERS_PROMOTED = "AdaptersPromoted"
ADAPTER_CONDITIONS = (ADAPTERS_READY, ADAPTERS_PROMOTED)

# Of the Ready condition: why the phase is what it is.
INVALID_SPEC = "InvalidSpec"
WAITING_FOR_DELETION = "WaitingForDeletion"
READY_REASON = READY
PENDING = ServingPhase.PENDING.value
LOADING = ServingPhase.LOADING.value
SCALED_TO_ZERO = "ScaledToZero"
ROLLOUT_STALLED = "RolloutStalled"
UNSCHEDULABLE = "Unschedulable"  # a pod's: Pending until a pod is scheduled, then Loading
MODEL_FETCH_FAILED = "ModelFetchFailed"
SERVER_FAILING = "ServerFailing"
# Of the ModelAvailable condition (and of Ready while there is nothing to serve).
MODEL_AVAILABLE_REASON = MODEL_AVAILABLE
FINETUNEJOB_NOT_FOUND = "FineTuneJobNotFound"
FINETUNEJOB_FAILED = "FineTuneJobFailed"
WAITING_FOR_MODEL = ServingPhase.WAITING_FOR_MODEL.value
# Of the RolledOut condition.
ROLLED_OUT_REASON = ROLLED_OUT
ROLLING_OUT = "RollingOut"
# Of the AdaptersReady condition.
ADAPTERS_READY_REASON = ADAPTERS_READY
ADAPTER_FAILED = "AdapterFailed"
ADAPTERS_LOADING = "AdaptersLoading"
# The server has no runtime LoRA loading: vLLM-TPU images before tpu-inference v0.25.0 answer
# /v1/load_lora_adapter with the worker's NotImplementedError (tpu-inference#2707), and a server started without
# VLLM_ALLOW_RUNTIME_LORA_UPDATING has no such route (404 {"detail": "Not Found"}).
RUNTIME_LORA_UNSUPPORTED = "RuntimeLoraUnsupported"
# Of the AdaptersPromoted condition: why an adapter's newest output is not served (yet).
PROMOTED = "Promoted"
WAITING_FOR_JOB = "WaitingForJob"
NO_ADAPTER = "NoAdapter"
WAITING_FOR_EVALUATION = "WaitingForEvaluation"
EVALUATION_FAILED = REASON_EVALUATION_FAILED
# An adapter held back for one of these is Failed in status.adapters, not Loading.
ADAPTER_FAILED_REASONS = (EVALUATION_FAILED, NO_ADAPTER)

# What Kubernetes says of a serving pod or its Deployment that the controller matches on.
CRASH_REASONS = (
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "InvalidImageName",
)
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"

# Event reasons: a phase change is posted under the new phase's name; besides, these.
ROLLING_MODEL = "RollingModel"
ADAPTER_LOADED = "AdapterLoaded"
ADAPTER_REPLACED = "AdapterReplaced"
ADAPTER_REMOVED = "AdapterRemoved"
EVENT_REASONS = (
    *(p.value for p in ServingPhase),
    ROLLING_MODEL,
    ADAPTER_LOADED,
    ADAPTER_REPLACED,
    ADAPTER_REMOVED,
    ADAPTER_FAILED,
)

LINE = DescribeLine.of(EVENT_REASONS)


# --- Ready -------------------------------------------------------------------------------------------------------


def waiting_for_deletion(kind: str, name: str) -> str:
    return f"waiting for {kind} {name}, still being deleted; it is created again once it is gone"


SCALED_TO_ZERO_MESSAGE = "spec.replicas is 0"


def replicas_ready(ready: int, replicas: int) -> str:
    return f"{ready}/{replicas} replicas ready"


def rolling_out_while_serving(ready: int, replicas: int, problem: str | None) -> str:
    said = f"{replicas_ready(ready, replicas)}; rolling out the new template while the old pods serve"
    return said + (f" ({problem})" if problem else "")


def rollout_stalled(why: str) -> str:
    return f"pods did not become ready within the progress deadline: {why}"


def not_ready(ready: int, replicas: int, problem: str) -> str:
    return f"{replicas_ready(ready, replicas)}; {problem}"


def loading(ready: int, replicas: int) -> str:
    return (
        f"{replicas_ready(ready, replicas)}; fetching the model and compiling (XLA compilation takes 8-10 minutes "
        "on a cold cache)"
    )


def pending(replicas: int) -> str:
    return f"waiting for {replicas} pod(s) to be scheduled on a TPU node"


# A Recreate rollout (the pod holds ReadWriteOnce disks) takes the old pods down before the new one starts.
RECREATING = (
    "; the pod is being replaced (Recreate: its ReadWriteOnce disks move to the new one), so nothing serves "
    "until the new one is ready"
)


def unscheduled(pod: str, why: str) -> str:
    return f"pod {pod} is not scheduled: {why}"


def model_fetch_failed(pod: str, code: str, why: str) -> str:
    """`code`: " (exit code N)", or empty."""
    return f"pod {pod}: model fetch failed{code}: {why}"


def server_failing(pod: str, container: str | None, code: str, why: str) -> str:
    return f"pod {pod}: container {container} is failing{code}: {why}"


def exit_code(code: object) -> str:
    return f" (exit code {code})"


# --- ModelAvailable ----------------------------------------------------------------------------------------------


def serving_uri(uri: str) -> str:
    return f"serving {uri}"


def job_not_found(job: str) -> str:
    return f"FineTuneJob {job!r} does not exist yet; waiting for it (spec.model.fineTuneJobRef)"


def serving_merged(job: str, uri: str) -> str:
    return f"serving FineTuneJob {job!r}'s merged model {uri}"


def job_failed(job: str) -> str:
    return (
        f"FineTuneJob {job!r} failed, so it has no merged model to serve; fix and rerun it, or point "
        "spec.model.uri at a merged model"
    )


def _phase(phase: str | None) -> str:
    return f"phase {phase or 'Pending'}"


def waiting_for_job_model(job: str, phase: str | None) -> str:
    return f"waiting for FineTuneJob {job!r} to succeed ({_phase(phase)})"


# --- RolledOut ---------------------------------------------------------------------------------------------------

ROLLED_OUT_MESSAGE = "every replica runs the current template"
ROLLING_OUT_MESSAGE = "a rollout is in progress"


# --- AdaptersReady and status.adapters ---------------------------------------------------------------------------


def adapter_said(name: str, message: str | None) -> str:
    """The first adapter that is not ready, and what its status says."""
    return f"{name}: {message}"


def adapters_ready(ready: str | None) -> str:
    return f"{ready} adapters ready on every ready replica"


def unsupported_message(image: str | None, answer: str) -> str:
    return (
        f"the vLLM server ({image or 'spec.vllm.image'}) cannot load LoRA adapters at runtime ({answer}); "
        f"use {DEFAULT_VLLM_IMAGE} or another vllm/vllm-tpu release of tpu-inference v0.25.0 or later (spec.vllm.image)"
    )


NO_LOAD_ROUTE = "HTTP 404: the server has no /v1/load_lora_adapter route"


def http_error(code: int, message: object) -> str:
    return f"HTTP {code}: {message}"


def fetching(uri: str) -> str:
    return f"fetching {uri}"


def loading_adapter(uri: str) -> str:
    return f"loading {uri}"


FETCH_FAILED = "fetch failed"


def unreachable(why: str) -> str:
    return f"cannot reach the replica's adapter endpoints: {why}"


def cannot_load_at_runtime(answer: str) -> str:
    return f"vLLM cannot load adapters at runtime: {answer}"


def refused_adapter(why: str) -> str:
    return f"vLLM refused the adapter: {why}"


def asking_for_fetch(why: str) -> str:
    return f"asking for the fetch: {why}"


def on_pod(pod: str, message: str) -> str:
    return f"pod {pod}: {message}"


def serving_on(uri: str, loaded: int, ready: int) -> str:
    return f"{serving_uri(uri)} on {loaded}/{ready} replicas"


WAITING_FOR_REPLICA = "waiting for a ready replica"


def loaded_of(message: str, loaded: int, ready: int) -> str:
    return f"{message} ({loaded}/{ready} replicas)"


def nothing_to_serve(name: str) -> str:
    return f"adapter {name!r}: nothing to serve yet"


# --- AdaptersPromoted ----------------------------------------------------------------------------------------------

PROMOTED_MESSAGE = "every adapter serves its newest output that may take traffic"


def held_back(name: str, message: str, serving: str | None) -> str:
    """Why adapter `name` does not take its newest output; `serving`: what it keeps serving meanwhile."""
    said = f"adapter {name!r}: {message}"
    return said + (f"; still serving {serving}" if serving else "")


def adapter_job_missing(job: str) -> str:
    return f"FineTuneJob {job!r} does not exist"


def other_base(job: str, job_model: str, model_id: str) -> str:
    return (
        f"FineTuneJob {job!r} fine-tunes {job_model!r} but this deployment serves {model_id!r}; serve it from a "
        "ServingDeployment of that base, or reference a job of this one"
    )


def rank_above_max(job: str, rank: int, max_rank: int) -> str:
    return (
        f"FineTuneJob {job!r} trains LoRA rank {rank}, above spec.vllm.lora.maxLoraRank ({max_rank}); raise "
        f"maxLoraRank to at least {rank} (this restarts the pods)"
    )


def waiting_for_adapter_job(job: str, phase: str | None) -> str:
    return f"waiting for FineTuneJob {job!r} ({_phase(phase)})"


def no_adapter(job: str) -> str:
    return f"FineTuneJob {job!r} wrote no adapter: set its spec.merge.writeAdapter: true and run it again"


def evaluation_gave_no_verdict(job: str, message: str | None) -> str:
    return (
        f"FineTuneJob {job!r}'s evaluation gave no verdict ({message}); raise its spec.evaluation.rerun to "
        "evaluate it again"
    )


def not_evaluated(job: str) -> str:
    return f"FineTuneJob {job!r} has not been evaluated yet"


def evaluation_failed(job: str, message: str | None) -> str:
    why = f": {message}" if message else ""
    return f"FineTuneJob {job!r} failed its evaluation{why}"


# --- Events --------------------------------------------------------------------------------------------------------


def rolling_model(deployment: str, uri: str) -> str:
    return f"rolling the Deployment {deployment} to model {uri}"


def adapter_loaded(name: str, replaced: bool, pods: int) -> str:
    what = "replaced" if replaced else "loaded"
    return LINE.fit(f"adapter {{name}} {what} on {pods} pod(s)", f"{{name}} {what}", name=name)


def adapter_removed(name: str) -> str:
    return LINE.fit("adapter {name} removed", "{name} removed", name=name)


def adapter_failed(name: str) -> str:
    return LINE.fit("adapter {name} failed; see status", "{name} failed", name=name)
