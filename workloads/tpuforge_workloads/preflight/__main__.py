"""python -m tpuforge_workloads.preflight --config TRAIN_CONFIG --slice v5p-8 [--json] [...]

Compiles the trainer's train step for the slice's TPU topology on this (CPU) machine and prints HBM per
chip, FLOPs, the step time and tokens/s at an assumed MFU, and the run's time and cost. The model's shape
comes from config.json at the config's model.uri (or --model-config): no weights are read. The step count
comes from --steps, else training.maxSteps, else the dataset (read and tokenised as the trainer would).
With training.remat unset, the step is compiled without remat first and, where that does not fit, with it:
the report's `remat` says which it is (the operator's training attempts then use it).

Exit codes: 0 fits; 3 does not fit (the fixes are printed); EXIT_BAD_CONFIG (2) unusable config or input.
With --termination-log (the operator's preflight Job), the JSON report is also written there, in one line, or
the reason a config was refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the TPU is only a compile target here

from tpuforge.api.catalog import TPU_SLICES, model_shape
from tpuforge.api.constants import EXIT_BAD_CONFIG, EXIT_DOES_NOT_FIT
from tpuforge_workloads import families
from tpuforge_workloads.families.decoder import ModelError
from tpuforge_workloads.preflight.run import preflight
from tpuforge_workloads.preflight.topology import TopologyError
from tpuforge_workloads.runtime import tensorboard, termination
from tpuforge_workloads.train.plan import BadInput, load_config, make_plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tpuforge_workloads.preflight", description=__doc__.split("\n")[2])
    ap.add_argument("--config", required=True, help="the trainer's config JSON (TrainConfig)")
    ap.add_argument("--slice", required=True, choices=sorted(TPU_SLICES), help="the job's spec.tpu.slice")
    ap.add_argument(
        "--mfu", type=float, help="assumed share of peak FLOP/s (default: the chip generation's, estimate.UTILIZATION)"
    )
    ap.add_argument("--steps", type=int, help="optimizer steps of the run (default: maxSteps or the dataset)")
    ap.add_argument("--model-config", help="a local config.json instead of the one at model.uri")
    ap.add_argument("--whole", action="store_true", help="compile every layer instead of extrapolating")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--termination-log", help="also write the JSON report (or why the config was refused) here")
    ap.add_argument(
        "--compile-cache",
        metavar="URI",
        help="store the compiled steps in this gs:// or local directory for the trainer (default: the config's "
        "compileCacheUri)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        if args.compile_cache:
            config.compile_cache_uri = args.compile_cache
        if args.model_config:
            raw = json.loads(Path(args.model_config).read_text())
            text = families.parse_config(raw, args.model_config)
            families.check_against_catalog(text, model_shape(config.model_name), args.model_config)
            steps = args.steps or config.training.max_steps
        else:
            steps = args.steps or config.training.max_steps
            if steps is None:
                plan = make_plan(config, write_manifest=False)
                text, steps = plan.text, plan.total_steps
            else:
                text = families.read_decoder(config.model_uri)
                families.check_against_catalog(text, model_shape(config.model_name), config.model_uri)
        if steps is None:
            raise BadInput("--steps: the run's step count is unknown; give --steps or training.maxSteps")
        report = preflight(text, config, TPU_SLICES[args.slice], steps, args.mfu, args.whole)
    except (BadInput, ModelError, TopologyError, OSError, KeyError, ValueError) as e:
        print(f"preflight: {e}", file=sys.stderr)
        if args.termination_log:
            termination.write(args.termination_log, f"Bad config: {e}", one_line=True)
        return EXIT_BAD_CONFIG
    print(json.dumps(report.to_json(), indent=2) if args.json else report.text())
    if args.termination_log:
        termination.write(args.termination_log, json.dumps(report.to_json(), separators=(",", ":")))
    return 0 if report.estimate.fits else EXIT_DOES_NOT_FIT


if __name__ == "__main__":
    tensorboard.without_torch()
    sys.exit(main())
