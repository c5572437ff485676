"""spec.evaluation.code: functional evaluation of code answers (pass@k). The model writes n samples per problem,
a checker runs each one against the problem's test, and pass@k is estimated from the verdicts."""

from __future__ import annotations

from pydantic import Field

from tpuforge.api.base import ApiModel

PASS_AT_K = "passAtK"
PASS_AT_PREFIX = "pass@"
# n's upper bound; also the most k there can be (distinct, each at most n), which bounds the apiserver's cost
# estimate of the rules over k (tpuforge.api.admission).
MAX_SAMPLES_PER_PROBLEM = 200


_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_UNITS.update({"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50})


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (512Mi, 1G, 1.5Gi) in bytes."""
    number = quantity.rstrip("KMGTPik")
    return int(float(number) * _UNITS[quantity[len(number) :]])


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
    cpu: str = Field(default="1", description="CPU request and limit of the checker container.")
    memory: str = Field(
        default="512Mi", description="Memory request and limit of the checker container; also each sample's cap."
    )


class CodeEvalSpec(ApiModel):
    samples_per_problem: int = Field(
        default=5,
        ge=1,
        le=MAX_SAMPLES_PER_PROBLEM,
        description="n: answers sampled per problem (pass@k is estimated from them).",
    )
    k: list[int] = Field(
        default_factory=lambda: [1, 5],
        min_length=1,
        max_length=MAX_SAMPLES_PER_PROBLEM,
        description="The k of each pass@k reported (each at most samplesPerProblem).",
    )
    temperature: float = Field(default=0.8, ge=0, le=2, description="Sampling temperature.")
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
