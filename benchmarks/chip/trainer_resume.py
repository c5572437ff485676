"""The trainer CLI (`python -m tpuforge_workloads.train`) on a tiny model from local files: a run of `--steps`
steps uninterrupted, and the same run killed (SIGKILL, no warning) once it has logged step `--kill-at`, then
started again to resume from its last checkpoint. Says whether the resumed run lost a step (run_summary.json
holds every step's loss across both attempts) and how far its losses are from the uninterrupted run's.

    python -m benchmarks.chip.trainer_resume --model gemma4-tiny|qwen3-tiny [--steps 300] [--kill-at 110]
        [--every 100] [--json out.jsonl] [--workdir DIR] [--base-quantization none|int8|int4]

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

from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec
from tpuforge.api.catalog import model_shape
from tpuforge_workloads.data import demo
from tpuforge_workloads.families.gemma4 import tiny as tiny_gemma4
from tpuforge_workloads.families.qwen3 import tiny as tiny_qwen3
from tpuforge_workloads.runtime.progress import SUMMARY_FILE


def config(
    model: str, model_dir: Path, data: Path, checkpoints: Path, steps: int, every: int, quantization: str = "none"
) -> TrainConfig:
    targets = list(model_shape(model).lora_targets)
    return TrainConfig(
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
            warmup_steps=10,
            packing=True,
            remat=True,
            seed=0,
        ),
        mesh=MeshSpec(fsdp=1, tp=1),
        checkpoint=CheckpointSpec(uri=str(checkpoints), every_steps=every, keep=2),
        metrics_port=0,
    )


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


def measure(model: str, steps: int, kill_at: int, every: int, workdir: Path, quantization: str) -> dict[str, Any]:
    import jax

    model_dir, data = workdir / model, workdir / "train.jsonl"
    (tiny_gemma4 if model_shape(model).family == "gemma4" else tiny_qwen3).write(str(model_dir))
    data.write_text(demo.jsonl(demo.records()))
    started = time.monotonic()
    whole = config(model, model_dir, data, workdir / "whole", steps, every, quantization)
    reference = trainer(whole, workdir / "run-whole")
    log = reference.communicate()[0]
    if reference.returncode != 0:
        return {"model": model, "error": f"uninterrupted run exited {reference.returncode}: {log[-800:]}"}
    want, _ = losses(workdir / "whole")
    killed = config(model, model_dir, data, workdir / "killed", steps, every, quantization)
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
    return {
        "model": model,
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
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma4-tiny")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--kill-at", type=int, default=110)
    ap.add_argument("--every", type=int, default=100, help="checkpoint every N steps")
    ap.add_argument("--workdir", help="default: a temporary directory")
    ap.add_argument("--json", help="append the row here")
    ap.add_argument("--base-quantization", default="none", choices=("none", "int8", "int4"), help="QLoRA's base")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="tpuforge-resume-"))
    row = measure(args.model, args.steps, args.kill_at, args.every, workdir, args.base_quantization)
    emit(row, args.json)
    return 0 if "error" not in row else 1


if __name__ == "__main__":
    sys.exit(main())
