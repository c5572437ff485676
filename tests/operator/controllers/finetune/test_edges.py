"""The FineTuneJob's phase edges (controllers/finetune/edges.py): one table owns every phase change, and only
`edges.move` assigns the phase."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path
from typing import get_args

import pytest

from tpuforge.api import FineTunePhase
from tpuforge.api import finetune_reasons as c
from tpuforge.controllers.finetune import edges
from tpuforge.controllers.finetune import events as ev

CONTROLLERS = Path(edges.__file__).resolve().parents[1]
FINETUNE = CONTROLLERS / "finetune"
# The views of observed Kubernetes objects (a pod's phase is the kubelet's, not the FineTuneJob's).
VIEWS = {n.name for n in ast.parse((FINETUNE / "children.py").read_text()).body if isinstance(n, ast.ClassDef)}


def _mentions_finetune_phase(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name | ast.Attribute) and "FineTunePhase" in ast.unparse(n) for n in ast.walk(node))


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found: list[ast.expr] = []
        for t in node.targets:
            found.extend(t.elts if isinstance(t, ast.Tuple) else [t])
        return found
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def _phase_writes(path: Path, ours: bool | None = None) -> list[str]:
    """Every place in `path` that sets a FineTuneJob's phase, with the function it is in. In finetune/, any
    `phase` written; elsewhere (serving has phases of its own) one whose value is a FineTunePhase."""
    tree = ast.parse(path.read_text(), str(path))
    ours = path.parent == FINETUNE if ours is None else ours
    found: list[str] = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            func = node.name
        value = node.value if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) else None
        counts = ours or (value is not None and _mentions_finetune_phase(value))
        for t in _targets(node):
            if isinstance(t, ast.Attribute) and t.attr == "phase" and counts:
                found.append(f"{path.name}:{node.lineno} {func}")
            if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == "phase":
                found.append(f"{path.name}:{node.lineno} {func}")
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                view = ast.unparse(node.func).split(".")[-1] in VIEWS
                if kw.arg == "phase" and ((ours and not view) or _mentions_finetune_phase(kw.value)):
                    found.append(f"{path.name}:{node.lineno} {func}")
            if ast.unparse(node.func) == "setattr" and len(node.args) > 1:
                arg = node.args[1]
                if isinstance(arg, ast.Constant) and arg.value == "phase":
                    found.append(f"{path.name}:{node.lineno} {func}")
        if isinstance(node, ast.Dict) and ours:
            for k in node.keys:
                if isinstance(k, ast.Constant) and k.value == "phase":
                    found.append(f"{path.name}:{node.lineno} {func}")
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, "")
    return found


def test_only_move_assigns_the_phase() -> None:
    writes = [w for p in sorted(CONTROLLERS.rglob("*.py")) for w in _phase_writes(p)]
    assert len(writes) == 1 and writes[0].startswith("edges.py:") and writes[0].endswith(" move"), writes


def test_the_walk_finds_a_phase_written_elsewhere(tmp_path: Path) -> None:
    """The check above sees the forms a phase can be written in."""
    sample = tmp_path / "stage.py"
    sample.write_text(
        "def a(st):\n    st.phase = 'Failed'\n"
        "def b(st):\n    st.phase, st.message = 'Failed', ''\n"
        "def c(st):\n    return st.model_copy(update={'phase': 'Failed'})\n"
        "def d():\n    return Status(phase='Failed')\n"
        "def e(st):\n    setattr(st, 'phase', 'Failed')\n"
    )
    assert [w.split()[1] for w in _phase_writes(sample, ours=True)] == ["a", "b", "c", "d", "e"]
    elsewhere = tmp_path / "serving.py"
    elsewhere.write_text("def f(st):\n    st.phase = 'Ready'\ndef g(st):\n    st.phase = FineTunePhase.FAILED\n")
    assert [w.split()[1] for w in _phase_writes(elsewhere, ours=False)] == ["g"]


def test_no_edge_is_written_twice_from_one_phase() -> None:
    keys = Counter((phase, edge) for sources, edge, _ in edges._EDGES for phase in sources)
    assert [k for k, n in keys.items() if n > 1] == []
    assert len(edges.TABLE) == sum(keys.values())
    first = edges._EDGES[0]
    with pytest.raises(ValueError, match="written twice"):
        edges._table([first, first])


def test_each_edge_is_one_transition_written_once() -> None:
    named = [edge for _, edge, _ in edges._EDGES]
    assert sorted(named) == sorted(set(named)), "an edge listed in two rows"
    assert set(named) == set(get_args(edges.Edge))
    for (_, edge), transition in edges.TABLE.items():
        assert transition is edges.BY_EDGE[edge]


def test_every_phase_and_edge_is_reachable_from_a_new_job() -> None:
    reached: set[edges.Phase] = {None}
    frontier: list[edges.Phase] = [None]
    while frontier:
        phase = frontier.pop()
        for (source, _), transition in edges.TABLE.items():
            if source == phase and transition.phase not in reached:
                reached.add(transition.phase)
                frontier.append(transition.phase)
    assert reached == {None, *FineTunePhase}
    assert {source for source, _ in edges.TABLE} <= reached


def test_every_edge_is_taken_somewhere() -> None:
    """Each edge's name appears in the controller outside the table (a step that takes it)."""
    used: set[str] = set()
    for path in FINETUNE.glob("*.py"):
        if path.name == "edges.py":
            continue
        used |= {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)}
    used |= set(edges.ADMITTED_TO.values())
    assert set(get_args(edges.Edge)) - used == set()
    stages = {FineTunePhase.PREFLIGHT, FineTunePhase.PENDING, FineTunePhase.MERGING, FineTunePhase.EVALUATING}
    assert set(edges.ADMITTED_TO) == stages


def test_ended_phases_are_reached_only_through_their_conditions() -> None:
    for edge, t in edges.BY_EDGE.items():
        if t.phase == FineTunePhase.FAILED:
            assert t.condition is not None and (t.condition.type, t.condition.status) == (c.FAILED, "True"), edge
            assert t.event == edges.Notice("Warning", ev.FAILED), edge
        if t.phase == FineTunePhase.SUCCEEDED:
            assert t.condition == edges.Condition(c.SUCCEEDED, "True", c.SUCCEEDED_REASON), edge
            assert t.event == edges.Notice("Normal", ev.SUCCEEDED), edge
        if t.event is not None:
            assert t.event.reason in ev.REASONS, edge
    assert edges.BY_EDGE["evaluated"].phase == FineTunePhase.SUCCEEDED
    assert edges.TABLE[FineTunePhase.EVALUATING, "evaluated"].phase == FineTunePhase.SUCCEEDED
    assert edges.BY_EDGE["deadline-exceeded"].condition == edges.Condition(c.FAILED, "True", c.DEADLINE_EXCEEDED)


def test_an_unlisted_edge_is_taken_as_its_transition_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the operator, an edge from a phase the table does not list is logged, never a wedged job (in these
    tests, conftest makes it an error)."""
    with pytest.raises(AssertionError, match="not in the table"):
        edges.lookup(FineTunePhase.SUCCEEDED, "training")
    seen: list[tuple[edges.Phase, str]] = []
    monkeypatch.setattr(edges, "unlisted", lambda phase, edge: seen.append((phase, edge)))
    assert edges.lookup(FineTunePhase.SUCCEEDED, "training") is edges.BY_EDGE["training"]
    assert seen == [(FineTunePhase.SUCCEEDED, "training")]


def test_the_modules_table_of_edges_names_every_edge() -> None:
    doc = edges.__doc__ or ""
    assert [e for e in get_args(edges.Edge) if e not in doc and not e.startswith("admitted-to-")] == []
    assert "admitted-to-<stage>" in doc
