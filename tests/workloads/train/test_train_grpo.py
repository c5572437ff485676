"""GRPO (spec.method grpo) on CPU: group-normalised advantages, the weighted reward, the loss against its formula
(the reference is the model with its adapters off), the plan's problems and held-out split (VerilogEval's
layout included), every rollout verdict from the real confined checker (a cheat is refused and counted), and
the trainer CLI's GRPO run, killed and resumed with the uninterrupted run's rewards and losses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.models import ROOT, TrainerProcess, read_summary, tiny_train_config
from tpuforge.api import GrpoSpec, LoraSpec, RewardSpec, TrainConfig
from tpuforge_workloads import families
from tpuforge_workloads.data import verilog_tasks
from tpuforge_workloads.data.pipeline import pad_example
from tpuforge_workloads.families.attention import model_inputs
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.train import grpo
from tpuforge_workloads.train.plan import BadInput, make_plan

VERILOGEVAL = ROOT / "tests" / "data" / "verilogeval"
needs_checker = pytest.mark.skipif(
    shutil.which("iverilog") is None or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs iverilog, root and setpriv (the confined checker)",
)


def _records(tmp_path: Path, names: tuple[str, ...] = verilog_tasks.SHORT) -> Path:
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in verilog_tasks.records(names=names)))
    return path


def _config(model_dir: Path, dataset: Path, ckpt: str, spec: GrpoSpec | None = None, **training: Any) -> TrainConfig:
    training = {
        "max_seq_len": 128,
        "micro_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "packing": False,
        **training,
    }
    config = tiny_train_config(str(model_dir), str(dataset), ckpt, **training)
    config.method = "grpo"
    config.grpo = spec or GrpoSpec(group_size=2, max_tokens=16)
    config.lora = LoraSpec(rank=4, alpha=8.0, dropout=0.0)
    config.data = config.data.model_copy(update={"eval_fraction": 0.25})
    return config


def test_advantages_are_relative_to_the_group() -> None:
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    got = grpo.group_advantages(rewards, scale=True)
    np.testing.assert_allclose(got[0], [1, -1, -1, 1], atol=1e-5)
    np.testing.assert_allclose(got[1], 0)  # a group that scored alike teaches nothing
    np.testing.assert_allclose(grpo.group_advantages(rewards, scale=False)[0], [0.5, -0.5, -0.5, 0.5])


def test_the_reward_is_the_weighted_sum_and_fraction_reads_the_testbench_counters() -> None:
    counters = {"passed": False, "stderr": "verdict: 3 mismatches in 12 samples (read from the testbench)\n"}
    assert grpo.checker_score(counters, "fraction") == pytest.approx(0.75)
    assert grpo.checker_score(counters, "pass") == 0.0
    assert grpo.checker_score({"passed": True}, "fraction") == 1.0
    assert grpo.checker_score({"passed": False, "stderr": "syntax error"}, "fraction") == 0.0
    judged = [
        grpo.Judged("```verilog\nmodule m(); endmodule\n```", "module m(); endmodule", True, score=1.0),
        grpo.Judged("the answer", "", True, score=0.0),
        grpo.Judged("```verilog\nmodule m(\n```", "module m(", False, score=0.5),
    ]
    spec = RewardSpec(checker=1.0, exact_match=2.0, format=0.5)
    got = grpo.rewards(judged, ["other", "the answer", "x"], spec)
    assert got == pytest.approx([1.5, 2.0, 0.5])  # the cut answer earns no format reward
    with pytest.raises(ValueError, match="every reward weight is 0"):
        RewardSpec(checker=0)


def test_the_loss_terms_follow_the_clipped_objective_and_the_k3_kl() -> None:
    rng = np.random.default_rng(0)
    logp, ref, old = (jnp.asarray(rng.normal(-2, 0.3, (3, 5)), jnp.float32) for _ in range(3))
    mask = jnp.asarray([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], jnp.float32)
    adv = jnp.asarray([1.0, -0.5, 2.0])
    loss, kl = grpo.grpo_terms(logp, ref, old, mask, adv, 0.2, 0.1)
    lp, rf, od, m, a = (np.asarray(x, np.float64) for x in (logp, ref, old, mask, adv))
    ratio = np.exp(lp - od)
    policy = -np.minimum(ratio * a[:, None], np.clip(ratio, 0.8, 1.2) * a[:, None])
    k3 = np.exp(rf - lp) - (rf - lp) - 1
    count = np.maximum(m.sum(-1), 1)
    np.testing.assert_allclose(loss, ((policy + 0.1 * k3) * m).sum(-1) / count, rtol=1e-5)
    np.testing.assert_allclose(kl, (k3 * m).sum(-1) / count, rtol=1e-5)
    assert float(loss[2]) == 0 and float(kl[2]) == 0  # an answer with no token counts for nothing


@pytest.fixture(scope="module")
def adapted(tiny_model_dir: Path, jax_devices: Any) -> Any:
    mesh = make_mesh(1, 1, jax_devices[:1])
    text = families.read_decoder(str(tiny_model_dir))
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(tiny_model_dir, text, families.of(text).tunix_config(text), mesh)
    return lora.apply_lora(base, LoraSpec(rank=4, alpha=8.0, dropout=0.0), mesh, seed=0)


def test_the_loss_scores_the_answer_tokens_against_the_base_with_the_adapters_off(adapted: Any) -> None:
    rows = []
    for i, (prompt, answer) in enumerate([(5, 6), (7, 4), (3, 9), (6, 6)]):
        tokens = np.arange(10 + i, 10 + i + prompt + answer, dtype=np.int32)
        mask = np.r_[np.zeros(prompt, bool), np.ones(answer, bool)]
        rows.append(pad_example({"tokens": tokens, "loss_mask": mask}, 32, 0))
    batch = {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in rows[0]}
    batch["loss_denominator"] = jnp.ones(4)
    batch["advantages"] = jnp.asarray([1.0, -1.0, 0.5, -0.5])
    inputs = model_inputs(batch)
    loss_fn = grpo.make_loss_fn(GrpoSpec(kl_coefficient=0.1))
    # B starts at zero: the policy is its reference (KL 0) and the ratio 1, so the loss is -mean(advantage).
    loss, aux = loss_fn(adapted, **inputs)
    assert float(aux["kl_sum"]) == pytest.approx(0, abs=1e-6) and float(aux["answers"]) == 4
    assert float(aux["tokens"]) == 6 + 4 + 9 + 6 and float(loss) == pytest.approx(0, abs=1e-6)

    stored = nnx.state(adapted, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(stored))))
    nnx.update(adapted, jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), stored))
    try:
        loss, aux = loss_fn(adapted, **inputs)
        assert float(aux["kl_sum"]) > 0 and float(loss) == pytest.approx(0.1 * float(aux["kl_sum"]) / 4, rel=1e-4)
        grads = nnx.grad(lambda m: loss_fn(m, **inputs)[0], argnums=nnx.DiffState(0, nnx.LoRAParam))(adapted)
        assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
    finally:
        nnx.update(adapted, stored)


def test_a_rollout_trained_several_steps_is_clipped_against_the_policy_that_sampled_it(
    adapted: Any, jax_devices: Any
) -> None:
    """spec.grpo.iterations > 1: pi_old's per-token log-probabilities (decode.RowLogps, computed once as the
    rollout is made) are the loss's own forward's while the adapters are unchanged (ratio 1: the loss is the
    one-step loss), and once the policy has moved the ratio leaves 1 and the clip bounds it."""
    from tpuforge_workloads.train.decode import RowLogps

    rows = []
    for i, (prompt, answer) in enumerate([(5, 6), (7, 4), (3, 9), (6, 6)]):
        tokens = np.arange(10 + i, 10 + i + prompt + answer, dtype=np.int32)
        mask = np.r_[np.zeros(prompt, bool), np.ones(answer, bool)]
        rows.append(pad_example({"tokens": tokens, "loss_mask": mask}, 32, 0))
    host = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    stored = nnx.state(adapted, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(2), len(jax.tree.leaves(stored))))
    nnx.update(adapted, jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), stored))
    try:
        with jax.set_mesh(make_mesh(1, 1, jax_devices[:1])):
            old = RowLogps(make_mesh(1, 1, jax_devices[:1]))(
                adapted, host["input_tokens"], host["segment_ids"], host["positions"]
            )
        assert old.shape == (4, 32) and old.dtype == np.float32 and not old[:, -1].any()
        batch = {k: jnp.asarray(v) for k, v in host.items()}
        batch["loss_denominator"] = jnp.ones(4)
        batch["advantages"] = jnp.asarray([1.0, -1.0, 0.5, -0.5])
        spec = GrpoSpec(kl_coefficient=0.1, clip_epsilon=0.2, iterations=2)
        loss_fn = grpo.make_loss_fn(spec)
        one_step, _ = loss_fn(adapted, **model_inputs(batch))
        kept, _ = loss_fn(adapted, **model_inputs({**batch, "old_logps": jnp.asarray(old)}))
        assert float(kept) == pytest.approx(float(one_step), rel=1e-4, abs=1e-6)
        # The policy moved since the rollout (pi_old 0.5 nats lower on every token): the ratio is e^0.5, and the
        # clip holds the rows with a positive advantage at 1.2.
        moved, aux = loss_fn(adapted, **model_inputs({**batch, "old_logps": jnp.asarray(old - 0.5)}))
        mask = host["input_mask"][:, 1:]
        adv = np.asarray([1.0, -1.0, 0.5, -0.5])
        ratio = np.where(adv > 0, 1.2, np.exp(0.5))
        kl = float(aux["kl_sum"]) / 4
        assert float(moved) == pytest.approx(float(np.mean(-ratio * adv)) + 0.1 * kl, rel=1e-4)
        assert mask.sum() == 25
    finally:
        nnx.update(adapted, stored)


def test_the_plan_reads_problems_with_tests_and_holds_some_out(tiny_model_dir: Path, tmp_path: Path) -> None:
    plan = make_plan(_config(tiny_model_dir, _records(tmp_path), str(tmp_path / "ck"), max_steps=3))
    assert len(plan.problems) == 3 and len(plan.eval_problems) == 1 and plan.stats.held_out == 1
    assert plan.rows == 2 and plan.total_steps == 3  # one prompt a micro-batch, two answers each
    assert all(p.test["files"]["tb.v"].startswith("module tb;") for p in plan.problems)
    assert {p.prompt for p in plan.problems}.isdisjoint(p.prompt for p in plan.eval_problems)

    layout = make_plan(_config(tiny_model_dir, VERILOGEVAL, str(tmp_path / "ve"), max_steps=3, max_seq_len=2048))
    assert len(layout.problems) + len(layout.eval_problems) == 5
    assert all(p.test["module"] == "TopModule" for p in layout.problems)


def test_a_problem_without_a_test_or_room_is_refused_naming_the_record_and_the_fix(
    tiny_model_dir: Path, chat_dataset: Path, tmp_path: Path
) -> None:
    with pytest.raises(BadInput, match=r'demo-chat.jsonl:\d+: no "test" object .*reward.checker: 0'):
        make_plan(_config(tiny_model_dir, chat_dataset, str(tmp_path / "a")))
    with pytest.raises(BadInput, match=r"grpo.maxTokens 200 do not fit in training.maxSeqLen 128"):
        make_plan(_config(tiny_model_dir, _records(tmp_path), str(tmp_path / "b"), GrpoSpec(max_tokens=200)))
    with pytest.raises(BadInput, match="packing: false"):
        make_plan(_config(tiny_model_dir, _records(tmp_path), str(tmp_path / "c"), packing=True))


@needs_checker
def test_every_verdict_comes_from_the_confined_checker_and_a_cheat_is_refused() -> None:
    from tpuforge_workloads.data.verilog_tasks import PROBLEMS, VERILOG_CHECK_COMMAND, fenced

    mux = PROBLEMS[0]
    problem = grpo.RlProblem(
        mux.ask, np.zeros(1, np.int32), fenced(mux.solution), {"files": {"tb.v": mux.testbench}}, ""
    )
    cheat = mux.broken.replace("endmodule", "initial $finish;\nendmodule")
    answers = [fenced(mux.solution), fenced(mux.broken), fenced(cheat), fenced(mux.solution)]
    check = grpo.Checker(VERILOG_CHECK_COMMAND, 10.0, 256 << 20, 2, tempfile.gettempdir())
    try:
        judged = grpo.judge(answers, [True, True, True, False], [problem] * 4, check, RewardSpec(exact_match=1.0))
    finally:
        check.close()
    assert [j.passed for j in judged] == [True, False, False, False]
    assert [j.failure for j in judged] == [None, "mismatch", "refused", "truncated"]
    assert [j.reward for j in judged] == [2.0, 0.0, 0.0, 1.0]  # the cut one matches the reference, no more
    figures = grpo.step_figures(grpo.Rollout({}, judged, [problem] * 4, [10, 10, 12, 16], 1.0, 0.5))
    assert figures["refused"] == 1 and figures["pass_rate"] == 0.25
    assert figures["failures"] == {"mismatch": 1, "refused": 1, "truncated": 1}


@pytest.mark.slow
@needs_checker
def test_a_killed_grpo_run_resumes_with_no_step_lost_and_the_same_rewards(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two steps on each rollout (iterations 2: rollouts at steps 1, 3, 5), a checkpoint every 3 steps: the one at
    step 3 falls inside the second rollout's steps and keeps that rollout. Killed after it (no warning), the
    run resumes at step 3 and trains step 4 on the answers the interrupted run sampled at step 3."""
    spec = GrpoSpec(group_size=2, max_tokens=8, temperature=1.0, iterations=2)
    config = _config(tiny_model_dir, _records(tmp_path), str(tmp_path / "reference"), spec, max_steps=6)
    config.checkpoint = config.checkpoint.model_copy(update={"every_steps": 3})
    reference = TrainerProcess(config, tmp_path / "ref")
    assert reference.run() == 0, reference.output()
    attempt = read_summary(config.checkpoint.uri)["attempts"][0]
    rl = {int(k): v for k, v in attempt["train_rl"].items()}
    assert sorted(rl) == list(range(1, 7))
    assert all(
        {"reward", "pass_rate", "kl", "response_tokens", "checker_share", "failures"} <= set(v) for v in rl.values()
    )
    sampled = [rl[s] for s in (1, 3, 5)]
    assert all(v["failures"].get("truncated", 0) + v["failures"].get("syntax", 0) > 0 for v in sampled)
    assert [rl[s]["iteration"] for s in range(1, 7)] == [1, 2, 1, 2, 1, 2]
    for s in (2, 4, 6):  # the second step on a rollout: its answers, nothing sampled or checked anew
        assert rl[s]["reward"] == rl[s - 1]["reward"] and rl[s]["response_tokens"] == rl[s - 1]["response_tokens"]
        assert rl[s]["rollout_seconds"] == 0 and rl[s]["checker_seconds"] == 0 and rl[s]["failures"] == {}
    assert not (Path(config.checkpoint.uri) / "6" / "rollout").exists()  # at a rollout's end: nothing to keep

    config.checkpoint.uri = str(tmp_path / "killed")
    first = TrainerProcess(config, tmp_path / "first").start()
    first.wait_for_line("step 3/6")
    committed = Path(config.checkpoint.uri) / "3" / "commit_success.txt"
    deadline = time.monotonic() + 120
    while not committed.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.proc is not None and committed.exists()
    first.proc.send_signal(signal.SIGKILL)
    first.wait()
    from tpuforge_workloads.train.checkpoints import latest_step

    assert latest_step(config.checkpoint.uri) == 3
    assert (Path(config.checkpoint.uri) / "3" / "rollout").is_dir()
    second = TrainerProcess(config, tmp_path / "second")
    assert second.run() == 0, second.output()
    attempts = read_summary(config.checkpoint.uri)["attempts"]
    assert attempts[-1]["start_step"] == 3
    resumed = {int(k): v for k, v in attempts[-1]["train_rl"].items()}
    assert sorted(resumed) == [4, 5, 6] and resumed[4]["iteration"] == 2
    for step in (4, 5, 6):
        assert resumed[step]["reward"] == pytest.approx(rl[step]["reward"], abs=1e-6)
        assert resumed[step]["response_tokens"] == pytest.approx(rl[step]["response_tokens"])
        assert resumed[step]["kl"] == pytest.approx(rl[step]["kl"], rel=1e-3, abs=1e-6)


@pytest.mark.slow
def test_the_preflight_compiles_the_grpo_step_with_its_groups_and_reference_forward(
    tiny_model_dir: Path, jax_devices: Any
) -> None:
    """The preflight compiles the trainer's own step: for GRPO, groupSize rows a prompt with their advantages
    (and, with two steps a rollout, pi_old's log-probabilities), and the reference forward."""
    from tpuforge_workloads.families import decoder
    from tpuforge_workloads.families.gemma4 import config as gemma4_config
    from tpuforge_workloads.preflight.step import compile_train_step

    text = gemma4_config.parse_config(decoder.read_config(str(tiny_model_dir)))
    mesh = make_mesh(1, 4, jax_devices[:4])
    sft = tiny_train_config(str(tiny_model_dir), "unused.jsonl", "unused", packing=False, micro_batch_size=2)
    rl = _config(tiny_model_dir, Path("unused.jsonl"), "unused", GrpoSpec(group_size=2, iterations=2), max_seq_len=64)
    sft_step = compile_train_step(text, sft, mesh, total_steps=4)
    rl_step = compile_train_step(text, rl, mesh, total_steps=4)
    assert rl_step.flops > 1.2 * sft_step.flops, (rl_step, sft_step)
