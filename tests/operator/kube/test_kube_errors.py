"""What the apiserver's refusals mean (tpuforge.kube.client): an admission webhook it could not call."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

from tpuforge.kube import client as kube_client


def test_a_write_refused_for_an_unreachable_webhook_names_it() -> None:
    said = (
        'Internal error occurred: failed calling webhook "mjobset.kb.io": failed to call webhook: Post '
        '"https://jobset-webhook-service.jobset-system.svc:443/mutate?timeout=10s": context deadline exceeded'
    )
    body = json.dumps({"kind": "Status", "status": "Failure", "message": said, "reason": "InternalError"})
    assert kube_client.unreachable_webhook(ApiException(status=500, reason="Internal", body=body)) == (
        "mjobset.kb.io",
        'failed to call webhook: Post "https://jobset-webhook-service.jobset-system.svc:443/mutate?timeout=10s": '
        "context deadline exceeded",
    )
    other = json.dumps({"kind": "Status", "message": "jobs.batch is forbidden", "reason": "Forbidden"})
    assert kube_client.unreachable_webhook(ApiException(status=403, reason="Forbidden", body=other)) is None
    assert kube_client.unreachable_webhook(ValueError("x")) is None
