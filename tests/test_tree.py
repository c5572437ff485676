"""The test tree's own rules: test modules import shared helpers from tests/fixtures/, never from another test
module (a helper two tests need belongs in fixtures, and importing a test module runs its module-level code
and pulls its tests into the importer's namespace)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED = "tests.fixtures"


def imported_test_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n.startswith("tests.") and not n.startswith(SHARED)]
    return sorted(set(found))


def test_no_module_of_the_tree_imports_a_test_module() -> None:
    offenders = {
        str(p.relative_to(TESTS.parent)): bad for p in sorted(TESTS.rglob("*.py")) if (bad := imported_test_modules(p))
    }
    assert offenders == {}, f"move what these import into {SHARED} (see tests/fixtures/)"


def test_the_check_sees_both_import_forms(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from tests.operator.api import test_crds as t\nimport tests.helm.test_kueue\n"
        "from tests.fixtures.helm import render\nfrom tests.fixtures import upstream\n"
    )
    assert imported_test_modules(probe) == ["tests.helm.test_kueue", "tests.operator.api"]
