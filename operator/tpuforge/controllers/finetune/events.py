"""The FineTuneJob's Events, each one line of `kubectl describe finetunejob` on an 80-column terminal (the room
is tpuforge.api.describe's: what the widest reason below leaves)."""

from __future__ import annotations

from tpuforge.api import display
from tpuforge.api import finetune_reasons as c
from tpuforge.api.describe import DescribeLine
from tpuforge.api.evaluation import Check, score

# Every reason the FineTuneJob controller posts; those that name a condition or its reason are that name.
CREATED = "Created"
PREFLIGHT = c.PREFLIGHT
TRAINING = c.TRAINING
PREEMPTED = c.PREEMPTED
RETRYING = c.RETRYING
RESUMING = "Resuming"
MERGING = c.MERGING
EVALUATING = c.EVALUATING
EVALUATED = c.EVALUATED
SUSPENDED = c.SUSPENDED
RESUMED = c.RESUMED
QUEUED = c.QUEUED
ADMITTED = c.ADMITTED
SUCCEEDED = c.SUCCEEDED
FAILED = c.FAILED
SPEC_FROZEN = "SpecFrozen"
NO_JOBSET = "NoJobSet"
EARLY_STOP = "EarlyStop"
NO_MODEL_YET = "NoModelYet"
REASONS = (
    CREATED,
    PREFLIGHT,
    TRAINING,
    PREEMPTED,
    RETRYING,
    RESUMING,
    MERGING,
    EVALUATING,
    EVALUATED,
    SUSPENDED,
    RESUMED,
    QUEUED,
    ADMITTED,
    SUCCEEDED,
    FAILED,
    SPEC_FROZEN,
    NO_JOBSET,
    EARLY_STOP,
    NO_MODEL_YET,
)


LINE = DescribeLine.of(REASONS)
MESSAGE_ROOM = LINE.room
fit = LINE.fit


def preflight_started(slice_id: str) -> str:
    return fit(f"compiling the step for {slice_id} on CPU", f"compiling for {slice_id}")


def preflight_result(
    headline: str, fits: bool, hbm_gib: float, capacity_gib: float, tokens_per_s: float, remat: bool | None = None
) -> str:
    """The report's headline (fits: 31.2 of 95 GiB per chip; ~2,900 tok/s at 8% MFU), shorter if need be;
    the shorter forms keep "remat off" where the step runs without it (the preflight's choice, or the user's)."""
    verdict = "fits" if fits else "does not fit"
    figures = f"{hbm_gib:,.1f}/{display.hbm_gib(capacity_gib)} GiB/chip"
    speed = f"; ~{tokens_per_s:,.0f} tok/s" if tokens_per_s else ""
    off = "; remat off" if remat is False else ""
    return fit(headline, f"{verdict} {figures}{speed}{off}", f"{verdict} {figures}{off}", verdict)


def preflight_failed() -> str:
    return fit("preflight failed; see the Failed condition", "preflight failed")


def created(slice_id: str, topology: str, spot: bool, hosts: int = 1) -> str:
    extra = ", spot" if spot else ""
    if hosts > 1:
        return fit(f"training on {slice_id} ({hosts} hosts{extra})", f"training on {slice_id}{extra}")
    return fit(f"training on {slice_id} ({topology}{extra})", f"training on {slice_id}{extra}")


def started(attempt: int, node: str | None) -> str:
    if not node:
        return fit(f"attempt {attempt} started")
    return fit(f"attempt {attempt} started on {{name}}", f"attempt {attempt} started", name=node)


def started_on_hosts(attempt: int, hosts: int) -> str:
    return fit(f"attempt {attempt} started on {hosts} hosts")


def preempted(attempt: int, node: str | None) -> str:
    if not node:
        return fit(f"attempt {attempt} preempted")
    return fit(f"attempt {attempt} preempted on {{name}}", f"attempt {attempt} preempted", name=node)


def host_preempted(attempt: int, host: int | None, hosts: int, node: str | None) -> str:
    """One host of a multi-host slice was taken away: which one, and its node."""
    which = f"host {host}/{hosts}" if host is not None else c.a_host_of(hosts)
    if not node:
        return fit(f"attempt {attempt} {which} preempted")
    # The node tells the hosts apart; the attempt number is in the Resuming Event that follows.
    return fit(
        f"attempt {attempt} {which} preempted on {{name}}",
        f"{which} preempted on {{name}}",
        f"attempt {attempt} {which} preempted",
        name=node,
    )


def retrying(attempt: int, why: str, used: int, limit: int) -> str:
    return fit(
        f"attempt {attempt} failed ({why}); retry {used}/{limit}",
        f"attempt {attempt} failed; retry {used}/{limit}",
    )


def resuming(attempt: int, step: int | None, lost: int | None) -> str:
    """Where the next attempt picks up, and the steps done since that checkpoint (done again)."""
    at = f"step {step}" if step is not None else "the latest checkpoint"
    if lost is None:
        return fit(f"attempt {attempt} resumes at {at}", f"attempt {attempt} from {at}")
    return fit(
        f"attempt {attempt} resumes at {at}, {lost} steps lost",
        f"attempt {attempt} from {at}, {lost} steps lost",
        f"attempt {attempt} from {at}, {lost} lost",
    )


def resumed(attempt: int, step: int | None) -> str:
    at = f" from step {step}" if step is not None else ""
    return fit(f"resuming as attempt {attempt}{at}", f"resuming as attempt {attempt}")


def merging(uri: str) -> str:
    return fit(f"merging into {uri}", "merging into spec.output.uri")


def merged(uri: str) -> str:
    return fit(c.merged(uri, None), "merged model in spec.output.uri")


def exporting(uri: str) -> str:
    return fit(f"exporting the adapter to {uri}", f"exporting adapter to {uri}", "exporting the adapter")


def adapter_exported(uri: str) -> str:
    return fit(f"adapter in {uri}", "adapter in status.outputs.adapterUri")


def evaluating(slice_id: str) -> str:
    return fit(f"evaluating the adapter on {slice_id}", f"evaluating on {slice_id}")


# Short metric names for one-line headlines.
_SHORT = {"exactMatch": "em", "loss": "loss"}
# pass@k first (pass@1 before pass@5), then exact match, then the loss.
_HEADLINE_ORDER = ("pass@1", "pass@5", "exactMatch", "loss")


def _scores(metrics: dict[str, float], base: dict[str, float]) -> list[str]:
    out = []
    rank = {name: i for i, name in enumerate(_HEADLINE_ORDER)}
    for name in sorted(metrics, key=lambda k: (rank.get(k, len(rank)), k)):
        value = score(name, metrics[name])
        was = f" (base {score(name, base[name])})" if name in base else ""
        out.append(f"{_SHORT.get(name, name)} {value}{was}")
    return out


def eval_passed(metrics: dict[str, float], base: dict[str, float]) -> str:
    """The headline: each score beside the base model's, as many as fit, pass@1 and exact match first."""
    parts = _scores(metrics, base)
    plain = [p.split(" (")[0] for p in parts]
    return fit(
        f"eval passed: {', '.join(parts)}",
        *(f"eval passed: {p}" for p in parts[:1]),
        f"eval passed: {', '.join(plain)}",
        *(f"eval passed: {p}" for p in plain[:1]),
        "eval passed",
    )


def eval_below(failed: Check | None) -> str:
    """The first threshold missed, e.g. "eval below threshold: em 0.20 < 0.50"; a pass@k held by its interval
    gives the low bound: "eval below: pass@1 low 0.45 < 0.60"."""
    if failed is None or failed.value is None:
        return fit("eval below threshold")
    name = _SHORT.get(failed.metric, failed.metric)
    sign = ">" if failed.threshold_name.startswith("max") else "<"
    value, limit = score(failed.metric, failed.value), score(failed.metric, failed.threshold)
    if failed.low is not None:
        low = score(failed.metric, failed.low)
        return fit(
            f"eval below threshold: {name} low {low} {sign} {limit}",
            f"eval below: {name} low {low} {sign} {limit}",
            "eval below threshold",
        )
    return fit(f"eval below threshold: {name} {value} {sign} {limit}", "eval below threshold")


def eval_failed() -> str:
    return fit("evaluation failed, outputs kept; see the Evaluated condition", "evaluation failed, outputs kept")


def evaluating_again(run: int) -> str:
    return fit(f"evaluating again (rerun {run})", "evaluating again")


def eval_unreadable() -> str:
    return fit("evaluation result unreadable", "eval result unreadable")


def stopped_early(step: int, best: int | None) -> str:
    if best is None:
        return fit(f"stopped early at step {step}")
    return fit(f"stopped early at step {step}; best step {best}", f"stopped at {step}; best {best}")


def trained_only() -> str:
    return fit("trained; merge off (spec.merge.enabled)", "trained; merge off")


def queued(role: str, queue: str) -> str:
    """`role` (training, preflight, merge, evaluation) waits in Kueue's LocalQueue `queue`."""
    if not queue:
        return fit(f"{role} waits for Kueue")
    return fit(f"{role} waits in Kueue queue {{name}}", f"{role} waits for Kueue", name=queue)


def admitted(role: str) -> str:
    return fit(f"Kueue admitted the {role}")


def suspended() -> str:
    return fit("training stopped; checkpoints stay")


def frozen(fields: list[str]) -> str:
    short = [f.removeprefix("spec.") for f in fields]
    n = len(fields)
    return fit(f"{', '.join(short)} not applied", f"{n} frozen field{'s' if n != 1 else ''} not applied")


def invalid_spec(fields: list[str]) -> str:
    if not fields:
        return "invalid spec"
    return fit(f"invalid {', '.join(fields)}", f"invalid {fields[0]}", "invalid spec")


def deadline(ran: str) -> str:
    return fit(f"deadline exceeded after {ran}", "deadline exceeded")


def gave_up(attempt: int, why: str, failures: int) -> str:
    return fit(
        f"attempt {attempt} failed ({why}); gave up",
        f"attempt {attempt} failed; {failures} failures",
    )


def preemptions_exhausted(attempt: int, preemptions: int) -> str:
    return fit(
        f"attempt {attempt} preempted; gave up after {preemptions} preemptions",
        f"gave up after {preemptions} preemptions",
    )


def rejected_config(attempt: int) -> str:
    return fit(f"attempt {attempt}: trainer rejected its config", f"attempt {attempt}: config rejected")


def merge_failed() -> str:
    return fit("merge failed; see the Merged condition", "merge failed")


def invalid_edit(fields: list[str]) -> str:
    named = f" ({', '.join(fields)})" if fields else ""
    return fit(f"edit invalid{named}; not applied", "edit invalid; not applied")


# Posted by the controller itself when a child cannot be created (outside the plan, so not in REASONS).
WEBHOOK_DOWN = "WebhookDown"


def webhook_down(webhook: str) -> str:
    return f"webhook {webhook!r} unreachable"


def no_jobset(slice_id: str) -> str:
    return fit(f"{slice_id} needs JobSet: install it", "multi-host needs JobSet installed")


def waiting_for_model(job: str) -> str:
    return fit(f"waiting for {job}'s merged model", "waiting for the model's job")


def no_model(job: str) -> str:
    return fit(f"no model to start from in {job}", "no model to start from")
