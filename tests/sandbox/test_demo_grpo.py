"""The GRPO demo's parts that need no sandbox: its two jobs (the SFT start, then GRPO from its merged model,
with the checker sidecar), its data files in the repository, the option that picks it, and the verdict on the
pass rate over the run."""

from __future__ import annotations

import json

from tpuforge.api.finetune import GrpoSpec
from tpuforge_sandbox.config import DEFAULT_BUCKET, repo_root
from tpuforge_sandbox.demo.cli import parse_args
from tpuforge_sandbox.demo.grpo import verdict
from tpuforge_sandbox.demo.job import load_jobs
from tpuforge_sandbox.demo.scenarios import GRPO
from tpuforge_sandbox.demo.setup import DATA

ROOT = repo_root()


def test_the_grpo_demo_starts_from_the_sft_starts_merged_model_with_the_verilog_checker() -> None:
    start, rl = load_jobs(ROOT / GRPO.jobs_yaml, DEFAULT_BUCKET)
    assert start.spec.method == "sft" and rl.spec.method == "grpo"
    ref = rl.spec.model.fine_tune_job_ref
    assert start.spec.merge.enabled and ref is not None and ref.name == start.name and rl.spec.model.uri is None
    grpo = rl.spec.grpo or GrpoSpec()
    assert grpo.reward.checker > 0 and grpo.checker.command[-1] == "tpuforge_workloads.evaluate.verilog"
    for job in (start, rl):
        records = (ROOT / DATA / job.spec.dataset.uri.rsplit("/", 1)[-1]).read_text().splitlines()
        assert records and all("tb.v" in json.loads(r)["test"]["files"] for r in records)
    assert parse_args(["--method", "grpo"]).method == "grpo"


def test_the_demo_fails_unless_the_pass_rate_of_the_second_half_is_above_the_first() -> None:
    assert verdict([0.25, 0.5, 0.5, 1.0]) is None
    assert "did not rise: 0.500 over steps 1-2, 0.500 over steps 3-4" in str(verdict([0.5, 0.5, 0.5, 0.5]))
    assert verdict([1.0, 0.5, 0.25]) is not None
    assert verdict([0.5]) is not None
