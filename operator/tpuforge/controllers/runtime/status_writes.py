"""A controller's memory of its own status writes, per object, until the watch brings them back.

A reconcile patches an object's status on the resourceVersion it computed from. Until the watch delivers
the new version, the informer still holds the old one: a reconcile then would compute from a stale status and
write again, only to meet a 409. So the controller records each write (the resourceVersion it was based on,
the one it produced, the status it wrote) and:

- `is_echo`: the watch event carrying the written version asks for no reconcile (the one that wrote it
  already saw that state);
- `current`: a reconcile reads the written status in place of the stale one, while the informer still holds
  the version the write was based on; once the informer holds any other version, the record is dropped (that
  version already includes the write, or someone else's after it);
- `forget`: a deleted object's record goes with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

K = TypeVar("K")


@dataclass(frozen=True)
class Written:
    based_on: str  # the resourceVersion the write was computed from
    resource_version: str  # the one the apiserver gave it
    status: dict[str, Any]  # the status as written


class StatusWrites(Generic[K]):
    def __init__(self) -> None:
        self._written: dict[K, Written] = {}

    def record(self, key: K, based_on: str, new: dict[str, Any]) -> None:
        """The write `new` (the object the status patch returned) made on version `based_on`."""
        meta = new.get("metadata") or {}
        self._written[key] = Written(based_on, meta.get("resourceVersion", ""), new.get("status") or {})

    def is_echo(self, key: K, resource_version: str) -> bool:
        written = self._written.get(key)
        return written is not None and written.resource_version == resource_version

    def current(self, key: K, resource_version: str) -> Written | None:
        """Our write, when the informer's version of the object (`resource_version`) is the one it replaced."""
        written = self._written.get(key)
        if written is not None and written.based_on != resource_version:
            self._written.pop(key, None)
            return None
        return written

    def forget(self, key: K) -> None:
        self._written.pop(key, None)
