"""python -m tpuforge_workloads.merge --config PATH [--termination-log PATH] [--verify]

Exit 0 after committing the output; EXIT_BAD_CONFIG (2) for a config or input rejected before anything was
written; 1 for any other failure. The reason goes to the termination log (the pod's termination message).
"""

from __future__ import annotations

import argparse
import logging
import os

# The merge runs on a CPU node; keep JAX (imported by Orbax) from probing for accelerators.
os.environ.setdefault("JAX_PLATFORMS", "cpu")


from tpuforge.api.configs import MergeConfig
from tpuforge.api.constants import EXIT_BAD_CONFIG, TERMINATION_LOG
from tpuforge_workloads.merge.errors import MergeInputError
from tpuforge_workloads.merge.merge import run_merge
from tpuforge_workloads.runtime import termination
from tpuforge_workloads.runtime.config_file import read_config

log = logging.getLogger("tpuforge_workloads.merge")


def load_config(path: str) -> MergeConfig:
    return read_config(MergeConfig, path, MergeInputError)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuforge_workloads.merge", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="MergeConfig JSON file")
    parser.add_argument("--termination-log", default=TERMINATION_LOG, help="where the failure reason goes")
    parser.add_argument("--verify", action="store_true", help="compare logits with the JAX LoRA model (slow)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax: each restore at INFO, read-only notes at WARNING
    logging.getLogger("fsspec").setLevel(logging.WARNING)  # gcsfs: each file opened at INFO
    try:
        run_merge(load_config(args.config), verify=args.verify)
    except MergeInputError as e:
        return termination.fail(args.termination_log, e, EXIT_BAD_CONFIG)
    except Exception as e:
        return termination.fail(args.termination_log, e, 1, unexpected="merge failed")
    return 0


if __name__ == "__main__":
    termination.exit_now(main())
