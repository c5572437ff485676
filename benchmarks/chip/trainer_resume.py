"""The trainer CLI (`python -m tpuforge_workloads.train`) on a tiny model from local files: a run of `--steps`
steps uninterrupted, and the same run killed (SIGKILL, no warning) once it has logged step `--kill-at`, then
started again to resume from its last checkpoint. Says whether the resumed run lost a step (run_summary.json
holds every step's loss across both attempts) and how far its losses are from the uninterrupted run's.

    python -m benchmarks.chip.trainer_resume --model gemma4-tiny|qwen3-tiny [--steps 300] [--kill-at 110]
        [--every 100] [--json out.jsonl] [--workdir DIR] [--base-quantization none|int8|int4]
        [--method sft|dpo|orpo|grpo]

`--method`: SFT on the capitals demo's records; DPO or ORPO on its preference pairs (the held-out pairs scored
at each checkpoint); GRPO (Gemma 4 only, with the Verilog tokenizer) on the Verilog demo's dozen problems from
an SFT start (`--sft-steps` on their right and broken answers, merged by the merge CLI, as benchmarks/grpo.py
starts), rewarded by exact match and format alone (the checker's verdict needs root and iverilog, which a TPU
VM's plain user has not); its rewards per step are kept beside the losses (`rewards`, and whether the resumed
run's are the uninterrupted run's).

The losses of the two runs on one platform should agree bit for bit (same seed, same data order, the step
restored from its checkpoint with the data iterator and dropout stream); the row also keeps the uninterrupted
losses, to set beside the same run on CPU.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.rows import emit

from benchmarks import grpo as grpo_benchmark
from tpuforge.api import (
    CheckpointSpec,
    GrpoSpec,
    LoraSpec,
    MeshSpec,
    PreferenceSpec,
    RewardSpec,
    TrainConfig,
    TrainingSpec,
)
from tpuforge.api.catalog import model_shape
from tpuforge_workloads.data import demo, verilog_tasks
from tpuforge_workloads.families.gemma4 import tiny as tiny_gemma4
from tpuforge_workloads.families.qwen3 import tiny as tiny_qwen3
from tpuforge_workloads.runtime.progress import SUMMARY_FILE

METHODS = ("sft", "dpo", "orpo", "grpo")


def dataset(method: str) -> str:
    """The run's records as JSONL: the capitals demo's (SFT), its preference pairs (DPO, ORPO), or the Verilog
    demo's problems with their right answers (GRPO)."""
    if method in ("dpo", "orpo"):
        return demo.jsonl(demo.preference_records())
    if method == "grpo":
        return demo.jsonl(verilog_tasks.records())
    return demo.jsonl(demo.records())


def sft_start(model: str, base: Path, workdir: Path, steps: int) -> Path:
    """GRPO's start: `steps` of SFT on the Verilog problems' right and broken answers (a model that writes both,
    so that a group's answers differ in reward), merged into `base` by the merge CLI as benchmarks/grpo.py
    merges its start. Returns the merged model."""
    data = workdir / "sft.jsonl"
    data.write_text(demo.jsonl(verilog_tasks.records() + verilog_tasks.records(broken=True)))
    c = config(model, base, data, workdir / "sft", steps, steps)
    c.training = c.training.model_copy(update={"max_seq_len": 160, "packing": False, "learning_rate": 5e-3})
    run = trainer(c, workdir / "run-sft")
    log = run.communicate()[0]
    if run.returncode != 0:
        raise RuntimeError(f"the SFT start exited {run.returncode}: {log[-800:]}")
    merged = workdir / "sft-merged"
    grpo_benchmark.merge(base, workdir / "sft", merged, workdir, c.lora)
    return merged


def config(
    model: str,
    model_dir: Path,
    data: Path,
    checkpoints: Path,
    steps: int,
    every: int,
    quantization: str = "none",
    method: str = "sft",
) -> TrainConfig:
    targets = list(model_shape(model).lora_targets)
    c = TrainConfig(
        model_name=model,
        model_uri=str(model_dir),
        dataset_uri=str(data),
        lora=LoraSpec(rank=8, alpha=16.0, dropout=0.05, target_modules=targets, base_quantization=quantization),
        training=TrainingSpec(
            max_seq_len=128,
            micro_batch_size=2,
            gradient_accumulation_steps=2,
            max_steps=steps,
            learning_rate=1e-3,
            warmup_steps=min(10, max(1, steps // 10)),
            packing=True,
            remat=True,
            seed=0,
        ),
        mesh=MeshSpec(fsdp=1, tp=1),
        checkpoint=CheckpointSpec(uri=str(checkpoints), every_steps=every, keep=2),
        metrics_port=0,
    )
    if method == "sft":
        return c
    # Preference pairs and rollouts are whole rows, not packed; a quarter held out (each checkpoint scores it).
    c.method = method
    c.data = c.data.model_copy(update={"eval_fraction": 0.25})
    c.training = c.training.model_copy(update={"packing": False})
    if method in ("dpo", "orpo"):
        c.preference = PreferenceSpec()
    else:  # two prompts a step, four answers each, of up to 48 tokens, in rows of 160
        reward = RewardSpec(checker=0.0, exact_match=1.0, format=0.5)
        c.grpo = GrpoSpec(group_size=4, max_tokens=48, reward=reward)
        c.training = c.training.model_copy(
            update={"max_seq_len": 160, "micro_batch_size": 2, "gradient_accumulation_steps": 1}
        )
    return c


def trainer(c: TrainConfig, workdir: Path) -> subprocess.Popen[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.json"
    path.write_text(c.model_dump_json(by_alias=True, exclude_none=True))
    cmd = [sys.executable, "-m", "tpuforge_workloads.train", "--config", str(path)]
    cmd += ["--termination-log", str(workdir / "termination-log")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _logged_step(line: str, steps: int) -> int | None:
    """The step a trainer log line reports ("step N/STEPS ..."), else None."""
    marker = f"/{steps}"
    for word in line.split():
        if word.endswith(marker) and word[: -len(marker)].isdigit():
            return int(word[: -len(marker)])
    return None


def losses(checkpoints: Path) -> tuple[dict[int, float], list[dict[str, Any]]]:
    attempts = json.loads((checkpoints / SUMMARY_FILE).read_text())["attempts"]
    merged: dict[int, float] = {}
    for a in attempts:
        merged.update({int(k): v for k, v in a["losses"].items()})
    return merged, attempts


def rewards(attempts: list[dict[str, Any]]) -> dict[int, float]:
    """A GRPO run's mean reward by step, over its attempts (the run summary's `train_rl`); {} for other methods."""
    merged: dict[int, float] = {}
    for a in attempts:
        merged.update({int(k): v["reward"] for k, v in a.get("train_rl", {}).items()})
    return merged


def measure(
    model: str,
    steps: int,
    kill_at: int,
    every: int,
    workdir: Path,
    quantization: str,
    method: str = "sft",
    sft_steps: int = 150,
) -> dict[str, Any]:
    import jax

    model_dir, data = workdir / model, workdir / "train.jsonl"
    started = time.monotonic()
    if method == "grpo":
        if model_shape(model).family != "gemma4":
            return {"model": model, "method": method, "error": "--method grpo runs on a Gemma 4 tiny model"}
        tiny_gemma4.write(str(model_dir), tokenizer="verilog")
        model_dir = sft_start(model, model_dir, workdir, sft_steps)
    else:
        (tiny_gemma4 if model_shape(model).family == "gemma4" else tiny_qwen3).write(str(model_dir))
    data.write_text(dataset(method))
    whole = config(model, model_dir, data, workdir / "whole", steps, every, quantization, method)
    reference = trainer(whole, workdir / "run-whole")
    log = reference.communicate()[0]
    if reference.returncode != 0:
        return {"model": model, "error": f"uninterrupted run exited {reference.returncode}: {log[-800:]}"}
    want, whole_attempts = losses(workdir / "whole")
    killed = config(model, model_dir, data, workdir / "killed", steps, every, quantization, method)
    first = trainer(killed, workdir / "run-killed")
    assert first.stdout is not None
    # Killed at the first step at or after `kill_at` once the checkpoint before it is committed (Orbax renames
    # its step folder into place at commit): on a chip the steps outrun an asynchronous commit, and a kill
    # before it would test a restart from step 0, not a resume.
    checkpoint = workdir / "killed" / str(kill_at // every * every)
    killed_after = None
    for line in first.stdout:
        step = _logged_step(line, steps)
        if step is not None and step >= kill_at and checkpoint.is_dir():
            first.send_signal(signal.SIGKILL)
            killed_after = step
            break
    first.wait()
    if killed_after is None:
        return {"model": model, "error": f"the run ended (exit {first.returncode}) before {checkpoint} was committed"}
    second = trainer(killed, workdir / "run-resumed")
    log = second.communicate()[0]
    if second.returncode != 0:
        return {"model": model, "error": f"resumed run exited {second.returncode}: {log[-800:]}"}
    got, attempts = losses(workdir / "killed")
    common = sorted(set(got) & set(want))
    diffs = [abs(got[s] - want[s]) / max(abs(want[s]), 1e-9) for s in common]
    want_rewards, got_rewards = rewards(whole_attempts), rewards(attempts)
    rl: dict[str, Any] = {}
    if want_rewards:
        rl = {
            "rewards": [want_rewards[s] for s in sorted(want_rewards)],
            "rewardsIdentical": all(got_rewards.get(s) == r for s, r in want_rewards.items()),
        }
    return {
        "model": model,
        "method": method,
        "baseQuantization": quantization,
        "platform": jax.devices()[0].platform,
        "steps": steps,
        "killedAfterStep": killed_after,
        "resumedAt": attempts[-1].get("start_step"),
        "attempts": len(attempts),
        "missingSteps": sorted(set(range(1, steps + 1)) - set(got)),
        "maxRelDiff": max(diffs) if diffs else None,
        "identical": all(got[s] == want[s] for s in common),
        "lossFirst": want.get(1),
        "lossLast": want.get(steps),
        "losses": [want[s] for s in sorted(want)],
        "seconds": round(time.monotonic() - started, 1),
    } | rl


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma4-tiny")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--kill-at", type=int, default=110)
    ap.add_argument("--every", type=int, default=100, help="checkpoint every N steps")
    ap.add_argument("--workdir", help="default: a temporary directory")
    ap.add_argument("--json", help="append the row here")
    ap.add_argument("--base-quantization", default="none", choices=("none", "int8", "int4"), help="QLoRA's base")
    ap.add_argument("--method", default="sft", choices=METHODS, help="the training method (spec.method)")
    ap.add_argument("--sft-steps", type=int, default=150, help="--method grpo: the SFT start's steps")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tpuforge-resume-"))
    row = measure(
        args.model,
        args.steps,
        args.kill_at,
        args.every,
        workdir,
        args.base_quantization,
        args.method,
        args.sft_steps,
    )
    emit(row, args.json)
    return 0 if "error" not in row else 1


if __name__ == "__main__":
    sys.exit(main())
