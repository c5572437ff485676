"""The named measurements of a session on a TPU machine, run one after another, each in a process of its own
under a deadline, each appending its JSON to the output directory as it goes.

One program holds a TPU at a time and a session is short, so each measurement is a separate command: one that
runs out of memory or time loses only itself, and whatever finished is already on disk (results.jsonl: one
line per measurement with its name, command, exit code and seconds; each measurement's own rows in
<name>.jsonl; its output in <name>.log). scripts/tpu-offline.sh runs this on the TPU machine
(docs/tpu-offline.md); on CPU, `--tiny` runs the same plan at tiny shapes.

    python -m benchmarks.chip.session --out DIR [--only NAME,...|GROUP] [--tiny] [--deadline S] [--budget S]
        [--list]

`--budget S`: the whole session's seconds (a lease on a chip is short): each measurement's deadline is capped at
what is left, and one that would start with less than a minute left is recorded as skipped, not started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Measurement:
    name: str
    group: str  # throughput, build, preflight, splash, trainer, decode
    args: tuple[str, ...]  # after `python -m`; {out}: this measurement's JSON lines file, {dir}: the output dir
    deadline_s: float


def _throughput(
    layers: int, seqs: str, batch: int = 1, remat: str = "full", layout: str = "fused", quantization: str = "none"
) -> Measurement:
    """The 31B's first `layers` at each of `seqs` (comma-separated): one process, one baseline, a child each;
    `layout`: the splash kernels' blocks (default the trainer's), `quantization`: QLoRA's base. XLA's FLOP count
    is left to the host (`benchmarks.train_throughput --flops-only 1`, the same CPU lowering): chip time is
    short."""
    name = f"throughput-31b-{layers}x{seqs.replace(',', '-')}-b{batch}"
    name += "".join(
        f"-{x}" for x, default in ((remat, "full"), (layout, "fused"), (quantization, "none")) if x != default
    )
    args = ["benchmarks.train_throughput", "--model", "gemma4-31b", "--layers", str(layers), "--seq", seqs]
    args += ["--batch", str(batch), "--steps", "8", "--warmup", "2", "--json", "{out}", "--timeout", "540"]
    args += ["--no-flops"]
    args += ["--splash-layout", layout, "--base-quantization", quantization]
    return Measurement(name, "throughput", (*args, "--remat", remat), 600)


def plan(tiny: bool = False) -> list[Measurement]:
    """The session's measurements, most wanted first. `tiny`: the same commands at tiny shapes (for a CPU host:
    what the runner does, not what the chip does)."""
    if tiny:
        bench = ("benchmarks.train_throughput", "--model", "gemma4-tiny", "--layers", "0", "--seq", "128")
        bench += ("--batch", "1", "--steps", "1", "--warmup", "1", "--json", "{out}")
        build = ("benchmarks.chip.build_memory", "--model", "gemma4-tiny", "--layers", "0", "--json", "{out}")
        decode = ("benchmarks.decode_speed", "--rows", "4", "--new", "8", "--repeats", "1", "--json", "{out}")
        return [
            Measurement("throughput-tiny", "throughput", bench, 600),
            Measurement("decode-tiny", "decode", decode, 300),
            Measurement("build-tiny", "build", build, 300),
            Measurement("splash-tiny", "splash", ("benchmarks.chip.splash_check", "--tiny", "--json", "{out}"), 300),
        ]
    out = [
        # 12 of the 31B's layers hold more than one chip's HBM in weights alone (the preflight grid shows it).
        _throughput(6, "2048,3072"),
        _throughput(6, "2048", batch=2),
        _throughput(6, "2048", remat="off"),
        _throughput(6, "4096"),  # fits since the head's own gradient (15.18 GiB compiled)
        _throughput(6, "2048", remat="off", quantization="int8"),  # QLoRA where the preflight chooses remat off
        _throughput(6, "4096", quantization="int8"),  # QLoRA at the length where the bf16 step leaves 0.6 GiB
        _throughput(6, "2048,3072", remat="saveAttention"),
        _throughput(6, "2048", remat="saveMatmuls"),
        _throughput(4, "2048"),  # the model-FLOPs column for the shorter cuts
        _throughput(2, "2048,4096"),
        # The splash kernels' block layouts: their speed at the 31B's shapes, their answers against the masked
        # reference, then the step with each (the default is the fastest: docs/performance.md).
        Measurement("splash-speed", "splash", ("benchmarks.chip.splash_speed", "--json", "{out}"), 600),
        # The logits over the 262k vocabulary and the loss, against their two matrix products alone.
        Measurement("head-speed", "throughput", ("benchmarks.chip.head_speed", "--json", "{out}"), 300),
        *(
            _throughput(6, "2048", layout=name) for name in ("uniform", "wideForward", "wideFused")
        ),  # fused: the default, above
        *(_throughput(6, "2048", quantization=q) for q in ("int8", "int4")),  # QLoRA's base: memory and time
        Measurement("build-31b-6", "build", ("benchmarks.chip.build_memory", "--layers", "6", "--json", "{out}"), 600),
        # QLoRA's build: each targeted weight quantized as it is made (as the loader quantizes it as it reads).
        Measurement(
            "build-31b-6-int8",
            "build",
            ("benchmarks.chip.build_memory", "--layers", "6", "--base-quantization", "int8", "--json", "{out}"),
            600,
        ),
    ]
    for kind in ("sliding", "global"):  # about 50 s a case on the chip: each kind a measurement of its own
        splash = ("benchmarks.chip.splash_check", "--cases", kind, "--json", "{out}")
        out.append(Measurement(f"splash-31b-{kind}", "splash", splash, 600))
    layouts = ("benchmarks.chip.splash_check", "--seq", "2048", "--layouts", "fused,wideForward,wideFused")
    out.append(Measurement("splash-31b-layouts", "splash", (*layouts, "--json", "{out}"), 600))
    # The grid only compiles (nothing runs on the chip): one process opens the chip once for the three cuts.
    for seq in (2048, 4096):
        grid = ("benchmarks.chip.preflight_vs_chip", "--side", "chip", "--layers", "2,4,6", "--seq", str(seq))
        out.append(Measurement(f"preflight-chip-{seq}", "preflight", (*grid, "--json", "{out}"), 600))
    # QLoRA's step: whether the preflight's extrapolation of an int8 base's temporaries holds at 2, 4, 6 layers.
    grid = ("benchmarks.chip.preflight_vs_chip", "--side", "chip", "--layers", "2,4,6", "--seq", "2048")
    out.append(
        Measurement(
            "preflight-chip-2048-int8", "preflight", (*grid, "--base-quantization", "int8", "--json", "{out}"), 600
        )
    )
    # 2 @ 4096: the chip fits what the host refuses; 2 @ 2048, where both agree, for a control. The programs
    # as lowered and as compiled, to diff against the host's (`--side cpu --hlo`).
    hlo = ("benchmarks.chip.preflight_vs_chip", "--side", "chip", "--layers", "2", "--seq", "2048,4096")
    out.append(Measurement("preflight-chip-hlo", "preflight", (*hlo, "--hlo", "{dir}/hlo", "--json", "{out}"), 600))
    for model in ("gemma4-tiny", "qwen3-tiny"):
        # The runs' files kept under the output directory: the adapters come back to be merged on a CPU.
        resume = ("--model", model, "--steps", "300", "--kill-at", "110", "--json", "{out}")
        resume += ("--workdir", f"{{dir}}/trainer-{model}-work")
        out.append(Measurement(f"trainer-{model}", "trainer", ("benchmarks.chip.trainer_resume", *resume), 900))
    # GRPO's rollout decode at the 31B's shapes: the KV cache against whole rows (8 answers of 128 tokens), then
    # the cache alone at a rollout's size (two prompts x a group of 8, 512 tokens each).
    # QLoRA's rollouts (int8 weights read at each token) last.
    decode = ("benchmarks.decode_speed", "--model", "gemma4-31b", "--layers", "6", "--prompt", "256")
    both = (*decode, "--rows", "8", "--new", "128", "--repeats", "2", "--json", "{out}")
    out.append(Measurement("decode-31b-6", "decode", both, 600))
    rollout = (*decode, "--rows", "16", "--new", "512", "--no-baseline", "--json", "{out}")
    out.append(Measurement("decode-31b-6-rollout", "decode", rollout, 600))
    out.append(Measurement("decode-31b-6-rollout-int8", "decode", (*rollout, "--base-quantization", "int8"), 600))
    # At the 31B plan's lengths (docs/training.md: ~512-token prompts, answers of up to 1024), 32 rows.
    long = ("benchmarks.decode_speed", "--model", "gemma4-31b", "--layers", "6", "--prompt", "512", "--rows", "32")
    long += ("--new", "1024", "--no-baseline", "--repeats", "1", "--json", "{out}")
    out.append(Measurement("decode-31b-6-rollout-32x1024", "decode", long, 600))
    for model in ("gemma4-tiny", "qwen3-tiny"):  # the two decodes' tokens on the chip, from written weights
        tiny = ("benchmarks.decode_speed", "--model", model, "--written", "--rows", "8", "--prompt", "40", "--new")
        out.append(Measurement(f"decode-{model}", "decode", (*tiny, "56", "--json", "{out}"), 300))
    # QLoRA's whole trainer: the int8 base quantized as it loads, killed and resumed (its losses beside bf16's).
    resume = ("--model", "gemma4-tiny", "--steps", "300", "--kill-at", "110", "--json", "{out}")
    resume += ("--workdir", "{dir}/trainer-gemma4-tiny-int8-work", "--base-quantization", "int8")
    out.append(Measurement("trainer-gemma4-tiny-int8", "trainer", ("benchmarks.chip.trainer_resume", *resume), 900))
    # Preference tuning and GRPO (exact match and format as the reward: no checker on a plain VM user), killed and
    # resumed as SFT is.
    for method, steps, kill_at, every in (("dpo", 200, 110, 100), ("orpo", 200, 110, 100), ("grpo", 60, 25, 20)):
        resume = ("--model", "gemma4-tiny", "--method", method, "--steps", str(steps), "--kill-at", str(kill_at))
        resume += ("--every", str(every), "--json", "{out}", "--workdir", f"{{dir}}/trainer-gemma4-tiny-{method}-work")
        out.append(
            Measurement(f"trainer-gemma4-tiny-{method}", "trainer", ("benchmarks.chip.trainer_resume", *resume), 900)
        )
    return out


def select(measurements: list[Measurement], only: str | None) -> list[Measurement]:
    """The measurements named (or of the groups named) in `only`, comma-separated; all when None."""
    if not only:
        return measurements
    wanted = set(only.split(","))
    chosen = [m for m in measurements if m.name in wanted or m.group in wanted]
    unknown = wanted - {m.name for m in chosen} - {m.group for m in chosen}
    if unknown:
        names = ", ".join(sorted({m.group for m in measurements} | {m.name for m in measurements}))
        raise ValueError(f"--only: {', '.join(sorted(unknown))} not in the plan; known: {names}")
    return chosen


def run(m: Measurement, out: Path, deadline_s: float | None = None) -> dict[str, object]:
    """One measurement in its own process; its record (also appended to out/results.jsonl)."""
    rows = out / f"{m.name}.jsonl"
    cmd = [sys.executable, "-m", *(a.replace("{out}", str(rows)).replace("{dir}", str(out)) for a in m.args)]
    deadline = min(m.deadline_s, deadline_s) if deadline_s else m.deadline_s
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    with open(out / f"{m.name}.log", "w") as log:
        # A process group of its own: at the deadline the measurement's children (the trainer runs the
        # resume check starts) go with it, so none is left holding the chip for the next measurement.
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            code: int | str = child.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            code = f"deadline {deadline:.0f} s"
    record: dict[str, object] = {
        "name": m.name,
        "group": m.group,
        "command": cmd[1:],
        "exit": code,
        "seconds": round(time.monotonic() - started, 1),
        "rows": [json.loads(line) for line in rows.read_text().splitlines()] if rows.exists() else [],
    }
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


MIN_START_S = 60.0  # a measurement started with less than this left of the budget would only open the chip


def skipped(m: Measurement, out: Path, left: float) -> None:
    """Record a measurement the budget left no time for, so results.jsonl names every one of the plan."""
    record = {"name": m.name, "group": m.group, "exit": f"skipped: {max(left, 0):.0f} s of the budget left"}
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps({**record, "seconds": 0, "rows": []}) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for results.jsonl, <name>.jsonl and <name>.log")
    ap.add_argument("--only", help="comma-separated measurement names or groups (default: all)")
    ap.add_argument("--tiny", action="store_true", help="the plan at tiny shapes (a CPU host)")
    ap.add_argument("--deadline", type=float, help="cap every measurement's deadline at this many seconds")
    ap.add_argument("--budget", type=float, help="the whole session's seconds: deadlines capped at what is left")
    ap.add_argument("--list", action="store_true", help="print the plan and exit")
    args = ap.parse_args(argv)
    try:
        chosen = select(plan(args.tiny), args.only)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            print(f"{m.name:32} {m.group:10} {m.deadline_s:5.0f} s  python -m {' '.join(m.args)}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    ends = time.monotonic() + args.budget if args.budget else None
    for m in chosen:
        deadline = args.deadline
        if ends is not None:
            left = ends - time.monotonic()
            if left < MIN_START_S:
                skipped(m, out, left)
                print(f"{m.name}: skipped, {left:.0f} s of the budget left", flush=True)
                failed += 1
                continue
            deadline = min(deadline, left) if deadline else left
        record = run(m, out, deadline)
        failed += record["exit"] != 0
        rows = record["rows"]
        print(f"{m.name}: exit {record['exit']} in {record['seconds']} s, {len(rows)} rows", flush=True)  # type: ignore[arg-type]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
