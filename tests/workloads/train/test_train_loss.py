"""The training loss (model/loss.py) on the tiny Gemma 4.

Packing changes nothing but speed: the loss of packed rows equals the loss of the same examples padded one
per row, because the block-diagonal mask keeps examples apart and positions restart in each. Gradient
accumulation weights tokens: 4 micro-batches of 1 row give the gradient of 1 batch of the same 4 rows.
The TPU attention path (splash attention with segment ids, attention.py) gives the masked path's loss and
gradient on packed rows. The trainer's evaluation runs without LoRA dropout: the evaluation Job's loss, every
time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from tokenizers import Tokenizer
from tunix.sft import peft_trainer

from tests.fixtures.models import eval_config, tiny_train_config
from tpuforge.api import LoraSpec
from tpuforge_workloads.data import demo
from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.pipeline import (
    BatchSpec,
    Example,
    batches,
    empty_batch,
    eval_batches,
    fill_row,
    first_fit,
    pad_example,
    prepare_examples,
)
from tpuforge_workloads.data.records import parse_line
from tpuforge_workloads.families import attention, decoder
from tpuforge_workloads.families.attention import model_inputs
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.families.gemma4 import model as gemma4_model
from tpuforge_workloads.model import checkpoint_read, lora, loss
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.train.loop import BatchFeed
from tpuforge_workloads.train.preemption import PreemptionWatch

pytestmark = pytest.mark.slow
SEQ = 64


@pytest.fixture(scope="module")
def lora_model(tiny_model_dir: Path, jax_devices: Any) -> tuple[Any, jax.sharding.Mesh]:
    """The tiny model with adapters whose B is random, so that they take part in the loss."""
    text = gemma4_config.parse_config(decoder.read_config(str(tiny_model_dir)))
    mesh = make_mesh(1, 4)
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(tiny_model_dir, text, gemma4_model.tunix_config(text), mesh)
    model = lora.apply_lora(base, LoraSpec(rank=4, alpha=8.0, dropout=0.0), mesh, seed=0)
    state = nnx.state(model, nnx.LoRAParam)
    rng = np.random.default_rng(0)
    nnx.update(
        model,
        jax.tree.map(lambda x: x + jax.numpy.asarray(rng.normal(0, 0.05, x.shape), x.dtype), state),
    )
    return model, mesh


@nnx.jit
def _jitted_loss(model: Any, batch: dict[str, Any]) -> Any:
    total, count = loss.nll_sum_and_count(model, **model_inputs(batch))
    return total / count


def _loss(model: Any, mesh: jax.sharding.Mesh, batch: dict[str, np.ndarray]) -> float:
    """The mean NLL per loss target of a batch, as the train step computes it."""
    with jax.set_mesh(mesh):
        return float(_jitted_loss(model, {k: jax.numpy.asarray(v) for k, v in batch.items()}))


def _examples(tiny_model_dir: Path, loss_on: str = "assistant", count: int = 24) -> list[Example]:
    encoder = ChatEncoder(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")))
    encoder.loss_on = loss_on  # type: ignore[assignment]
    records = [parse_line(json.dumps(r), "demo", i + 1) for i, r in enumerate(demo.records()[:count])]
    return prepare_examples([r for r in records if r], encoder, SEQ, "drop", "demo")[0]


def test_packed_loss_equals_unpacked_loss(lora_model: tuple[Any, jax.sharding.Mesh], tiny_model_dir: Path) -> None:
    model, mesh = lora_model
    for loss_on in ("assistant", "all"):
        examples = _examples(tiny_model_dir, loss_on)
        spec = BatchSpec(max_seq_len=SEQ, rows=4, packing=True, seed=0, pad_id=0, epochs=1)
        packed = next(iter(batches(examples, spec)))
        assert packed["segment_ids"].max() >= 2  # examples share rows

        # The same examples, one per row, in packing order.
        rows = []
        for tokens, segments in zip(packed["input_tokens"], packed["segment_ids"], strict=True):
            for seg in range(1, segments.max() + 1):
                ex = next(e for e in examples if np.array_equal(e["tokens"], tokens[segments == seg]))
                rows.append(pad_example(ex, SEQ, 0))
        unpacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
        assert unpacked["input_mask"].sum() == packed["input_mask"].sum()

        packed_loss = _loss(model, mesh, packed)
        unpacked_loss = _loss(model, mesh, unpacked)
        np.testing.assert_allclose(packed_loss, unpacked_loss, rtol=1e-5, err_msg=loss_on)

        # Without the block-diagonal mask, examples would see each other: the loss would change.
        leaky = dict(packed, segment_ids=(packed["segment_ids"] > 0).astype(np.int32))
        leaky["positions"] = np.tile(np.arange(SEQ, dtype=np.int32), (len(leaky["positions"]), 1))
        assert abs(_loss(model, mesh, leaky) - packed_loss) > 1e-3


def _one_step_update(model: Any, mesh: jax.sharding.Mesh, examples: list[Example], rows: int, accumulation: int) -> Any:
    """The LoRA weights' change after one optimizer step of SGD (learning rate 1: minus the gradient) through
    PeftTrainer with our loss and data feed, `accumulation` micro-batches of `rows` rows; the model is left
    as it was."""
    before = jax.tree.map(lambda x: x.copy(), nnx.state(model, nnx.LoRAParam))  # the step donates the weights
    spec = BatchSpec(max_seq_len=SEQ, rows=rows, packing=False, seed=0, pad_id=0, epochs=1)
    feed = BatchFeed(iter(batches(examples, spec)), accumulation, 1, PreemptionWatch(), [])
    config = peft_trainer.TrainingConfig(
        eval_every_n_steps=1000,
        max_steps=1,
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
        data_sharding_axis=("fsdp",),
        pbar_description=None,
    )
    with jax.set_mesh(mesh):
        trainer = peft_trainer.PeftTrainer(model, optax.sgd(1.0), config).with_loss_fn(loss.loss_fn, has_aux=True)
        trainer.with_gen_model_input_fn(model_inputs)
        trainer.with_data_hooks(feed)
        trainer.train([])
    assert trainer.train_steps == 1
    update = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), nnx.state(model, nnx.LoRAParam), before)
    nnx.update(model, before)
    return update


def test_gradient_accumulation_weights_tokens_not_micro_batches(
    lora_model: tuple[Any, jax.sharding.Mesh], tiny_model_dir: Path
) -> None:
    model, mesh = lora_model
    examples = _examples(tiny_model_dir, count=4)
    for i, e in enumerate(examples):  # 1/4, 2/4, 3/4, all of each example's targets: unequal counts
        targets = np.flatnonzero(e["loss_mask"])
        e["loss_mask"][targets[: len(targets) - max(1, len(targets) * (i + 1) // 4)]] = False
    spec = BatchSpec(max_seq_len=SEQ, rows=4, packing=False, seed=0, pad_id=0, epochs=1)
    targets = next(iter(batches(examples, spec)))["input_mask"][:, 1:].sum(axis=1)
    assert targets.max() >= 3 * targets.min(), targets  # a mean of per-row means would differ

    whole = _one_step_update(model, mesh, examples, rows=4, accumulation=1)
    accumulated = _one_step_update(model, mesh, examples, rows=1, accumulation=4)
    scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(whole))
    assert scale > 0
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(accumulated), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5 * scale)


def test_splash_attention_with_segment_ids_gives_the_masked_path_s_loss(
    lora_model: tuple[Any, jax.sharding.Mesh], tiny_model_dir: Path
) -> None:
    """On TPU the model gets the segment ids and runs splash attention (causal; within the window on sliding
    layers); here the same kernels run in Pallas interpret mode, on the same 4-device mesh. (Its backward
    kernels are splash's own; the TPU compile of the train step through them is test_preflight_tpu's.)"""
    model, mesh = lora_model
    examples = _examples(tiny_model_dir, count=10)
    window = model.config.sliding_window_size
    # One example longer than the sliding window (three joined), so that the window bites inside a segment.
    long = {k: np.concatenate([e[k] for e in examples[:3]]) for k in ("tokens", "loss_mask")}
    assert window < len(long["tokens"]) <= 128
    members = [long, *examples[3:]]
    batch = empty_batch(4, 128, 0)
    for row, indices in enumerate(first_fit([len(e["tokens"]) for e in members], 128, 4)[:4]):
        fill_row(batch, row, [members[i] for i in indices])
    assert batch["segment_ids"].max() >= 3 and (batch["segment_ids"] == 0).any()  # packed, and padded

    with jax.set_mesh(mesh):
        inputs = model_inputs({k: jax.numpy.asarray(v) for k, v in batch.items()})
        assert not isinstance(inputs["attention_mask"], attention.Segments)  # on CPU: the masked path
        masked = _jitted_nll(model, inputs)
        segments = attention.Segments(jax.numpy.asarray(batch["segment_ids"]))
        splash = _jitted_nll(model, dict(inputs, attention_mask=segments))

    np.testing.assert_allclose(float(splash), float(masked), rtol=1e-5)


@nnx.jit
def _jitted_nll(model: Any, inputs: dict[str, Any]) -> Any:
    total, count = loss.nll_sum_and_count(model, **inputs)
    return total / count


@pytest.fixture(scope="module")
def dropout_model(lora_model: tuple[Any, jax.sharding.Mesh], tiny_model_dir: Path) -> Any:
    """The same adapted model with LoRA dropout 0.5, holding copies of `lora_model`'s adapter weights (the
    evaluation step donates them)."""
    reference, mesh = lora_model
    text = gemma4_config.parse_config(decoder.read_config(str(tiny_model_dir)))
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(tiny_model_dir, text, gemma4_model.tunix_config(text), mesh)
    model = lora.apply_lora(base, LoraSpec(rank=4, alpha=8.0, dropout=0.5), mesh, seed=0)
    nnx.update(model, jax.tree.map(lambda x: x.copy(), nnx.state(reference, nnx.LoRAParam)))
    return model


def test_in_training_eval_is_dropout_free_and_gives_the_evaluation_job_s_loss(
    lora_model: tuple[Any, jax.sharding.Mesh], dropout_model: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With LoRA dropout 0.5, the trainer's evaluation (its eval step, over padded batches of its row count)
    gives the same loss on every call, and the evaluation Job's (its Scorer, one record at a time, on a
    model built without dropout holding the same adapters). Tunix's own eval step, traced without the switch,
    drops activations: its loss is another one each call."""
    from tpuforge_workloads.evaluate.loss import Scorer, mean_loss
    from tpuforge_workloads.preflight.step import NoCheckpoints
    from tpuforge_workloads.train.loop import set_loss_denominator
    from tpuforge_workloads.train.trainer import make_trainer

    reference, mesh = lora_model
    config = tiny_train_config(str(tiny_model_dir), "unused.jsonl", str(tmp_path / "ckpt"))
    config.lora = LoraSpec(rank=4, alpha=8.0, dropout=0.5)
    assert config.training.max_seq_len == SEQ
    examples = _examples(tiny_model_dir, count=6)
    evals = eval_batches(examples, config.training.micro_batch_size * config.mesh.fsdp, SEQ, 0)
    set_loss_denominator(evals, [int(b["input_mask"][:, 1:].sum()) for b in evals])

    def eval_loss(trainer: Any, step: Any) -> float:
        trainer._run_eval(evals, step)
        return float(trainer.take_eval_loss())

    with jax.set_mesh(mesh):
        trainer = make_trainer(dropout_model, config, 16, NoCheckpoints())
        _, eval_step = trainer.jit_train_and_eval_step()
        ours = [eval_loss(trainer, eval_step) for _ in range(2)]
        tunix_step = nnx.jit(peft_trainer.PeftTrainer.create_eval_step_fn(trainer))
        tunix = [eval_loss(trainer, lambda batch: tunix_step(dropout_model, batch)) for _ in range(2)]
        scorer = Scorer(eval_config(config, "unused", "unused", tmp_path), mesh, pad_id=0)
        job = mean_loss([scorer(reference, e) for e in examples])

    assert ours[0] == ours[1]
    assert ours[0] == pytest.approx(job, rel=1e-5)
    assert tunix[0] != tunix[1] and min(abs(t - job) for t in tunix) > 1e-3, (tunix, job)


def test_the_heads_own_gradient_equals_autodiff_through_the_models_logits(
    lora_model: tuple[Any, jax.sharding.Mesh], tiny_model_dir: Path
) -> None:
    """Gemma 4's loss from its final hidden states (loss.head_nll, families/head.py) against the model's own
    soft-capped float32 logits differentiated by JAX: the same loss and LoRA gradient, packed rows and padding."""
    model, mesh = lora_model
    spec = BatchSpec(max_seq_len=SEQ, rows=4, packing=True, seed=0, pad_id=0, epochs=1)
    batch = next(iter(batches(_examples(tiny_model_dir), spec)))
    inputs = model_inputs({k: jax.numpy.asarray(v) for k, v in batch.items()})

    def ours(model: Any) -> Any:
        return loss.nll_sum_and_count(model, **inputs)[0]

    def reference(model: Any) -> Any:
        with lora.adapters_in_compute_dtype(model):
            mask = attention.for_model(model, inputs["attention_mask"])
            logits, _ = model(inputs["input_tokens"], inputs["positions"], None, mask)
        return loss.token_nll(logits[:, :-1], inputs["input_tokens"][:, 1:], inputs["input_mask"][:, 1:])[0]

    lora_only = nnx.DiffState(0, nnx.LoRAParam)
    with jax.set_mesh(mesh):
        got, got_grads = nnx.jit(nnx.value_and_grad(ours, argnums=lora_only))(model)
        want, want_grads = nnx.jit(nnx.value_and_grad(reference, argnums=lora_only))(model)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    flat_got, flat_want = jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)
    assert len(flat_got) == len(flat_want) > 0
    scale = max(float(np.max(np.abs(np.asarray(w)))) for w in flat_want)
    for g, w in zip(flat_got, flat_want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-4 * scale)
