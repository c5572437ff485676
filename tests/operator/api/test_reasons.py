"""Every reason, condition message and Event text is written once: in the reasons tables (api/finetune_reasons,
api/serving_reasons, the FineTuneJob's Events in controllers/finetune/events). The controllers pass names and
message functions of those tables, never a literal, wherever a reason or a message is asked for; and the tables
do not say one thing twice."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import tpuforge

PACKAGE = Path(tpuforge.__file__).parent
TABLES = {
    "FineTuneJob": ("api/finetune_reasons.py", "controllers/finetune/events.py"),
    "ServingDeployment": ("api/serving_reasons.py",),
}
TABLE_FILES = {path for paths in TABLES.values() for path in paths}
# The parameters and fields that take a reason or a text a user reads (`short`: an Event's one-line text).
TEXT_PARAMETERS = ("reason", "message", "short")
EVENT_TYPES = ("Normal", "Warning")


def parse(path: str) -> ast.Module:
    return ast.parse((PACKAGE / path).read_text(), path)


def sources(under: str) -> Iterator[str]:
    for path in sorted((PACKAGE / under).rglob("*.py")):
        yield str(path.relative_to(PACKAGE))


def text_of(node: ast.expr) -> str | None:
    """A string literal's text (an f-string's with `{}` for each value); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def is_written_text(node: ast.expr) -> bool:
    """A literal with words in it: an f-string that only joins texts (`f"{a}; {b}"`) says nothing of its own."""
    text = text_of(node)
    return text is not None and re.search(r"[A-Za-z]", text) is not None


def sinks() -> dict[str, set[tuple[int | None, str]]]:
    """Every function and dataclass of the operator that takes a reason or a message: its name -> (position,
    parameter). Calls are matched by name, so a method is found however it is reached."""
    out: dict[str, set[tuple[int | None, str]]] = defaultdict(set)
    for path in sources("."):
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                params = [a.arg for a in node.args.posonlyargs + node.args.args]
                params = params[1:] if params[:1] in (["self"], ["cls"]) else params
                out[node.name] |= {(i, p) for i, p in enumerate(params) if p in TEXT_PARAMETERS}
                out[node.name] |= {(None, a.arg) for a in node.args.kwonlyargs if a.arg in TEXT_PARAMETERS}
            elif isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                fields = [
                    s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                ]
                out[node.name] |= {(i, f) for i, f in enumerate(fields) if f in TEXT_PARAMETERS}
    return {name: found for name, found in out.items() if found}


def literal_texts(path: str, taking: dict[str, set[tuple[int | None, str]]]) -> Iterator[str]:
    """Where `path` passes a literal as a reason or a message, or posts an Event (type, reason, message) of
    literals."""
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            for position, param in taking.get(name, ()):
                if position is not None and position < len(node.args) and is_written_text(node.args[position]):
                    yield f"{path}:{node.lineno}: {name}(... {param}={ast.unparse(node.args[position])})"
            for keyword in node.keywords:
                if keyword.arg in TEXT_PARAMETERS and is_written_text(keyword.value):
                    yield f"{path}:{node.lineno}: {name}(... {keyword.arg}={ast.unparse(keyword.value)})"
        elif isinstance(node, ast.Tuple) and node.elts and text_of(node.elts[0]) in EVENT_TYPES:
            for element in node.elts[1:]:
                if is_written_text(element):
                    yield f"{path}:{node.lineno}: Event {ast.unparse(node)}"


def test_the_controllers_write_no_reason_or_message_of_their_own() -> None:
    taking = sinks()
    assert {"condition", "set_condition", "event", "post_event", "to_failed", "finish", "AttemptEnd"} <= set(taking)
    found = [
        where for path in sources("controllers") if path not in TABLE_FILES for where in literal_texts(path, taking)
    ]
    assert not found, "use a name or a message function of the reasons tables:\n" + "\n".join(found)


def constants(path: str) -> Iterator[tuple[str, str]]:
    """The table's names given a literal string: (name, text)."""
    for node in parse(path).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            text = text_of(node.value)
            if text is not None and not isinstance(node.value, ast.JoinedStr):
                yield node.targets[0].id, text


def test_a_kind_writes_each_reason_once() -> None:
    """A condition's reason that names its condition, or an Event named as the condition it reports, is that
    name, not the same word written again."""
    for kind, paths in TABLES.items():
        names: dict[str, list[str]] = defaultdict(list)
        for path in paths:
            for name, text in constants(path):
                names[text].append(f"{path}:{name}")
        twice = {text: where for text, where in names.items() if len(where) > 1}
        assert not twice, f"{kind}: written more than once: {twice}"


def texts(path: str) -> Iterator[tuple[str, str]]:
    """(text, owner): each literal of at least three words in a table, by the function or name it belongs to
    (docstrings left out)."""
    for top in parse(path).body:
        if isinstance(top, ast.FunctionDef):
            owner = top.name
            docstring = ast.get_docstring(top, clean=False)
        elif isinstance(top, ast.Assign):
            owner, docstring = ast.unparse(top.targets[0]), None
        else:
            continue
        parts = {id(v) for n in ast.walk(top) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(top):
            if not isinstance(node, ast.expr) or id(node) in parts:
                continue
            text = text_of(node)
            if text is not None and text != docstring and len(re.findall(r"[A-Za-z]+", text)) >= 3:
                yield text.strip(), f"{path}:{owner}"


def test_no_message_is_written_in_two_places() -> None:
    owners: dict[str, set[str]] = defaultdict(set)
    for path in sorted(TABLE_FILES):
        for text, owner in texts(path):
            owners[text].add(owner)
    twice = {text: sorted(where) for text, where in owners.items() if len(where) > 1}
    assert not twice, f"the same text in two places: {twice}"
