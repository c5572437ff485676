"""What training on several hosts costs over one: the trainer CLI on an emulated two-host slice (two
processes joined by jax.distributed on loopback, 4 virtual CPU devices each, mesh fsdp=2 x tp=4 over both)
against one process with all 8 devices, same config, seed and global batch. Measured in this run, on the tiny
Gemma 4 model.

The per-step cost of going multi-host is the hosts' agreement at every step boundary (one barrier through
the coordination service), each process assembling its rows into global arrays, and the cross-process
(gloo) collectives in the step itself. The ratio is the steady-state step time (median after the first,
compiling step, from the run summary) of the two-process run over the one-process run; best of `--rounds`
rounds that alternate which goes first. Target ratio <= 1.15.

For context it also times one small all-reduce over the same 8 devices, within one process and across the
two (the CPU emulation's cross-process collectives run over gloo on loopback TCP), and the hosts' per-step
agreement (a coordination-service barrier).

    .venv/bin/python benchmarks/train_multihost.py [--steps 30] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's own folder is on the path, not the repository's root, which holds benchmarks/.
if (root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, root)

from benchmarks.training.tiny_config import train_config

from tpuforge.api import MeshSpec, TrainConfig
from tpuforge_workloads.data import demo
from tpuforge_workloads.families.gemma4 import tiny as tiny_model
from tpuforge_workloads.runtime.progress import SUMMARY_FILE
from tpuforge_workloads.train.hosts import ENV_COORDINATOR_ADDRESS, ENV_NUM_PROCESSES, ENV_PROCESS_ID

ROOT = Path(__file__).resolve().parents[1]
SEQ = 128
MICRO_BATCH = 2  # per fsdp replica: 4 rows a micro-batch over fsdp=2
ACCUMULATION = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(devices: int, cache: Path) -> dict[str, str]:
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    return {
        **os.environ,
        "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices}".strip(),
        "JAX_PLATFORMS": "cpu",
        # Rounds after the first skip compiling; the first step is left out of the comparison anyway.
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "workloads"), str(ROOT)]),
    }


def run(config: TrainConfig, work: Path, hosts: int, cache: Path) -> dict[str, Any]:
    """The trainer CLI on `hosts` processes (8 devices in all); the run summary's timings."""
    work.mkdir(parents=True)
    config_path = work / "config.json"
    config_path.write_text(config.model_dump_json(by_alias=True, exclude_none=True))
    coordinator = f"127.0.0.1:{free_port()}"
    procs = []
    for i in range(hosts):
        env = environment(8 // hosts, cache)
        if hosts > 1:
            env.update({ENV_NUM_PROCESSES: str(hosts), ENV_PROCESS_ID: str(i), ENV_COORDINATOR_ADDRESS: coordinator})
        argv = [sys.executable, "-m", "tpuforge_workloads.train", "--config", str(config_path)]
        argv += ["--termination-log", str(work / f"termination-{i}")]
        log = open(work / f"host-{i}.log", "w")  # noqa: SIM115 (closed with the process)
        procs.append((subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    started = time.monotonic()
    codes = []
    for p, log in procs:
        codes.append(p.wait(1800))
        log.close()
    if codes != [0] * hosts:
        tail = (work / "host-0.log").read_text().splitlines()[-30:]
        raise SystemExit(f"{hosts}-process run failed {codes}:\n" + "\n".join(tail))
    summary = json.loads((Path(config.checkpoint.uri) / SUMMARY_FILE).read_text())
    attempt = summary["attempts"][-1]
    return {**attempt["timings"], "wall_s": time.monotonic() - started, "devices": len(attempt["devices"])}


def probe(process_id: int, hosts: int, coordinator: str) -> None:
    """(Run as a subprocess.) Milliseconds per blocking all-reduce of 8 KB over an fsdp=2 x tp=4 mesh, and
    per Agreement round; printed as JSON by process 0."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tpuforge_workloads.train import hosts as slice_hosts
    from tpuforge_workloads.train import rollcall

    h = slice_hosts.Hosts(process_id, hosts, coordinator if hosts > 1 else None)
    rollcall.initialize(h)
    mesh = jax.make_mesh((2, 4), ("fsdp", "tp"), devices=jax.devices())
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())  # type: ignore[no-untyped-call]
    x = jax.device_put(np.ones((8, 256), np.float32), rows)
    total = jax.jit(lambda a: jnp.sum(a, axis=0), out_shardings=replicated)
    total(x).block_until_ready()
    started = time.perf_counter()
    for _ in range(20):
        total(x).block_until_ready()
    allreduce_ms = (time.perf_counter() - started) / 20 * 1000
    agree = slice_hosts.Agreement(h, "probe")
    started = time.perf_counter()
    for _ in range(20):
        agree.any(False)
    agreement_ms = (time.perf_counter() - started) / 20 * 1000
    if process_id == 0:
        print(json.dumps({"allreduce_ms": allreduce_ms, "agreement_ms": agreement_ms}), flush=True)


def run_probe(hosts: int) -> dict[str, float]:
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--probe", str(i), str(hosts), coordinator],
            cwd=ROOT,
            env=environment(8 // hosts, Path(tempfile.gettempdir())),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i in range(hosts)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    line = next(x for x in outputs[0].splitlines() if x.startswith("{"))
    return json.loads(line)  # type: ignore[no-any-return]


def main() -> int:
    if sys.argv[1:2] == ["--probe"]:
        probe(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    # The cross-process collectives per step are fixed by the model (weights gathered per layer, gradients
    # reduced); a batch with more tokens per step shows how much of the step they stay once compute dominates,
    # as it does on a TPU slice with a 31B model.
    parser.add_argument("--seq-len", type=int, default=SEQ)
    parser.add_argument("--micro-batch", type=int, default=MICRO_BATCH, help="rows per fsdp replica")
    parser.add_argument("--accumulation", type=int, default=ACCUMULATION)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="train-multihost-"))
    model_dir, data, cache = work / "model", work / "demo-chat.jsonl", work / "jax-cache"
    tiny_model.write(str(model_dir))
    data.write_text(demo.jsonl(demo.records()))
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for r in range(args.rounds):
        # Alternate which goes first, so that a machine getting busier or quieter favours neither.
        for hosts in (1, 2) if r % 2 == 0 else (2, 1):
            config = train_config(
                model_dir,
                data,
                work / f"ckpt-{hosts}-{r}",
                args.steps,
                seq=args.seq_len,
                micro_batch=args.micro_batch,
                accumulation=args.accumulation,
                mesh=MeshSpec(fsdp=2, tp=4),
            )
            runs[hosts].append(run(config, work / f"run-{hosts}-{r}", hosts, cache))
            print(f"round {r}: {hosts} process(es): {json.dumps(runs[hosts][-1])}", flush=True)
    one = min(x["median_step_s"] for x in runs[1])
    two = min(x["median_step_s"] for x in runs[2])
    tokens_per_step = args.seq_len * args.micro_batch * 2 * args.accumulation  # token slots of a global step
    results = {
        "steps": args.steps,
        "global_batch_rows": args.micro_batch * 2 * args.accumulation,
        "seq_len": args.seq_len,
        "one_process_8_devices_step_s": one,
        "two_processes_4_devices_step_s": two,
        "multihost_step_time_ratio": two / one,
        "one_process_token_slots_per_s": tokens_per_step / one,
        "two_processes_token_slots_per_s": tokens_per_step / two,
        "runs": runs,
    }
    for hosts in (1, 2):
        for k, v in run_probe(hosts).items():
            results[f"{k}_{hosts}_process"] = v
    print(json.dumps(results, indent=2))
    ok = results["multihost_step_time_ratio"] <= 1.15
    print(f"{'PASS' if ok else 'MISS'}  step time ratio (2 processes / 1 process, same global batch) <= 1.15")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
