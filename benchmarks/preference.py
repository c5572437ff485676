"""What preference tuning learns, at CPU scale: the demo's job (examples/finetune-demo.yaml: LoRA and training
spec) run with spec.method dpo and orpo on the demo's preference pairs (examples/data/demo-preferences.jsonl:
a capital question, the right capital chosen, another country's rejected), a quarter of the pairs held out,
on the tiny Gemma 4 by the trainer CLI. On the held-out pairs it scores

- the starting model (the base: LoRA B is zero) and each tuned model alike: preference accuracy, the share of
  pairs whose chosen answer has the higher log-probability (summed over the answer's tokens), and the mean
  log-probability margin (chosen - rejected), nats;
- each run's own held-out figures from its run summary: the preference loss, accuracy and reward margin at
  step 0 and at its last step (DPO's reward is beta x the log-probability change from the base, so its
  step-0 margin is 0; ORPO's is the mean per-token log-probability).

With `--start sft` the preference runs start from an SFT model rather than the base: the demo's job (SFT,
`--sft-steps` steps of 4) trained on the chosen answers of the training pairs only
(tpuforge_workloads.data.demo.preference_sft_records: the held-out pairs, split as the trainer splits the pairs
file, are left out), merged by the merge CLI, and each method run on that merged model (its reference model,
for DPO). Then the base and the SFT model are both scored on the held-out pairs, and each run's gains are
against the SFT model.

    .venv/bin/python benchmarks/preference.py [--methods dpo orpo] [--steps 120] [--seed 0]
        [--rejected mistaken|swapped] [--start base|sft] [--sft-steps 200]
        [--set preference.beta=0.5 ...] [--json out.jsonl]

One JSON line for the starting model (with --start sft: the base, then the SFT model), then one per method.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from benchmarks.learning_quality import lora_model, set_field, train, train_config
from benchmarks.rows import emit

from tpuforge_workloads.data import demo

ROOT = Path(__file__).resolve().parents[1]
DEMO_JOB = ROOT / "examples" / "finetune-demo.yaml"
PAIRS = ROOT / "examples" / "data" / "demo-preferences.jsonl"
EVAL_FRACTION = demo.PREFERENCE_EVAL_FRACTION  # as the preference demo holds out


def job_spec(method: str, steps: int, seed: int, overrides: list[str]) -> dict[str, Any]:
    """The demo job's spec as a preference job: `method`, pairs held out, two pairs a micro-batch."""
    spec: dict[str, Any] = copy.deepcopy(yaml.safe_load(DEMO_JOB.read_text())["spec"])
    spec["method"] = method
    for path, value in (
        ("dataset.evalFraction", EVAL_FRACTION),
        ("training.maxSteps", steps),
        ("training.microBatchSize", 2),
        ("training.warmupSteps", max(1, steps // 10)),
        ("training.seed", seed),
        ("checkpoint.everySteps", max(1, steps // 4)),
    ):
        set_field(spec, path, value)
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected field.path=value")
        set_field(spec, path, yaml.safe_load(raw))
    return spec


def held_out_ranking(model_dir: Path, ckpt: Path | None, config: Any) -> dict[str, float]:
    """Preference accuracy and mean log-probability margin on the held-out pairs: of the base with the run's
    last adapter (`ckpt`), or of the base alone (None: the adapters zeroed)."""
    import jax
    import numpy as np

    from tpuforge_workloads.data.pipeline import eval_batches
    from tpuforge_workloads.families.attention import model_inputs
    from tpuforge_workloads.model import loss
    from tpuforge_workloads.model.mesh import make_mesh
    from tpuforge_workloads.train import preference
    from tpuforge_workloads.train.plan import make_plan

    plan = make_plan(config, write_manifest=False)
    mesh = make_mesh(1, 1, jax.local_devices()[:1])
    model = lora_model(model_dir, Path(config.checkpoint.uri), mesh)
    logps, counts = [], []
    with jax.set_mesh(mesh):
        for batch in eval_batches(plan.eval_examples, 8, config.training.max_seq_len, plan.batch.pad_id):
            inputs = model_inputs(batch)
            if ckpt is None:
                with preference.adapters_off(model):
                    logp, count = loss.answer_logps(model, **inputs)
            else:
                logp, count = loss.answer_logps(model, **inputs)
            real = np.asarray(count) > 0
            logps += np.asarray(logp)[real].tolist()
            counts += np.asarray(count)[real].tolist()
    summed = np.array(logps[0::2]) - np.array(logps[1::2])
    per_token = np.array(logps[0::2]) / np.array(counts[0::2]) - np.array(logps[1::2]) / np.array(counts[1::2])
    return {
        "pairs": len(summed),
        "accuracy": round(float((summed > 0).mean()), 4),
        "margin": round(float(summed.mean()), 4),
        "perTokenAccuracy": round(float((per_token > 0).mean()), 4),
        "perTokenMargin": round(float(per_token.mean()), 4),
    }


def run_method(
    method: str, steps: int, seed: int, overrides: list[str], pairs: Path, model_dir: Path, work: Path
) -> tuple[dict[str, Any], Any]:
    ckpt = work / method / "checkpoints"
    config = train_config(job_spec(method, steps, seed, overrides), model_dir, pairs, ckpt, (1, 1))
    row: dict[str, Any] = {"method": method, "pairs": pairs.name, "seed": seed, "steps": steps}
    row |= {"set": overrides} if overrides else {}
    row |= train(config, work / method, 1)
    from tpuforge_workloads.runtime.progress import SUMMARY_FILE

    attempt = json.loads((ckpt / SUMMARY_FILE).read_text())["attempts"][-1]
    evals = attempt["eval_preference"]
    last = str(max(int(s) for s in evals))
    row["trainerHeldOut"] = {"step0": evals["0"], f"step{last}": evals[last]}
    row["heldOutAccuracyByStep"] = {s: e["accuracy"] for s, e in evals.items()}
    row["heldOut"] = held_out_ranking(model_dir, ckpt, config)
    return row, config


def sft_start(pairs: Path, steps: int, seed: int, model_dir: Path, work: Path) -> tuple[Path, dict[str, Any]]:
    """The demo's SFT job on the chosen answers of the training pairs of `pairs`, `steps` steps, merged; the
    merged model's directory and the run's row."""
    from tpuforge.api import FineTuneJobSpec, parse
    from tpuforge.api.configs import merge_config

    rows = [json.loads(line) for line in pairs.read_text().splitlines() if line.strip()]
    data = work / "sft" / "chosen.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    records = demo.preference_sft_records(rows, EVAL_FRACTION)
    data.write_text(demo.jsonl(records))
    spec: dict[str, Any] = copy.deepcopy(yaml.safe_load(DEMO_JOB.read_text())["spec"])
    for path, value in (
        ("training.maxSteps", steps),
        ("training.warmupSteps", max(1, steps // 10)),
        ("training.seed", seed),
        ("checkpoint.everySteps", steps),
        ("merge.verify", False),
    ):
        set_field(spec, path, value)
    ckpt = work / "sft" / "checkpoints"
    config = train_config(spec, model_dir, data, ckpt, (1, 1))
    row: dict[str, Any] = {"method": "sft", "pairs": pairs.name, "seed": seed, "steps": steps, "records": len(records)}
    row |= train(config, work / "sft", 1)
    merged = work / "sft" / "merged"
    spec["model"]["uri"], spec["checkpoint"]["uri"], spec["output"]["uri"] = str(model_dir), str(ckpt), str(merged)
    cfg = merge_config("bench", "preference-sft", parse(FineTuneJobSpec, spec, root="spec"))
    (work / "sft" / "merge.json").write_text(cfg.model_copy(update={"job": None}).model_dump_json(by_alias=True))
    proc = subprocess.run(
        [sys.executable, "-m", "tpuforge_workloads.merge", "--config", str(work / "sft" / "merge.json")],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"merge exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return merged, row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", nargs="+", default=["dpo", "orpo"], choices=["dpo", "orpo"])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rejected",
        default="mistaken",
        choices=["mistaken", "swapped"],
        help="mistaken: the repo's set; swapped: each wrong answer is another country's capital",
    )
    p.add_argument(
        "--start",
        default="base",
        choices=["base", "sft"],
        help="base: tune the base; sft: first SFT on the training pairs' chosen answers, merged, and tune that",
    )
    p.add_argument("--sft-steps", type=int, default=200, help="--start sft: the SFT run's steps (4 records each)")
    p.add_argument("--set", action="append", default=[], help="field.path=value in the job's spec")
    p.add_argument("--json", default=None, help="append each row to this JSON-lines file")
    args = p.parse_args(argv)

    from tpuforge_workloads.families.gemma4 import tiny as tiny_model

    with tempfile.TemporaryDirectory(prefix="preference-bench-") as tmp:
        work = Path(tmp)
        model_dir = work / "gemma4-tiny"
        tiny_model.write(str(model_dir))
        pairs = PAIRS
        if args.rejected != "mistaken":
            pairs = work / f"demo-preferences-{args.rejected}.jsonl"
            pairs.write_text(demo.jsonl(demo.preference_records(rejected=args.rejected)))
        start: dict[str, Any] | None = None
        tuned_from, sft_row = model_dir, None
        if args.start == "sft":
            tuned_from, sft_row = sft_start(pairs, args.sft_steps, args.seed, model_dir, work)
        for method in args.methods:
            row, config = run_method(method, args.steps, args.seed, args.set, pairs, tuned_from, work)
            row["start"] = args.start
            if start is None:
                base: dict[str, Any] = {"method": "start" if sft_row is None else "base", "pairs": pairs.name}
                base["heldOut"] = held_out_ranking(model_dir, None, config)
                emit(base, args.json)
                start = base
                if sft_row is not None:
                    # The SFT model: the merged model the runs start from, adapters off.
                    start = sft_row | {"heldOut": held_out_ranking(tuned_from, None, config)}
                    emit(start, args.json)
            for key in ("accuracy", "perTokenAccuracy", "perTokenMargin"):
                row[f"{key}Gain"] = round(row["heldOut"][key] - start["heldOut"][key], 4)
            emit(row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
