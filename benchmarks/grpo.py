"""What GRPO (spec.method grpo) learns at CPU scale, with the checker's verdict as its only signal.

The 40 Verilog problems written here (tpuforge_workloads.data.verilog_tasks: its dozen PROBLEMS and the 28
MORE_PROBLEMS), each asked in three phrasings. The tiny Gemma 4 (Verilog tokenizer) is first SFT-trained on
every phrasing with the right and a plausible wrong answer (the task set's `broken` one) equally often: the
"SFT start", a model that writes either, merged into its base by the merge CLI. GRPO then trains a LoRA on
that merged model by the trainer CLI, on the first two phrasings only, its reward the confined Verilog
checker's pass, its KL reference the SFT model (the adapters off). The third phrasing of each problem is held
out of GRPO (never sampled, never rewarded; the SFT start has seen it, with both answers). Both models are
scored on it by the same checker:

- pass@1 of greedy answers, and pass@1 estimated from `--samples` answers per problem at the rollouts'
  temperature, each with its 95% Clopper-Pearson interval over the 40 problems (evaluate.passk), before (the
  SFT start) and after GRPO;
- the rise, after - before, of each with its paired 95% interval over the same problems (evaluate.passk.
  paired_rise: greedy, Newcombe's square-and-add interval for paired proportions, with the exact McNemar
  p-value; sampled, the Student t interval of the per-problem differences), the count of problems that rose,
  fell, passed or failed both times, each problem's verdicts before and after, and a verdict line on stderr:
  is the rise beyond its interval (its low bound above 0);
- from the GRPO run's summary: the reward by step, the pass rate of its first and last steps, the KL at its
  end, and the checker's and the rollout's shares of the step time (their seconds over the steps' seconds).

    .venv/bin/python benchmarks/grpo.py [--steps 24] [--sft-steps 300] [--samples 8] [--prompts 4] [--iterations 1]
        [--json out.jsonl]

Needs root (the checker runs each answer under a uid of its own) and iverilog. One JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.learning_quality import lora_model, train
from benchmarks.rows import emit

from tpuforge_workloads.data.verilog_tasks import MORE_PROBLEMS, PROBLEMS, Problem

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 72  # the longest right answer of the 40 is 63 tokens and its end of turn
MAX_SEQ_LEN = 160  # the longest prompt (77 tokens) and MAX_TOKENS
LORA = {"rank": 16, "alpha": 32.0, "dropout": 0.0}
BENCH_PROBLEMS = PROBLEMS + MORE_PROBLEMS  # 40 held out: the paired interval of a rise needs more than 20


def phrasings(name: str, ports: str) -> list[str]:
    """Three ways to ask for module `name`: the first two trained on, the last held out."""
    return [
        f"Write a Verilog module {name}({ports}). Answer with the module only.",
        f"Implement module {name} in Verilog ({ports}). Reply with the module alone.",
        f"Give the Verilog code of module {name} ({ports}), and nothing else.",
    ]


def records(problems: tuple[Problem, ...] = PROBLEMS) -> tuple[list[dict[str, Any]], ...]:
    """(SFT records: both answers to every phrasing; GRPO problems: the first two phrasings with the right
    answer as reference; held-out problems: the third phrasing, which GRPO never samples). Of the dozen
    PROBLEMS by default: the GRPO demo's files (examples/data/demo-verilog-*.jsonl); the benchmark passes all
    40 (BENCH_PROBLEMS)."""
    from tpuforge_workloads.data.verilog_tasks import fenced

    sft, train_problems, held = [], [], []
    for p in problems:
        ports = p.ask.split("(", 1)[1].rsplit(")", 1)[0]
        asks = phrasings(p.name, ports)
        test = {"files": {"tb.v": p.testbench}}

        def record(ask: str, answer: str, test: dict[str, Any] = test) -> dict[str, Any]:
            return {"messages": [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}],
                    "test": test}  # fmt: skip

        for ask in asks:
            sft += [record(ask, fenced(p.solution)), record(ask, fenced(p.broken))]
        train_problems += [record(ask, fenced(p.solution)) for ask in asks[:2]]
        held.append(record(asks[2], fenced(p.solution)))
    return sft, train_problems, held


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(model: Path, data: Path, ckpt: Path, steps: int, lr: float, seed: int, **extra: Any) -> Any:
    from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec

    return TrainConfig(
        model_name="gemma4-tiny",
        model_uri=str(model),
        dataset_uri=str(data),
        lora=LoraSpec(**LORA),
        training=TrainingSpec(
            max_seq_len=MAX_SEQ_LEN,
            micro_batch_size=extra.pop("micro_batch_size", 4),
            gradient_accumulation_steps=1,
            max_steps=steps,
            learning_rate=lr,
            warmup_steps=max(1, steps // 20),
            packing=False,
            seed=seed,
        ),
        mesh=MeshSpec(fsdp=1, tp=1),
        checkpoint=CheckpointSpec(uri=str(ckpt), every_steps=max(steps // 2, 1), keep=1),
        metrics_port=0,
        **extra,
    )


def merge(base: Path, ckpt: Path, out: Path, workdir: Path, lora: Any = None) -> None:
    """The SFT adapter (trained with `lora`, default LORA) merged into its base by the merge CLI, on the CPU:
    the model GRPO starts from (and its reference)."""
    from tpuforge.api import LoraSpec
    from tpuforge.api.configs import MergeConfig

    cfg = MergeConfig(
        model_name="gemma4-tiny", base_model_uri=str(base), checkpoint_uri=str(ckpt), output_uri=str(out),
        lora=lora or LoraSpec(**LORA),
    )  # fmt: skip
    path = workdir / "merge.json"
    path.write_text(cfg.model_dump_json(by_alias=True, exclude_none=True))
    proc = subprocess.run(
        [sys.executable, "-m", "tpuforge_workloads.merge", "--config", str(path), "--termination-log",
         str(workdir / "merge-termination")],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"merge exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def score(
    model: Any, model_dir: Path, held: Path, samples: int, check: Any, seed: int, temperature: float
) -> dict[str, Any]:
    """Held-out pass@1: greedy, and estimated from `samples` answers per problem at `temperature`."""
    import jax

    from tpuforge.api import GrpoSpec, RewardSpec
    from tpuforge_workloads.data.chat import ChatEncoder, read_tokenizer
    from tpuforge_workloads.data.records import read_dataset
    from tpuforge_workloads.evaluate.passk import exact_interval, problem_pass_at_k
    from tpuforge_workloads.model.mesh import make_mesh
    from tpuforge_workloads.train import grpo

    encoder = ChatEncoder(read_tokenizer(str(model_dir)), "assistant", False)
    problems = grpo.rl_problems(
        read_dataset(str(held), "held").records, encoder, MAX_SEQ_LEN, GrpoSpec(max_tokens=MAX_TOKENS)
    )
    mesh = make_mesh(1, 1, jax.devices()[:1])
    sampler = grpo.RolloutSampler(encoder, mesh, MAX_SEQ_LEN, MAX_TOKENS, temperature, seed)
    reward = RewardSpec()
    with jax.set_mesh(mesh):
        greedy, judged = grpo.greedy_pass_rate(sampler, model, problems, check, reward)
        asked = [p for p in problems for _ in range(samples)]
        out = sampler.sample(model, [p.tokens for p in asked], step=10_000)
        answers, spans = sampler.answers(out, asked)
    sampled = grpo.judge(answers, [s for _, s in spans], asked, check, reward)
    verdicts = [[j.passed for j in sampled[i * samples : (i + 1) * samples]] for i in range(len(problems))]
    per = problem_pass_at_k(verdicts, 1)
    g_low, g_high = exact_interval([float(j.passed) for j in judged], 0.95)
    s_low, s_high = exact_interval(per, 0.95)
    return {
        "greedyPassAt1": round(greedy, 4),
        "greedyInterval": [round(g_low, 4), round(g_high, 4)],
        "sampledPassAt1": round(sum(per) / len(per), 4),
        "sampledInterval": [round(s_low, 4), round(s_high, 4)],
        "problems": len(problems),
        "greedyPassed": [int(j.passed) for j in judged],  # per problem, in the held-out file's order
        "samplesPassed": [sum(v) for v in verdicts],  # per problem, of `samples`
    }


def rise(before: dict[str, Any], after: dict[str, Any], samples: int, names: list[str]) -> dict[str, Any]:
    """The rise of held-out pass@1 from the SFT start to the tuned model, greedy and sampled, each with its paired
    95% interval over the same problems (evaluate.passk.paired_rise), and each problem's verdicts."""
    from tpuforge_workloads.evaluate.passk import paired_rise

    def rounded(r: dict[str, Any]) -> dict[str, Any]:
        out = {**r, "rise": round(r["rise"], 4), "interval": [round(v, 4) for v in r["interval"]]}
        return {**out, **({"mcnemarExactP": round(r["mcnemarExactP"], 5)} if "mcnemarExactP" in r else {})}

    greedy = paired_rise(before["greedyPassed"], after["greedyPassed"], 0.95, exact=True)
    sampled = paired_rise(
        [c / samples for c in before["samplesPassed"]], [c / samples for c in after["samplesPassed"]], 0.95, exact=False
    )
    verdicts = zip(
        names, before["greedyPassed"], after["greedyPassed"], before["samplesPassed"], after["samplesPassed"],
        strict=True,
    )  # fmt: skip
    return {
        "greedy": rounded(greedy),
        "sampled": rounded(sampled),
        "perProblem": [{"problem": n, "greedy": [b, a], "samplesPassed": [sb, sa]} for n, b, a, sb, sa in verdicts],
    }


def verdict_lines(r: dict[str, Any]) -> list[str]:
    """The plain verdicts: for greedy and sampled pass@1, the rise, its paired interval, beyond it or not."""
    out = []
    for kind in ("greedy", "sampled"):
        g = r[kind]
        low, high = g["interval"]
        counts = f" ({g['rose']} rose, {g['fell']} fell, McNemar p {g['mcnemarExactP']:.3g})" if "rose" in g else ""
        yes = "yes" if g["beyondInterval"] else "no"
        out.append(
            f"{kind} pass@1 rise {g['rise']:+.3f} [{low:+.3f}, {high:+.3f}]{counts}: rise beyond its interval: {yes}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24, help="GRPO steps")
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--samples", type=int, default=8, help="answers per held-out problem for sampled pass@1")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts a GRPO step (each answered --group times)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--kl", type=float, default=0.04)
    parser.add_argument("--iterations", type=int, default=1, help="optimizer steps on each rollout (GRPO's mu)")
    parser.add_argument("--temperature", type=float, default=0.5, help="of the rollouts and the sampled pass@1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", help="working directory (default: a fresh temporary one)")
    parser.add_argument("--json", help="append the row here too")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from tpuforge.api import GrpoSpec
    from tpuforge_workloads.data.verilog_tasks import VERILOG_CHECK_COMMAND
    from tpuforge_workloads.families.gemma4 import tiny
    from tpuforge_workloads.train import grpo

    work = Path(args.work or tempfile.mkdtemp(prefix="grpo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    sft_rows, train_rows, held_rows = records(BENCH_PROBLEMS)
    sft_data = jsonl(work / "sft.jsonl", sft_rows)
    rl_data = jsonl(work / "problems.jsonl", train_rows)
    held = jsonl(work / "held.jsonl", held_rows)
    base = work / "base"
    if not (base / "config.json").exists():
        tiny.write(str(base), tokenizer="verilog", seed=args.seed)
    started = time.monotonic()
    merged = work / "sft-merged"
    if (merged / "config.json").exists():  # --work of an earlier run: its SFT start, as it was
        sft = {"reused": str(merged)}
    else:
        sft = train(config(base, sft_data, work / "sft-ck", args.sft_steps, 5e-3, args.seed), work / "sft", 1)
        merge(base, work / "sft-ck", merged, work)
    rl_ck = work / f"rl-ck-{args.steps}"
    spec = GrpoSpec(group_size=args.group, temperature=args.temperature, max_tokens=MAX_TOKENS, kl_coefficient=args.kl,
                    iterations=args.iterations)  # fmt: skip
    rl_cfg = config(merged, rl_data, rl_ck, args.steps, args.lr, args.seed, method="grpo", grpo=spec,
                    micro_batch_size=args.prompts)  # fmt: skip
    rl_cfg.eval_uri = str(held)
    rl = train(rl_cfg, work / f"rl-{args.steps}", 1)
    check = grpo.Checker(VERILOG_CHECK_COMMAND, 10.0, 256 << 20, os.cpu_count() or 1, tempfile.gettempdir())
    import jax

    from tpuforge_workloads.model import lora
    from tpuforge_workloads.model.mesh import make_mesh

    mesh = make_mesh(1, 1, jax.devices()[:1])
    with jax.set_mesh(mesh):
        start_model = lora.untrained_lora_model(str(merged), str(rl_ck), mesh=mesh)
    before = score(start_model, merged, held, args.samples, check, args.seed, args.temperature)
    with jax.set_mesh(mesh):
        tuned = lora_model(merged, rl_ck, mesh)
    after = score(tuned, merged, held, args.samples, check, args.seed, args.temperature)
    held_rise = rise(before, after, args.samples, [p.name for p in BENCH_PROBLEMS])
    summary = json.loads((rl_ck / "run_summary.json").read_text())
    steps = {int(k): v for a in summary["attempts"] for k, v in a.get("train_rl", {}).items()}
    first, last = steps[min(steps)], steps[max(steps) - (max(steps) - 1) % args.iterations]  # the last rollout
    checker_s = sum(s["checker_seconds"] for s in steps.values())
    step_s = sum(s["step_seconds"] for s in steps.values())
    emit(
        {
            "benchmark": "grpo",
            "problems": {"train": len(train_rows), "heldOut": len(held_rows)},
            "sft": sft,
            "grpo": {
                **rl,
                "groupSize": args.group,
                "promptsPerStep": args.prompts,
                "temperature": args.temperature,
                "learningRate": args.lr,
                "klCoefficient": args.kl,
                "iterations": args.iterations,
            },
            "heldOutBefore": before,
            "heldOutAfter": after,
            "heldOutRise": held_rise,
            "rewardFirstStep": first["reward"],
            "rewardLastStep": last["reward"],
            "passRateFirstStep": first["pass_rate"],
            "passRateLastStep": last["pass_rate"],
            "klLastStep": last.get("kl"),
            "rewardByStep": [round(steps[s]["reward"], 3) for s in sorted(steps)],
            "checkerShareOfStepTime": round(checker_s / step_s, 4) if step_s else None,
            "rolloutShareOfStepTime": round(sum(s["rollout_seconds"] for s in steps.values()) / step_s, 4),
            "seconds": round(time.monotonic() - started, 1),
        },
        args.json,
    )
    for line in verdict_lines(held_rise):
        print(line, file=sys.stderr, flush=True)
    check.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
