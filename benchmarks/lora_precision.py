"""LoRA adapters stored in bfloat16 (as Qwix creates them on a bfloat16 base) against float32 (what the trainer
keeps), on the tiny Gemma 4 loaded in bfloat16, all else equal: the same data, seeds, initial adapters,
optimizer (AdamW, warmup-cosine) and steps, the forward computing in bfloat16 either way.

Prints the training loss every `--every` steps for both, the first step whose loss is not finite, the
held-out loss at the end, and how many entries of A never changed from their initial value (in bfloat16 an
AdamW step of ~lr is rounded away on any entry larger than ~256 x lr). Measured (docs/training.md): with
bfloat16 adapters, and so bfloat16 AdamW moments, the adapters are NaN after the first optimizer step.

    .venv/bin/python benchmarks/lora_precision.py [--steps 200] [--lr 1e-4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()

import jax
import numpy as np
from flax import nnx
from tunix.sft import hooks, peft_trainer

from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec
from tpuforge_workloads.data import demo
from tpuforge_workloads.data.pipeline import batches, eval_batches
from tpuforge_workloads.families.attention import model_inputs
from tpuforge_workloads.families.gemma4 import tiny as tiny_model
from tpuforge_workloads.model import loss
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.train import loop, plan
from tpuforge_workloads.train.preemption import PreemptionWatch
from tpuforge_workloads.train.trainer import optimizer as run_optimizer

SEQ = 128


class Losses(hooks.TrainingHooks):  # type: ignore[misc]
    def __init__(self) -> None:
        self.losses: dict[int, float] = {}

    def on_train_step_end(self, train_ctx: Any, train_step: int, train_loss: float) -> None:
        self.losses[train_step] = float(train_loss)

    def on_train_start(self, train_ctx: Any) -> None: ...
    def on_train_end(self, train_ctx: Any) -> None: ...
    def on_train_step_start(self, train_ctx: Any) -> None: ...
    def on_eval_step_start(self, train_ctx: Any) -> None: ...
    def on_eval_step_end(self, train_ctx: Any, eval_loss: float) -> None: ...


def bf16_tiny_model(out: Path) -> None:
    """The tiny checkpoint, declared bfloat16: the loader casts its weights to bfloat16 as it would the 31B's."""
    tiny_model.write(str(out))
    config = json.loads((out / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2))


def held_out_loss(model: Any, p: plan.Plan, mesh: jax.sharding.Mesh) -> float:
    step = nnx.jit(lambda m, b: loss.nll_sum_and_count(m, **model_inputs(b)))
    total = count = 0.0
    with jax.set_mesh(mesh):
        for b in eval_batches(p.eval_examples, p.rows, SEQ, p.batch.pad_id):
            s, n = step(model, {k: jax.numpy.asarray(v) for k, v in b.items()})
            total, count = total + float(s), count + float(n)
    return total / count


def train(p: plan.Plan, mesh: jax.sharding.Mesh, adapter_dtype: str) -> dict[str, Any]:
    model = loop.build_model(p, mesh, {}, adapter_dtype=adapter_dtype)
    initial = jax.tree.map(lambda x: np.asarray(x, np.float32), nnx.state(model, nnx.LoRAParam))
    g = p.config.training.gradient_accumulation_steps
    config = peft_trainer.TrainingConfig(
        eval_every_n_steps=10**6,
        max_steps=p.total_steps,
        gradient_accumulation_steps=g if g > 1 else None,
        data_sharding_axis=("fsdp",),
        pbar_description=None,
    )
    recorder = Losses()
    feed = loop.BatchFeed(iter(batches(p.examples, p.batch)), g, p.total_steps, PreemptionWatch(), [])
    with jax.set_mesh(mesh):
        trainer = peft_trainer.PeftTrainer(model, run_optimizer(p.config.training, p.total_steps), config).with_loss_fn(
            loss.loss_fn, has_aux=True
        )
        trainer.with_gen_model_input_fn(model_inputs)
        trainer.with_data_hooks(feed)
        trainer.with_training_hooks(recorder)
        trainer.train([])
    final = jax.tree.map(lambda x: np.asarray(x, np.float32), nnx.state(model, nnx.LoRAParam))
    pairs = list(zip(jax.tree.leaves(initial), jax.tree.leaves(final), strict=True))
    # B starts at zero, so only A's entries can stay "unchanged" for a reason other than no gradient.
    a_pairs = [
        (i, f)
        for (path, _), (i, f) in zip(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)), pairs, strict=True)
        if "lora_a" in str(path[-1])
    ]
    return {
        "losses": recorder.losses,
        "held_out_loss": held_out_loss(model, p, mesh),
        "a_unchanged_fraction": sum(int((i == f).sum()) for i, f in a_pairs) / sum(i.size for i, _ in a_pairs),
        "adapter_rms_change": float(np.sqrt(np.mean(np.concatenate([((f - i) ** 2).ravel() for i, f in pairs])))),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, force=True)

    work = Path(tempfile.mkdtemp(prefix="lora-precision-"))
    model_dir, data = work / "model", work / "demo-chat.jsonl"
    bf16_tiny_model(model_dir)
    records = demo.records()
    data.write_text(demo.jsonl(records[:-16]))
    (work / "eval.jsonl").write_text(demo.jsonl(records[-16:]))
    mesh = make_mesh(1, 4)
    results: dict[str, Any] = {"steps": args.steps, "learning_rate": args.lr}
    for dtype in ("bfloat16", "float32"):
        config = TrainConfig(
            model_name="gemma4-tiny",
            model_uri=str(model_dir),
            dataset_uri=str(data),
            eval_uri=str(work / "eval.jsonl"),
            lora=LoraSpec(rank=8, alpha=16.0, dropout=0.0),
            training=TrainingSpec(
                max_seq_len=SEQ,
                micro_batch_size=4,
                gradient_accumulation_steps=2,
                max_steps=args.steps,
                learning_rate=args.lr,
                warmup_steps=max(1, args.steps // 20),
                packing=True,
                remat=False,
            ),
            mesh=MeshSpec(fsdp=1, tp=4),
            checkpoint=CheckpointSpec(uri=str(work / f"ckpt-{dtype}"), every_steps=10**6, keep=1),
            metrics_port=0,
        )
        results[dtype] = train(plan.make_plan(config), mesh, dtype)

    print(f"tiny Gemma 4 in bfloat16, {args.steps} steps, peak lr {args.lr}; training loss by step")
    print(f"{'step':>6} {'bf16 adapters':>14} {'fp32 adapters':>14}")
    bf, fp = results["bfloat16"]["losses"], results["float32"]["losses"]
    for step in sorted(bf):
        if step % args.every == 0 or step == max(bf):
            print(f"{step:>6} {bf[step]:>14.4f} {fp.get(step, float('nan')):>14.4f}")
    for name in ("bfloat16", "float32"):
        bad = [step for step, x in sorted(results[name]["losses"].items()) if not np.isfinite(x)]
        results[name]["first_non_finite_step"] = bad[0] if bad else None
        print(f"{name} adapters: first step with a non-finite loss: {bad[0] if bad else 'none'}")
    for key in ("held_out_loss", "a_unchanged_fraction", "adapter_rms_change"):
        print(f"{key:>22}: bf16 {results['bfloat16'][key]:.4g}  fp32 {results['float32'][key]:.4g}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
