"""The Kubernetes API permissions the operator needs, read from its code with `ast` (nothing is imported but
the constants the code names).

Every API call of the controllers goes through the `tpuforge.kube_*` modules (`kube_objects`, `kube_client`,
`kube_events`); the scan reads each call of them in operator/tpuforge/controllers/:
- `get`, `list_objects`, `delete`, `patch` name (apiVersion, kind) as arguments: constants are resolved;
  `x.api_version` / `x.kind` of a value object are the kinds the controllers construct such objects with
  (e.g. `ChildRef("batch/v1", "Job", name)`); anything else is a child built by the manifests;
- the same calls of a `kube_async.AsyncApi`, made through a name `kube_api` (they have no client argument);
- `create`, `create_if_absent`, and `request` with a `resource_path(...)` act on a child object, i.e. on the
  kinds the manifests modules the controller imports build (dict literals with apiVersion, kind, metadata);
- `patch_status` writes the status of the kind the module reconciles (its kopf handlers' own-group
  resource), `post_event` creates Events;
- kopf handlers: kopf lists and watches each handled resource, and patches those whose handlers keep state
  on the object (change handlers, timers, daemons: annotations and a finalizer). Event and index handlers
  only watch.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tpuforge.api.constants import GROUP

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "tpuforge"


class Permission(NamedTuple):
    group: str  # "" for the core group
    resource: str  # "pods", "finetunejobs/status"
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}{'.' + self.group if self.group else ''}"


@dataclass(frozen=True)
class Use:
    """A permission and where the code needs it."""

    permission: Permission
    where: str


ApiKind = tuple[str, str]  # (apiVersion, kind)

_HTTP = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
# The names the calls are made through: the modules, and an AsyncApi.
_RECEIVERS = ("kube_objects", "kube_client", "kube_events", "kube_api")
# kube_objects function -> (verb, index of the apiVersion argument) for the calls that name their kind.
_NAMED = {"get": ("get", 1), "list_objects": ("list", 1), "delete": ("delete", 1), "patch": ("patch", 1)}
_OBJECT = {"create": "create", "create_if_absent": "create"}
_KOPF_STATEFUL = {"create", "update", "delete", "resume", "field", "timer", "daemon"}
_KOPF_WATCHING = _KOPF_STATEFUL | {"event", "index"}
# A typed-client call (`read_namespaced_pod`, `patch_namespaced_custom_object_status`, ...) would bypass the
# scan: the controllers must use the tpuforge.kube_* modules.
_TYPED_CLIENT = re.compile(
    r"^(read|list|create|replace|patch|delete|connect)_\w*(namespaced_|custom_object|for_all_namespaces|custom_resource)"
)


def _kube_client() -> Any:
    return importlib.import_module("tpuforge.kube.client")


def group_of(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


def plural_of(kind: str) -> str:
    plurals: dict[str, str] = _kube_client().PLURALS
    if kind not in plurals:
        raise AssertionError(f"tpuforge.kube.client.PLURALS lacks kind {kind!r}")
    return plurals[kind]


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


class Module:
    """One source file: its tree and the module-level names whose values are known without running it."""

    def __init__(self, path: Path):
        self.path = path
        self.tree = ast.parse(path.read_text(), str(path))
        self.bindings: dict[str, Callable[[], Any]] = {}
        self.imports: list[tuple[str, str | None]] = []  # (module, imported name or None for the module)
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.bindings[target.id] = functools.partial(lambda v: v, node.value.value)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.imports.append((node.module, alias.name))
                    self.bindings[alias.asname or alias.name] = functools.partial(_imported, node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.imports.append((alias.name, None))

    def value(self, node: ast.AST | None) -> Any:
        """A literal or a module-level constant (direct or imported); None when only known at run time."""
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        head, _, rest = _dotted(node).partition(".")
        if not head or head not in self.bindings:
            return None
        value = self.bindings[head]()
        for part in rest.split(".") if rest else []:
            value = getattr(value, part, None)
        return value

    def where(self, node: ast.AST) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{getattr(node, 'lineno', '?')}"

    def function_kinds(self, name: str) -> set[ApiKind]:
        """Kinds of the objects the module-level function `name` builds (none for a non-function)."""
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return built_kinds(self, node)
        return set()


@functools.cache
def load(module: str) -> Module | None:
    """A tpuforge module's source, or None for a name that is not a module of the package."""
    path = ROOT / "operator" / Path(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return Module(candidate)
    return None


def _imported_target(module: str, name: str | None) -> tuple[Module, str | None] | None:
    """What an import brings from a tpuforge module: (module, None) for a whole module, (module, name)."""
    if name is not None and (sub := load(f"{module}.{name}")) is not None:
        return sub, None
    mod = load(module)
    return (mod, name) if mod is not None else None


def manifest_kinds(mod: Module) -> set[ApiKind]:
    """The child kinds a controller module deals with: the objects built by what it imports from
    tpuforge.manifests, directly or through the controller modules it imports."""
    out: set[ApiKind] = set()
    seen: set[tuple[Path, str | None]] = set()
    todo: list[tuple[Module, str | None]] = [(mod, None)]
    while todo:
        m, name = todo.pop()
        if (m.path, name) in seen:
            continue
        seen.add((m.path, name))
        if name is not None:
            out |= m.function_kinds(name)
            continue
        in_manifests = "manifests" in m.path.parts
        if in_manifests:
            out |= built_kinds(m, m.tree)
        for module, imported in m.imports:
            follow = module.startswith("tpuforge.manifests") or (
                not in_manifests and module.startswith("tpuforge.controllers")
            )
            target = _imported_target(module, imported) if follow else None
            if target is not None:
                # A controller module's function works with everything that module imports.
                todo.append((target[0], None) if module.startswith("tpuforge.controllers") else target)
    return out


def _imported(module: str, name: str) -> Any:
    try:
        return importlib.import_module(f"{module}.{name}")
    except ImportError:
        return getattr(importlib.import_module(module), name, None)


def _dict_kind(mod: Module, node: ast.Dict) -> ApiKind | None:
    """(apiVersion, kind) of a dict literal that is a whole object (it has metadata)."""
    keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}
    if not {"apiVersion", "kind", "metadata"} <= keys.keys():
        return None
    api_version, kind = mod.value(keys["apiVersion"]), mod.value(keys["kind"])
    if not (isinstance(api_version, str) and isinstance(kind, str)):
        raise AssertionError(f"{mod.where(node)}: an object whose apiVersion/kind are not constants")
    return api_version, kind


def built_kinds(mod: Module, tree: ast.AST) -> set[ApiKind]:
    """The kinds of the objects built as dict literals in `tree`."""
    return {k for n in ast.walk(tree) if isinstance(n, ast.Dict) and (k := _dict_kind(mod, n))}


def constructed_kinds(modules: Iterable[Module]) -> set[ApiKind]:
    """(apiVersion, kind) given as the first two literal arguments to the constructor of a class that has
    `api_version` and `kind` fields (the value objects that name a child, like `ChildRef`)."""
    classes = set()
    for m in modules:
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ClassDef):
                fields = [
                    s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                ]
                if fields[:2] == ["api_version", "kind"]:
                    classes.add(node.name)
    out = set()
    for m in modules:
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] in classes and len(node.args) >= 2:
                api_version, kind = m.value(node.args[0]), m.value(node.args[1])
                if isinstance(api_version, str) and isinstance(kind, str):
                    out.add((api_version, kind))
    return out


def _kopf_resource(mod: Module, call: ast.Call) -> tuple[str, str]:
    """(group, plural) of a kopf handler decorator: (group, version, plural) or ("v1", plural)."""
    args = [mod.value(a) for a in call.args]
    if len(args) == 3 and all(isinstance(a, str) for a in args):
        return args[0], args[2]
    if len(args) == 2 and all(isinstance(a, str) for a in args):
        return group_of(args[0]) if "/" in args[0] else ("" if args[0] == "v1" else args[0]), args[1]
    raise AssertionError(f"{mod.where(call)}: give kopf the resource as constant (group, version, plural)")


def kopf_handlers(mod: Module) -> Iterator[tuple[str, tuple[str, str], ast.Call]]:
    """(handler type, (group, plural), decorator) of every resource handler in the module."""
    for node in ast.walk(mod.tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and _dotted(deco.func).startswith("kopf."):
                handler = _dotted(deco.func).rsplit(".", 1)[-1]
                if handler in _KOPF_WATCHING:
                    yield handler, _kopf_resource(mod, deco), deco


class Scan:
    """The permissions of the controllers package."""

    def __init__(self, paths: Iterable[Path] | None = None):
        self.modules = [
            Module(p) for p in (paths if paths is not None else sorted((PACKAGE / "controllers").rglob("*.py")))
        ]
        self.value_kinds = constructed_kinds(self.modules)

    def uses(self) -> list[Use]:
        out: list[Use] = []
        for mod in self.modules:
            out += self._kopf_uses(mod)
            out += self._kube_uses(mod)
            out += self._informer_uses(mod)
        return out

    def _informer_uses(self, mod: Module) -> Iterator[Use]:
        """`Informer(api_version=..., kind=...)` (tpuforge.controllers.runtime.informer): a LIST and a WATCH."""
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] == "Informer":
                given = {k.arg: mod.value(k.value) for k in node.keywords}
                v, k = given.get("api_version"), given.get("kind")
                if not (isinstance(v, str) and isinstance(k, str)):
                    raise AssertionError(f"{mod.where(node)}: give an Informer api_version= and kind= as constants")
                for verb in ("list", "watch"):
                    yield Use(Permission(group_of(v), plural_of(k), verb), f"{mod.where(node)} (informer)")

    def _kopf_uses(self, mod: Module) -> Iterator[Use]:
        for handler, (group, plural), deco in kopf_handlers(mod):
            for verb in ["list", "watch"] + (["patch"] if handler in _KOPF_STATEFUL else []):
                yield Use(Permission(group, plural, verb), f"{mod.where(deco)} (kopf.{handler})")

    def _reconciled(self, mod: Module) -> set[str]:
        """Own-group plurals this module reconciles: those with a handler other than a plain event handler,
        and those it watches with an informer."""
        watched = {u.permission.resource for u in self._informer_uses(mod) if u.permission.group == GROUP}
        return watched | {p for h, (g, p), _ in kopf_handlers(mod) if g == GROUP and h != "event"}

    def _kinds(self, mod: Module, api_version: ast.AST | None, kind: ast.AST | None) -> set[ApiKind]:
        v, k = mod.value(api_version), mod.value(kind)
        if isinstance(v, str) and isinstance(k, str):
            return {(v, k)}
        if isinstance(kind, ast.Attribute) and kind.attr == "kind":
            return self.value_kinds
        return manifest_kinds(mod)

    def _kube_uses(self, mod: Module) -> Iterator[Use]:
        for node in ast.walk(mod.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            fn, receiver = node.func.attr, _dotted(node.func.value)
            if receiver not in _RECEIVERS:
                if _TYPED_CLIENT.match(fn):
                    raise AssertionError(f"{mod.where(node)}: call the API through tpuforge.kube_* ({receiver}.{fn})")
                continue
            where = mod.where(node)
            if fn in _NAMED:
                verb, i = _NAMED[fn]
                i -= receiver == "kube_api"  # an AsyncApi call has no client argument
                sub = next((mod.value(k.value) for k in node.keywords if k.arg == "subresource"), None)
                args = node.args[i : i + 2]
                for v, k in self._kinds(mod, *(args + [None] * (2 - len(args)))):
                    yield Use(Permission(group_of(v), plural_of(k) + (f"/{sub}" if sub else ""), verb), where)
            elif fn in _OBJECT:
                for v, k in manifest_kinds(mod):
                    yield Use(Permission(group_of(v), plural_of(k), _OBJECT[fn]), where)
            elif fn == "patch_status":
                for plural in self._reconciled(mod):
                    yield Use(Permission(GROUP, f"{plural}/status", "patch"), where)
            elif fn == "post_event":
                yield Use(Permission("", "events", "create"), where)
            elif fn == "request":
                yield from self._request_uses(mod, node, shift=receiver == "kube_api")

    def _request_uses(self, mod: Module, call: ast.Call, shift: bool = False) -> Iterator[Use]:
        """A request's (method, path); an AsyncApi's has no client argument before them (`shift`)."""
        i = 1 - shift
        method = mod.value(call.args[i]) if len(call.args) > i else None
        path = call.args[i + 1] if len(call.args) > i + 1 else None
        built = _resource_path_call(mod, path)
        if built is None:
            return  # a discovery request (/apis/<group>/<version>): every authenticated user may read those
        if method not in _HTTP:
            raise AssertionError(f"{mod.where(call)}: request() with a method that is not a constant")
        args = built.args
        verb = _HTTP[method]
        if verb == "get" and len(args) < 4:
            verb = "list"
        for v, k in self._kinds(mod, args[0] if args else None, args[1] if len(args) > 1 else None):
            yield Use(Permission(group_of(v), plural_of(k), verb), mod.where(call))


def _resource_path_call(mod: Module, node: ast.AST | None) -> ast.Call | None:
    """The `kube_client.resource_path(...)` call a request's path comes from, directly or through a local name."""
    if isinstance(node, ast.Call) and _dotted(node.func).endswith("resource_path"):
        return node
    if isinstance(node, ast.Name):
        for n in ast.walk(mod.tree):
            if (
                isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets)
                and isinstance(n.value, ast.Call)
                and _dotted(n.value.func).endswith("resource_path")
            ):
                return n.value
    return None


def granted(rules: Iterable[dict[str, Any]]) -> set[Permission]:
    """The permissions PolicyRules grant, one per (group, resource, verb); wildcards are refused."""
    out: set[Permission] = set()
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    assert "*" not in (group, resource, verb), f"wildcard in rule {rule}"
                    out.add(Permission(group, resource, verb))
    return out
