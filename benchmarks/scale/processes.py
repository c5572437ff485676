"""The processes the operator-at-scale benchmark starts beside the sandbox: the operator itself (its CPU
seconds, threads and peak RSS read from /proc; restarted once with --restart-midway), py-spy sampling it, and the
CPU-spinning processes of --load."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
from benchmarks.scale.observe import metric

from tpuforge_sandbox import Sandbox, wait_for
from tpuforge_sandbox.operator_command import operator_argv, operator_env
from tpuforge_sandbox.procs import free_port

REPO = Path(__file__).resolve().parents[2]


class OperatorProcess:
    """The operator as a process of its own against the sandbox, watching `namespaces`. `restart` stops it
    (SIGTERM, as a rollout does) and starts another in its place: CPU seconds, peak RSS and counters then
    cover both processes."""

    COUNTERS = ("tpuforge_reconcile_total", "tpuforge_reconcile_conflicts_total")

    def __init__(self, sandbox: Sandbox, log: Path, namespaces: list[str], cprofile: Path | None = None):
        self._args = (sandbox, log, namespaces, cprofile)
        self.restarts = 0
        self._past = {"cpu": 0.0, "sys": 0.0, "rss": 0.0, **dict.fromkeys(self.COUNTERS, 0.0)}
        self._start()

    def _start(self) -> None:
        sandbox, log, namespaces, cprofile = self._args
        self.port = free_port()
        profile = ["-m", "cProfile", "-o", str(cprofile)] if cprofile else []
        argv = operator_argv(sandbox.kubeconfig, self.port, namespaces, python_options=profile)
        env = {**operator_env(), "PYTHONPATH": str(REPO / "operator")}
        out = log if not self.restarts else log.with_name(f"{log.stem}.{self.restarts}{log.suffix}")
        self.proc = subprocess.Popen(argv, stdout=out.open("wb"), stderr=subprocess.STDOUT, env=env)
        self.ps = psutil.Process(self.proc.pid)
        wait_for(self._ready, 60, "the operator's /metrics")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2):
                return True
        except OSError:
            return False

    def restart(self) -> float:
        """Stop this operator and start another; the seconds from the stop until the new one serves /metrics
        (it has listed every object by then)."""
        for name in self.COUNTERS:
            self._past[name] += metric(self.port, name)
        self._past["rss"] = self.peak_rss_mb()
        cpu, sys_cpu = self.cpu_seconds(), self.system_cpu_seconds()
        started = time.monotonic()
        self.stop()
        self._past["cpu"], self._past["sys"] = cpu, sys_cpu
        self.restarts += 1
        self._start()
        return time.monotonic() - started

    def metric(self, name: str) -> float:
        """A counter's value, summed over this process and those before it (a restart starts it at 0)."""
        return self._past.get(name, 0.0) + metric(self.port, name)

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return max(self._past["rss"], int(line.split()[1]) / 1024)
        return max(self._past["rss"], float(self.ps.memory_info().rss / 2**20))

    def cpu_seconds(self) -> float:
        t = self.ps.cpu_times()
        return self._past["cpu"] + float(t.user + t.system)

    def thread_cpu_seconds(self) -> dict[int, float]:
        """CPU seconds of each of the current process's threads, by thread id (the event loop's is the pid)."""
        out: dict[int, float] = {}
        tick = os.sysconf("SC_CLK_TCK")
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def system_cpu_seconds(self) -> float:
        return self._past["sys"] + float(self.ps.cpu_times().system)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            print("  (the operator did not stop within 30 s of SIGTERM; killed)", flush=True)
            self.proc.kill()
            self.proc.wait(10)


class Profiler:
    """py-spy sampling the operator's running threads (idle ones, waiting on a socket or a lock, are left
    out), without pausing it, until `stop`."""

    def __init__(self, pid: int, out: Path):
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        argv = [py_spy, "record", "--pid", str(pid), "--nonblocking", "--rate", "100", "--output", str(out)]
        if out.suffix != ".svg":
            argv += ["--format", "raw"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(1.0)  # attached before the burst starts

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)


class CpuLoad:
    """K processes spinning on the CPU, as other work on a shared machine would."""

    def __init__(self, processes: int) -> None:
        spin = "while True:\n    pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(processes)]

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
