"""A FineTuneJob's curves in TensorBoard, from the sandbox: `tpuforge sandbox tensorboard JOB`.

TensorBoard cannot read the sandbox's GCS: its data server authenticates to the real GCS and ignores the
emulator's variables (it serves an empty page). So the job's event files (`<spec.checkpoint.uri>/tensorboard/`:
the trainer's run `train/`, the evaluation's `eval/`) are copied into the sandbox's state directory, and
TensorBoard serves that copy on 127.0.0.1; while it runs, files the job adds or grows are copied again, so the
curves of a running job move. On GKE the same files are in a real bucket that TensorBoard reads itself
(docs/ml-engineer.md).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from kubernetes.client.exceptions import ApiException

from tpuforge.api.constants import FINETUNEJOB_PLURAL, GROUP, TENSORBOARD_SUBDIR, VERSION
from tpuforge_sandbox import gcs_objects
from tpuforge_sandbox.kubeapi import Kube
from tpuforge_sandbox.sandbox import Sandbox, SandboxError

DEFAULT_PORT = 6006  # TensorBoard's own default
PULL_EVERY = 10.0  # seconds between copies while TensorBoard runs (it reloads its logdir every 5 s)


def event_files_uri(kube: Kube, namespace: str, job: str) -> str:
    """`<spec.checkpoint.uri>/tensorboard` of the FineTuneJob `namespace/job`."""
    try:
        obj = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, FINETUNEJOB_PLURAL, job)
    except ApiException as e:
        if e.status == 404:
            raise SandboxError(
                f"no FineTuneJob {job!r} in namespace {namespace!r}: `kubectl get finetunejobs -A` lists them "
                "(-n chooses the namespace)"
            ) from None
        raise
    return f"{obj['spec']['checkpoint']['uri'].rstrip('/')}/{TENSORBOARD_SUBDIR}"


def pull(gcs_url: str, uri: str, local: Path) -> list[str]:
    """Copy every object under `uri` that `local` lacks, or has at another size, to the same relative path
    there; returns what was copied. Each file appears whole (written beside it under a name TensorBoard does not
    read, then renamed), so TensorBoard never reads half of one."""
    prefix = gcs_objects.split_uri(uri)[1].rstrip("/") + "/"
    copied = []
    for obj in gcs_objects.list_objects(gcs_url, uri):
        rel = obj.name[len(prefix) :]
        dest = local / rel
        if dest.is_file() and dest.stat().st_size == obj.size:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = gcs_objects.read(gcs_url, f"gs://{gcs_objects.split_uri(uri)[0]}/{obj.name}")
        with tempfile.NamedTemporaryFile(dir=dest.parent, prefix=".pull-", delete=False) as f:
            f.write(data)
        os.replace(f.name, dest)
        copied.append(rel)
    return copied


def tensorboard_argv(logdir: Path, port: int) -> list[str]:
    """TensorBoard from this environment, on loopback only."""
    return [sys.executable, "-m", "tensorboard.main", f"--logdir={logdir}", "--host=127.0.0.1", f"--port={port}"]


def show(
    sb: Sandbox,
    job: str,
    namespace: str = "default",
    port: int = DEFAULT_PORT,
    serve: bool = True,
    every: float = PULL_EVERY,
    say: Callable[[str], None] = print,
) -> int:
    """Copy the job's event files into the sandbox's state directory, then (with `serve`) run TensorBoard over
    them until it exits or the user interrupts it, copying again every `every` seconds. Returns its exit code."""
    with sb.api_client() as api:
        uri = event_files_uri(Kube(api), namespace, job)
    logdir = sb.dir / "tensorboard" / namespace / job
    logdir.mkdir(parents=True, exist_ok=True)
    copied = pull(sb.gcs_url, uri, logdir)
    if copied:
        say(f"copied {len(copied)} event file(s) of {uri}/ to {logdir}")
    else:
        say(f"no new event files in {uri}/ (the trainer writes them from its first step)")
    argv = tensorboard_argv(logdir, port)
    if not serve:
        say(f"to see the curves: tensorboard --logdir {shlex.quote(str(logdir))} --host 127.0.0.1 --port {port}")
        return 0
    # TensorBoard's own files (its instance record) go under the state directory too, not the host's /tmp.
    tmp = sb.dir / "tensorboard" / ".tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # Its output goes to a log of its own: nothing but this command holds the caller's output, so the caller
    # sees it end when this command ends, whatever TensorBoard's processes are still doing then.
    log_path = sb.dir / "tensorboard" / "tensorboard.log"
    # A process group of its own: stopping it stops what TensorBoard starts too (its data server).
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, env={**os.environ, "TMPDIR": str(tmp)}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    # Ctrl-C stops it even where this command was started with SIGINT ignored (as a non-interactive shell starts
    # what it runs in the background), and a terminated command stops its TensorBoard too.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    say(
        f"TensorBoard on http://127.0.0.1:{port}/ (Ctrl-C stops it; its log: {log_path}); new event files are "
        f"copied every {every:.0f} s"
    )
    try:
        while True:
            try:
                code = proc.wait(timeout=every)
            except subprocess.TimeoutExpired:
                pass
            else:
                say(f"TensorBoard exited ({code}); the end of its log:\n{_tail(log_path)}")
                return code
            try:
                pull(sb.gcs_url, uri, logdir)
            except OSError as e:  # the sandbox went down: TensorBoard keeps what it has
                say(f"copying from {uri}/ failed: {e}")
    except KeyboardInterrupt:
        say("stopping TensorBoard")
        return 0
    finally:
        _stop(proc)


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """TensorBoard's whole process group: asked to end, then killed after 10 s with whatever is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt
