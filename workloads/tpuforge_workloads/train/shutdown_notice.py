"""GKE's own notice of a Spot reclaim: the VM's metadata value `instance/preempted` turns TRUE when Compute
Engine starts preempting it, before the node shuts down and the kubelet sends SIGTERM. The kubelet's graceful
node shutdown gives the pod only ~15 s of that (whatever its terminationGracePeriodSeconds), so the trainer
starts its checkpoint on the notice instead of waiting for the signal; the pod's own grace stays long (300 s)
for everything else that stops it (drains, Kueue preemption, suspension), which do honour it.

The watch reads the value, then long-polls the metadata server for a change (`?wait_for_change=true` with the
last ETag) in a daemon thread and, on TRUE, calls
`on_notice` once. Off GCE (the sandbox, a laptop), or behind a metadata server that does not serve the value
(GKE's Workload Identity server serves a subset of the VM's metadata), the first answer fails and the watch ends
quietly: the trainer then stops on SIGTERM alone.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable

log = logging.getLogger(__name__)

# The host google-auth also reads; the sandbox's tests point it at a local server.
METADATA_HOST_ENV = "GCE_METADATA_HOST"
DEFAULT_METADATA_HOST = "metadata.google.internal"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
# A long poll returns on a change or after this long (the server's own limit is longer); then it asks again.
POLL_SECONDS = 60
FIRST_TRY_SECONDS = 2.0  # off GCE, give up this quickly


def preempted_url(host: str | None = None) -> str:
    return f"http://{host or os.environ.get(METADATA_HOST_ENV) or DEFAULT_METADATA_HOST}{PREEMPTED_PATH}"


def _ask(url: str, etag: str | None, timeout: float) -> tuple[bool, str | None]:
    """The value now (no `etag` yet), else once it differs from the value of `etag` (or the poll times out)."""
    query = f"?wait_for_change=true&timeout_sec={POLL_SECONDS}&last_etag={etag}" if etag else ""
    request = urllib.request.Request(url + query, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.read().decode().strip().upper() == "TRUE", answer.headers.get("ETag")


def watch(on_notice: Callable[[], None], url: str | None = None) -> threading.Thread:
    """Start the watch; `on_notice` runs (in the watch's thread) when the VM is being preempted."""

    def run() -> None:
        where, etag, first = url or preempted_url(), None, True
        while True:
            try:
                preempted, etag = _ask(where, etag, FIRST_TRY_SECONDS if first else POLL_SECONDS + 10)
            except (OSError, urllib.error.URLError) as exc:
                if first:
                    log.info("no GCE metadata server (%s): not watching for a Spot shutdown notice", exc)
                    return
                log.warning("Spot shutdown notice: %s; asking again", exc)
                continue
            first = False
            if preempted:
                log.warning("GKE's Spot shutdown notice: this VM is being preempted; checkpointing now")
                on_notice()
                return

    thread = threading.Thread(target=run, name="spot-notice", daemon=True)
    thread.start()
    return thread
