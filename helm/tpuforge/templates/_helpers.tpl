{{/* Names and labels shared by every template. */}}

{{- define "tpuforge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name: "<release>-tpuforge", or the release name alone when it already says tpuforge. */}}
{{- define "tpuforge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tpuforge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Immutable once a Deployment exists: only the name and the instance. */}}
{{- define "tpuforge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tpuforge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tpuforge.labels" -}}
helm.sh/chart: {{ include "tpuforge.chart" . }}
{{ include "tpuforge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tpuforge
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "tpuforge.operatorLabels" -}}
{{ include "tpuforge.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "tpuforge.operatorSelectorLabels" -}}
{{ include "tpuforge.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "tpuforge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tpuforge.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Where the operator's default images come from (tpuforge.api.images): `--image-registry`, `--image-tag`. */}}
{{- define "tpuforge.imageRegistry" -}}
{{- trimSuffix "/" .Values.images.registry }}
{{- end }}

{{- define "tpuforge.imageTag" -}}
{{- default .Chart.AppVersion .Values.images.tag }}
{{- end }}

{{- define "tpuforge.image" -}}
{{- $repository := .Values.image.repository | default (printf "%s/operator" (include "tpuforge.imageRegistry" . | default "tpuforge")) }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default (include "tpuforge.imageTag" .) .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* imagePullSecrets entries as names: `{name: x}` or plain `x`. */}}
{{- define "tpuforge.pullSecretNames" -}}
{{- range .Values.imagePullSecrets }}
- {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}
{{- end }}

{{- define "tpuforge.metricsServiceName" -}}
{{- printf "%s-metrics" (include "tpuforge.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The training pods the operator creates (tpuforge.manifests.finetune_training labels them so). */}}
{{- define "tpuforge.trainerSelectorLabels" -}}
app.kubernetes.io/name: tpuforge-trainer
app.kubernetes.io/managed-by: tpuforge
{{- end }}

{{/* The training pods of a multi-host slice: JobSet labels its pods with their JobSet's name. */}}
{{- define "tpuforge.jobsetTrainerSelector" -}}
matchLabels:
  {{- include "tpuforge.trainerSelectorLabels" . | nindent 2 }}
matchExpressions:
  - {key: jobset.sigs.k8s.io/jobset-name, operator: Exists}
{{- end }}

{{/* What every pod the operator creates may reach: DNS, the GKE metadata server (169.254.169.254:80, and
169.254.169.252:988 where Workload Identity runs on GKE Dataplane V2) and HTTPS (networkPolicy.workloads.httpsTo). */}}
{{- define "tpuforge.workloadEgress" -}}
- ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
- to:
    - ipBlock: {cidr: 169.254.169.254/32}
  ports:
    - {port: 80, protocol: TCP}
- to:
    - ipBlock: {cidr: 169.254.169.252/32}
  ports:
    - {port: 988, protocol: TCP}
- ports:
    - {port: 443, protocol: TCP}
  {{- with .Values.networkPolicy.workloads.httpsTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* The operator's rules on namespaced resources: in the ClusterRole when it watches every namespace, in a Role
per namespace otherwise (the table in operator/tpuforge/controllers/permissions.py). */}}
{{- define "tpuforge.namespacedRules" -}}
# The controllers post Events on the objects they handle.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# FineTuneJobs: watched (one informer, which the ServingDeployments that serve them read too), status
# written, deleted after ttlSecondsAfterFinished. `get` on the status: the operator grants it to the
# trainer's Role.
- apiGroups: ["tpuforge.dev"]
  resources: ["finetunejobs"]
  verbs: ["list", "watch", "delete"]
- apiGroups: ["tpuforge.dev"]
  resources: ["finetunejobs/status"]
  verbs: ["get", "patch"]
# ServingDeployments: watched (an informer), status written.
- apiGroups: ["tpuforge.dev"]
  resources: ["servingdeployments"]
  verbs: ["list", "watch"]
- apiGroups: ["tpuforge.dev"]
  resources: ["servingdeployments/status"]
  verbs: ["patch"]
# FineTuneJob children: training and merge Jobs, their config, the trainer's identity and Role.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "watch", "create", "delete"]
# Multi-host training attempts: one JobSet per attempt, watched like the Jobs (JobSet must be installed
# on the cluster; without it the list answers 404 and multi-host jobs wait with a condition that says so).
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["list", "watch", "create", "delete"]
# Kueue's Workloads (kueue.x-k8s.io/v1beta2), one per queued Job or JobSet: read only, to show why a
# FineTuneJob is Queued. Where Kueue is not installed the list answers 404 and nothing is queued.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["list", "watch", "create"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create"]
# Pods of both kinds' children: watched for progress, failures and readiness.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# ServingDeployment children: the vLLM Deployment, its Service, the XLA cache PVC, scrape configs; each
# watched by an informer, read before an update. Where a scrape config's CRD is not installed its list
# answers 404 and none is made.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "update"]
# The vLLM pods' PodDisruptionBudget, applied like the other serving children.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: ["monitoring.googleapis.com"]
  resources: ["podmonitorings"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "list", "watch", "create", "update"]
{{- end }}

{{/* A container's resources: on GKE Autopilot (gke.autopilot) the requests given as the third argument with
limits equal to them; otherwise the second argument as it is. Called with (list $ given autopilot). */}}
{{- define "tpuforge.resources" -}}
{{- $root := index . 0 }}
{{- $given := index . 1 }}
{{- $autopilot := index . 2 }}
{{- if $root.Values.gke.autopilot -}}
requests:
  {{- toYaml $autopilot | nindent 2 }}
limits:
  {{- toYaml $autopilot | nindent 2 }}
{{- else if $given }}
{{- toYaml $given }}
{{- end }}
{{- end }}

{{/* Values that cannot work on GKE Autopilot, refused at install: a selector naming a node pool (Autopilot
creates and names its node pools itself, so the pods would never be scheduled), and a Spot grace above the
25 s Autopilot gives a Spot Pod on preemption. Renders nothing. */}}
{{- define "tpuforge.autopilotChecks" -}}
{{- if .Values.gke.autopilot }}
{{- $pool := "cloud.google.com/gke-nodepool" }}
{{- $fix := "GKE Autopilot creates and names its node pools itself, so no node carries a pool name you chose: remove the key (gke.autopilot is true)" }}
{{- if hasKey (.Values.nodeSelector | default dict) $pool }}
{{- fail (printf "nodeSelector[%s]: %s" $pool $fix) }}
{{- end }}
{{- range .Values.kueue.flavors }}
{{- if hasKey (.nodeLabels | default dict) $pool }}
{{- fail (printf "kueue.flavors[%s].nodeLabels[%s]: %s" .name $pool $fix) }}
{{- end }}
{{- end }}
{{- if gt (int .Values.tpu.spotGraceSeconds) 25 }}
{{- fail (printf "tpu.spotGraceSeconds: %v is more than GKE Autopilot gives a Spot Pod on preemption (25 s): set at most 25 (gke.autopilot is true)" .Values.tpu.spotGraceSeconds) }}
{{- end }}
{{- if hasKey (.Values.kueue.cpuFlavor.nodeLabels | default dict) $pool }}
{{- fail (printf "kueue.cpuFlavor.nodeLabels[%s]: %s" $pool $fix) }}
{{- end }}
{{- end }}
{{- end }}
