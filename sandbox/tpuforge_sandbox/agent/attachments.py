"""ReadWriteOnce claims and the nodes they are attached to, kept as Kubernetes' attach/detach controller keeps
them: a claim attaches to the node of the first running pod that mounts it; other pods on that node may mount
it too, and a pod on another node waits (GKE's `Multi-Attach error`) until no pod on the first node uses it.
ReadWriteMany and ReadOnlyMany claims attach anywhere.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

ONE_NODE_MODES = ("ReadWriteOnce",)


@dataclass
class Attachments:
    # (namespace, claim) -> pod uid -> (node, pod name): the pods that hold the claim's attachment.
    _users: dict[tuple[str, str], dict[str, tuple[str, str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attach(self, ns: str, claims: dict[str, list[str]], uid: str, pod: str, node: str) -> str | None:
        """Attach every claim (name -> access modes) the pod mounts on `node`, or none of them: then the
        kubelet-style message of the first that is attached to another node."""
        with self._lock:
            for claim, modes in sorted(claims.items()):
                if not any(m in ONE_NODE_MODES for m in modes) or any(m not in ONE_NODE_MODES for m in modes):
                    continue
                holders = sorted(
                    name for u, (n, name) in self._users.get((ns, claim), {}).items() if n != node and u != uid
                )
                if holders:
                    return f'Multi-Attach error for volume "{claim}" Volume is already used by pod(s) ' + ", ".join(
                        holders
                    )
            for claim in claims:
                self._users.setdefault((ns, claim), {})[uid] = (node, pod)
            return None

    def release(self, uid: str) -> None:
        """The pod has ended (or is gone): its claims detach from its node once no other pod there uses them."""
        with self._lock:
            for key in list(self._users):
                self._users[key].pop(uid, None)
                if not self._users[key]:
                    del self._users[key]
