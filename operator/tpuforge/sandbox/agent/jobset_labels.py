"""The labels and annotations of JobSet objects and their children: JobSet's own keys, as the upstream
controller writes them, and the sandbox's (sandbox.tpuforge.dev/...)."""

API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
LOOPBACK_PORTS = "sandbox.tpuforge.dev/loopback-ports"
# A namespace with this label set to "off" has no JobSet controller: for tests that play it themselves.
CONTROLLER_SWITCH = "sandbox.tpuforge.dev/jobset-controller"
# Each pod of a JobSet listens on its own loopback address, so two hosts' servers on one port never collide.
LOOPBACK_IP = "sandbox.tpuforge.dev/loopback-ip"
