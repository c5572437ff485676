"""libtpu's error when the container's user may not open a TPU device file, turned into the fix.

tpuforge runs TPU containers as uid 65532 without capabilities. GKE's TPU device plugin hands the pod the
chips' device files (/dev/vfio/N on v5p and v6e, /dev/accelN on older TPUs); where a node keeps them owned by
root with no access for others, libtpu fails to initialise with `TPU initialization failed:
open(/dev/vfio/0): Permission denied` (or `Operation not permitted`), which says nothing about what to change.
"""

from __future__ import annotations

import os
import re

_DENIED = re.compile(r"open\((?P<path>/dev/(?:vfio|accel)[^)]*)\): (?P<why>Permission denied|Operation not permitted)")
FIX = (
    "run the TPU containers as root: set spec.tpu.runAsRoot: true on this object, or the Helm value "
    "tpu.runAsRoot: true (the default) for every job (they stay unprivileged, without capabilities; "
    "docs/platform-team.md, TPU containers and root)"
)


def device_denied(error: BaseException | str) -> str | None:
    """What to tell the user when `error` is libtpu failing to open a TPU device file for lack of permission;
    None for any other error."""
    m = _DENIED.search(str(error))
    if m is None:
        return None
    return (
        f"libtpu cannot open the TPU device {m['path']} as uid {os.getuid()} ({m['why']}): this node's TPU "
        f"device files are not open to a non-root user; {FIX}"
    )
