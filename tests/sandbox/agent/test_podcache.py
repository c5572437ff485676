"""The node agent's pod view (agent/podcache.py), without a cluster: one LIST, then watch events; a watch that
ends resumes from the last resourceVersion, one too old (410) or failing starts again from a LIST. (Against a
real apiserver the agent's own tests: tests/sandbox/agent/test_node_agent.py.)"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from tpuforge_sandbox.agent.podcache import PodCache, with_bindings


def pod(uid: str, rv: str, node: str = "") -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": uid, "resourceVersion": rv}, "spec": {"nodeName": node}}


class FakeKube:
    """A LIST answered from `listed`; each watch plays the next script (a list of events, or an exception)."""

    def __init__(self, listed: list[dict[str, Any]], rv: str, watches: list[Any], stopping: threading.Event):
        self.listed, self.rv, self.watches, self.stopping = listed, rv, watches, stopping
        self.calls: list[tuple[str, str]] = []

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("list", self.rv))
        return [dict(p) for p in self.listed], self.rv

    def watch_pods(self, resource_version: str, timeout: int) -> Iterator[bytes]:
        self.calls.append(("watch", resource_version))
        if not self.watches:
            self.stopping.set()
            return iter(())
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        return iter([json.dumps(e).encode() for e in script])


def test_the_view_follows_list_then_watch_resumes_and_relists_when_too_old_or_failed() -> None:
    stopping = threading.Event()
    changes: list[int] = []
    kube = FakeKube([pod("a", "5"), pod("b", "5")], "5", [], stopping)
    kube.watches = [
        [  # ends on its own after two events: resumed from rv 7
            {"type": "MODIFIED", "object": pod("a", "6", node="tpu-0")},
            {"type": "DELETED", "object": pod("b", "7")},
        ],
        [{"type": "ADDED", "object": pod("c", "8")}, {"type": "ERROR", "object": {"code": 410}}],  # too old
        ConnectionError("reset"),  # fails: a LIST again
    ]
    cache = PodCache(kube, lambda: changes.append(1), stopping)
    cache.sync()
    assert sorted(p["metadata"]["uid"] for p in cache.list()) == ["a", "b"]
    kube.listed, kube.rv = [pod("a", "6", node="tpu-0"), pod("c", "8"), pod("d", "9")], "9"
    cache.watch()
    assert kube.calls == [
        ("list", "5"),
        ("watch", "5"),
        ("watch", "7"),  # resumed where the first ended
        ("list", "9"),  # after the 410
        ("watch", "9"),
        ("list", "9"),  # after the failure
        ("watch", "9"),  # nothing left to play: the test stops it
    ]
    view = {p["metadata"]["uid"]: p for p in cache.list()}
    assert sorted(view) == ["a", "c", "d"] and view["a"]["spec"]["nodeName"] == "tpu-0"
    # Each LIST and each applied event told the agent to look (the ERROR did not).
    assert len(changes) == 3 + 3


def test_a_binding_the_view_does_not_show_yet_counts_until_it_does() -> None:
    bound = {"a": "tpu-0", "b": "tpu-1", "gone": "tpu-2"}
    pods = [pod("a", "6"), pod("b", "7", node="tpu-1"), pod("c", "8")]
    seen = with_bindings(pods, bound)
    assert [p["spec"]["nodeName"] for p in seen] == ["tpu-0", "tpu-1", ""]
    assert pods[0]["spec"]["nodeName"] == ""  # the view itself is not changed
    assert bound == {"a": "tpu-0"}  # b's binding is in the view, "gone" is gone
    assert with_bindings(pods, {}) is pods
