"""The steps of the preference-tuning demo (`tpuforge demo --method dpo|orpo`), functions of the session: the job
(examples/finetune-dpo-demo.yaml) moved to the method asked for, its model and preference pairs in GCS, what
the trainer reported on the held-out pairs, and the measurement the demo stands on: the held-out pairs scored
by the starting model (the base: DPO and ORPO start from it, LoRA B being zero) and by the merged tuned model,
per token as benchmarks/preference.py scores them (in a subprocess of the workloads package, transformers on
CPU). The demo fails, with the numbers, when the tuned model does not prefer the chosen answers more than the
start did (`verdict`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuforge.api import FineTuneJobSpec
from tpuforge.api.finetune import PREFERENCE_METHODS, PreferenceSpec
from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.demo.job import DemoError, DemoJob, checked, load_job, parse_spec
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


def read_job(s: DemoSession) -> None:
    """The preference demo's FineTuneJob, with the session's method: read and checked before anything starts."""
    s.jobs = [for_method(load_job(s.root / s.scenario.jobs_yaml, s.sb.bucket), s.method)]


def write_inputs(s: DemoSession) -> None:
    """The tiny model and the preference pairs (examples/data, named as in the job's dataset URI) in GCS."""
    job = s.job
    assert job is not None
    spec = job.spec
    write_model(s, spec.model.name, spec.model.location)
    local = s.root / DATA / spec.dataset.uri.rsplit("/", 1)[-1]
    if not local.exists():
        raise DemoError(f"{s.scenario.jobs_yaml}: {spec.dataset.uri} should be {local}, which does not exist")
    data = local.read_bytes()
    gcs_objects.upload(s.sb.gcs_url, spec.dataset.uri, data)
    lines = data.splitlines()
    held = max(1, round(spec.dataset.eval_fraction * len(lines)))
    s.say(
        f"{local.relative_to(s.root)} -> {spec.dataset.uri}: {len(lines)} preference pairs "
        f"(evalFraction {spec.dataset.eval_fraction:g}: {held} held out, never trained on), e.g."
    )
    first = json.loads(lines[0])
    prompt = first["prompt"] if isinstance(first["prompt"], str) else first["prompt"][-1]["content"]
    for key, text in (("prompt", prompt), ("chosen", first["chosen"]), ("rejected", first["rejected"])):
        s.say(f"  {key:>9}: {text}")


def describe_method(s: DemoSession) -> None:
    """One line on what the method optimises, under the applied job."""
    job = s.job
    assert job is not None
    p = job.spec.preference or PreferenceSpec()  # unset: the defaults
    if job.spec.method == "dpo":
        s.say(
            f"  method dpo (beta {p.beta:g}): raise the chosen answer's log-probability against the rejected one's, "
            "relative to the reference model (the base itself, adapters off); held-out pairs scored at every "
            f"checkpoint, select: {job.spec.checkpoint.select} on their preference loss"
        )
    else:
        s.say(
            f"  method orpo (lambda {p.orpo_lambda:g}): the chosen answer's NLL plus an odds-ratio term against the "
            f"rejected one, no reference model; held-out pairs scored at every checkpoint, select: "
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
    """Why the tuned model does not prefer the chosen answers more than the start did, or None when it does: its
    held-out per-token accuracy must be higher (or both at 1) and its mean per-token margin higher."""
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
    """The held-out pairs scored by the start (the base) and by the merged tuned model; the verdict."""
    job = s.job
    assert job is not None
    spec = job.spec
    s.say(trainer_record(s.statuses.get(job.name) or {}))
    args = ["-m", TOOL, "--pairs", spec.dataset.uri, "--eval-fraction", str(spec.dataset.eval_fraction)]
    args += ["--split-seed", str(spec.dataset.split_seed), "--max-seq-len", str(spec.training.max_seq_len)]
    args += ["--model", f"start={spec.model.location}", "--model", f"tuned={spec.output.uri}"]
    out = run_tool(s, args, "scoring the held-out pairs with both models")
    rows = {r["model"]: r for r in map(json.loads, out.splitlines())}
    start, tuned = rows["start"], rows["tuned"]
    n = int(start["pairs"])
    s.console.print(
        table(
            ["held-out pairs", "start (the base)", f"tuned ({spec.method})"],
            [
                [
                    "preference accuracy (per token)",
                    f"{start['accuracy']:.3f} ({round(start['accuracy'] * n)} of {n})",
                    f"{tuned['accuracy']:.3f} ({round(tuned['accuracy'] * n)} of {n})",
                ],
                ["mean reward margin (nats/token)", f"{start['margin']:.3f}", f"{tuned['margin']:.3f}"],
                ["accuracy, summed log-prob", f"{start['summedAccuracy']:.3f}", f"{tuned['summedAccuracy']:.3f}"],
            ],
            right=(1, 2),
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
            f"the tuned model prefers the chosen answers more than the start did: accuracy {start['accuracy']:.3f} "
            f"-> {tuned['accuracy']:.3f}, margin {start['margin']:.3f} -> {tuned['margin']:.3f} nats/token",
            style="green",
        )


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"
