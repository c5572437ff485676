"""The steps of the preference-tuning demo (`tpuforge demo --method dpo|orpo`), functions of the session: the two
jobs of examples/finetune-dpo-demo.yaml (an SFT start on the chosen answers of the training pairs, merged, then
the preference job, moved to the method asked for, from that merged model by spec.model.fineTuneJobRef), the
model, the SFT records and the preference pairs in GCS, each job applied and followed in turn, what the trainer
reported on the held-out pairs, and the measurement the demo stands on: the held-out pairs scored by the base,
by the SFT start (where DPO and ORPO start, and DPO's reference model) and by the merged tuned model, per token
as benchmarks/preference.py scores them (in a subprocess of the workloads package, transformers on CPU). The
demo fails, with the numbers, when the tuned model does not prefer the chosen answers more than the SFT start
did (`verdict`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuforge.api import FineTuneJobSpec
from tpuforge.api.finetune import PREFERENCE_METHODS, PreferenceSpec
from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.demo import follow, setup
from tpuforge_sandbox.demo.job import DemoError, DemoJob, checked, load_jobs, parse_spec
from tpuforge_sandbox.demo.session import DemoSession
from tpuforge_sandbox.demo.setup import DATA, run_tool, write_model
from tpuforge_sandbox.demo.view import table

TOOL = "tpuforge_workloads.evaluate.preference"


def for_method(job: DemoJob, method: str) -> DemoJob:
    """The preference demo's job run with `method` (dpo or orpo): spec.method set, and the job and its
    checkpoint and output directories named after the method (demo-dpo -> demo-orpo)."""
    if method not in PREFERENCE_METHODS:
        raise DemoError(f"--method {method}: the preference demo runs {' or '.join(PREFERENCE_METHODS)}")
    if job.spec.method == method:
        return job
    old = job.name
    new = old.replace(job.spec.method, method) if job.spec.method in old else f"{old}-{method}"
    spec = dict(job.body["spec"]) | {"method": method}
    for key in ("checkpoint", "output"):
        spec[key] = {**spec[key], "uri": spec[key]["uri"].replace(f"/{old}/", f"/{new}/")}
    body = {**job.body, "metadata": {**job.body["metadata"], "name": new}, "spec": spec}
    path = Path(f"{old} as {method}")
    return DemoJob(body, checked(path, parse_spec(path, FineTuneJobSpec, body)))


def read_jobs(s: DemoSession) -> None:
    """The SFT start and the preference job, with the session's method: read and checked before anything starts."""
    jobs = load_jobs(s.root / s.scenario.jobs_yaml, s.sb.bucket)
    if [j.spec.method for j in jobs] != ["sft", "dpo"]:
        raise DemoError(f"{s.scenario.jobs_yaml}: expected an SFT job, then a dpo job")
    start, tuned = jobs
    ref = tuned.spec.model.fine_tune_job_ref
    if ref is None or ref.name != start.name:
        raise DemoError(f"{s.scenario.jobs_yaml}: {tuned.name}'s spec.model.fineTuneJobRef should name {start.name}")
    s.jobs = [start, for_method(tuned, s.method)]


def jobs_of(s: DemoSession) -> tuple[DemoJob, DemoJob]:
    """(the SFT start, the preference job), whatever their order in the session."""
    start = next(j for j in s.jobs if j.spec.method == "sft")
    tuned = next(j for j in s.jobs if j.spec.method in PREFERENCE_METHODS)
    return start, tuned


def write_inputs(s: DemoSession) -> None:
    """The tiny model, the SFT records and the preference pairs (examples/data, named as in the jobs' dataset
    URIs) in GCS."""
    start, tuned = jobs_of(s)
    write_model(s, start.spec.model.name, start.spec.model.location)
    data: dict[str, bytes] = {}
    for job in (start, tuned):
        local = s.root / DATA / job.spec.dataset.uri.rsplit("/", 1)[-1]
        if not local.exists():
            raise DemoError(f"{s.scenario.jobs_yaml}: {job.spec.dataset.uri} should be {local}, which does not exist")
        data[job.name] = local.read_bytes()
        gcs_objects.upload(s.sb.gcs_url, job.spec.dataset.uri, data[job.name])
    pairs = data[tuned.name].splitlines()
    held = max(1, round(tuned.spec.dataset.eval_fraction * len(pairs)))
    s.say(
        f"{DATA / tuned.spec.dataset.uri.rsplit('/', 1)[-1]} -> {tuned.spec.dataset.uri}: {len(pairs)} preference "
        f"pairs (evalFraction {tuned.spec.dataset.eval_fraction:g}: {held} held out, never trained on), e.g."
    )
    first = json.loads(pairs[0])
    prompt = first["prompt"] if isinstance(first["prompt"], str) else first["prompt"][-1]["content"]
    for key, text in (("prompt", prompt), ("chosen", first["chosen"]), ("rejected", first["rejected"])):
        s.say(f"  {key:>9}: {text}")
    s.say(
        f"{DATA / start.spec.dataset.uri.rsplit('/', 1)[-1]} -> {start.spec.dataset.uri}: "
        f"{len(data[start.name].splitlines())} chat records, the chosen answers of the {len(pairs) - held} "
        "training pairs (tpuforge_workloads.data.demo.preference_sft_records): the held-out pairs are left out"
    )


def run_start(s: DemoSession) -> None:
    """The SFT start: applied, followed to its end (training and merge); the demo halts if it fails."""
    follow.run_start(
        s,
        "a model that knows the capitals of the training pairs: what the preference job starts from, its reference "
        "model, and what the demo measures it against",
    )


def run_tuned(s: DemoSession) -> None:
    """The preference job, applied and followed to its end; then first in the session's jobs, as the job whose
    record, output and commands the later steps show."""
    start, tuned = jobs_of(s)
    s.jobs = [tuned]
    setup.apply_job(s)
    describe_method(s)
    follow.follow(s)
    follow.halt_unless_succeeded(s)
    s.jobs = [tuned, start]


def describe_method(s: DemoSession) -> None:
    """One line on what the method optimises, under the applied job."""
    job = s.job
    assert job is not None
    p = job.spec.preference or PreferenceSpec()  # unset: the defaults
    ref = job.spec.model.fine_tune_job_ref
    starts = f"{ref.name}'s merged model" if ref else "the base"
    if job.spec.method == "dpo":
        s.say(
            f"  method dpo (beta {p.beta:g}), from {starts}: raise the chosen answer's log-probability against the "
            f"rejected one's, relative to the reference model (the model it starts from, adapters off); held-out "
            f"pairs scored at every checkpoint, select: {job.spec.checkpoint.select} on their preference loss"
        )
    else:
        s.say(
            f"  method orpo (lambda {p.orpo_lambda:g}), from {starts}: the chosen answer's NLL plus an odds-ratio "
            f"term against the rejected one, no reference model; held-out pairs scored at every checkpoint, select: "
            f"{job.spec.checkpoint.select} on their preference loss"
        )


def trainer_record(status: Mapping[str, Any]) -> str:
    """The trainer's last held-out preference figures, from status.progress.preference."""
    p = (status.get("progress") or {}).get("preference") or {}
    if p.get("evalAccuracy") is None:
        return "the trainer reported no held-out preference evaluation (status.progress.preference is empty)"
    return (
        f"the trainer's last held-out evaluation (status.progress.preference, step {p.get('evalStep')}): "
        f"preference accuracy {p['evalAccuracy']:.3g}, reward margin {_num(p.get('evalRewardMargin'))}, "
        f"preference loss {_num(p.get('evalLoss'))}"
    )


def verdict(start: Mapping[str, float], tuned: Mapping[str, float]) -> str | None:
    """Why the tuned model does not prefer the chosen answers more than the start (the SFT model it was tuned
    from) did, or None when it does: its held-out per-token accuracy must be higher (or both at 1) and its mean
    per-token margin higher."""
    if tuned["pairs"] != start["pairs"]:
        return f"the two models were scored on different pairs ({start['pairs']} and {tuned['pairs']})"
    if tuned["margin"] <= start["margin"]:
        return (
            f"the tuned model's held-out reward margin {tuned['margin']:.3f} nats/token is not above the start's "
            f"{start['margin']:.3f}"
        )
    if tuned["accuracy"] < start["accuracy"] or (tuned["accuracy"] == start["accuracy"] < 1):
        return (
            f"the tuned model's held-out preference accuracy {tuned['accuracy']:.3f} is not above the start's "
            f"{start['accuracy']:.3f}"
        )
    return None


def compare(s: DemoSession) -> None:
    """The held-out pairs scored by the base, the SFT start and the merged tuned model; the verdict (the tuned
    model against the SFT start)."""
    start_job, job = jobs_of(s)
    spec = job.spec
    s.say(trainer_record(s.statuses.get(job.name) or {}))
    args = ["-m", TOOL, "--pairs", spec.dataset.uri, "--eval-fraction", str(spec.dataset.eval_fraction)]
    args += ["--split-seed", str(spec.dataset.split_seed), "--max-seq-len", str(spec.training.max_seq_len)]
    args += ["--model", f"base={start_job.spec.model.location}", "--model", f"start={start_job.spec.output.uri}"]
    args += ["--model", f"tuned={spec.output.uri}"]
    out = run_tool(s, args, "scoring the held-out pairs with the three models")
    rows = {r["model"]: r for r in map(json.loads, out.splitlines())}
    base, start, tuned = rows["base"], rows["start"], rows["tuned"]
    n = int(start["pairs"])
    models = (base, start, tuned)
    s.console.print(
        table(
            ["held-out pairs", "base", "start (SFT, merged)", f"tuned ({spec.method} after SFT)"],
            [
                ["preference accuracy (per token)"]
                + [f"{m['accuracy']:.3f} ({round(m['accuracy'] * n)} of {n})" for m in models],
                ["mean reward margin (nats/token)"] + [f"{m['margin']:.3f}" for m in models],
                ["accuracy, summed log-prob"] + [f"{m['summedAccuracy']:.3f}" for m in models],
            ],
            right=(1, 2, 3),
        )
    )
    s.say(
        "reward margin: the chosen answer's mean log-probability per token minus the rejected one's; accuracy: "
        "the share of pairs where it is above 0 (per token, so a shorter answer is not preferred for its length)"
    )
    problem = verdict(start, tuned)
    if problem:
        s.say(problem, style="red")
        s.problems.append(problem)
    else:
        s.say(
            f"the tuned model prefers the chosen answers more than the SFT start did: accuracy {start['accuracy']:.3f} "
            f"-> {tuned['accuracy']:.3f}, margin {start['margin']:.3f} -> {tuned['margin']:.3f} nats/token",
            style="green",
        )


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"
