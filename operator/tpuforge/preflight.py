"""`tpuforge preflight -f finetune.yaml`: the job's train step compiled for its TPU slice on this machine.

The operator side only turns the FineTuneJob into the trainer's config (the same TrainConfig the training
pod gets) and runs the workloads' preflight (`python -m tpuforge_workloads.preflight`) on it in a child
process: compiling needs JAX and libtpu (the `workloads` and `tpu` extras), which the operator never
imports.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tpuforge.api import FineTuneJobSpec, SpecError, parse, train_config
from tpuforge.api.validation import FieldError, check_finetune

USAGE = (
    "tpuforge preflight -f FINETUNE_YAML [--json] [--mfu M] [--steps N] [--model-config PATH] [--whole] "
    "[--compile-cache URI]"
)


def load_job(path: str) -> tuple[str, str, FineTuneJobSpec]:
    """(namespace, name, spec) of the FineTuneJob in a YAML file, validated as the operator would."""
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if isinstance(d, dict)]
    except (OSError, yaml.YAMLError) as e:
        raise SpecError([FieldError(f"-f {path}", f"cannot read ({e})")]) from None
    jobs = [d for d in docs if d.get("kind") == "FineTuneJob"]
    if len(jobs) != 1:
        raise SpecError([FieldError(f"-f {path}", f"expected one FineTuneJob, found {len(jobs)}")])
    meta = jobs[0].get("metadata") or {}
    spec = parse(FineTuneJobSpec, jobs[0].get("spec") or {})
    errors = check_finetune(spec)
    if errors:
        raise SpecError(errors)
    return meta.get("namespace", "default"), meta.get("name", "job"), spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tpuforge preflight", usage=USAGE, description=__doc__.split("\n")[0])
    ap.add_argument("-f", "--file", required=True, help="a FineTuneJob manifest")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument(
        "--mfu",
        type=float,
        help="assumed share of peak FLOP/s (default: the chip generation's, 0.72 as measured on TPU v5e)",
    )
    ap.add_argument("--steps", type=int, help="the run's optimizer steps (default: maxSteps or the dataset)")
    ap.add_argument("--model-config", help="a local config.json instead of reading the one at spec.model.uri")
    ap.add_argument("--whole", action="store_true", help="compile every layer instead of extrapolating")
    ap.add_argument(
        "--compile-cache",
        metavar="URI",
        help="store the compiled steps there for the trainer (e.g. the job's <checkpoint.uri>/compile-cache; "
        "useful with --whole); default: not stored",
    )
    args = ap.parse_args(argv)
    try:
        namespace, name, spec = load_job(args.file)
        config = train_config(namespace, name, spec).model_copy(
            update={"job": None, "metrics_port": 0, "compile_cache_uri": args.compile_cache}
        )
    except (SpecError, ValueError) as e:  # ValueError: a fineTuneJobRef, which only the operator resolves
        print(f"tpuforge preflight: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tpuforge-preflight-") as tmp:
        path = Path(tmp) / "train.json"
        path.write_text(json.dumps(config.model_dump(mode="json", by_alias=True)))
        cmd = [sys.executable, "-m", "tpuforge_workloads.preflight", "--config", str(path), "--slice", spec.tpu.slice]
        for flag, value in (("--mfu", args.mfu), ("--steps", args.steps), ("--model-config", args.model_config)):
            if value is not None:
                cmd += [flag, str(value)]
        cmd += ["--json"] if args.json else []
        cmd += ["--whole"] if args.whole else []
        return subprocess.call(cmd)
