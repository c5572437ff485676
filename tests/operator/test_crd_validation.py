"""The CRDs' CEL validation rules (tpuforge.api.admission) in the sandbox's real apiserver: `kubectl apply`
refuses each invalid spec of the unit tests at admission, naming the field, and stores nothing; every example
passes them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.fixtures.admission import EXAMPLES, INVALID, ROOT, InvalidSpec, refusals
from tests.fixtures.cluster import kubectl
from tpuforge_sandbox import Sandbox

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_kubectl_apply_refuses_the_invalid_spec_naming_the_field(
    sandbox: Sandbox, namespace: str, tmp_path: Path, case: InvalidSpec
) -> None:
    obj = case.object()
    [(_, rule)] = refusals(obj)  # the rule, as the unit tests find it
    manifest = tmp_path / "refused.yaml"
    manifest.write_text(yaml.safe_dump(obj))
    out = kubectl(sandbox, "apply", "-n", namespace, "-f", str(manifest))
    assert out.returncode != 0, out.stdout
    # e.g. The FineTuneJob "refused" is invalid: spec.tpu.mesh: Invalid value: fsdp x tp must equal ...
    assert f'{obj["kind"]} "refused" is invalid: {case.field}: ' in out.stderr, out.stderr
    assert rule["message"] in out.stderr, out.stderr
    got = kubectl(sandbox, "get", "-n", namespace, obj["kind"].lower(), "refused")
    assert got.returncode != 0 and "NotFound" in got.stderr, got.stdout


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_passes_the_rules(sandbox: Sandbox, namespace: str, example: str) -> None:
    out = kubectl(sandbox, "apply", "--dry-run=server", "-n", namespace, "-f", str(ROOT / "examples" / example))
    assert out.returncode == 0, out.stderr
