"""How `make test` spreads the tests over its two pytest workers (tests/fixtures/tiers.py), on a small suite of
its own run with `-n 2`: every cluster test in one worker (one sandbox), each other module whole in one
worker (its module fixtures made once), and the cluster's group started first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
import json, os, pytest

def record(request, what):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open("ran.jsonl", "a") as f:
        f.write(json.dumps({"test": request.node.name, "what": what, "worker": worker}) + "\\n")

@pytest.fixture(scope="session")
def sandbox(request):
    record(request, "sandbox")

@pytest.fixture(scope="module")
def made(request):
    record(request, "module fixture")

@pytest.fixture(autouse=True)
def ran(request):
    record(request, "test")
"""

CLUSTER = """
import pytest
pytestmark = pytest.mark.cluster
{tests}
"""

PLAIN = """
import pytest
pytestmark = {marks}
{tests}
"""


def suite(folder: Path) -> None:
    (folder / "conftest.py").write_text(CONFTEST)
    for module in ("a", "b"):
        tests = "\n".join(f"def test_cluster_{module}{i}(sandbox): pass" for i in range(3))
        (folder / f"test_cluster_{module}.py").write_text(CLUSTER.format(tests=tests))
    for module, marks in (("c", "[]"), ("d", "[pytest.mark.slow]"), ("e", "[]")):
        tests = "\n".join(f"def test_plain_{module}{i}(made): pass" for i in range(4))
        (folder / f"test_plain_{module}.py").write_text(PLAIN.format(marks=marks, tests=tests))


def test_two_workers_take_the_cluster_whole_and_each_other_module_whole(tmp_path: Path) -> None:
    suite(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "pytest", "-n", "2", "-p", "tests.fixtures.tiers", "-p", "no:cacheprovider", "-q"]
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [json.loads(line) for line in (tmp_path / "ran.jsonl").read_text().splitlines()]
    tests = [r for r in rows if r["what"] == "test"]
    assert len(tests) == 18
    worker = {r["test"]: r["worker"] for r in tests}
    cluster = {worker[t] for t in worker if t.startswith("test_cluster")}
    assert len(cluster) == 1, worker
    for module in "cde":
        assert len({worker[t] for t in worker if t.startswith(f"test_plain_{module}")}) == 1, worker
    assert [r["worker"] for r in rows if r["what"] == "sandbox"] == list(cluster)  # one sandbox
    assert sorted(r["test"] for r in rows if r["what"] == "module fixture") == [f"test_plain_{m}.py" for m in "cde"]
    # The cluster's worker starts with the cluster; the other with the slow module.
    firsts = {}
    for r in tests:
        firsts.setdefault(r["worker"], r["test"])
    (other,) = set(firsts) - cluster
    assert firsts[next(iter(cluster))].startswith("test_cluster") and firsts[other].startswith("test_plain_d"), firsts
