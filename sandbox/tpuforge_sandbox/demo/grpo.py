"""The steps of the GRPO demo (`tpuforge demo --method grpo`, `make demo METHOD=grpo`), functions of the session:
the two jobs of examples/finetune-grpo-demo.yaml (the SFT start, then GRPO from its merged model), iverilog
checked before anything starts, the tiny model and the Verilog problems in GCS, each job applied and followed in
turn, and the GRPO run's figures step by step: the mean reward and the pass rate of the answers sampled at each
step, every one judged by the checker sidecar beside the trainer. The demo fails unless the pass rate of the
run's second half is above its first half's (`verdict`)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from typing import Any

from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.kube import objects as kube_objects
from tpuforge.manifests.finetune_training import CHECKER_CONTAINER
from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.demo import follow, setup
from tpuforge_sandbox.demo.job import DemoError, load_jobs
from tpuforge_sandbox.demo.session import NAMESPACE, DemoSession
from tpuforge_sandbox.demo.view import table
from tpuforge_sandbox.sandbox import OPERATOR

SUMMARY_FILE = "run_summary.json"  # the trainer's run summary in the checkpoint directory (runtime/progress.py)


def read_jobs(s: DemoSession) -> None:
    """The SFT start and the GRPO job, read and checked; iverilog, which the checker sidecar runs."""
    s.jobs = load_jobs(s.root / s.scenario.jobs_yaml, s.sb.bucket)
    if [j.spec.method for j in s.jobs] != ["sft", "grpo"]:
        raise DemoError(f"{s.scenario.jobs_yaml}: expected an SFT job, then a grpo job")
    if shutil.which("iverilog") is None:
        raise DemoError("--method grpo needs iverilog (`make iverilog`): the checker sidecar runs it")


def write_inputs(s: DemoSession) -> None:
    """The tiny Gemma 4 (Verilog tokenizer) and both jobs' problems in GCS; one problem as the model sees it."""
    start = s.jobs[0]
    setup.write_model(s, start.spec.model.name, start.spec.model.location, tokenizer="verilog")
    for job in s.jobs:
        local = s.root / setup.DATA / job.spec.dataset.uri.rsplit("/", 1)[-1]
        if not local.exists():
            raise DemoError(f"{s.scenario.jobs_yaml}: {job.spec.dataset.uri} should be {local}, which does not exist")
        gcs_objects.upload(s.sb.gcs_url, job.spec.dataset.uri, local.read_bytes())
        s.say(f"{local.relative_to(s.root)} -> {job.spec.dataset.uri}: {len(local.read_bytes().splitlines())} records")
    first = json.loads(
        (s.root / setup.DATA / s.jobs[1].spec.dataset.uri.rsplit("/", 1)[-1]).read_text().splitlines()[0]
    )
    s.say(f"  {'prompt':>9}: {first['messages'][0]['content']}")
    tb = first["test"]["files"]["tb.v"].splitlines()
    s.say(f"  {'test':>9}: tb.v, {len(tb)} lines, run with the answer's module by iverilog in the checker sidecar")


def run_start(s: DemoSession) -> None:
    """The SFT start: applied, followed to its end (training and merge); the demo halts if it fails."""
    follow.run_start(
        s, "a model that writes the right module and a plausible wrong one equally often: what GRPO starts from"
    )


def run_grpo(s: DemoSession) -> None:
    """The GRPO job, applied and followed; each step's reward and pass rate printed as the trainer reports them
    (status.progress.rl), then the whole run's from its summary."""
    job = s.jobs[1]
    s.jobs = [job]
    setup.apply_job(s)
    spec = job.spec
    g = spec.grpo
    assert g is not None
    s.say(
        f"  each step: {g.group_size} answers to each of {spec.training.micro_batch_size} prompts at temperature "
        f"{g.temperature:g}, up to {g.max_tokens} tokens; each answer's module run against its testbench by the "
        f"checker sidecar ({g.checker.parallelism()} at once, a uid and a scratch directory of its own each)"
    )
    operator = s.sb.daemon(OPERATOR)
    deadline = time.monotonic() + follow.JOB_TIMEOUT
    seen_events: set[str] = set()
    shown, phase = 0, ""
    status: dict[str, Any] = {}
    while True:
        if operator.pid() is None:
            raise DemoError(f"the operator has exited; last lines of {operator.log}:\n{operator.log_tail()}")
        obj = kube_objects.get(s.api, API_VERSION, FINETUNEJOB_KIND, NAMESPACE, job.name)
        if obj is None:
            raise DemoError(f"FineTuneJob {job.name} disappeared (deleted by someone?)")
        status = obj.get("status") or {}
        for line in follow.new_events(s.api, obj["metadata"]["uid"], seen_events):
            s.say(line)
        follow.remember_pods(s, status)
        step = int((status.get("progress") or {}).get("step") or 0)
        rl = (status.get("progress") or {}).get("rl")
        if rl and step > shown:
            shown = step
            s.say(
                f"  step {step:>3}/{spec.training.max_steps}: reward {rl.get('reward', 0):.3f}, pass rate "
                f"{rl.get('passRate', 0):.3f}, KL {rl.get('kl') or 0:.4f}, {rl.get('responseTokens', 0):.0f} tokens an "
                f"answer, checker {100 * (rl.get('checkerShare') or 0):.0f}% of the step"
            )
        if status.get("phase") != phase:
            phase = status.get("phase", "")
            table_text = s.kubectl_table("get", "finetunejobs")
            if table_text:
                s.say(f"$ kubectl get finetunejobs\n{table_text}")
        if phase in ("Succeeded", "Failed"):
            break
        if time.monotonic() > deadline:
            raise DemoError(f"FineTuneJob {job.name} did not finish: {status}")
        time.sleep(0.5)
    s.statuses[job.name] = status
    follow.halt_unless_succeeded(s)


def steps_of(s: DemoSession) -> dict[int, Mapping[str, Any]]:
    """The GRPO run's figures by step, from the trainer's run summary (every attempt's)."""
    job = s.jobs[0]
    summary = json.loads(gcs_objects.read(s.sb.gcs_url, f"{job.spec.checkpoint.uri}/{SUMMARY_FILE}"))
    return {int(k): v for a in summary["attempts"] for k, v in (a.get("train_rl") or {}).items()}


def verdict(pass_rates: list[float]) -> str | None:
    """Why the pass rate did not rise over the run, or None when it did: the mean of the second half of the
    steps must be above the first half's."""
    if len(pass_rates) < 2:
        return f"{len(pass_rates)} steps: too few to tell a rise"
    half = len(pass_rates) // 2
    first, second = pass_rates[:half], pass_rates[half:]
    a, b = sum(first) / len(first), sum(second) / len(second)
    if b <= a:
        return (
            f"the pass rate did not rise: {a:.3f} over steps 1-{half}, {b:.3f} over steps {half + 1}-{len(pass_rates)}"
        )
    return None


def show_run(s: DemoSession) -> None:
    """Every step's figures, where the checker's time went, the sidecar's own account, and the verdict."""
    by_step = steps_of(s)
    rows = [
        [
            str(n),
            f"{v['reward']:.3f}",
            f"{v['pass_rate']:.3f}",
            f"{v.get('kl') or 0:.4f}",
            ", ".join(f"{k} {c}" for k, c in sorted((v.get("failures") or {}).items())) or "-",
            f"{v.get('checker_seconds', 0):.1f} s of {v.get('step_seconds', 0):.1f} s",
        ]
        for n, v in sorted(by_step.items())
    ]
    s.console.print(table(["step", "reward", "pass rate", "KL", "failures", "checker"], rows, right=(0, 1, 2, 3, 5)))
    checker = sum(v.get("checker_seconds", 0) for v in by_step.values())
    total = sum(v.get("step_seconds", 0) for v in by_step.values())
    s.say(
        f"the checker sidecar took {checker:.0f} s of the steps' {total:.0f} s "
        f"({100 * checker / max(total, 1e-9):.0f}%)"
    )
    pod = next((name for key, name in s.pods.items() if key.startswith("train")), None)
    if pod:
        log = s.sb.pod_log(NAMESPACE, pod, CHECKER_CONTAINER)
        if log.exists():
            lines = log.read_text(errors="replace").splitlines()
            s.say(f"the checker sidecar's log ({pod}/{CHECKER_CONTAINER}), first and last lines:")
            for line in [*lines[:1], *lines[-2:]]:
                s.say(f"  {line}")
    pass_rates = [float(v["pass_rate"]) for _, v in sorted(by_step.items())]
    problem = verdict(pass_rates)
    if problem:
        s.say(problem, style="red")
        s.problems.append(problem)
    else:
        half = len(pass_rates) // 2
        s.say(
            f"the pass rate rose: {sum(pass_rates[:half]) / half:.3f} over the first {half} steps, "
            f"{sum(pass_rates[half:]) / (len(pass_rates) - half):.3f} over the last {len(pass_rates) - half}",
            style="green",
        )
