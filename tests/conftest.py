"""Shared fixtures live in tests/fixtures/, one module per area; this file only wires them in."""

pytest_plugins = [
    "tests.fixtures.builds",
    "tests.fixtures.gcs",
    "tests.fixtures.cluster",
    "tests.fixtures.models",
    "tests.fixtures.operator",
    "tests.fixtures.pipelines",
    "tests.fixtures.tiers",
]
