"""Every phase edge these tests take must be in the table (controllers/finetune/edges.py): the operator only logs
one that is not, a test fails on it."""

from __future__ import annotations

import pytest

from tpuforge.controllers.finetune import edges


def _fail(phase: edges.Phase, edge: edges.Edge) -> None:
    raise AssertionError(f"phase edge {edge!r} from {phase} is not in the table (controllers/finetune/edges.py)")


@pytest.fixture(autouse=True)
def _every_edge_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edges, "unlisted", _fail)
