"""Names shared by the operator and the workloads: API group, labels, exit codes, file names."""

from __future__ import annotations

GROUP = "tpuforge.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "tpuforge"

FINETUNEJOB_KIND = "FineTuneJob"
FINETUNEJOB_PLURAL = "finetunejobs"
FINETUNEJOB_SHORT = "ftj"
SERVING_KIND = "ServingDeployment"
SERVING_PLURAL = "servingdeployments"
SERVING_SHORT = "sdep"

# The source of the operator's Events, shown in the From column of `kubectl describe`: short leaves room.
EVENT_COMPONENT = "tpuforge"

PROJECT_VERSION = "0.1.0"
DEFAULT_TRAINER_IMAGE = f"tpuforge/trainer:{PROJECT_VERSION}"
DEFAULT_MERGER_IMAGE = f"tpuforge/merger:{PROJECT_VERSION}"
DEFAULT_EVALUATOR_IMAGE = f"tpuforge/evaluator:{PROJECT_VERSION}"
DEFAULT_OPERATOR_IMAGE = f"tpuforge/operator:{PROJECT_VERSION}"
# The first tpu-inference release with runtime LoRA loading (/v1/load_lora_adapter) on TPU is v0.25.0
# (vllm-project/tpu-inference#2707); v0.27.0 is the newest release, and serves Gemma 4. docs/serving.md says more.
# The one place the vLLM-TPU release is named: the serving image's default and the base of every tpuforge image
# built on vLLM (images/serving.Dockerfile, images/evaluator.Dockerfile, by the build argument VLLM_TPU_IMAGE).
VLLM_TPU_REPOSITORY = "vllm/vllm-tpu"
VLLM_TPU_TAG = "v0.27.0"
DEFAULT_VLLM_IMAGE = f"{VLLM_TPU_REPOSITORY}:{VLLM_TPU_TAG}"
# A multimodal model's server batches each image or video whole (--disable_chunked_mm_input, which vLLM-TPU
# requires for them), so --max-num-batched-tokens must hold Gemma 4's largest item: a 32-frame video at 70
# soft tokens a frame with its markers and timestamps, 2496 tokens (vLLM's own budget, refused at start-up
# below it: "max_tokens_per_mm_item (2496) is larger than max_num_batched_tokens (2048)"). vLLM's defaults are
# below it (2048 on CPU, less on TPU); 4096 is what vLLM's Gemma 4 31B benchmark on a v6e-8 runs with.
MULTIMODAL_ITEM_TOKENS = 2496
MULTIMODAL_MAX_NUM_BATCHED_TOKENS = 4096

# Labels on every child object.
LABEL_FINETUNEJOB = f"{GROUP}/finetunejob"
LABEL_SERVING = f"{GROUP}/servingdeployment"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"  # on a Job or JobSet: the Kueue LocalQueue it waits in

# GKE node labels, taint and extended resource for TPUs.
GKE_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
GKE_SPOT = "cloud.google.com/gke-spot"
# The VM's machine type (a well-known Kubernetes label): on v6e one topology comes as different machine types
# (2x4 is one ct6e-standard-8t host or two ct6e-standard-4t hosts).
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
TPU_RESOURCE = "google.com/tpu"

# What a reclaimed Spot VM gives a non-system pod between SIGTERM and SIGKILL: GKE's graceful node shutdown
# lasts 30 s, 15 for other pods and then 15 for critical system pods; a longer terminationGracePeriodSeconds has
# no effect on a reclaim (GKE, "Spot VMs": termination and graceful shutdown).
GKE_SPOT_GRACE_SECONDS = 15
# Set on Spot training pods: the trainer watches GKE's shutdown notice (the VM's metadata `instance/preempted`)
# and starts its checkpoint on it, before the node's SIGTERM and its short grace.
SPOT_NOTICE_ENV = "TPUFORGE_SPOT_NOTICE"
# Ports of a multi-host training pod besides its metrics: the JAX coordinator (COORDINATOR_PORT, process 0) and
# the TPU runtime's port, which GKE's multi-host TPU samples declare on every worker.
TPU_RUNTIME_PORT = 8471

# GKE node pool label: one multi-host TPU slice is one node pool.
GKE_NODEPOOL = "cloud.google.com/gke-nodepool"

# Kueue's Workload (kueue.x-k8s.io), one per Job or JobSet it queues, owned by that object: whether Kueue has
# admitted it, and if not why. v1beta2 is served from Kueue v0.15 and stored from v0.16.
KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
KUEUE_WORKLOAD_KIND = "Workload"
KUEUE_WORKLOAD_PLURAL = "workloads"

# JobSet (jobset.x-k8s.io), which runs a multi-host slice's training pods: one pod per TPU VM host.
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_KIND = "JobSet"
JOBSET_PLURAL = "jobsets"
# One JobSet per node pool: JobSet's own scheduling gate, so two slices' pods never share a node pool.
JOBSET_EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"  # set by JobSet on its Jobs and pods
# Set by Indexed Jobs on each pod: its index, 0 .. completions-1 (the JAX process id).
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

# Where the evaluation's containers keep their copies of the base model and the adapter (a sized volume).
EVAL_WORK_DIR_ENV = "TPUFORGE_EVAL_WORK_DIR"

# A GRPO trainer's checker is the sidecar beside it (evaluate.check --serve): the trainer hands it answers and
# reads its verdicts through this directory (the spool), a volume both mount. Unset: the checker runs in the
# trainer's own process (CPU runs, tests).
CHECKER_SPOOL_ENV = "TPUFORGE_CHECKER_SPOOL"
# The multi-host training pods' environment (the trainer calls jax.distributed.initialize with it). Unset on a
# single host, where the trainer runs one process.
ENV_NUM_PROCESSES = "TPUFORGE_NUM_PROCESSES"
ENV_PROCESS_ID = "TPUFORGE_PROCESS_ID"
ENV_COORDINATOR_ADDRESS = "TPUFORGE_COORDINATOR_ADDRESS"
COORDINATOR_PORT = 8476  # JAX's usual coordinator port, on process 0's pod
# How long the hosts wait for each other to join the slice (spec.tpu.joinTimeoutSeconds): long enough for
# uneven image pulls and node start-ups on a big slice.
ENV_JOIN_TIMEOUT = "TPUFORGE_JOIN_TIMEOUT_SECONDS"
JOIN_TIMEOUT_SECONDS = 1800
# spec.runPolicy.maxPreemptions: on Spot capacity a reclaim every few hours is normal, so a day's run may see
# several; past this many, something keeps taking the pods away (a node pool that never holds, a drain loop).
DEFAULT_MAX_PREEMPTIONS = 20
# spec.evaluation.activeDeadlineSeconds: a 31B evaluation (two model copies fetched, vLLM compiled twice, a few
# hundred answers scored) takes well under an hour on a v6e-8; four hours leave room for a retry or two.
EVAL_ACTIVE_DEADLINE_SECONDS = 4 * 3600

# The trainer exits with this code after it has checkpointed on SIGTERM, so the operator counts a
# preemption and not a failure. 143 (128+SIGTERM) is what a process killed by SIGTERM reports, so the
# trainer uses a code of its own.
EXIT_PREEMPTED = 83
# Exit code for a config the workload rejects before doing any expensive work.
EXIT_BAD_CONFIG = 2
# The preflight's exit code for a job whose step does not fit the chips' HBM (its report says what to change).
EXIT_DOES_NOT_FIT = 3
# First word of the termination message after a preemption checkpoint.
TERMINATION_PREEMPTED = "Preempted"

# Merge output commit marker: an output directory without it is absent to every reader.
COMPLETE_MARKER = "_COMPLETE"
# Where the export puts the PEFT adapter, committed on its own (its own _COMPLETE), under the output URI.
ADAPTER_SUBDIR = "adapter"
COMPILE_CACHE_SUBDIR = "compile-cache"  # under spec.checkpoint.uri
# TensorBoard's log directory, under spec.checkpoint.uri: one run the trainer writes (train/) and one the
# evaluation's score step writes (eval/), so `tensorboard --logdir <checkpoint.uri>/tensorboard` shows both.
TENSORBOARD_SUBDIR = "tensorboard"
TENSORBOARD_TRAIN_RUN = "train"
TENSORBOARD_EVAL_RUN = "eval"
# The most tokens a sample generation at an in-training evaluation (training.evalSamples) may add.
EVAL_SAMPLE_MAX_NEW_TOKENS = 32
# Where the evaluation puts its report (report.jsonl per example, summary.json), committed, under the output URI.
EVALUATION_SUBDIR = "evaluation"
# The CPU pseudo-slice of spec.evaluation.slice: a node without TPUs (the sandbox, or a CPU node pool).
CPU_SLICE = "cpu"

# Where pods find their config file (ConfigMap mounted read-only).
CONFIG_MOUNT_DIR = "/etc/tpuforge"
CONFIG_FILE = "config.json"
TERMINATION_LOG = "/dev/termination-log"
