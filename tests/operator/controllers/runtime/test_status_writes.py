"""A controller's own status writes: their echo asks for nothing, a reconcile before it reads the write, and
any other version of the object ends the record."""

from __future__ import annotations

from tpuforge.controllers.runtime.status_writes import StatusWrites

KEY = ("ns", "job")


def _written(version: str, phase: str) -> dict[str, object]:
    return {"metadata": {"resourceVersion": version}, "status": {"phase": phase}}


def test_the_echo_of_a_write_is_known_and_the_write_read_until_it_arrives() -> None:
    writes: StatusWrites[tuple[str, str]] = StatusWrites()
    assert writes.current(KEY, "1") is None and not writes.is_echo(KEY, "1")
    writes.record(KEY, "1", _written("2", "Running"))
    # The informer still holds version 1: the reconcile reads version 2 and its status instead.
    written = writes.current(KEY, "1")
    assert written is not None and (written.resource_version, written.status) == ("2", {"phase": "Running"})
    assert writes.is_echo(KEY, "2") and not writes.is_echo(KEY, "3")
    # The informer has moved on (the echo, or a later write by someone else): the record is dropped.
    assert writes.current(KEY, "2") is None
    assert writes.current(KEY, "1") is None and not writes.is_echo(KEY, "2")


def test_a_deleted_object_is_forgotten() -> None:
    writes: StatusWrites[tuple[str, str]] = StatusWrites()
    writes.record(KEY, "5", _written("6", "Failed"))
    writes.record(("ns", "other"), "1", _written("2", "Pending"))
    writes.forget(KEY)
    assert writes.current(KEY, "5") is None and not writes.is_echo(KEY, "6")
    assert writes.is_echo(("ns", "other"), "2")
