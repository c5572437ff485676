"""The preference demo (`tpuforge demo --method dpo|orpo`): its two jobs (the SFT start on the training pairs'
chosen answers, then DPO from its merged model), the CLI's choice of it, and its verdict: it fails unless the
tuned model prefers the chosen answers of the held-out pairs more than the SFT start did."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from tpuforge.api.validation import check_finetune
from tpuforge_sandbox import Sandbox
from tpuforge_sandbox.config import DEFAULT_BUCKET, repo_root
from tpuforge_sandbox.demo import cli
from tpuforge_sandbox.demo.job import DemoError, load_jobs
from tpuforge_sandbox.demo.preference import for_method, jobs_of, read_jobs, trainer_record, verdict
from tpuforge_sandbox.demo.scenarios import PREFERENCE
from tpuforge_sandbox.demo.session import DemoSession
from tpuforge_sandbox.demo.setup import DATA

ROOT = repo_root()
START = {"pairs": 16, "accuracy": 0.5625, "margin": 0.046, "summedAccuracy": 1.0, "summedMargin": 41.1}


def test_the_preference_demo_is_an_sft_start_then_dpo_from_its_merged_model() -> None:
    start, dpo = load_jobs(ROOT / PREFERENCE.jobs_yaml, DEFAULT_BUCKET)
    assert (start.spec.method, start.spec.merge.enabled, start.spec.dataset.eval_fraction) == ("sft", True, 0)
    assert (start.spec.model.name, start.spec.tpu.slice) == ("gemma4-tiny", "v5p-8")
    spec = dpo.spec
    assert (dpo.name, spec.method, spec.model.name, spec.tpu.slice) == ("demo-dpo", "dpo", "gemma4-tiny", "v5p-8")
    assert spec.model.uri is None and spec.model.fine_tune_job_ref is not None
    assert spec.model.fine_tune_job_ref.name == start.name
    assert spec.dataset.eval_fraction > 0 and spec.merge.enabled
    assert (ROOT / DATA / spec.dataset.uri.rsplit("/", 1)[-1]).name == "demo-preferences.jsonl"
    assert (ROOT / DATA / start.spec.dataset.uri.rsplit("/", 1)[-1]).name == "demo-preferences-sft.jsonl"
    assert check_finetune(start.spec) == [] and check_finetune(spec) == []


def test_the_sft_start_trains_on_the_chosen_answers_of_the_training_pairs_and_never_a_held_out_one() -> None:
    from tpuforge_workloads.data import demo
    from tpuforge_workloads.data.preference import parse_preference
    from tpuforge_workloads.data.records import read_dataset
    from tpuforge_workloads.data.split import split

    start, dpo = load_jobs(ROOT / PREFERENCE.jobs_yaml, DEFAULT_BUCKET)
    pairs_file = ROOT / DATA / dpo.spec.dataset.uri.rsplit("/", 1)[-1]
    sft_file = ROOT / DATA / start.spec.dataset.uri.rsplit("/", 1)[-1]
    # Held out as the DPO job's trainer holds them out: its evalFraction and splitSeed on the file.
    pairs = read_dataset(str(pairs_file), parse=parse_preference).records
    trained, held = split(pairs, dpo.spec.dataset.eval_fraction, dpo.spec.dataset.split_seed, "pairs")

    def conversation(messages: object) -> str:
        return json.dumps([[m.role, m.content] for m in messages])  # type: ignore[attr-defined]

    sft = [json.loads(line)["messages"] for line in sft_file.read_text().splitlines()]
    got = [json.dumps([[m["role"], m["content"]] for m in ms]) for ms in sft]
    assert got == [conversation((*r.prompt, *r.chosen)) for r in trained]
    assert len(held) == 16 and len(got) == 48
    assert not set(got) & {conversation((*r.prompt, *r.chosen)) for r in held}
    # The file is the generator's, with the demo's split (the constants the job's spec must agree with).
    rows = [json.loads(line) for line in pairs_file.read_text().splitlines()]
    assert sft_file.read_text() == demo.jsonl(demo.preference_sft_records(rows))
    assert (
        dpo.spec.dataset.eval_fraction,
        dpo.spec.dataset.split_seed,
    ) == (demo.PREFERENCE_EVAL_FRACTION, demo.PREFERENCE_SPLIT_SEED)


def test_orpo_is_the_same_job_with_its_own_name_and_directories() -> None:
    start, dpo = load_jobs(ROOT / PREFERENCE.jobs_yaml, DEFAULT_BUCKET)
    orpo = for_method(dpo, "orpo")
    assert (orpo.name, orpo.spec.method) == ("demo-orpo", "orpo")
    assert orpo.spec.checkpoint.uri == "gs://tpuforge/demo/runs/demo-orpo/checkpoints"
    assert orpo.spec.output.uri == "gs://tpuforge/demo/runs/demo-orpo/merged"
    assert orpo.spec.model.fine_tune_job_ref is not None and orpo.spec.model.fine_tune_job_ref.name == start.name
    same = {"method": "dpo", "checkpoint": dpo.spec.checkpoint, "output": dpo.spec.output}
    assert orpo.spec.model_copy(update=same) == dpo.spec
    assert check_finetune(orpo.spec) == []
    assert for_method(dpo, "dpo") is dpo
    with pytest.raises(DemoError, match="--method sft: the preference demo runs dpo or orpo"):
        for_method(dpo, "sft")


def test_the_session_reads_both_jobs_with_the_method_asked_for(tmp_path: Path) -> None:
    demo = DemoSession(Sandbox(tmp_path), Console(file=io.StringIO()), PREFERENCE, method="orpo")
    read_jobs(demo)
    assert [j.name for j in demo.jobs] == ["demo-preference-start", "demo-orpo"]
    start, tuned = jobs_of(demo)
    demo.jobs = [tuned, start]  # as after the tuned job's run: the same two, whichever is first
    assert jobs_of(demo) == (start, tuned)


def session_of(argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> DemoSession | int:
    """The session `tpuforge demo ARGV` would run (or its exit status when it refuses the options)."""
    seen: list[DemoSession] = []

    def run(demo: DemoSession) -> int:
        seen.append(demo)
        return 0

    monkeypatch.setattr(cli, "run", run)
    rc = cli.main([*argv, "--dir", str(tmp_path)])
    return seen[0] if seen else rc


def test_the_method_flag_picks_the_preference_demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cli.parse_args([]).method == "sft"
    for method in ("dpo", "orpo"):
        demo = session_of(["--method", method], monkeypatch, tmp_path)
        assert isinstance(demo, DemoSession)
        assert (demo.scenario, demo.method, demo.serve) == (PREFERENCE, method, False)
    plain = session_of(["--method", "sft"], monkeypatch, tmp_path)
    assert isinstance(plain, DemoSession) and plain.scenario.name == "capitals"
    assert session_of(["--method", "dpo", "--preempt"], monkeypatch, tmp_path) == 2
    assert session_of(["--method", "orpo", "--queue"], monkeypatch, tmp_path) == 2
    with pytest.raises(SystemExit):
        cli.parse_args(["--method", "ppo"])


def test_the_demo_passes_when_the_tuned_model_prefers_the_chosen_answers_more() -> None:
    tuned = {**START, "accuracy": 1.0, "margin": 4.53}
    assert verdict(START, tuned) is None
    # Both already right on every pair: a larger margin is the gain.
    assert verdict({**START, "accuracy": 1.0}, {**tuned, "margin": 4.53}) is None


def test_the_demo_fails_when_the_tuned_model_does_not_prefer_the_chosen_answers_more() -> None:
    assert verdict(START, dict(START)) == (
        "the tuned model's held-out reward margin 0.046 nats/token is not above the start's 0.046"
    )
    assert verdict(START, {**START, "accuracy": 1.0, "margin": -0.2}) is not None  # a worse margin
    assert verdict(START, {**START, "margin": 0.5}) == (
        "the tuned model's held-out preference accuracy 0.562 is not above the start's 0.562"
    )
    assert verdict(START, {**START, "accuracy": 0.5, "margin": 0.5}) is not None  # fewer pairs right
    assert verdict(START, {**START, "pairs": 15, "accuracy": 1.0, "margin": 4.0}) is not None


def test_a_failed_verdict_ends_the_demo_with_exit_status_1(tmp_path: Path) -> None:
    out = io.StringIO()
    demo = DemoSession(Sandbox(tmp_path), Console(file=out, width=200), PREFERENCE, method="dpo")
    problem = verdict(START, dict(START))
    assert problem is not None
    demo.problems.append(problem)
    assert demo.finish() == 1
    assert out.getvalue().strip().splitlines()[-1] == f"demo failed: {problem}"


def test_the_trainers_held_out_figures_are_told_from_the_status() -> None:
    status = {
        "progress": {"preference": {"evalStep": 120, "evalAccuracy": 1.0, "evalRewardMargin": 5.25, "evalLoss": 0.0059}}
    }
    assert trainer_record(status) == (
        "the trainer's last held-out evaluation (status.progress.preference, step 120): preference accuracy 1, "
        "reward margin 5.25, preference loss 0.0059"
    )
    assert "reported no held-out preference evaluation" in trainer_record({})
