"""Events: the core/v1 Event the operator writes about an object (`event_object`), and `post_event`, which
writes one and never fails the caller's work (kube_async.AsyncApi.post_event is the same on the event loop).
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from tpuforge.api.constants import EVENT_COMPONENT
from tpuforge.kube.client import Obj
from tpuforge.kube.objects import create

log = logging.getLogger(__name__)


def event_time() -> str:
    """Now, to the second, as an Event's timestamps give it."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


_INSTANCE = socket.gethostname()


def event_object(involved: Mapping[str, Any], type_: str, reason: str, message: str, now: str) -> Obj:
    """A core/v1 Event about `involved` (any object with apiVersion, kind and metadata)."""
    meta = involved.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace") or "default"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": name,
            "namespace": namespace,
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": EVENT_COMPONENT},
        "reportingComponent": EVENT_COMPONENT,
        "reportingInstance": _INSTANCE,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post_event(api: k8s.ApiClient, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Best effort: an Event that cannot be written is logged, never fails the caller's work."""
    try:
        create(api, event_object(involved, type_, reason, message, event_time()))
    except Exception as exc:  # events are advisory; the status carries the same facts
        log.warning("could not post event %s on %s: %s", reason, (involved.get("metadata") or {}).get("name"), exc)


__all__ = ["event_object", "post_event"]
