"""Merge throughput and memory on a synthetic checkpoint with Gemma 4 31B tensor shapes.

The base is the 31B's multimodal layout (bf16, `model.language_model.` prefix, sharded at 2 GiB) cut to a
few decoder layers (alternating sliding and global, so both attention shapes are there) plus the full
262144 x 5376 embedding: 4.8 GB with 2 layers. The LoRA checkpoint has rank 64 on every Gemma 4 target.

Each configuration runs in the same invocation, each step in its own process, started by a driver that holds
no data (a child's peak RSS, from wait4, starts at its parent's RSS at fork: the driver's is printed):
  copy         a plain copy of the base's safetensors bytes through the same storage layer (read in ranges,
               written through staged writes), and, on a local disk, shutil.copyfile: the baseline
  merge        python -m tpuforge_workloads.merge (the streamed merge, hashing, spot check, commit)
  whole-model  the merge as the source report did it: every tensor in RAM, float32 temporaries, one file
               (local disk only)
then the number of layers doubles and the local runs repeat: the streamed merge's peak RSS must stay flat.

On a local disk, copy and merge alternate for --rounds rounds (default 3): a copy's time swings with the disk
and the page cache (8.6 to 24 s for the same 6.9 GB, one run after another, on the 2-core VM), so each merge
is compared with the copy just before it, and the median of those ratios is the result.

Targets: merge throughput >= 0.9x the plain copy; peak RSS <= 2 GB + 2 x the largest tensor, flat as the
layers double.

    python benchmarks/merge_throughput.py                  # 2 and 4 layers, local disk and fake-gcs-server
    python benchmarks/merge_throughput.py --layers 1 --no-gcs
    python benchmarks/merge_throughput.py --layers 4 --no-gcs --no-whole-model --rounds 5
    python benchmarks/merge_throughput.py --model gemma4-tiny-mm --layers 1 --rounds 1   # seconds: a smoke run
Needs ~4x the base size of free disk (base, outputs, and a GCS copy of each) and, for the whole-model
merge, RAM for the whole base.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "workloads")]

RANK = 64
SHARD_BYTES = 2 << 30
COPY_CHUNK = 32 << 20


@dataclasses.dataclass
class Run:
    what: str
    seconds: float
    peak_rss: int  # bytes
    driver_rss: int  # bytes: this process's RSS when it started the step, a floor under peak_rss
    cpu_seconds: float  # user + system CPU of the step: what a loaded machine makes scarce
    user_seconds: float  # of which user CPU (the merge's own work; system CPU is mostly the kernel's copies)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "workloads")])}


def _measure(what: str, args: list[str]) -> Run:
    """Run a child process; its wall time and its own peak RSS (from wait4)."""
    os.sync()  # earlier steps' dirty pages are written back before, not during, this one
    driver = _rss()
    started = time.monotonic()
    proc = subprocess.Popen(args, env=_env())
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: {' '.join(args)} exited {proc.returncode}")
    return Run(what, seconds, usage.ru_maxrss * 1024, driver, usage.ru_utime + usage.ru_stime, usage.ru_utime)


def _self(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


# ---- the steps, each run as `merge_throughput.py --step NAME ...` in a child process --------------------


def step_copy(src: str, dst: str) -> None:
    """Every safetensors file of `src` to `dst`, streamed through tpuforge_workloads.storage, read into one
    reused buffer as the merge reads (a fresh buffer per read costs more CPU than the read itself)."""
    from tpuforge_workloads import storage
    from tpuforge_workloads.storage import staged as staged_write

    buf = memoryview(bytearray(COPY_CHUNK))
    for name in storage.list_files(src):
        if not name.endswith(".safetensors"):
            continue
        size = storage.size(storage.join(src, name))
        with staged_write.open_staged_write(storage.join(dst, name), storage.join(dst, "_staging", name), size) as w:
            for offset in range(0, size, COPY_CHUNK):
                w.write(buf[: storage.read_range_into(storage.join(src, name), offset, buf)])
        w.publish()


def step_cp(src: str, dst: str) -> None:
    Path(dst).mkdir(parents=True, exist_ok=True)
    for f in Path(src).glob("*.safetensors"):
        shutil.copyfile(f, Path(dst) / f.name)


def step_whole_model(config_path: str) -> None:
    """The source report's way: load everything, merge in float32 in memory, save one file."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from tpuforge.api.configs import MergeConfig
    from tpuforge_workloads.merge.mapping import peft_factors
    from tpuforge_workloads.merge.plan import make_plan

    cfg = MergeConfig.model_validate_json(Path(config_path).read_text())
    plan = make_plan(cfg)
    tensors: dict[str, Any] = {}
    for name in plan.base.files:
        tensors.update(load_file(str(Path(cfg.base_model_uri) / name)))
    adapters = {layer: plan.lora.layer(layer) for layer in range(plan.layout.num_layers)}
    for t in plan.targets:
        w = tensors[t.tensor]
        lora_a, lora_b = peft_factors(t, *adapters[t.layer][t.module])
        tensors[t.tensor] = (w.astype(np.float32) + plan.scale * (lora_b @ lora_a)).astype(w.dtype)
    Path(cfg.output_uri).mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(Path(cfg.output_uri) / "model.safetensors"), metadata={"format": "pt"})


# ---- the driver ----------------------------------------------------------------------------------------------


def sgemm_gflops(width: int, seconds: float = 2.0) -> float:
    """This machine's float32 matmul rate on the merge's shape of product (rows x 64) @ (64 x width), width
    the model's (5376 for the 31B)."""
    import numpy as np

    rng = np.random.default_rng(0)
    b = rng.standard_normal((2048, RANK), dtype=np.float32)
    a = rng.standard_normal((RANK, width), dtype=np.float32)
    n, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        b @ a
        n += 1
    return n * 2 * 2048 * RANK * width / (time.monotonic() - started) / 1e9


def step_inputs(root: str, layers: str, result: str, model: str) -> None:
    base, ckpt, size, largest, gflop = make_inputs(Path(root), int(layers), model)
    width = _shape(model, int(layers)).embed_dim
    Path(result).write_text(json.dumps([base, ckpt, size, largest, gflop, sgemm_gflops(width)]))


def _shape(model: str, layers: int) -> Any:
    from tpuforge.api.catalog import model_shape

    return dataclasses.replace(model_shape(model), num_layers=layers, sliding_per_global=1)


def step_upload(local: str, uri: str) -> None:
    upload_dir(Path(local), uri)


def make_inputs(root: Path, layers: int, model: str) -> tuple[str, str, int, int, float]:
    """(base dir, checkpoint dir, safetensors bytes, largest tensor bytes, GFLOP of the LoRA deltas) of a
    synthetic model of `model`'s shapes (the 31B's by default)."""
    from tpuforge.api import LoraSpec
    from tpuforge_workloads.merge import synthetic
    from tpuforge_workloads.merge.plan import read_base_config
    from tpuforge_workloads.model import lora

    shape = _shape(model, layers)
    base, ckpt = root / "base", root / "ckpt"
    started = time.monotonic()
    specs = synthetic.write_base(str(base), shape, dtype="BF16", shard_bytes=SHARD_BYTES)
    text = read_base_config(str(base))
    spec = LoraSpec(rank=RANK, alpha=RANK)
    tree = synthetic.lora_tree(text, RANK, spec.target_modules)
    manifest = lora.manifest(model, str(base), spec)
    synthetic.write_lora_checkpoint(str(ckpt), tree, step=100, manifest=manifest)
    size = sum(f.stat().st_size for f in base.glob("*.safetensors"))
    largest = max(2 * math.prod(s.shape) for s in specs)
    # Each merged weight costs one (out x r) @ (r x in) product: 2 * r flops per element.
    gflop = sum(
        2 * RANK * math.prod(s.shape) for s in specs if s.name.endswith("_proj.weight") and "vision" not in s.name
    )
    print(f"[{layers} layers] inputs: {size / 1e9:.2f} GB base in {time.monotonic() - started:.0f} s", flush=True)
    return str(base), str(ckpt), size, largest, gflop / 1e9


def merge_config(base: str, ckpt: str, out: str, path: Path, model: str) -> Path:
    from tpuforge.api import LoraSpec
    from tpuforge.api.configs import MergeConfig

    cfg = MergeConfig(
        model_name=model,
        base_model_uri=base,
        checkpoint_uri=ckpt,
        output_uri=out,
        lora=LoraSpec(rank=RANK, alpha=RANK),
    )
    path.write_text(cfg.model_dump_json(by_alias=True))
    return path


def upload_dir(local: Path, uri: str) -> None:
    from tpuforge_workloads import storage
    from tpuforge_workloads.storage import staged as staged_write

    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        rel = f.relative_to(local).as_posix()
        if f.suffix == ".safetensors":  # large: parts + compose, as the merge's own writes
            size = f.stat().st_size
            staged = staged_write.open_staged_write(storage.join(uri, rel), storage.join(uri, "_up", rel), size)
            with staged as w, open(f, "rb") as src:
                while chunk := src.read(COPY_CHUNK):
                    w.write(chunk)
            w.publish()
        else:
            storage.upload_file(f, storage.join(uri, rel))


def run_config(root: Path, layers: int, gcs: bool, whole_model: bool, rounds: int, model: str) -> list[dict[str, Any]]:
    from tpuforge_workloads import storage

    # Inputs (and the matmul rate) in a child: the driver must stay small (see _measure).
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        _self("--step", "inputs", str(root / "in"), str(layers), str(root / "in.json"), model),
        env=_env(),
        check=True,
    )
    base, ckpt, size, largest, gflop, rate = json.loads((root / "in.json").read_text())
    print(
        f"[{layers} layers] LoRA deltas: {gflop:.0f} GFLOP; sgemm here now: {rate:.1f} GFLOPS, so >= "
        f"{gflop / rate:.0f} s of matmul alone",
        flush=True,
    )
    rows = []

    def record(where: str, run: Run, round_: int = 0) -> None:
        rows.append(
            {
                "layers": layers,
                "where": where,
                "round": round_,
                "what": run.what,
                "seconds": run.seconds,
                "gb_per_s": size / run.seconds / 1e9,
                "peak_rss_gb": run.peak_rss / 1e9,
                "base_gb": size / 1e9,
                "largest_tensor_gb": largest / 1e9,
                "delta_gflop": gflop,
                "sgemm_gflops": rate,
                "driver_rss_gb": run.driver_rss / 1e9,
                "cpu_seconds": run.cpu_seconds,
                "user_seconds": run.user_seconds,
                "load_average": os.getloadavg()[0],
            }
        )
        print(
            f"[{layers} layers, {where}, round {round_ + 1}] {run.what}: {run.seconds:.1f} s, "
            f"{size / run.seconds / 1e6:.0f} MB/s, "
            f"CPU {run.cpu_seconds:.1f} s (user {run.user_seconds:.1f}), peak RSS {run.peak_rss / 1e9:.2f} GB "
            f"(driver {run.driver_rss / 1e9:.2f} GB), load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )

    record("local", _measure("cp", _self("--step", "cp", base, str(root / "cp"))))
    shutil.rmtree(root / "cp")
    cfg = merge_config(base, ckpt, str(root / "merged"), root / "merge.json", model)
    for r in range(rounds):
        record("local", _measure("copy", _self("--step", "copy", base, str(root / "copy"))), r)
        shutil.rmtree(root / "copy")
        merge = [sys.executable, "-m", "tpuforge_workloads.merge", "--config", str(cfg)]
        record("local", _measure("merge", merge), r)
        shutil.rmtree(root / "merged")
    if whole_model:
        cfg = merge_config(base, ckpt, str(root / "whole"), root / "whole.json", model)
        record("local", _measure("whole-model", _self("--step", "whole-model", str(cfg))))
        shutil.rmtree(root / "whole")
    if gcs:
        from tpuforge_sandbox.gcs import create_bucket, start_gcs

        server = start_gcs(root / "gcs", log=root / "fake-gcs-server.log")
        saved = dict(os.environ)
        os.environ.update(server.env())
        try:
            create_bucket(server.url, "bench")
            for local, uri in ((base, "gs://bench/base"), (ckpt, "gs://bench/ckpt")):
                subprocess.run(_self("--step", "upload", local, uri), env=_env(), check=True)
            record("gcs", _measure("copy", _self("--step", "copy", "gs://bench/base", "gs://bench/copy")))
            storage.delete_dir("gs://bench/copy")
            cfg = merge_config(
                "gs://bench/base", "gs://bench/ckpt", "gs://bench/merged", root / "merge-gcs.json", model
            )
            record("gcs", _measure("merge", [sys.executable, "-m", "tpuforge_workloads.merge", "--config", str(cfg)]))
        finally:
            server.stop()
            os.environ.clear()
            os.environ.update(saved)
            shutil.rmtree(root / "gcs", ignore_errors=True)
    shutil.rmtree(root / "in")
    return rows


def report(rows: list[dict[str, Any]]) -> None:
    print(
        "\nlayers  where  round  step         seconds   GB/s   vs copy  CPU s  user s  load  peak RSS GB  RSS limit GB"
    )
    for r in rows:
        copy = next(
            x
            for x in rows
            if (x["layers"], x["where"], x["round"], x["what"]) == (r["layers"], r["where"], r["round"], "copy")
        )
        limit = 2 + 2 * r["largest_tensor_gb"]
        print(
            f"{r['layers']:>6}  {r['where']:<5}  {r['round'] + 1:>5}  {r['what']:<11}  {r['seconds']:>7.1f}  "
            f"{r['gb_per_s']:>5.2f}  {copy['seconds'] / r['seconds']:>6.2f}x  {r['cpu_seconds']:>5.1f}  "
            f"{r['user_seconds']:>6.1f}  {r['load_average']:>4.1f}  {r['peak_rss_gb']:>11.2f}  {limit:>12.2f}"
        )
    for layers, where in sorted({(r["layers"], r["where"]) for r in rows if r["what"] == "merge"}):
        pairs = {
            r["round"]: r["seconds"] for r in rows if (r["layers"], r["where"], r["what"]) == (layers, where, "copy")
        }
        ratios = [
            pairs[r["round"]] / r["seconds"]
            for r in rows
            if (r["layers"], r["where"], r["what"]) == (layers, where, "merge")
        ]
        print(
            f"merge vs copy, {layers} layers, {where}: median {statistics.median(ratios):.2f}x over {len(ratios)} "
            f"round(s) (min {min(ratios):.2f}x, max {max(ratios):.2f}x; target >= 0.9x)"
        )
    merges = [r for r in rows if r["what"] == "merge" and r["where"] == "local" and r["round"] == 0]
    if len(merges) == 2:
        print(
            f"streamed merge peak RSS, {merges[1]['layers']} vs {merges[0]['layers']} layers: "
            f"{merges[1]['peak_rss_gb'] / merges[0]['peak_rss_gb']:.2f}x"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gemma4-31b", help="the catalog model whose shapes are merged")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the first run (doubled next)")
    parser.add_argument("--workdir", default=None, help="where inputs and outputs go (default: a temp dir)")
    parser.add_argument("--no-gcs", action="store_true", help="skip the fake-gcs-server runs")
    parser.add_argument("--no-whole-model", action="store_true", help="skip the whole-model merge")
    parser.add_argument("--rounds", type=int, default=3, help="copy/merge pairs on the local disk per size")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        name, *rest = args.step
        steps: dict[str, Any] = {
            "copy": step_copy,
            "cp": step_cp,
            "whole-model": step_whole_model,
            "inputs": step_inputs,
            "upload": step_upload,
        }
        steps[name](*rest)
        return 0
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="merge-bench-"))
    rows = []
    try:
        for layers in (args.layers, 2 * args.layers):
            gcs = not args.no_gcs and layers == args.layers  # fake-gcs-server is slow: once is enough
            rows += run_config(root / f"l{layers}", layers, gcs, not args.no_whole_model, args.rounds, args.model)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
