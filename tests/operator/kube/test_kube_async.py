"""kube_async.AsyncApi, the FineTuneJob controller's writes on the event loop, against the sandbox's
apiserver: the same outcomes as the synchronous calls, conditional status writes, and credentials read once,
and again after a 401."""

from __future__ import annotations

import asyncio
import copy
import uuid
from typing import Any

import pytest
from kubernetes import client

from tpuforge.api.constants import API_VERSION, FINETUNEJOB_KIND
from tpuforge.kube import async_client as kube_async
from tpuforge.kube import client as kube_client
from tpuforge.kube import objects as kube_objects
from tpuforge_sandbox import Sandbox

pytestmark = pytest.mark.cluster


def config_map(ns: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": {"k": "v"}}


def finetunejob(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": FINETUNEJOB_KIND,
        "metadata": {"name": f"j-{uuid.uuid4().hex[:8]}", "namespace": ns},
        "spec": {
            "model": {"name": "gemma4-31b", "uri": "gs://m/gemma4-31b"},
            "dataset": {"uri": "gs://d/train.jsonl"},
            "training": {"maxSeqLen": 1024},
            "tpu": {"slice": "v5p-8"},
            "checkpoint": {"uri": "gs://c/ckpt"},
            "output": {"uri": "gs://o/merged"},
            "serviceAccountName": "default",
        },
    }


def test_writes_match_the_synchronous_calls(sandbox: Sandbox, api_client: client.ApiClient, namespace: str) -> None:
    kube_client.configure(sandbox.kubeconfig)
    ns = namespace
    sync = kube_client.api_client()
    ftj = kube_objects.create(sync, finetunejob(ns))

    async def scenario() -> None:
        api = kube_async.AsyncApi(8)
        try:
            assert await api.create_if_absent(config_map(ns, "a")) is True
            assert await api.create_if_absent(config_map(ns, "a")) is False  # exists: not an error
            assert kube_objects.get(sync, "v1", "ConfigMap", ns, "a") is not None

            version = ftj["metadata"]["resourceVersion"]
            new = await api.patch_status(ftj, {"phase": "Pending"}, version)
            assert new["status"]["phase"] == "Pending"
            with pytest.raises(kube_client.ApiException) as stale:  # written on a version that is no longer current
                await api.patch_status(ftj, {"phase": "Training"}, version)
            assert kube_client.is_conflict(stale.value)
            got = kube_objects.get(sync, API_VERSION, FINETUNEJOB_KIND, ns, ftj["metadata"]["name"])
            assert got is not None and got["status"]["phase"] == "Pending"

            await api.post_event(ftj, "Normal", "Testing", "an event from the event loop")
            reasons = [e["reason"] for e in kube_objects.list_objects(sync, "v1", "Event", ns)]
            assert "Testing" in reasons

            assert await api.delete("v1", "ConfigMap", ns, "a") is True
            assert await api.delete("v1", "ConfigMap", ns, "a") is False  # already gone
        finally:
            await api.close()

    asyncio.run(scenario())


def test_credentials_are_read_once_and_again_after_a_401(sandbox: Sandbox, namespace: str) -> None:
    good = kube_client.configure(sandbox.kubeconfig)
    cfg = copy.deepcopy(good)
    real = dict(cfg.api_key)
    reads: list[int] = []

    def refresh(c: client.Configuration) -> None:
        # The first read gives a token the apiserver refuses; later ones the real one.
        reads.append(1)
        c.api_key = {k: ("Bearer not-a-token" if len(reads) == 1 else v) for k, v in real.items()}

    cfg.refresh_api_key_hook = refresh

    async def scenario() -> None:
        api = kube_async.AsyncApi(2, cfg)
        try:
            assert await api.create_if_absent(config_map(namespace, "b")) is True  # 401, read again, created
            assert len(reads) == 2
            for i in range(5):
                await api.create_if_absent(config_map(namespace, f"c{i}"))
            assert len(reads) == 2  # not one per request
        finally:
            await api.close()

    asyncio.run(scenario())
