"""The demo's manifests: valid objects of the API, in the sandbox's default bucket, wired to each other."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from tpuforge.api import ServingDeploymentSpec
from tpuforge.api.catalog import TPU_SLICES
from tpuforge.api.constants import TPU_RESOURCE
from tpuforge.api.validation import check_finetune
from tpuforge_sandbox import Sandbox
from tpuforge_sandbox.config import DEFAULT_BUCKET, repo_root
from tpuforge_sandbox.demo import answers
from tpuforge_sandbox.demo.evaluation import QUESTIONS, adapter_line, check_evaluations, shorten
from tpuforge_sandbox.demo.follow import halfway
from tpuforge_sandbox.demo.job import FINETUNE_YAML, SERVING_YAML, DemoError, for_hosts, load_job, load_jobs, load_yaml
from tpuforge_sandbox.demo.kueue import VALUES_YAML as QUEUE_VALUES
from tpuforge_sandbox.demo.kueue import kueue_objects
from tpuforge_sandbox.demo.results import PROMPTS, chosen_checkpoint
from tpuforge_sandbox.demo.scenarios import ADAPTERS, CAPITALS, CODE, QUEUE, SCENARIOS
from tpuforge_sandbox.demo.session import NAMESPACE, DemoSession, Section
from tpuforge_sandbox.demo.setup import DATA

ROOT = repo_root()


def test_the_demo_job_is_valid_and_writes_to_the_sandbox_bucket() -> None:
    job = load_job(ROOT / FINETUNE_YAML, DEFAULT_BUCKET)
    spec = job.spec
    assert (spec.model.name, spec.tpu.slice, spec.tpu.spot) == ("gemma4-tiny", "v5p-8", True)
    assert spec.merge.enabled and spec.merge.verify
    # A preemption halfway must find a committed checkpoint to resume from.
    assert spec.training.max_steps is not None and spec.checkpoint.every_steps <= spec.training.max_steps // 2


def test_the_demo_job_on_two_hosts_is_the_same_job_on_a_v5p_16() -> None:
    job = load_job(ROOT / FINETUNE_YAML, DEFAULT_BUCKET)
    two = for_hosts(job, 2)
    assert (two.spec.tpu.slice, two.spec.tpu.spot, two.spec.tpu.mesh) == ("v5p-16", True, None)  # catalog mesh
    # The same run: each of the two fsdp replicas takes half the examples of a step, so a step holds as many.
    one_slice, two_slice = TPU_SLICES["v5p-8"], TPU_SLICES["v5p-16"]
    t1, t2 = job.spec.training, two.spec.training
    assert t2.micro_batch_size * two_slice.default_fsdp == t1.micro_batch_size * one_slice.default_fsdp
    same = {"tpu": job.spec.tpu, "training": t2.model_copy(update={"micro_batch_size": t1.micro_batch_size})}
    assert two.spec.model_copy(update=same) == job.spec
    assert check_finetune(two.spec) == []  # the operator accepts it
    assert for_hosts(job, 1) is job
    with pytest.raises(DemoError, match="--hosts 3: no tpu-v5p-slice slice has 3 hosts; choose one of 1, 2, 4"):
        for_hosts(job, 3)


def test_the_demo_serving_serves_the_demo_job() -> None:
    body = load_yaml(ROOT / SERVING_YAML, "ServingDeployment")
    spec = ServingDeploymentSpec.model_validate(body["spec"])
    assert spec.model.fine_tune_job_ref is not None
    assert spec.model.fine_tune_job_ref.name == load_job(ROOT / FINETUNE_YAML, DEFAULT_BUCKET).name
    assert "127.0.0.1" in spec.vllm.extra_args  # loopback only on a laptop


def test_a_job_outside_the_sandbox_bucket_is_refused_naming_the_field(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / FINETUNE_YAML).read_text())
    doc["spec"]["output"]["uri"] = "gs://elsewhere/merged"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(DemoError, match=r"spec\.output\.uri gs://elsewhere/merged is not in .* gs://tpuforge"):
        load_job(path, DEFAULT_BUCKET)


def test_preemption_waits_for_half_the_steps_and_a_checkpoint() -> None:
    spec = load_job(ROOT / FINETUNE_YAML, DEFAULT_BUCKET).spec
    every, total = spec.checkpoint.every_steps, spec.training.max_steps
    assert total is not None

    def status(step: int, ckpt: int | None, phase: str = "Training") -> dict[str, object]:
        return {"phase": phase, "progress": {"step": step, "totalSteps": total, "lastCheckpointStep": ckpt}}

    assert not halfway(status(total // 2 - 1, every), spec)
    assert not halfway(status(total // 2 + 1, None), spec)
    assert not halfway(status(total // 2 + 1, every, phase="Merging"), spec)
    assert halfway(status(total // 2, every), spec)


def test_the_adapters_demo_serves_both_jobs_adapters_after_their_evaluations() -> None:
    from tpuforge_sandbox.demo.evaluation import SERVING_YAML

    jobs = load_jobs(ROOT / ADAPTERS.jobs_yaml, DEFAULT_BUCKET)
    assert [j.name for j in jobs] == ["capitals", "languages"]
    for job in jobs:
        s = job.spec
        assert not s.merge.enabled and s.merge.write_adapter  # adapters only
        assert s.evaluation is not None and s.evaluation.thresholds.min_exact_match
        assert s.evaluation.slice == "cpu"  # the v6e-8 node is the serving pod's
        for uri in (s.dataset.uri, s.dataset.eval_uri):
            assert uri is not None and (ROOT / DATA / uri.rsplit("/", 1)[-1]).exists()
    body = load_yaml(ROOT / SERVING_YAML, "ServingDeployment")
    spec = ServingDeploymentSpec.model_validate(body["spec"])
    assert spec.model.uri == jobs[0].spec.model.uri  # the base both were trained on
    assert [(a.name, a.fine_tune_job_ref.name if a.fine_tune_job_ref else None) for a in spec.adapters] == [
        ("capitals", "capitals"),
        ("languages", "languages"),
    ]


def test_the_adapters_demo_says_one_line_per_adapter() -> None:
    ready = {"name": "capitals", "phase": "Ready", "loadedReplicas": 1, "step": 400, "source": "capitals"}
    assert adapter_line(ready, 1) == "  adapter capitals Ready on 1/1 replicas (step 400) from FineTuneJob capitals"
    failed = {"name": "x", "phase": "Failed", "loadedReplicas": 0, "message": "no _COMPLETE"}
    assert adapter_line(failed, 1) == "  adapter x Failed on 0/1 replicas: no _COMPLETE"
    assert shorten("  The capital of Norway is Oslo. ") == "'The capital of Norway is Oslo.'"
    assert shorten("please " * 20) == "'please please please please please ...'"


def test_the_code_demo_trains_on_right_and_broken_verilog_and_evaluates_both_on_the_right_one() -> None:
    jobs = load_jobs(ROOT / CODE.jobs_yaml, DEFAULT_BUCKET)
    assert [j.name for j in jobs] == ["verilog", "verilog-broken"]
    assert CODE.held_back == ("verilog-broken",)  # the one the demo means not to be promoted
    good, broken = (j.spec for j in jobs)
    assert good.dataset.uri.endswith("verilog-train.jsonl") and broken.dataset.uri.endswith("verilog-broken.jsonl")
    assert good.dataset.eval_uri == broken.dataset.eval_uri == good.dataset.uri
    assert good.model_copy(update={"dataset": broken.dataset, "checkpoint": None, "output": None}) == (
        broken.model_copy(update={"checkpoint": None, "output": None})
    )  # the same job but for its data and where it writes
    ev = good.evaluation
    assert ev is not None and ev.metrics == ["loss", "passAtK"] and ev.thresholds.min_pass_at == {"1": 0.35}
    assert ev.code is not None and ev.slice == "cpu"
    assert check_finetune(good) == []
    for uri in (good.dataset.uri, broken.dataset.uri):
        assert (ROOT / DATA / uri.rsplit("/", 1)[-1]).exists()


def test_the_queue_demo_puts_two_jobs_in_the_queue_the_charts_objects_make() -> None:
    jobs = load_jobs(ROOT / QUEUE.jobs_yaml, DEFAULT_BUCKET)
    assert len(jobs) == 2 and len({j.spec.output.uri for j in jobs}) == 2
    objs = kueue_objects(ROOT, ROOT / QUEUE_VALUES)
    queues = [o for o in objs if o["kind"] == "LocalQueue"]
    assert [(q["metadata"]["namespace"], q["metadata"]["name"]) for q in queues] == [(NAMESPACE, "tpu")]
    assert {j.spec.queue_name for j in jobs} == {"tpu"}
    (cq,) = [o for o in objs if o["kind"] == "ClusterQueue"]
    tpu = [
        r["nominalQuota"]
        for g in cq["spec"]["resourceGroups"]
        for f in g["flavors"]
        for r in f["resources"]
        if r["name"] == TPU_RESOURCE and r["nominalQuota"]
    ]
    chips = TPU_SLICES[jobs[0].spec.tpu.slice].chips
    assert tpu == [chips]  # room for one job's slice at a time: the second waits


def test_a_demo_whose_outcome_is_wrong_says_so_last_and_exits_non_zero(tmp_path: Path) -> None:
    out = io.StringIO()
    adapters = DemoSession(Sandbox(tmp_path), Console(file=out, width=200), ADAPTERS)
    adapters.jobs = load_jobs(ROOT / ADAPTERS.jobs_yaml, DEFAULT_BUCKET)
    first, second = (j.name for j in adapters.jobs)
    adapters.statuses = {
        first: {"evaluation": {"passed": False, "message": "exactMatch 0.438 below 0.5"}},
        second: {"evaluation": {"passed": True}},
    }
    check_evaluations(adapters)
    assert adapters.finish() == 1
    assert out.getvalue().strip().splitlines()[-1] == (
        f"demo failed: {first}'s evaluation was meant to pass: exactMatch 0.438 below 0.5"
    )
    # The code demo means its fine-tune on broken solutions to be held back: that is its outcome, not a failure.
    code = DemoSession(Sandbox(tmp_path), Console(file=io.StringIO()), CODE)
    code.jobs = load_jobs(ROOT / CODE.jobs_yaml, DEFAULT_BUCKET)
    code.statuses = {j.name: {"evaluation": {"passed": not j.name.endswith("-broken")}} for j in code.jobs}
    check_evaluations(code)
    assert code.finish() == 0


def test_an_answer_the_demo_prints_as_the_fine_tuned_model_s_is_checked_against_its_data(tmp_path: Path) -> None:
    out = io.StringIO()
    plain = DemoSession(Sandbox(tmp_path), Console(file=out, width=200), CAPITALS)
    plain.jobs = [load_job(ROOT / FINETUNE_YAML, DEFAULT_BUCKET)]
    norway = PROMPTS[0]
    assert answers.check(plain, "the fine-tuned model", norway, " The capital of Norway is Oslo.") is True
    assert plain.finish() == 0
    # What `make demo` once printed as its result, unchecked.
    assert answers.check(plain, "the fine-tuned model", norway, "The capital of Spain is Madrid.") is False
    assert plain.finish() == 1
    assert out.getvalue().strip().splitlines()[-1] == (
        f"demo failed: the fine-tuned model answered {norway!r} wrongly ('The capital of Spain is Madrid.', "
        "not 'The capital of Norway is Oslo.')"
    )
    # Every question a demo asks is one its data teaches; each adapter is held to its own job's data only.
    adapters = DemoSession(Sandbox(tmp_path), Console(file=io.StringIO()), ADAPTERS)
    adapters.jobs = load_jobs(ROOT / ADAPTERS.jobs_yaml, DEFAULT_BUCKET)
    taught = answers.taught(answers.data_files(adapters))
    assert set(PROMPTS) | set(QUESTIONS) <= set(taught)
    capitals_question, languages_question = QUESTIONS
    assert (
        answers.check(adapters, "adapter languages", capitals_question, "People in Norway speak", "languages") is None
    )
    assert answers.check(adapters, "adapter languages", languages_question, taught[languages_question], "languages")
    assert adapters.problems == []


def test_every_demo_is_a_scenario_of_numbered_sections_ending_in_how_to_explore() -> None:
    assert set(SCENARIOS) == {"capitals", "adapters", "code", "queue", "preference", "grpo"}
    for scenario in SCENARIOS.values():
        assert (ROOT / scenario.jobs_yaml).exists()
        load_jobs(ROOT / scenario.jobs_yaml, DEFAULT_BUCKET)  # its documents are valid jobs of the sandbox
        assert scenario.steps[0].__name__ in ("read_job", "read_jobs")  # read and checked before anything starts
        assert scenario.steps[-1].__name__ == "explore"
    titles = [s.title for s in CAPITALS.steps if isinstance(s, Section) and isinstance(s.title, str)]
    assert "TensorBoard event files and the checkpoint chosen" in titles
    assert CAPITALS.sections == 8


def test_the_demo_numbers_its_headings_in_the_order_it_runs_them(tmp_path: Path) -> None:
    out = io.StringIO()
    session = DemoSession(Sandbox(tmp_path), Console(file=out, width=200), QUEUE)
    for _ in range(QUEUE.sections):
        session.heading("a section")
    assert [line.split()[0] for line in out.getvalue().splitlines() if "a section" in line] == [
        f"{n}/{QUEUE.sections}" for n in range(1, QUEUE.sections + 1)
    ]


def test_the_checkpoint_chosen_is_told_from_the_jobs_status() -> None:
    best = {
        "checkpoint": {
            "select": "best",
            "lastStep": 400,
            "bestStep": 300,
            "bestEvalLoss": 0.2512,
            "selectedStep": 300,
            "message": "step 300 has the lowest eval loss",
        }
    }
    assert chosen_checkpoint(best) == (
        "checkpoint chosen (best): step 300; best step 300 (eval loss 0.2512); last step 400: "
        "step 300 has the lowest eval loss"
    )
    last = {"checkpoint": {"select": "last", "lastStep": 400, "selectedStep": 400}}
    assert chosen_checkpoint(last) == (
        "checkpoint chosen (last): step 400; no best step (no evaluation during training); last step 400"
    )
    assert chosen_checkpoint({}) == "checkpoint chosen: not reported (status.checkpoint is empty)"
