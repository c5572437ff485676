"""GKE's Spot shutdown notice (the VM's metadata `instance/preempted`), watched by the trainer: a local server
plays the metadata server, long polls included."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tpuforge_workloads.train import shutdown_notice


class Metadata:
    """A metadata server whose `instance/preempted` turns TRUE when the test says so."""

    def __init__(self) -> None:
        self.preempted = threading.Event()
        self.asked: list[tuple[str, str | None]] = []
        metadata = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                metadata.asked.append((self.path, self.headers.get("Metadata-Flavor")))
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403)
                    return
                if "last_etag=before" in self.path:
                    metadata.preempted.wait(10)
                body = b"TRUE" if metadata.preempted.is_set() else b"FALSE"
                self.send_response(200)
                self.send_header("ETag", "after" if metadata.preempted.is_set() else "before")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def metadata() -> Iterator[Metadata]:
    m = Metadata()
    yield m
    m.preempted.set()
    m.server.shutdown()


def test_the_notice_starts_the_stop_once_the_vm_is_being_preempted(metadata: Metadata) -> None:
    noticed = threading.Event()
    thread = shutdown_notice.watch(noticed.set, shutdown_notice.preempted_url(metadata.host))
    assert not noticed.wait(0.5)  # FALSE: the watch waits for a change
    metadata.preempted.set()
    assert noticed.wait(10)
    thread.join(5)
    assert not thread.is_alive()
    assert all(flavor == "Google" for _, flavor in metadata.asked)
    first, *polls = [path for path, _ in metadata.asked]
    assert first == shutdown_notice.PREEMPTED_PATH  # the value now, then a long poll for its change
    assert polls and all("wait_for_change=true" in p and "last_etag=before" in p for p in polls)


def test_off_gce_the_watch_ends_quietly() -> None:
    noticed = threading.Event()
    thread = shutdown_notice.watch(noticed.set, "http://127.0.0.1:9/computeMetadata/v1/instance/preempted")
    thread.join(10)
    assert not thread.is_alive() and not noticed.is_set()
