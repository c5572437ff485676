"""The termination message: how a pod's program tells the operator why it stopped (or, for the evaluation,
what it found). Kubernetes keeps at most 4096 bytes of it; outside a pod the path is not writable and the
log has the message."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from tpuforge_workloads.runtime import tpu_access

log = logging.getLogger(__name__)
LIMIT = 4096  # bytes Kubernetes keeps of a termination message


def write(path: str, message: str, one_line: bool = False) -> None:
    """`message`, cut to what Kubernetes keeps; `one_line` folds it for `kubectl describe`."""
    if one_line:
        message = " ".join(message.split())
    data = message.encode()[: LIMIT - 1].decode(errors="ignore")
    try:
        Path(path).write_text(data + ("\n" if one_line else ""), encoding="utf-8")
    except OSError as e:
        log.warning("termination log %s not written: %s", path, e.strerror or e)


def fail(path: str, error: BaseException, code: int, unexpected: str | None = None) -> int:
    """Stop a program: log `error` (with its traceback when it is `unexpected`, which says what failed), say
    it in the termination message, and return the exit code `code`. A TPU device the user may not open is
    said with its fix, first."""
    denied = tpu_access.device_denied(error)
    if denied is not None:
        log.error("%s", denied)
        write(path, denied)
    elif unexpected is None:
        log.error("%s", error)
        write(path, str(error))
    else:
        log.exception("%s", unexpected)
        write(path, f"{type(error).__name__}: {error}")
    return code


def exit_now(code: int) -> None:
    """End the process with `code` once its logs and output are flushed, skipping the interpreter's teardown.
    For programs whose native libraries leave threads behind: a vLLM engine's can abort that teardown
    ("terminate called without an active exception", SIGABRT) after the work is done and reported, turning
    a success into a failed pod; JAX's thread pools and clients make it cost the merge a third of a second.
    Every file must be closed (and every output committed) before."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
