"""The registry (tpuforge_workloads/families/__init__.py): a model family is one folder under families/ and a row
of the registry, matching the catalog's families; no other module of the workloads or the benchmarks names a
family's Tunix model."""

from __future__ import annotations

import re
from pathlib import Path

from tpuforge.api.catalog import MODELS
from tpuforge_workloads import families

ROOT = Path(__file__).resolve().parents[3]
FAMILIES_DIR = ROOT / "workloads" / "tpuforge_workloads" / "families"
# What a family's folder holds (families/__init__.py's docstring).
FAMILY_MODULES = ("config.py", "model.py", "attention.py", "merge.py", "tiny.py")


def test_every_family_of_the_catalog_has_a_row_and_a_folder() -> None:
    assert {m.family for m in MODELS.values()} == set(families.FAMILIES)
    for name in families.FAMILIES:
        folder = FAMILIES_DIR / name
        assert sorted(p.name for p in folder.glob("*.py") if p.name in FAMILY_MODULES) == sorted(FAMILY_MODULES)


def test_only_a_family_s_folder_names_its_tunix_model() -> None:
    mention = re.compile(r"\btunix\.models\.(\w+)")
    found = []
    for path in sorted([*(ROOT / "workloads").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        for m in mention.finditer(path.read_text()):
            name = m.group(1)
            if name in families.FAMILIES and not path.is_relative_to(FAMILIES_DIR / name):
                found.append(f"{path.relative_to(ROOT)}: tunix.models.{name}")
    assert not found, "a family's Tunix model named outside its folder (families/<name>/): " + "; ".join(found)


def test_every_hf_prefix_of_a_family_is_one_the_merge_detects() -> None:
    assert families.HF_PREFIXES == ("model.language_model.", "model.")
    for f in families.FAMILIES.values():
        assert set(f.hf_prefixes) <= set(families.HF_PREFIXES)
