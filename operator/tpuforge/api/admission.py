"""The rules the apiserver checks at admission: CEL `x-kubernetes-validations` that `tpuforge.crds` puts on
the schema of each model below, so `kubectl apply` refuses a spec that cannot run and names the field
(`spec.tpu.mesh: Invalid value: fsdp x tp must equal ...`).

They are the cross-field checks of validation.py and serving_validation.py that need no catalog lookup, or only
the slice catalog's chip counts, small enough to inline in a rule. The operator keeps every check (it also
reads objects stored before a rule existed), and alone does those that need the model catalog (head counts,
LoRA targets) or quantities (resources against a host).

How the apiserver evaluates a rule: `self` is the object of the model the rule is on, after defaulting, so a
field with a default is always there and an optional one is read behind has(). A rule that iterates a list
needs the list's maxItems (the models' max_length), or the apiserver's cost estimate refuses the CRD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.code_eval import PASS_AT_K, CodeEvalSpec
from tpuforge.api.constants import CPU_SLICE, GKE_SPOT, GKE_TPU_ACCELERATOR, GKE_TPU_TOPOLOGY, INSTANCE_TYPE
from tpuforge.api.finetune import DatasetRef, EvaluationSpec, FineTuneJobSpec, ModelRef, TpuSpec, TrainingSpec
from tpuforge.api.scheduling import PodScheduling, Toleration
from tpuforge.api.serving import (
    AdapterSource,
    LoraServingSpec,
    ModelStorageSpec,
    ServingDeploymentSpec,
    ServingModel,
    ServingTpu,
    XlaCacheSpec,
)

# The field error the apiserver reports: "Invalid value" or "Required value", each followed by the message.
# (FieldValueDuplicate would drop the message, so duplicates are reported as invalid.)
Reason = Literal["FieldValueInvalid", "FieldValueRequired"]


@dataclass(frozen=True)
class AdmissionRule:
    rule: str  # CEL over `self`, the model's object; true when the object is valid
    message: str  # after the field in the error; says what to change
    field_path: str = ""  # the field the error names, relative to the object (".mesh.tp"); empty: the object
    reason: Reason = "FieldValueInvalid"

    def to_schema(self) -> dict[str, str]:
        """The rule as it stands in `x-kubernetes-validations`."""
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        out["reason"] = self.reason
        return out


def _cel_map(entries: dict[str, int]) -> str:
    return "{" + ", ".join(f"'{key}': {value}" for key, value in entries.items()) + "}"


def _cel_list(items: list[str]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def _listing(entries: dict[str, int]) -> str:
    return ", ".join(f"{key}: {value}" for key, value in entries.items())


def _cel_str_map(entries: dict[str, str]) -> str:
    return "{" + ", ".join(f"'{key}': '{value}'" for key, value in entries.items()) + "}"


SLICE_CHIPS = {s.id: s.chips for s in TPU_SLICES.values()}
SLICE_CHIPS_PER_HOST = {s.id: s.chips_per_host for s in TPU_SLICES.values()}
MULTI_HOST_SLICES = [s.id for s in TPU_SLICES.values() if s.hosts > 1]
SINGLE_HOST_SLICES = [s.id for s in TPU_SLICES.values() if s.hosts == 1]


def _owned_label(key: str, values: dict[str, str]) -> str:
    """The slice's value of node label `key`, where the spec's scheduling.nodeSelector names it."""
    sel = "self.scheduling.nodeSelector"
    return (
        f"(!(self.slice in {_cel_str_map(values)}) || !('{key}' in {sel}) || {sel}['{key}'] == "
        f"{_cel_str_map(values)}[self.slice])"
    )


# The node labels the operator sets for a TPU pod (tpuforge.api.scheduling.owned_labels): the spec's
# scheduling.nodeSelector may repeat them, not contradict them.
_SLICE_LABELS = " && ".join(
    _owned_label(key, values)
    for key, values in (
        (GKE_TPU_ACCELERATOR, {s.id: s.accelerator for s in TPU_SLICES.values()}),
        (GKE_TPU_TOPOLOGY, {s.id: s.topology for s in TPU_SLICES.values()}),
        (INSTANCE_TYPE, {s.id: s.machine_type for s in TPU_SLICES.values() if s.hosts == 1}),
    )
)
# The same three rules on a FineTuneJob's spec.tpu and a ServingDeployment's.
TPU_SCHEDULING_RULES = (
    AdmissionRule(
        _SLICE_LABELS,
        "contradicts the node labels of spec.tpu.slice (its accelerator, topology or machine type): remove the key, "
        "which the operator sets from spec.tpu.slice, or change spec.tpu.slice",
        ".scheduling.nodeSelector",
    ),
    AdmissionRule(
        f"!('{GKE_SPOT}' in self.scheduling.nodeSelector) || "
        f"(self.spot && self.scheduling.nodeSelector['{GKE_SPOT}'] == 'true')",
        f"{GKE_SPOT} is the operator's: remove it and set spec.tpu.spot, which also tolerates the Spot taint",
        ".scheduling.nodeSelector",
    ),
    AdmissionRule(
        "!self.spot || (!has(self.scheduling.reservation) && !self.scheduling.flexStart)",
        "Spot VMs consume no reservation and are not flex-start capacity: remove scheduling.reservation and "
        "scheduling.flexStart, or set spec.tpu.spot: false",
        ".scheduling",
    ),
)


ADMISSION_RULES: dict[type[BaseModel], tuple[AdmissionRule, ...]] = {
    FineTuneJobSpec: (
        # (A URI with a trailing slash may slip through here; the operator's check strips it.)
        AdmissionRule(
            "!(self.output.uri + '/').startsWith(self.checkpoint.uri + '/') && "
            "!(self.checkpoint.uri + '/').startsWith(self.output.uri + '/')",
            "must not be inside spec.checkpoint.uri or contain it; use sibling directories",
            ".output.uri",
        ),
        AdmissionRule(
            "!has(self.evaluation) || self.merge.writeAdapter",
            "must be true when spec.evaluation is set: the evaluation serves the exported adapter with vLLM",
            ".merge.writeAdapter",
        ),
        AdmissionRule(
            "!has(self.evaluation) || has(self.evaluation.datasetUri) || has(self.dataset.evalUri) || "
            "(has(self.dataset.evalFraction) && self.dataset.evalFraction > 0.0)",
            "the evaluation needs held-out records: set spec.evaluation.datasetUri or spec.dataset.evalUri, or "
            "spec.dataset.evalFraction",
            ".evaluation.datasetUri",
            "FieldValueRequired",
        ),
        AdmissionRule(
            "self.checkpoint.select != 'best' || has(self.dataset.evalUri) || "
            "(has(self.dataset.evalFraction) && self.dataset.evalFraction > 0.0)",
            "best picks the step with the lowest in-training eval loss, which needs held-out records: set "
            "spec.dataset.evalUri or spec.dataset.evalFraction, or use select: last",
            ".checkpoint.select",
        ),
        AdmissionRule(
            "!has(self.training.earlyStopping) || has(self.dataset.evalUri) || "
            "(has(self.dataset.evalFraction) && self.dataset.evalFraction > 0.0)",
            "early stopping follows the in-training eval loss, which needs held-out records: set "
            "spec.dataset.evalUri or spec.dataset.evalFraction, or remove spec.training.earlyStopping",
            ".training.earlyStopping",
        ),
        AdmissionRule(
            "!has(self.training.earlyStopping) || self.checkpoint.select == 'best' || !(has(self.dataset.evalUri) || "
            "(has(self.dataset.evalFraction) && self.dataset.evalFraction > 0.0))",
            "must be best with spec.training.earlyStopping: early stopping ends training patience evaluations after "
            "the best step, and select: last would export the step it stopped at instead",
            ".checkpoint.select",
        ),
        AdmissionRule(
            "self.method == 'grpo' || !has(self.grpo)",
            "configures reinforcement learning, and spec.method is not grpo: set spec.method: grpo (with records "
            "that carry a test), or remove spec.grpo",
            ".grpo",
        ),
        AdmissionRule(
            "self.method != 'grpo' || !has(self.grpo) || self.grpo.maxTokens < self.training.maxSeqLen",
            "leaves no room for the prompt: each sampled answer and its prompt share a row of "
            "spec.training.maxSeqLen tokens; lower grpo.maxTokens or raise training.maxSeqLen",
            ".grpo.maxTokens",
        ),
        AdmissionRule(
            "self.method in ['dpo', 'orpo'] || !has(self.preference)",
            "configures the dpo and orpo losses, and spec.method is neither: set spec.method: dpo or orpo (with "
            "preference records), or remove spec.preference",
            ".preference",
        ),
        AdmissionRule(
            "self.method == 'sft' || !self.training.packing",
            "dpo, orpo and grpo score each answer in a row of its own: set packing: false",
            ".training.packing",
        ),
        AdmissionRule(
            "self.method == 'sft' || self.training.lossOn == 'assistant'",
            "dpo, orpo and grpo score the answers only: set lossOn: assistant",
            ".training.lossOn",
        ),
        AdmissionRule(
            "self.method != 'orpo' || !has(self.preference) || self.preference.labelSmoothing == 0.0",
            "applies to dpo only (orpo has no reference model to smooth against): remove it or set 0",
            ".preference.labelSmoothing",
        ),
        AdmissionRule(
            "self.method in ['sft', 'grpo'] || !has(self.evaluation) || has(self.evaluation.datasetUri)",
            "the evaluation scores chat or prompt/completion records, and with method dpo or orpo the job's dataset "
            "holds preference records: give spec.evaluation.datasetUri, a file of records to score",
            ".evaluation.datasetUri",
            "FieldValueRequired",
        ),
        AdmissionRule(
            "self.method in ['dpo', 'orpo'] || !has(self.evaluation) || "
            "!('preferenceAccuracy' in self.evaluation.metrics)",
            "preferenceAccuracy ranks the answers of preference pairs, which only spec.method dpo and orpo train "
            "on: set spec.method: dpo or orpo, or remove preferenceAccuracy from spec.evaluation.metrics",
            ".evaluation.metrics",
        ),
        AdmissionRule(
            "!has(self.evaluation) || !('preferenceAccuracy' in self.evaluation.metrics) || has(self.dataset.evalUri) "
            "|| (has(self.dataset.evalFraction) && self.dataset.evalFraction > 0.0)",
            "preferenceAccuracy is scored on held-out preference pairs: set spec.dataset.evalUri (a file of pairs) "
            "or spec.dataset.evalFraction, or remove preferenceAccuracy from spec.evaluation.metrics",
            ".evaluation.metrics",
        ),
    ),
    TpuSpec: (
        AdmissionRule(
            f"!has(self.mesh) || !(self.slice in {_cel_map(SLICE_CHIPS)}) || "
            f"self.mesh.fsdp * self.mesh.tp == {_cel_map(SLICE_CHIPS)}[self.slice]",
            f"fsdp x tp must equal the chips of spec.tpu.slice ({_listing(SLICE_CHIPS)}); or leave the mesh out "
            "for the slice's default",
            ".mesh",
        ),
        AdmissionRule(
            f"!has(self.mesh) || !(self.slice in {_cel_map(SLICE_CHIPS_PER_HOST)}) || "
            f"self.mesh.tp <= {_cel_map(SLICE_CHIPS_PER_HOST)}[self.slice]",
            "tensor parallelism across hosts would stall every step: tp must be at most the chips of one host of "
            f"spec.tpu.slice ({_listing(SLICE_CHIPS_PER_HOST)}), and fsdp spans the hosts",
            ".mesh.tp",
        ),
        *TPU_SCHEDULING_RULES,
    ),
    ModelRef: (
        AdmissionRule(
            "has(self.uri) != has(self.fineTuneJobRef)",
            "set exactly one of spec.model.uri and spec.model.fineTuneJobRef",
        ),
    ),
    DatasetRef: (
        AdmissionRule(
            "!has(self.evalUri) || !has(self.evalFraction) || self.evalFraction == 0.0",
            "holds records out of spec.dataset.uri, but spec.dataset.evalUri already names the held-out records: "
            "set one of them",
            ".evalFraction",
        ),
    ),
    TrainingSpec: (
        AdmissionRule(
            "!has(self.maxSteps) || self.warmupSteps < self.maxSteps",
            "the warmup must be shorter than maxSteps",
            ".warmupSteps",
        ),
    ),
    EvaluationSpec: (
        AdmissionRule(
            "!has(self.thresholds.maxLoss) || 'loss' in self.metrics",
            "needs the loss metric: add loss to spec.evaluation.metrics or remove the threshold",
            ".thresholds.maxLoss",
        ),
        AdmissionRule(
            "!has(self.thresholds.minExactMatch) || 'exactMatch' in self.metrics",
            "needs the exactMatch metric: add exactMatch to spec.evaluation.metrics or remove the threshold",
            ".thresholds.minExactMatch",
        ),
        AdmissionRule(
            "!has(self.thresholds.minPreferenceAccuracy) || 'preferenceAccuracy' in self.metrics",
            "needs the preferenceAccuracy metric: add preferenceAccuracy to spec.evaluation.metrics or remove the "
            "threshold",
            ".thresholds.minPreferenceAccuracy",
        ),
        AdmissionRule(
            f"!('{PASS_AT_K}' in self.metrics) || has(self.code)",
            f"the {PASS_AT_K} metric samples answers and runs them with a checker: set spec.evaluation.code, or "
            f"remove {PASS_AT_K} from spec.evaluation.metrics",
            ".code",
            "FieldValueRequired",
        ),
        AdmissionRule(
            f"!has(self.code) || '{PASS_AT_K}' in self.metrics",
            f"spec.evaluation.code is set but the metrics leave out {PASS_AT_K}: add it or remove spec.evaluation.code",
            ".metrics",
        ),
        # Each key is a measured k exactly when there are as many k with a key as keys (a k listed twice, which
        # CodeEvalSpec's rule refuses, can only add to the count). Map lookups keep the cost estimate low;
        # comparing the keys' strings would not.
        AdmissionRule(
            "!has(self.thresholds.minPassAt) || size(self.thresholds.minPassAt) <= "
            "(has(self.code) ? self.code.k.filter(k, string(k) in self.thresholds.minPassAt).size() : 0)",
            "holds a pass@k that is not measured: each key must be one of spec.evaluation.code.k (with "
            f"{PASS_AT_K} in spec.evaluation.metrics)",
            ".thresholds.minPassAt",
        ),
        AdmissionRule(
            f"!(self.slice in {_cel_list(MULTI_HOST_SLICES)})",
            f"spans several hosts and the evaluation runs one vLLM server; use {CPU_SLICE} or one of "
            f"{', '.join(SINGLE_HOST_SLICES)}",
            ".slice",
        ),
    ),
    CodeEvalSpec: (
        AdmissionRule(
            "has(self.checker)",
            "the image and command that run each sample against its test (exit 0 = pass)",
            ".checker",
            "FieldValueRequired",
        ),
        AdmissionRule(
            "self.k.all(k, k >= 1 && k <= self.samplesPerProblem)",
            "pass@k needs at least k samples per problem: each k must be between 1 and samplesPerProblem",
            ".k",
        ),
        AdmissionRule(
            "self.k.all(k, self.k.exists_one(other, other == k))",
            "lists a k twice; list each once",
            ".k",
        ),
    ),
    ServingDeploymentSpec: (
        AdmissionRule(
            "self.adapters.all(a, self.adapters.exists_one(other, other.name == a.name))",
            "two adapters have the same name; give each its own",
            ".adapters",
        ),
        AdmissionRule(
            "!has(self.vllm.servedModelName) || self.adapters.all(a, a.name != self.vllm.servedModelName)",
            "an adapter has the base model's name (spec.vllm.servedModelName); give the adapter another name",
            ".adapters",
        ),
        # Each replica holds a whole TPU VM, so replicas run on different nodes, and a ReadWriteOnce disk
        # attaches to one node at a time.
        # A streamed model's pods mount no ReadWriteOnce disk: a ReadWriteOnce cache is then the node's own.
        AdmissionRule(
            "self.replicas <= 1 || self.xlaCache.accessMode == 'ReadWriteMany' || self.modelStorage.medium == 'Stream'",
            "replicas > 1 run on as many TPU VMs and a ReadWriteOnce disk attaches to one: set ReadWriteMany with "
            "a storageClassName that provides it (Filestore), stream the model (modelStorage.medium Stream), or "
            "use replicas: 1",
            ".xlaCache.accessMode",
        ),
        AdmissionRule(
            "self.replicas <= 1 || self.modelStorage.medium != 'Disk'",
            "replicas > 1 cannot share one model disk (ReadWriteOnce); use Stream (no model volume) or NodeLocal, or "
            "replicas: 1",
            ".modelStorage.medium",
        ),
        AdmissionRule(
            f"!(self.tpu.slice in {_cel_map(SLICE_CHIPS)}) || "
            f"{_cel_map(SLICE_CHIPS)}[self.tpu.slice] % self.vllm.tensorParallelSize == 0",
            f"must divide the chips of spec.tpu.slice ({_listing(SLICE_CHIPS)})",
            ".vllm.tensorParallelSize",
        ),
    ),
    ServingModel: (
        AdmissionRule(
            "has(self.uri) != has(self.fineTuneJobRef)",
            "set exactly one of spec.model.uri and spec.model.fineTuneJobRef",
        ),
    ),
    AdapterSource: (
        AdmissionRule(
            "has(self.uri) != has(self.fineTuneJobRef)",
            "set exactly one of uri and fineTuneJobRef",
        ),
    ),
    ServingTpu: (
        AdmissionRule(
            f"!(self.slice in {_cel_list(MULTI_HOST_SLICES)})",
            f"spans several hosts and one vLLM server runs on one host; use one of {', '.join(SINGLE_HOST_SLICES)}",
            ".slice",
        ),
        *TPU_SCHEDULING_RULES,
    ),
    XlaCacheSpec: (
        AdmissionRule(
            "self.accessMode != 'ReadWriteMany' || has(self.storageClassName)",
            "required with accessMode ReadWriteMany: the default class (Hyperdisk Balanced) attaches to one node at "
            "a time; name a class that many nodes mount (e.g. Filestore's standard-rwx)",
            ".storageClassName",
            "FieldValueRequired",
        ),
    ),
    ModelStorageSpec: (
        AdmissionRule(
            "self.medium != 'HyperdiskML' || has(self.storageClassName)",
            "required with medium HyperdiskML: a class of type hyperdisk-ml (the chart's storage.hyperdiskML)",
            ".storageClassName",
            "FieldValueRequired",
        ),
        AdmissionRule(
            "(self.medium == 'HyperdiskML') == has(self.dataSource)",
            "the GCPDataSource that fills the model volume: required with medium HyperdiskML, and only there",
            ".dataSource",
        ),
        AdmissionRule(
            "self.medium != 'Stream' || !has(self.size)",
            "a streamed model (medium Stream, the default) has no volume to size: remove size, or set medium Disk, "
            "NodeLocal or HyperdiskML",
            ".size",
        ),
        AdmissionRule(
            "self.medium != 'Stream' || !has(self.storageClassName)",
            "a streamed model (medium Stream, the default) has no volume: remove storageClassName, or set medium "
            "Disk, NodeLocal or HyperdiskML",
            ".storageClassName",
        ),
    ),
    PodScheduling: (
        AdmissionRule(
            "!has(self.reservation) || !self.flexStart",
            "reservation and flexStart are different kinds of capacity; set one of them",
        ),
    ),
    Toleration: (
        AdmissionRule(
            "self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "a toleration with operator Exists takes no value; remove value or use Equal",
        ),
        AdmissionRule(
            "self.operator != 'Equal' || has(self.key)",
            "a toleration with operator Equal needs a key; set key, or use Exists for every taint",
        ),
        AdmissionRule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds applies to effect NoExecute only; set that effect or remove it",
        ),
    ),
    LoraServingSpec: (
        AdmissionRule(
            "!has(self.maxCpuLoras) || self.maxCpuLoras >= self.maxLoras",
            "vLLM needs maxCpuLoras >= maxLoras",
            ".maxCpuLoras",
        ),
    ),
}


__all__ = ["ADMISSION_RULES", "TPU_SCHEDULING_RULES", "AdmissionRule"]
