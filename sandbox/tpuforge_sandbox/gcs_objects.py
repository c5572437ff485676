"""The few object operations the demo needs on the sandbox's fake-gcs-server, over the GCS JSON API.

The operator side never imports the workloads' storage module (it would pull the GCS client libraries of the
pods into the control plane's tools); these calls are plain HTTP to the loopback emulator, like
`gcs.create_bucket`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass


@dataclass(frozen=True)
class GcsObject:
    name: str  # the key, without the bucket
    size: int


def split_uri(uri: str) -> tuple[str, str]:
    """gs://bucket/key -> (bucket, key)."""
    if not uri.startswith("gs://"):
        raise ValueError(f"{uri}: not a gs:// URI")
    bucket, _, key = uri[len("gs://") :].partition("/")
    if not bucket:
        raise ValueError(f"{uri}: no bucket")
    return bucket, key


def _object_url(url: str, bucket: str, name: str) -> str:
    return f"{url}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"


def list_objects(url: str, uri: str) -> list[GcsObject]:
    """Every object under the directory `uri`, with its size, sorted by name."""
    bucket, key = split_uri(uri)
    prefix = key.rstrip("/") + "/" if key else ""
    out: list[GcsObject] = []
    token = ""
    while True:
        query = urllib.parse.urlencode({"prefix": prefix, **({"pageToken": token} if token else {})})
        with urllib.request.urlopen(f"{url}/storage/v1/b/{bucket}/o?{query}", timeout=10) as r:
            page = json.load(r)
        out += [GcsObject(item["name"], int(item.get("size", 0))) for item in page.get("items", [])]
        token = page.get("nextPageToken", "")
        if not token:
            return sorted(out, key=lambda o: o.name)


def exists(url: str, uri: str) -> bool:
    bucket, key = split_uri(uri)
    try:
        urllib.request.urlopen(_object_url(url, bucket, key), timeout=10).close()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise
    return True


def read(url: str, uri: str) -> bytes:
    bucket, key = split_uri(uri)
    with urllib.request.urlopen(_object_url(url, bucket, key) + "?alt=media", timeout=30) as r:
        return bytes(r.read())


def upload(url: str, uri: str, data: bytes) -> None:
    bucket, key = split_uri(uri)
    query = urllib.parse.urlencode({"uploadType": "media", "name": key})
    req = urllib.request.Request(
        f"{url}/upload/storage/v1/b/{bucket}/o?{query}",
        data=data,
        headers={"Content-Type": "application/octet-stream"},
        method="POST",
    )
    urllib.request.urlopen(req, timeout=60).close()


def delete_dir(url: str, uri: str) -> int:
    """Delete every object under the directory `uri`; returns how many there were."""
    bucket, _ = split_uri(uri)
    objects = list_objects(url, uri)
    for o in objects:
        req = urllib.request.Request(_object_url(url, bucket, o.name), method="DELETE")
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
    return len(objects)
