"""Semantic validation beyond the CRD schema, and the FineTuneJob's rules. Every error names the field and the
fix. The ServingDeployment's rules are in serving_validation; those the apiserver can check on its own are also
CEL rules in the CRDs (admission)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from tpuforge.api.base import PodResources
from tpuforge.api.catalog import MODELS, TPU_SLICES, ModelShape, Stage, TpuSlice, model_shape, tpu_slice
from tpuforge.api.code_eval import CHECK_RUNNER_MEMORY, MIN_SAMPLE_MEMORY, PASS_AT_K
from tpuforge.api.constants import CPU_SLICE
from tpuforge.api.finetune import PREFERENCE_ACCURACY, PREFERENCE_METHODS, EvaluationSpec, FineTuneJobSpec, MeshSpec
from tpuforge.api.labels import label_errors, label_value_problem
from tpuforge.api.quantization import contracted_sizes, tile_size
from tpuforge.api.resources import quantity, resource_errors, tpu_server_requests, trainer_requests
from tpuforge.api.scheduling import PodScheduling, scheduling_errors

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class FieldError:
    field: str  # e.g. spec.tpu.mesh.tp
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecError(ValueError):
    """A spec that cannot run. `errors` lists every problem found, each naming its field."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))

    @property
    def fields(self) -> list[str]:
        return [e.field for e in self.errors]


def _alias_path(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """Pydantic's error location, rendered with the wire (camelCase) names."""
    parts: list[str] = []
    current: Any = model
    for item in loc:
        if isinstance(item, int):
            parts[-1] = f"{parts[-1]}[{item}]" if parts else f"[{item}]"
            continue
        name = str(item)
        fields = getattr(current, "model_fields", None)
        if fields and name in fields:
            info = fields[name]
            parts.append(info.alias or name)
            ann = info.annotation
            current = _model_in(ann)
        else:
            parts.append(name)
            current = None
    return ".".join(parts)


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def parse(model: type[M], raw: Any, root: str = "spec") -> M:
    """Parse a wire object into `model`, turning pydantic's errors into FieldErrors under `root`."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = []
        for err in exc.errors():
            path = _alias_path(model, tuple(err["loc"]))
            field = f"{root}.{path}" if path else root
            msg = err["msg"]
            if err["type"] == "missing":
                msg = "is required"
            elif err["type"] == "extra_forbidden":
                msg = "is not a known field (check its spelling and nesting)"
            errors.append(FieldError(field, msg))
        raise SpecError(errors) from None


def check_uri(errors: list[FieldError], field: str, uri: str | None) -> None:
    if uri is None:
        return
    if not uri.startswith("gs://") or len(uri) <= len("gs://") or uri[len("gs://")] == "/":
        errors.append(FieldError(field, f"must be a gs:// URI such as gs://my-bucket/path (got {uri!r})"))


LOCAL_PREFIX = "file://"


def is_local_path(uri: str) -> bool:
    """A local file: file:///abs/path or /abs/path."""
    return uri.startswith(LOCAL_PREFIX) or uri.startswith("/")


def check_data_uri(errors: list[FieldError], field: str, uri: str | None, local_paths: bool) -> None:
    """A dataset file: gs://, or a local path where the operator allows them (--local-dataset-paths: the
    sandbox, whose pods are processes on the machine that has the file)."""
    if uri is None or not is_local_path(uri):
        check_uri(errors, field, uri)
        return
    path = uri[len(LOCAL_PREFIX) :] if uri.startswith(LOCAL_PREFIX) else uri
    if not local_paths:
        errors.append(
            FieldError(
                field,
                f"{uri!r} is a local path, which only the sandbox's pods (local processes) can read; on a cluster the "
                "training and evaluation pods see only GCS: upload the file and use its gs:// URI",
            )
        )
    elif not path.startswith("/"):
        errors.append(FieldError(field, f"a local path must be absolute, like file:///data/train.jsonl (got {uri!r})"))


def _divides_heads(errors: list[FieldError], field: str, tp: int, shape: ModelShape) -> None:
    counts = {
        "query heads": shape.num_heads,
        "kv heads": shape.num_kv_heads,
        "global kv heads": shape.num_global_kv_heads,
    }
    bad = {k: v for k, v in counts.items() if v % tp}
    if bad:
        fits = sorted(d for d in range(1, shape.num_heads + 1) if all(v % d == 0 for v in counts.values()))
        what = ", ".join(f"{v} {k}" for k, v in bad.items())
        errors.append(
            FieldError(
                field,
                f"tp={tp} does not divide {shape.id}'s {what}; use one of {fits}",
            )
        )


def unsupported_stage(field: str, shape: ModelShape, stage: Stage) -> FieldError:
    """A catalog model that tpuforge does not yet run through `stage`: why, and the models that it does."""
    able = sorted(m.id for m in MODELS.values() if m.supports(stage))
    what = {"finetune": "fine-tuning (FineTuneJob)", "serve": "serving (ServingDeployment)"}[stage]
    return FieldError(
        field,
        f"{shape.id} is in the model catalog, but {what} is not supported for it yet: {shape.unsupported_because}; "
        f"use one of {able}",
    )


def resolved_mesh(spec: FineTuneJobSpec) -> MeshSpec:
    """The mesh the job runs on: the spec's, or the slice's default."""
    if spec.tpu.mesh is not None:
        return spec.tpu.mesh
    s = tpu_slice(spec.tpu.slice)
    return MeshSpec(fsdp=s.default_fsdp, tp=s.default_tp)


def check_finetune(spec: FineTuneJobSpec, local_paths: bool = False) -> list[FieldError]:
    """Every semantic problem with a FineTuneJob spec (empty when it can run). `local_paths`: the pods can read
    local dataset files (the sandbox)."""
    errors: list[FieldError] = []
    shape: ModelShape | None = MODELS.get(spec.model.name)
    if shape is None:
        errors.append(FieldError("spec.model.name", f"unknown model; use one of {sorted(MODELS)}"))
    elif not shape.supports("finetune"):
        errors.append(unsupported_stage("spec.model.name", shape, "finetune"))
        shape = None  # its mesh, LoRA targets and evaluation are moot until it trains
    slc: TpuSlice | None = TPU_SLICES.get(spec.tpu.slice)
    if slc is None:
        errors.append(FieldError("spec.tpu.slice", f"unknown TPU slice; use one of {sorted(TPU_SLICES)}"))
    if not spec.service_account_name:
        errors.append(
            FieldError(
                "spec.serviceAccountName",
                "required: the ServiceAccount the job's pods run as, one that may read spec.model.uri and "
                "spec.dataset.uri and write spec.checkpoint.uri and spec.output.uri (on GKE, a Kubernetes "
                "ServiceAccount allowed on those buckets through Workload Identity; the namespace's `default` "
                "account is not)",
            )
        )
    check_uri(errors, "spec.model.uri", spec.model.uri)
    check_data_uri(errors, "spec.dataset.uri", spec.dataset.uri, local_paths)
    check_data_uri(errors, "spec.dataset.evalUri", spec.dataset.eval_uri, local_paths)
    if spec.dataset.eval_uri is not None and spec.dataset.eval_fraction > 0:
        errors.append(
            FieldError(
                "spec.dataset.evalFraction",
                "holds records out of spec.dataset.uri, but spec.dataset.evalUri already names the held-out "
                "records: set one of them",
            )
        )
    check_uri(errors, "spec.checkpoint.uri", spec.checkpoint.uri)
    check_uri(errors, "spec.output.uri", spec.output.uri)
    ck, out = spec.checkpoint.uri.rstrip("/") + "/", spec.output.uri.rstrip("/") + "/"
    if ck.startswith(out) or out.startswith(ck):
        errors.append(
            FieldError("spec.output.uri", "must not be inside spec.checkpoint.uri or contain it; use siblings")
        )

    if slc is not None and shape is not None:
        mesh = resolved_mesh(spec)
        field = "spec.tpu.mesh" if spec.tpu.mesh else "spec.tpu.slice"
        if mesh.fsdp * mesh.tp != slc.chips:
            errors.append(
                FieldError(
                    field,
                    f"mesh fsdp={mesh.fsdp} x tp={mesh.tp} = {mesh.fsdp * mesh.tp} devices, but {slc.id} has "
                    f"{slc.chips} chips; make fsdp x tp = {slc.chips}",
                )
            )
        if mesh.tp > slc.chips_per_host:
            # Tensor parallelism all-reduces activations inside every layer: over ICI within one host it is
            # cheap, across hosts it would stall every step. FSDP is the axis that spans hosts.
            errors.append(
                FieldError(
                    "spec.tpu.mesh.tp",
                    f"tp={mesh.tp} spans more than one host of {slc.id} ({slc.chips_per_host} chips per host), and "
                    f"tensor parallelism across hosts would stall every step; use tp <= {slc.chips_per_host} and "
                    f"fsdp = {slc.chips} / tp (e.g. fsdp={slc.default_fsdp}, tp={slc.default_tp})",
                )
            )
        _divides_heads(errors, "spec.tpu.mesh.tp", mesh.tp, shape)
    if shape is not None:
        unknown = [m for m in spec.lora.target_modules if m not in shape.lora_targets]
        if unknown:
            errors.append(
                FieldError(
                    "spec.lora.targetModules",
                    f"{unknown} are not {shape.family} modules; choose from {list(shape.lora_targets)}",
                )
            )
        _check_base_quantization(errors, spec.lora.base_quantization, shape)
    t = spec.training
    if t.max_steps is not None and t.warmup_steps >= t.max_steps:
        errors.append(
            FieldError(
                "spec.training.warmupSteps",
                f"warmup ({t.warmup_steps}) must be shorter than maxSteps ({t.max_steps})",
            )
        )
    _check_checkpoint_choice(errors, spec)
    _check_method(errors, spec)
    _check_preference_metric(errors, spec)
    default = trainer_requests(PodResources(), shape, slc.hosts) if shape and slc else None
    check_resources(errors, "spec.tpu.resources", spec.tpu.resources, slc, default)
    check_scheduling(errors, "spec.tpu.scheduling", spec.tpu.scheduling, slc, spec.tpu.spot, "spec.tpu.slice")
    own, top = spec.tpu.scheduling.priority_class_name, spec.priority_class_name
    if own and top and own != top:
        errors.append(
            FieldError(
                "spec.tpu.scheduling.priorityClassName",
                f"{own!r} differs from spec.priorityClassName {top!r}; both name the training pods' PriorityClass: "
                "keep one",
            )
        )
    check_resources(errors, "spec.merge.resources", spec.merge.resources, None)
    check_resources(errors, "spec.preflight.resources", spec.preflight.resources, None)
    _check_labels(errors, spec)
    _check_evaluation(errors, spec, shape, local_paths)
    return errors


def _check_base_quantization(errors: list[FieldError], quantization: str, shape: ModelShape) -> None:
    """int4 scales tiles of each contracted axis (quantization.tile_size): a model none of whose tiles divides
    every such axis cannot be built."""
    sizes = contracted_sizes(shape.embed_dim, shape.hidden_dim, (shape.head_dim, shape.global_head_dim))
    try:
        tile_size(quantization, sizes)
    except ValueError as e:
        errors.append(FieldError("spec.lora.baseQuantization", f"{e} ({shape.id}); use int8 or none"))


def _check_method(errors: list[FieldError], spec: FineTuneJobSpec) -> None:
    """dpo and orpo train on pairs of rows (a prompt with its chosen answer, the same prompt with its rejected
    one), scored on the answers alone; spec.preference is theirs. (Whether the records are preference records
    the trainer checks, naming the file and line.)"""
    method, pref = spec.method, spec.preference
    if method != "grpo" and spec.grpo is not None:
        errors.append(
            FieldError(
                "spec.grpo",
                "configures reinforcement learning, and spec.method is not grpo: set spec.method: grpo (with records "
                "that carry a test), or remove spec.grpo",
            )
        )
    if method not in PREFERENCE_METHODS and pref is not None:
        errors.append(
            FieldError(
                "spec.preference",
                "configures the dpo and orpo losses, and spec.method is neither: set spec.method: dpo or orpo "
                "(with preference records), or remove spec.preference",
            )
        )
    if method == "sft":
        return
    if method == "grpo" and spec.grpo is not None and spec.grpo.max_tokens >= spec.training.max_seq_len:
        errors.append(
            FieldError(
                "spec.grpo.maxTokens",
                "leaves no room for the prompt: each sampled answer and its prompt share a row of "
                "spec.training.maxSeqLen tokens; lower grpo.maxTokens or raise training.maxSeqLen",
            )
        )
    if method == "grpo" and spec.grpo is not None:
        for field, q in (("cpu", spec.grpo.checker.cpu), ("memory", spec.grpo.checker.memory)):
            if not is_quantity(q):
                errors.append(FieldError(f"spec.grpo.checker.{field}", f"must be a Kubernetes quantity (got {q!r})"))
    if spec.training.packing:
        errors.append(
            FieldError(
                "spec.training.packing",
                "dpo, orpo and grpo score each answer in a row of its own: set packing: false",
            )
        )
    if spec.training.loss_on != "assistant":
        errors.append(
            FieldError(
                "spec.training.lossOn",
                "dpo, orpo and grpo score the answers only: set lossOn: assistant",
            )
        )
    if method == "orpo" and pref is not None and pref.label_smoothing:
        errors.append(
            FieldError(
                "spec.preference.labelSmoothing",
                "applies to dpo only (orpo has no reference model to smooth against); remove it or set 0",
            )
        )
    ev = spec.evaluation
    if method in PREFERENCE_METHODS and ev is not None and ev.dataset_uri is None:
        errors.append(
            FieldError(
                "spec.evaluation.datasetUri",
                f"the evaluation scores chat or prompt/completion records, and with method {method} the job's "
                "dataset holds preference records: give spec.evaluation.datasetUri, a file of records to score",
            )
        )


def _check_preference_metric(errors: list[FieldError], spec: FineTuneJobSpec) -> None:
    """preferenceAccuracy: a preference job's metric, scored on its held-out pairs."""
    ev = spec.evaluation
    if ev is None or PREFERENCE_ACCURACY not in ev.metrics:
        return
    if spec.method not in PREFERENCE_METHODS:
        errors.append(
            FieldError(
                "spec.evaluation.metrics",
                "preferenceAccuracy ranks the answers of preference pairs, which only spec.method dpo and orpo train "
                "on: set spec.method: dpo or orpo, or remove preferenceAccuracy from spec.evaluation.metrics",
            )
        )
    if spec.dataset.eval_uri is None and spec.dataset.eval_fraction == 0:
        errors.append(
            FieldError(
                "spec.evaluation.metrics",
                "preferenceAccuracy is scored on held-out preference pairs: set spec.dataset.evalUri (a file of "
                "pairs) or spec.dataset.evalFraction, or remove preferenceAccuracy from spec.evaluation.metrics",
            )
        )


def _check_labels(errors: list[FieldError], spec: FineTuneJobSpec) -> None:
    """The labels the job's children carry from its spec (the scheduling blocks' are scheduling_errors')."""
    for field, selector in (
        ("spec.merge.nodeSelector", spec.merge.node_selector),
        ("spec.preflight.nodeSelector", spec.preflight.node_selector),
    ):
        errors.extend(FieldError(f, m) for f, m in label_errors(field, selector))
    problem = label_value_problem(spec.queue_name) if spec.queue_name else None
    if problem:
        errors.append(FieldError("spec.queueName", f"{problem}; it is written as label kueue.x-k8s.io/queue-name"))


def _check_checkpoint_choice(errors: list[FieldError], spec: FineTuneJobSpec) -> None:
    """select: best and early stopping both follow the in-training eval loss: they need the eval set, and early
    stopping needs more evaluations than its patience."""
    held_out = "set spec.dataset.evalUri (records held out from training) or spec.dataset.evalFraction"
    no_eval_set = spec.dataset.eval_uri is None and not spec.dataset.eval_fraction
    if spec.checkpoint.select == "best" and no_eval_set:
        errors.append(
            FieldError(
                "spec.checkpoint.select",
                "best picks the step with the lowest in-training eval loss, and without held-out records there is "
                f"none: {held_out}, or use select: last",
            )
        )
    stopping = spec.training.early_stopping
    if stopping is None:
        return
    if no_eval_set:
        errors.append(
            FieldError(
                "spec.training.earlyStopping",
                f"early stopping follows the in-training eval loss, and without held-out records there is none: "
                f"{held_out}, or remove spec.training.earlyStopping",
            )
        )
    if spec.checkpoint.select != "best" and not no_eval_set:  # without an eval set, the error above says it
        errors.append(
            FieldError(
                "spec.checkpoint.select",
                f"must be best with spec.training.earlyStopping: early stopping ends training {stopping.patience} "
                f"evaluation(s) after the best step, and select: {spec.checkpoint.select} would export the step it "
                "stopped at instead; set spec.checkpoint.select: best",
            )
        )
    max_steps, every = spec.training.max_steps, spec.checkpoint.every_steps
    if max_steps is not None and max_steps // every <= stopping.patience:
        errors.append(
            FieldError(
                "spec.training.earlyStopping.patience",
                f"training evaluates every spec.checkpoint.everySteps ({every}) steps, {max_steps // every} times in "
                f"maxSteps {max_steps}, so a patience of {stopping.patience} can never stop it early: lower the "
                "patience or checkpoint.everySteps",
            )
        )


def _check_evaluation(
    errors: list[FieldError], spec: FineTuneJobSpec, shape: ModelShape | None, local_paths: bool
) -> None:
    ev = spec.evaluation
    if ev is None:
        return
    if not spec.merge.write_adapter:
        # The evaluation serves the base with the adapter under vLLM: it needs the exported PEFT adapter.
        what = "an adapter-only job" if not spec.merge.enabled else "a merged model and its adapter"
        errors.append(
            FieldError(
                "spec.merge.writeAdapter",
                "must be true when spec.evaluation is set: the evaluation serves the exported adapter with vLLM; "
                f"set spec.merge.writeAdapter: true (with spec.merge.enabled: {str(spec.merge.enabled).lower()} "
                f"for {what})",
            )
        )
    if ev.dataset_uri is None and spec.dataset.eval_uri is None and spec.dataset.eval_fraction == 0:
        errors.append(
            FieldError(
                "spec.evaluation.datasetUri",
                "the evaluation needs held-out records: set spec.evaluation.datasetUri or spec.dataset.evalUri "
                "(a gs:// file of records), or spec.dataset.evalFraction to hold some out of spec.dataset.uri",
            )
        )
    check_data_uri(errors, "spec.evaluation.datasetUri", ev.dataset_uri, local_paths)
    t = ev.thresholds
    for threshold, metric, value in (
        ("maxLoss", "loss", t.max_loss),
        ("minExactMatch", "exactMatch", t.min_exact_match),
        ("minPreferenceAccuracy", PREFERENCE_ACCURACY, t.min_preference_accuracy),
    ):
        if value is not None and metric not in ev.metrics:
            errors.append(
                FieldError(
                    f"spec.evaluation.thresholds.{threshold}",
                    f"needs the {metric} metric, which spec.evaluation.metrics {list(ev.metrics)} leaves out; "
                    f"add {metric} to spec.evaluation.metrics or remove the threshold",
                )
            )
    _check_code(errors, ev)
    single = sorted(s.id for s in TPU_SLICES.values() if s.hosts == 1)
    slc = TPU_SLICES.get(ev.slice)
    if ev.slice != CPU_SLICE and (slc is None or slc.hosts > 1):
        why = f"{ev.slice} spans {slc.hosts} hosts and the evaluation runs one vLLM server" if slc else "unknown slice"
        errors.append(FieldError("spec.evaluation.slice", f"{why}; use cpu or one of {single}"))
    elif slc is not None and shape is not None and ("loss" in ev.metrics or PREFERENCE_ACCURACY in ev.metrics):
        # The loss runs the trainer's sharded forward pass on the slice's default mesh.
        _divides_heads(errors, "spec.evaluation.slice", slc.default_tp, shape)
    default = tpu_server_requests(PodResources(), shape) if shape and slc else None
    check_resources(errors, "spec.evaluation.resources", ev.resources, slc, default)
    size = ev.model_storage.size
    if size is not None and not is_quantity(size):
        errors.append(FieldError("spec.evaluation.modelStorage.size", f"{size!r} is not a size; e.g. 80Gi"))
    on_tpu = slc if ev.slice != CPU_SLICE else None
    check_scheduling(errors, "spec.evaluation.scheduling", ev.scheduling, on_tpu, False, "spec.evaluation.slice", None)
    check_scheduling(
        errors, "spec.evaluation", PodScheduling(node_selector=ev.node_selector), on_tpu, False, "spec.evaluation.slice"
    )
    for key, label in ev.node_selector.items():
        other = ev.scheduling.node_selector.get(key)
        if other is not None and other != label:
            errors.append(
                FieldError(
                    f"spec.evaluation.scheduling.nodeSelector[{key}]",
                    f"{other!r} differs from spec.evaluation.nodeSelector[{key}] {label!r}; keep one",
                )
            )


def check_scheduling(
    errors: list[FieldError],
    field: str,
    sched: PodScheduling,
    slc: TpuSlice | None,
    spot: bool,
    slice_field: str,
    spot_field: str | None = "spec.tpu.spot",
) -> None:
    """`sched` (at `field`) against what the operator sets for pods of `slc` (tpuforge.api.scheduling)."""
    errors.extend(FieldError(f, m) for f, m in scheduling_errors(field, sched, slc, spot, slice_field, spot_field))


def _check_code(errors: list[FieldError], ev: EvaluationSpec) -> None:
    """passAtK, spec.evaluation.code and thresholds.minPassAt agree with each other."""
    code, asked = ev.code, PASS_AT_K in ev.metrics
    if asked and code is None:
        errors.append(
            FieldError(
                "spec.evaluation.code",
                "the passAtK metric samples answers and runs them with a checker: set spec.evaluation.code with "
                "its checker (image and command), or remove passAtK from spec.evaluation.metrics",
            )
        )
    if code is not None and not asked:
        errors.append(
            FieldError(
                "spec.evaluation.metrics",
                f"spec.evaluation.code is set but the metrics {list(ev.metrics)} leave out passAtK; add passAtK "
                "or remove spec.evaluation.code",
            )
        )
    if code is not None and code.checker is None:
        errors.append(
            FieldError(
                "spec.evaluation.code.checker",
                "is required: the image and command that run each sample against its test (exit 0 = pass), "
                "e.g. the Verilog checker in docs/ml-engineer.md",
            )
        )
    if code is not None:
        n = code.samples_per_problem
        for i, k in enumerate(code.k):
            if not 1 <= k <= n:
                errors.append(
                    FieldError(
                        f"spec.evaluation.code.k[{i}]",
                        f"pass@{k} needs at least {k} samples per problem but samplesPerProblem is {n}; raise "
                        f"samplesPerProblem to {max(k, 1)} or drop this k",
                    )
                )
        if len(set(code.k)) != len(code.k):
            errors.append(FieldError("spec.evaluation.code.k", f"lists a k twice ({code.k}); list each once"))
        if code.checker is not None:
            for field, q in (("cpu", code.checker.cpu), ("memory", code.checker.memory)):
                if not is_quantity(q):
                    errors.append(
                        FieldError(
                            f"spec.evaluation.code.checker.{field}", f"must be a Kubernetes quantity (got {q!r})"
                        )
                    )
            if is_quantity(code.checker.cpu) and is_quantity(code.checker.memory):
                checker = code.checker
                if checker.sample_memory() < MIN_SAMPLE_MEMORY:
                    errors.append(
                        FieldError(
                            "spec.evaluation.code.checker.memory",
                            f"{checker.memory} leaves {max(0, checker.sample_memory()) >> 20}Mi per sample with cpu "
                            f"{checker.cpu} ({checker.parallelism()} checked at once, the runner keeps "
                            f"{CHECK_RUNNER_MEMORY >> 20}Mi); each needs at least {MIN_SAMPLE_MEMORY >> 20}Mi: raise "
                            "memory or lower cpu",
                        )
                    )
    asked_k = set(code.k) if code is not None else set()
    for key, value in ev.thresholds.min_pass_at.items():
        field = f"spec.evaluation.thresholds.minPassAt.{key}"
        if not 0 <= value <= 1:
            errors.append(FieldError(field, f"is a fraction of problems: between 0 and 1 (got {value})"))
        if key not in {str(k) for k in asked_k}:
            errors.append(
                FieldError(
                    field,
                    f"holds pass@{key}, which is not measured: spec.evaluation.code.k is {sorted(asked_k)}; add "
                    f"{key} to spec.evaluation.code.k (with passAtK in spec.evaluation.metrics) or remove the "
                    "threshold",
                )
            )


def is_quantity(q: str) -> bool:
    try:
        quantity(q)
    except ValueError:
        return False
    return True


def check_resources(
    errors: list[FieldError],
    field: str,
    own: PodResources,
    host: TpuSlice | None,
    default: dict[str, str] | None = None,
) -> None:
    errors.extend(FieldError(f, m) for f, m in resource_errors(field, own, host, default))


def validate_finetune(raw: Any, local_paths: bool = False) -> FineTuneJobSpec:
    """Parse and check a FineTuneJob spec; raise SpecError naming every bad field."""
    spec = parse(FineTuneJobSpec, raw)
    errors = check_finetune(spec, local_paths)
    if errors:
        raise SpecError(errors)
    return spec


__all__ = [
    "FieldError",
    "SpecError",
    "check_data_uri",
    "check_finetune",
    "check_resources",
    "check_scheduling",
    "check_uri",
    "is_quantity",
    "model_shape",
    "parse",
    "resolved_mesh",
    "tpu_slice",
    "unsupported_stage",
    "validate_finetune",
]
