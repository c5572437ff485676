"""DPO and ORPO (spec.method) on the tiny Gemma 4, on CPU: the plan's pairs, the losses against their
formulas (the DPO reference is the model with its adapters zeroed), and the trainer CLI's DPO run, killed
and resumed with the losses of the uninterrupted run, its preference figures in the run summary."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.models import ROOT, TrainerProcess, read_summary, tiny_train_config
from tpuforge.api import LoraSpec, PreferenceSpec, TrainConfig
from tpuforge_workloads import families
from tpuforge_workloads.data.pipeline import MicroBatches
from tpuforge_workloads.families.attention import model_inputs
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.loss import answer_logps
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.train import preference
from tpuforge_workloads.train.plan import BadInput, make_plan

PAIRS = ROOT / "examples" / "data" / "demo-preferences.jsonl"


def _config(model_dir: Path, dataset: Path, ckpt: str, method: str = "dpo", **training: Any) -> TrainConfig:
    config = tiny_train_config(str(model_dir), str(dataset), ckpt, packing=False, **training)
    config.method = method  # type: ignore[assignment]
    config.preference = PreferenceSpec()
    config.data = config.data.model_copy(update={"eval_fraction": 0.25})
    return config


def test_the_plan_batches_pairs_and_holds_pairs_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    plan = make_plan(_config(tiny_model_dir, PAIRS, str(tmp_path / "ck")))
    assert plan.rows == 4 and plan.batch.group == 2  # microBatchSize 2 pairs, two rows each
    assert plan.stats.records == 48 and plan.stats.held_out == 16 and plan.stats.examples == 96
    assert len(plan.eval_examples) == 32
    batch = MicroBatches(plan.examples, plan.batch)[0]
    texts = [plan.tokenizer.decode(row.tolist()) for row in batch["input_tokens"]]
    for chosen, rejected in (texts[0:2], texts[2:4]):
        assert chosen.split("The capital")[0] == rejected.split("The capital")[0] and chosen != rejected
    assert plan.samples and "The capital of" in plan.samples[0].reference


def test_an_sft_dataset_for_dpo_is_refused_naming_the_line_and_the_record_it_needs(
    tiny_model_dir: Path, chat_dataset: Path, tmp_path: Path
) -> None:
    with pytest.raises(BadInput, match=r"demo-chat.jsonl:1: prompt: missing .*preference records like"):
        make_plan(_config(tiny_model_dir, chat_dataset, str(tmp_path / "ck")))


@pytest.fixture(scope="module")
def adapted(tiny_model_dir: Path, jax_devices: Any) -> Any:
    mesh = make_mesh(1, 1, jax_devices[:1])
    text = families.read_decoder(str(tiny_model_dir))
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(tiny_model_dir, text, families.of(text).tunix_config(text), mesh)
    return lora.apply_lora(base, LoraSpec(rank=4, alpha=8.0, dropout=0.0), mesh, seed=0)


def _batch(tiny_model_dir: Path) -> dict[str, Any]:
    plan = make_plan(_config(tiny_model_dir, PAIRS, "/tmp/unused-preference-ck"), write_manifest=False)
    return {k: jnp.asarray(v) for k, v in model_inputs(MicroBatches(plan.examples, plan.batch)[0]).items()}


def test_dpo_against_its_formula_with_the_reference_the_adapters_off(adapted: Any, tiny_model_dir: Path) -> None:
    inputs = _batch(tiny_model_dir)
    denominator = jnp.ones(4)
    base_logp, count = answer_logps(adapted, **inputs)
    loss, aux = preference.make_loss_fn("dpo", PreferenceSpec(beta=0.1))(
        adapted, **inputs, loss_denominator=denominator
    )
    # B starts at zero: the model is its reference, every reward 0 and the loss log 2.
    assert float(loss) == pytest.approx(math.log(2), abs=1e-6) and float(aux["margin_sum"]) == 0
    assert float(aux["pairs"]) == 2 and float(aux["correct"]) == 0

    stored = nnx.state(adapted, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(stored))))
    nnx.update(adapted, jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), stored))
    try:
        logp, _ = answer_logps(adapted, **inputs)
        with preference.adapters_off(adapted):
            np.testing.assert_allclose(answer_logps(adapted, **inputs)[0], base_logp, rtol=1e-6)
        assert not np.allclose(logp, base_logp)  # the trained weights are back
        spec = PreferenceSpec(beta=0.5, label_smoothing=0.1)
        loss, aux = preference.make_loss_fn("dpo", spec)(adapted, **inputs, loss_denominator=denominator)
        h = 0.5 * ((logp - base_logp)[0::2] - (logp - base_logp)[1::2])
        want = -(0.9 * jax.nn.log_sigmoid(h) + 0.1 * jax.nn.log_sigmoid(-h))
        assert float(loss) == pytest.approx(float(want.mean()), rel=1e-5)
        assert float(aux["margin_sum"]) == pytest.approx(float(h.sum()), rel=1e-5)
        assert float(aux["correct"]) == float((h > 0).sum())

        orpo, aux = preference.make_loss_fn("orpo", PreferenceSpec(orpo_lambda=0.2))(
            adapted, **inputs, loss_denominator=denominator
        )
        mean = np.asarray(logp / count, np.float64)
        odds = mean - np.log1p(-np.exp(mean))
        ratio = odds[0::2] - odds[1::2]
        want_orpo = -mean[0::2] + 0.2 * np.log1p(np.exp(-ratio))
        assert float(orpo) == pytest.approx(float(want_orpo.mean()), rel=1e-5)
        assert float(aux["margin_sum"]) == pytest.approx(float((mean[0::2] - mean[1::2]).sum()), rel=1e-5)
        # The gradient reaches the adapters through the policy term only.
        grads = nnx.grad(
            lambda m: preference.make_loss_fn("dpo", spec)(m, **inputs, loss_denominator=denominator)[0],
            argnums=nnx.DiffState(0, nnx.LoRAParam),
        )(adapted)
        assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
    finally:
        nnx.update(adapted, stored)


def test_summary_means_over_pairs() -> None:
    got = preference.summary(
        {"loss_sum": 2.0, "pairs": 4.0, "correct": 3.0, "margin_sum": 1.0, "chosen_sum": -2.0, "rejected_sum": -3.0}
    )
    assert got == {"loss": 0.5, "accuracy": 0.75, "margin": 0.25, "chosen_reward": -0.5, "rejected_reward": -0.75}


@pytest.mark.slow
def test_dpo_learns_the_preferences_and_a_killed_run_resumes_with_the_same_losses(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # Eight pairs, evaluated on themselves: ten steps of four pairs are five epochs, enough to learn them.
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(PAIRS.read_text().splitlines(keepends=True)[:8]))
    config = _config(tiny_model_dir, pairs, str(tmp_path / "reference"), max_steps=10, learning_rate=1e-2)
    config.data = config.data.model_copy(update={"eval_fraction": 0.0})
    config.eval_uri = str(pairs)
    reference = TrainerProcess(config, tmp_path / "ref")
    assert reference.run() == 0, reference.output()
    attempt = read_summary(config.checkpoint.uri)["attempts"][0]
    evals = attempt["eval_preference"]
    assert evals["0"]["accuracy"] == 0 and evals["0"]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert evals["10"]["accuracy"] >= 0.75 and evals["10"]["margin"] > 0.5, evals
    assert evals["10"]["loss"] < 0.5 * math.log(2), evals
    assert attempt["eval_losses"]["10"] == pytest.approx(evals["10"]["loss"], abs=1e-6)  # rounded there
    assert sorted(int(s) for s in attempt["train_preference"]) == list(range(1, 11))
    losses = {int(k): v for k, v in attempt["losses"].items()}

    config.checkpoint.uri = str(tmp_path / "killed")
    first = TrainerProcess(config, tmp_path / "first").start()
    first.wait_for_line("step 5/10")
    assert first.proc is not None
    first.proc.send_signal(signal.SIGKILL)
    first.wait()
    from tpuforge_workloads.train.checkpoints import latest_step

    resumed_at = latest_step(config.checkpoint.uri)
    assert resumed_at is not None and 2 <= resumed_at < 10
    second = TrainerProcess(config, tmp_path / "second")
    assert second.run() == 0, second.output()
    attempts = read_summary(config.checkpoint.uri)["attempts"]
    assert attempts[-1]["start_step"] == resumed_at
    resumed = {int(k): v for k, v in attempts[-1]["losses"].items()}
    assert min(resumed) == resumed_at + 1
    steps = range(resumed_at + 1, 11)
    np.testing.assert_allclose([resumed[s] for s in steps], [losses[s] for s in steps], rtol=1e-5)
    assert json.loads(second.termination_message())["step"] == 10


@pytest.mark.slow
def test_the_preflight_compiles_the_dpo_step_with_its_pairs_and_reference_forward(
    tiny_model_dir: Path, jax_devices: Any
) -> None:
    """The preflight compiles the trainer's own step: for DPO, two rows a pair and the reference forward, so
    more FLOPs a micro-batch than the SFT step of as many rows (each row's forward runs twice)."""
    from tpuforge_workloads.families import decoder
    from tpuforge_workloads.families.gemma4 import config as gemma4_config
    from tpuforge_workloads.preflight.step import compile_train_step

    text = gemma4_config.parse_config(decoder.read_config(str(tiny_model_dir)))
    mesh = make_mesh(1, 4, jax_devices[:4])
    sft = tiny_train_config(str(tiny_model_dir), "unused.jsonl", "unused", packing=False, micro_batch_size=2)
    dpo = _config(tiny_model_dir, PAIRS, "unused", micro_batch_size=1)
    sft_step = compile_train_step(text, sft, mesh, total_steps=4)
    dpo_step = compile_train_step(text, dpo, mesh, total_steps=4)
    assert dpo_step.flops > 1.2 * sft_step.flops, (dpo_step, sft_step)
