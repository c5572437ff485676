"""What a fine-tune learns, at CPU scale: the demo's job (examples/finetune-demo.yaml: its data, LoRA and
training spec, every other setting the product's default) trained on the tiny Gemma 4 by the trainer CLI, then
scored by greedy answers, exact match, on

- held out: paraphrases of the task's questions that the training data never has
  (tpuforge_workloads.data.demo.held_out_records), the score the band is about;
- seen: the task's own phrasings (the demo asks "Which city is the capital of Norway?", a training record).

    .venv/bin/python benchmarks/learning_quality.py [--seeds 0 1 2] [--steps 400] [--mesh 1x4]
        [--set training.maxGradNorm=1e9 ...] [--task capitals] [--base-quantization none int8 int4]
        [--json out.jsonl] [--check]

`--set` changes one field of the job's spec (camelCase path, YAML value), so each default that shapes
learning can be measured against the others held fixed. `--base-quantization` trains once per value (QLoRA) and
scores each adapter twice: on the full-precision base (heldOut, as the merged model and serving answer) and on
the quantized base it trained against (heldOutQuantizedForward); baseBytes / quantizedBaseBytes are the base's
parameter bytes in each. `--mesh FxT` trains on F x T virtual CPU devices
(the run's effective batch is microBatchSize x F rows, as on a slice). `--check` compares the held-out score
with the recorded band (benchmarks/learning_quality.json) and exits 1 below it. One JSON line per seed.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from benchmarks.rows import emit

ROOT = Path(__file__).resolve().parents[1]
DEMO_JOB = ROOT / "examples" / "finetune-demo.yaml"
BAND_FILE = Path(__file__).with_suffix(".json")


def set_field(spec: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    node = spec
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def job_spec(overrides: list[str], steps: int | None) -> dict[str, Any]:
    """The demo job's spec with `overrides` ("a.b=value") applied."""
    spec: dict[str, Any] = copy.deepcopy(yaml.safe_load(DEMO_JOB.read_text())["spec"])
    if steps is not None:
        set_field(spec, "training.maxSteps", steps)
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected field.path=value")
        set_field(spec, path, yaml.safe_load(raw))
    return spec


def train_config(spec: dict[str, Any], model_dir: Path, data: Path, ckpt: Path, mesh: tuple[int, int]) -> Any:
    """The TrainConfig the operator would give the job's trainer, on local files and the asked mesh."""
    from tpuforge.api import FineTuneJobSpec, MeshSpec, parse
    from tpuforge.api.configs import train_config as operator_config

    spec = copy.deepcopy(spec)
    spec["model"]["uri"] = str(model_dir)
    spec["dataset"]["uri"] = str(data)
    spec["checkpoint"]["uri"] = str(ckpt)
    spec["output"]["uri"] = str(ckpt.parent / "merged")
    parsed = parse(FineTuneJobSpec, spec, root="spec")
    config = operator_config("bench", "learning-quality", parsed)
    return config.model_copy(
        update={"job": None, "mesh": MeshSpec(fsdp=mesh[0], tp=mesh[1]), "compile_cache_uri": None, "metrics_port": 0}
    )


def train(config: Any, workdir: Path, devices: int) -> dict[str, Any]:
    """The trainer CLI on `devices` virtual CPU devices; its last step's loss and how long it took."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.json"
    path.write_text(config.model_dump_json(by_alias=True, exclude_none=True))
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices}".strip(),
    }
    started = time.monotonic()
    args = ["--config", str(path), "--termination-log", str(workdir / "termination-log")]
    proc = subprocess.run(
        [sys.executable, "-m", "tpuforge_workloads.train", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"trainer exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads((workdir / "termination-log").read_text())
    return {"loss": result["loss"], "steps": result["step"], "trainSeconds": round(time.monotonic() - started, 1)}


def lora_model(model_dir: Path, ckpt: Path, mesh: Any, base_quantization: str = "none") -> Any:
    """The base with the run's last LoRA checkpoint: on the full-precision base (as the merge and serving use
    the adapter), or on the base quantized as `base_quantization` (the forward a QLoRA run trained against)."""
    from tpuforge_workloads.model import lora
    from tpuforge_workloads.model.adapter_checkpoint import restore_lora_params

    model = lora.untrained_lora_model(str(model_dir), str(ckpt), mesh=mesh, base_quantization=base_quantization)
    restore_lora_params(str(ckpt), model)
    return model


def base_param_bytes(model: Any) -> int:
    """Bytes of the LoRA model's base weights (every parameter but the adapters), 4-bit types at half a byte."""
    import jax
    from flax import nnx

    leaves = jax.tree.leaves(nnx.state(model, nnx.Not(nnx.LoRAParam)))
    return int(sum(x.size * (0.5 if x.dtype.name in ("int4", "uint4") else x.dtype.itemsize) for x in leaves))


def answers(
    model_dir: Path, ckpt: Path, questions: list[dict[str, Any]], max_seq_len: int, base_quantization: str = "none"
) -> tuple[list[str], int]:
    """Greedy answers of the base with the run's last LoRA checkpoint, as the trainer's samples decode, and
    the base's parameter bytes."""
    import jax

    from tpuforge_workloads.data.chat import ChatEncoder, read_tokenizer
    from tpuforge_workloads.data.records import parse_object
    from tpuforge_workloads.model.mesh import make_mesh
    from tpuforge_workloads.train.samples import Sampler, pick_prompts

    mesh = make_mesh(1, 1, jax.local_devices()[:1])
    model = lora_model(model_dir, ckpt, mesh, base_quantization)
    encoder = ChatEncoder(read_tokenizer(str(model_dir)))
    records = [parse_object(q, "question", i) for i, q in enumerate(questions)]
    prompts = pick_prompts(records, encoder, len(records), max_seq_len)
    with jax.set_mesh(mesh):
        out = Sampler(prompts, encoder, mesh, max_seq_len).answers(model)
    return [a["answer"] for a in out], base_param_bytes(model)


def exact(questions: list[dict[str, Any]], got: list[str]) -> float:
    right = [str(q["messages"][-1]["content"]).strip() == a for q, a in zip(questions, got, strict=True)]
    return sum(right) / len(right)


def run_seed(
    spec: dict[str, Any], task: str, seed: int, mesh: tuple[int, int], model_dir: Path, work: Path
) -> dict[str, Any]:
    from tpuforge_workloads.data import demo

    t = demo.TASKS[task]
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"{task}.jsonl"
    if not data.exists():
        data.write_text(demo.jsonl(demo.records(t)))
    seeded = copy.deepcopy(spec)
    set_field(seeded, "training.seed", seed)
    ckpt = work / f"run-{seed}" / "checkpoints"
    config = train_config(seeded, model_dir, data, ckpt, mesh)
    row: dict[str, Any] = {"task": task, "seed": seed, "mesh": f"{mesh[0]}x{mesh[1]}"}
    row |= train(config, work / f"run-{seed}", mesh[0] * mesh[1])
    held = demo.held_out_records(t)
    seen = demo.seen_records(t)
    got, row["baseBytes"] = answers(model_dir, ckpt, held + seen, config.training.max_seq_len)
    row["heldOut"] = round(exact(held, got[: len(held)]), 4)
    row["seen"] = round(exact(seen, got[len(held) :]), 4)
    quantization = config.lora.base_quantization
    if quantization != "none":
        # QLoRA: the adapter above runs on the full-precision base (as merged and served); here on the base
        # it trained against.
        row["baseQuantization"] = quantization
        trained, row["quantizedBaseBytes"] = answers(
            model_dir, ckpt, held + seen, config.training.max_seq_len, quantization
        )
        row["heldOutQuantizedForward"] = round(exact(held, trained[: len(held)]), 4)
        row["seenQuantizedForward"] = round(exact(seen, trained[len(held) :]), 4)
    row["wrong"] = {
        q["messages"][-2]["content"]: a
        for q, a in zip(held + seen, got, strict=True)
        if q["messages"][-1]["content"].strip() != a
    }
    return row


def band(task: str) -> dict[str, Any]:
    return dict(json.loads(BAND_FILE.read_text())[task])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="capitals", choices=["capitals", "languages"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=None, help="training.maxSteps (default: the demo's)")
    p.add_argument("--mesh", default="1x1", help="fsdp x tp virtual CPU devices (default 1x1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="spec field=value")
    p.add_argument(
        "--base-quantization",
        nargs="+",
        choices=["none", "int8", "int4"],
        help="QLoRA: train once per value (spec.lora.baseQuantization), scoring each adapter on the "
        "full-precision base and on the quantized one it trained against",
    )
    p.add_argument("--json", type=Path, help="append one JSON line per seed here")
    p.add_argument("--check", action="store_true", help="exit 1 when the held-out mean is below the band")
    p.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary directory)")
    args = p.parse_args(argv)
    fsdp, tp = (int(x) for x in args.mesh.split("x"))
    spec = job_spec(args.overrides, args.steps)

    from tpuforge_workloads.families.gemma4 import tiny as tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        model_dir = work / "gemma4-tiny"
        if not (model_dir / "config.json").exists():
            tiny_model.write(str(model_dir))
        rows = []
        runs = [(q, seed) for q in args.base_quantization or [None] for seed in args.seeds]
        for quantization, seed in runs:
            run_spec, run_work = spec, work / f"s{seed}"
            if quantization is not None:
                run_spec = copy.deepcopy(spec)
                set_field(run_spec, "lora.baseQuantization", quantization)
                run_work = work / f"{quantization}-s{seed}"
            row = run_seed(run_spec, args.task, seed, (fsdp, tp), model_dir, run_work)
            row["set"] = args.overrides
            rows.append(row)
            emit(row, args.json)
    if args.base_quantization:
        for quantization in args.base_quantization:
            group = [r for r in rows if r.get("baseQuantization", "none") == quantization]
            print(
                f"{quantization}: held-out exact match {statistics.fmean(r['heldOut'] for r in group):.3f} "
                f"(full-precision base), loss {statistics.fmean(r['loss'] for r in group):.3f}"
            )
    # The band is the full-precision LoRA's; quantized runs alone are held to it too.
    plain = [r for r in rows if r.get("baseQuantization", "none") == "none"] or rows
    scores = [r["heldOut"] for r in plain]
    mean = statistics.fmean(scores)
    spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
    print(f"held-out exact match: mean {mean:.3f}, sd {spread:.3f} over seeds {args.seeds}")
    if args.check:
        low = band(args.task)["low"]
        if mean < low:
            print(f"below the recorded band: {mean:.3f} < {low} ({BAND_FILE.name})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
