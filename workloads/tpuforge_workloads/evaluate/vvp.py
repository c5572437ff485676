"""What a design does, read from iverilog's compiled output (the vvp file `iverilog -o` writes), not from its text.

The vvp file is the elaborated design: every module instance as a scope (its instance name, its module's name
and its parent), every port with its direction, every system task or function call by its resolved name
(`%vpi_call ... "$display"`, `%vpi_func ... "$fopen"`, `.sfunc ... "$random"`, and `$time`-like arguments),
every `force`/`release` as an opcode, every bidirectional switch as a `.tran` island. Whatever spelling,
macro, escaped identifier or generate block wrote them, this is what they became. Stdlib only (the checker
image).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

# S_0x... .scope module, "inst" "Type" <file> <line>[, <def file> <def line> <0>, S_parent];
_SCOPE = re.compile(
    r'^(?P<id>S_0x[0-9a-f]+) \.scope (?P<kind>[a-z]+), "(?P<name>(?:[^"\\]|\\.)*)" "(?P<type>(?:[^"\\]|\\.)*)"'
    r"[^;]*?(?:, (?P<parent>S_0x[0-9a-f]+))?;$"
)
_PORT = re.compile(r'^\s*\.port_info \d+ /(?P<dir>[A-Z]+) \d+ "(?P<name>(?:[^"\\]|\\.)*)"')
_CURRENT_SCOPE = re.compile(r"^\s*\.scope (?P<id>S_0x[0-9a-f]+);$")
# %vpi_call[/w|/i] <file> <line> "$name", args... ; %vpi_func[/r|/s] <file> <line> "$name" <width>, args...;
# L_... .sfunc[/e] <file> <line> "$name", "<signature>", args...;
_CALL = re.compile(r'(?:%vpi_call|%vpi_func|\.sfunc)(?:/\w+)? \d+ \d+ "(?P<name>\$[A-Za-z0-9_$]+)"(?P<args>.*)$')
_CALLISH = re.compile(r"%vpi_|\.sfunc")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SYSTEM_ARG = re.compile(r"(?<![\w$])\$[A-Za-z_][A-Za-z0-9_$]*")
_FORCE = re.compile(r"^\s*%(?P<op>force|release)\b")
_TRAN = re.compile(r"^\s*(?:\S+ )?\.(?P<op>r?tran(?:if[01])?|island)\b")


class Unreadable(ValueError):
    """A line of the vvp file that looks like a call but does not parse: the reader fails closed."""


@dataclass(frozen=True)
class Scope:
    id: str
    kind: str  # module, begin, task, function, package, generate, ...
    name: str  # the instance name
    type: str  # the module's name (for a module scope)
    parent: str | None


@dataclass
class Design:
    """What the compiler produced, as the checker's rules need it."""

    scopes: dict[str, Scope] = field(default_factory=dict)
    ports: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # scope id -> [(direction, name)]
    calls: Counter[str] = field(default_factory=Counter)  # system task/function name -> times called
    calls_in: dict[str, set[str]] = field(default_factory=dict)  # name -> scope ids it is called in
    forces: Counter[str] = field(default_factory=Counter)  # force | release -> times
    switches: Counter[str] = field(default_factory=Counter)  # tran, rtran, tranif0, ... island
    version: str = ""

    def roots(self) -> list[Scope]:
        return [s for s in self.scopes.values() if s.kind == "module" and s.parent is None]

    def module_types(self) -> set[str]:
        return {s.type for s in self.scopes.values() if s.kind == "module"}

    def path(self, scope: Scope) -> str:
        names = [scope.name]
        while scope.parent is not None and scope.parent in self.scopes:
            scope = self.scopes[scope.parent]
            names.append(scope.name)
        return ".".join(reversed(names))

    def subtree(self, root: Scope) -> Counter[tuple[str, str]]:
        """(path below `root`, module type) of every module instance under `root`, `root` itself as "". Other
        scopes (blocks, tasks) are left out: the compiler numbers its unnamed ones across the whole design."""
        base = self.path(root)
        out: Counter[tuple[str, str]] = Counter()
        for s in self.scopes.values():
            p = self.path(s)
            if s.kind == "module" and (p == base or p.startswith(base + ".")):
                out[(p[len(base) + 1 :], s.type)] += 1
        return out


def _unescape(text: str) -> str:
    return text.replace('\\"', '"').replace("\\\\", "\\")


def parse(text: str, strict: bool = True) -> Design:
    """Raises Unreadable for a call line this reader does not understand (`strict`: the design judged; the
    whole simulation, test included, is read for its scopes only)."""
    d = Design()
    current: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(":ivl_version "):
            d.version = _STRING.search(line).group()[1:-1] if _STRING.search(line) else ""  # type: ignore[union-attr]
            continue
        m = _SCOPE.match(line)
        if m:
            current = m.group("id")
            d.scopes[current] = Scope(
                current, m.group("kind"), _unescape(m.group("name")), _unescape(m.group("type")), m.group("parent")
            )
            continue
        m = _CURRENT_SCOPE.match(line)
        if m:
            current = m.group("id")
            continue
        m = _PORT.match(line)
        if m and current is not None:
            d.ports.setdefault(current, []).append((m.group("dir"), _unescape(m.group("name"))))
            continue
        if _CALLISH.search(line):
            m = _CALL.search(line)
            if m is None and not strict:
                continue
            if m is None:
                raise Unreadable(f"vvp line {number}: a call this checker cannot read: {line.strip()[:200]}")
            names = [m.group("name"), *_SYSTEM_ARG.findall(_STRING.sub('""', m.group("args")))]
            for name in names:
                d.calls[name] += 1
                d.calls_in.setdefault(name, set()).add(current or "")
            continue
        m = _FORCE.match(line)
        if m:
            d.forces[m.group("op")] += 1
            continue
        m = _TRAN.match(line)
        if m and m.group("op") != "island":
            d.switches[m.group("op")] += 1
    return d
