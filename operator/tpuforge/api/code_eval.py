"""spec.evaluation.code: functional evaluation of code answers (pass@k). The model writes n samples per problem,
a checker runs each one against the problem's test, and pass@k is estimated from the verdicts."""

from __future__ import annotations

from pydantic import Field, model_validator

from tpuforge.api.base import ApiModel, StatusModel
from tpuforge.api.resources import quantity

PASS_AT_K = "passAtK"
PASS_AT_PREFIX = "pass@"
# n's upper bound; also the most k there can be (distinct, each at most n), which bounds the apiserver's cost
# estimate of the rules over k (tpuforge.api.admission).
MAX_SAMPLES_PER_PROBLEM = 200
# The defaults report pass@1 as VerilogEval v2 and most leaderboards do: greedy (temperature 0, one sample per
# problem), so the score is comparable and the same on every rerun; its spread is then only over the problems
# (status.evaluation.standardErrors). Asked for more samples, the default temperature is low when only pass@1
# is asked (Codex/HumanEval's 0.2: the estimate of pass@1 is best at a low temperature) and higher when a
# larger k is (pass@k for k > 1 needs varied samples).
DEFAULT_SAMPLES_PER_PROBLEM = 1
GREEDY_TEMPERATURE = 0.0
PASS_AT_1_TEMPERATURE = 0.2
PASS_AT_K_TEMPERATURE = 0.8
# Each pass@k comes with an exact binomial (Clopper-Pearson) interval over problems at this level: its coverage
# holds for a dozen problems, where a bootstrap's does not (evaluate.passk).
CONFIDENCE_LEVEL = 0.95
INTERVAL_METHOD = "clopper-pearson"
# Why a sample failed, in the report and status.evaluation.failures: the checker's categories (its verdict's
# "failure"), and "truncated" for an answer vLLM cut at maxNewTokens (it fails whatever the checker said).
# "task": the checker found the problem itself broken (its reference does not compile with the checker's
# simulator); such problems are kept out of pass@k and counted in status.evaluation.excludedProblems.
FAILURE_CATEGORIES = ("syntax", "compile", "mismatch", "timeout", "refused", "limit", "truncated", "task", "error")


_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_UNITS.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50})


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (512Mi, 1G, 1.5Gi) in bytes."""
    number = quantity.rstrip("KMGTPik")
    return int(float(number) * _UNITS[quantity[len(number) :]])


# The checker runner's own share of its container's memory, and the least a sample gets of the rest.
CHECK_RUNNER_MEMORY = 96 << 20
MIN_SAMPLE_MEMORY = 64 << 20


def default_temperature(k: list[int], samples_per_problem: int = DEFAULT_SAMPLES_PER_PROBLEM) -> float:
    """The temperature the samples are drawn at when spec.evaluation.code.temperature is unset: greedy for one
    sample per problem, else by the largest k."""
    if samples_per_problem <= 1:
        return GREEDY_TEMPERATURE
    return PASS_AT_1_TEMPERATURE if max(k, default=1) <= 1 else PASS_AT_K_TEMPERATURE


def pass_at_metric(k: int) -> str:
    """The name a pass@k score goes by in status.evaluation.metrics, the report and Prometheus: pass@1."""
    return f"{PASS_AT_PREFIX}{k}"


class CheckerSpec(ApiModel):
    image: str = Field(
        description="Container image of the checker (e.g. tpuforge/checker-verilog:<version>, Debian's iverilog)."
    )
    command: list[str] = Field(
        min_length=1,
        description="Run once per sample in a fresh scratch directory holding sample.txt (the code taken from the "
        "answer), test.json (the record's test object) and each entry of test.files; exit code 0 = pass.",
    )
    timeout_seconds: float = Field(
        default=10.0, gt=0, le=600, description="Per-sample limit; a sample still running then is killed and fails."
    )
    cpu: str = Field(
        default="1",
        description="CPU request and limit of the checker container; one sample is checked at once per whole CPU.",
    )
    memory: str = Field(
        default="512Mi",
        description="Memory request and limit of the checker container. The runner keeps 96Mi; each sample checked "
        "at once gets an equal share of the rest (all its processes together) and fails alone past it.",
    )

    def parallelism(self) -> int:
        """Samples checked at once: one per whole CPU of the checker container."""
        return max(1, int(quantity(self.cpu)))

    def sample_memory(self) -> int:
        """Each sample's memory cap, below the container's limit so that a greedy sample never gets the
        container (and the whole evaluation) killed."""
        return (quantity_bytes(self.memory) - CHECK_RUNNER_MEMORY) // self.parallelism()


class CodeEvalSpec(ApiModel):
    samples_per_problem: int = Field(
        default=DEFAULT_SAMPLES_PER_PROBLEM,
        ge=1,
        le=MAX_SAMPLES_PER_PROBLEM,
        description="n: answers sampled per problem (pass@k is estimated from them). The default, 1 at temperature "
        "0, is greedy pass@1 as VerilogEval v2 reports it; 20 at a low temperature estimates the sampled pass@1 "
        "with a small variance.",
    )
    k: list[int] = Field(
        default_factory=lambda: [1],
        min_length=1,
        max_length=MAX_SAMPLES_PER_PROBLEM,
        description="The k of each pass@k reported (each at most samplesPerProblem).",
    )
    temperature: float | None = Field(
        default=None,
        ge=0,
        le=2,
        description=f"Sampling temperature; unset: {GREEDY_TEMPERATURE:g} (greedy) with one sample per problem, "
        f"else {PASS_AT_1_TEMPERATURE} when k is only [1] (pass@1), {PASS_AT_K_TEMPERATURE} when a larger k is "
        "asked.",
    )
    top_p: float = Field(default=0.95, gt=0, le=1, description="Nucleus sampling: keep this much probability mass.")
    max_new_tokens: int = Field(default=512, ge=1, description="Longest answer sampled.")
    seed: int = Field(
        default=0,
        ge=0,
        description="Sampling seed: problem i is sampled with seed + i, base and adapter alike, so a rerun of the "
        "same evaluation draws the same samples.",
    )
    checker: CheckerSpec | None = Field(
        default=None, description="What runs each sample against its test (required with the passAtK metric)."
    )

    @model_validator(mode="after")
    def _default_temperature(self) -> CodeEvalSpec:
        if self.temperature is None:
            self.temperature = default_temperature(self.k, self.samples_per_problem)
        return self

    @property
    def sampling_temperature(self) -> float:
        """The temperature the samples are drawn at: the one set, else the default (see default_temperature)."""
        if self.temperature is not None:
            return self.temperature
        return default_temperature(self.k, self.samples_per_problem)


class ConfidenceInterval(StatusModel):
    """A score's confidence interval (CONFIDENCE_LEVEL, over the problems)."""

    low: float = Field(description="Lower bound; minPassAt is held against it.")
    high: float = Field(description="Upper bound.")
    method: str | None = Field(
        default=None,
        description=f"How it was made: {INTERVAL_METHOD} (an exact binomial interval over the problems, their "
        "pass@k estimates summed as successes); unset from an older evaluator (a bootstrap).",
    )
