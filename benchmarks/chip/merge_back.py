"""The adapters a chip trained, merged and verified on a CPU host: the working directory of
`benchmarks.chip.trainer_resume` (brought back in a session's output) through the merge CLI with `--verify`
(transformers loads the merged model and its logits are checked against the base plus the adapters).

    python -m benchmarks.chip.merge_back --workdir DIR/trainer-gemma4-tiny-work [--json out.jsonl]

The merge reads the base model the chip trained on (the tiny model written into the working directory) and
the killed-and-resumed run's checkpoints, its latest step; the LoRA settings are the check's own.
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

from benchmarks.chip.trainer_resume import config
from benchmarks.rows import emit

from tpuforge.api.configs import MergeConfig


def merge(workdir: Path, out: Path) -> dict[str, object]:
    lora = json.loads((workdir / "killed" / "lora.json").read_text())
    model = lora["model_name"]
    base = workdir / model
    train = config(model, base, workdir / "train.jsonl", workdir / "killed", 1, 1)
    merge_config = MergeConfig(
        model_name=model,
        base_model_uri=str(base),
        checkpoint_uri=str(workdir / "killed"),
        output_uri=str(out),
        lora=train.lora,
        write_adapter=True,
        verify=True,
    )
    path = out.parent / f"{model}-merge.json"
    path.write_text(merge_config.model_dump_json(by_alias=True))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    started = time.monotonic()
    cmd = [sys.executable, "-m", "tpuforge_workloads.merge", "--config", str(path), "--verify"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    steps = sorted(int(p.name) for p in (workdir / "killed").iterdir() if p.name.isdigit())
    return {
        "model": model,
        "mergedStep": steps[-1] if steps else None,
        "exit": done.returncode,
        "verified": done.returncode == 0 and (out / "_COMPLETE").exists(),
        "adapter": (out / "adapter" / "adapter_model.safetensors").exists(),
        "seconds": round(time.monotonic() - started, 1),
        "logTail": (done.stdout + done.stderr)[-1500:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True, help="a trainer_resume working directory")
    ap.add_argument("--out", help="where the merged model goes (default: a temporary directory)")
    ap.add_argument("--json", help="append the row here")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="tpuforge-merge-back-")) / "merged"
    row = merge(Path(args.workdir), out)
    emit(row, args.json)
    return 0 if row["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
