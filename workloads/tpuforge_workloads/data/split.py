"""The held-out split of one file (spec.dataset.evalFraction, splitSeed): which records the trainer leaves out
for evaluation and the evaluation Job scores.

A record's place in the split depends on its seed-keyed hash of its messages only, not on its line or row:
each process that reads the same file with the same seed holds out the same records (the trainer in every
attempt, on every host, and the evaluation Job), and the same records in JSONL or Parquet split alike. The
`round(fraction * n)` records with the smallest keys are held out (at least one), and both parts keep the
file's order. Identical records have the same key and go to the same side: the cut is moved past the copies
of the last record held out, so that no record scored as held out was also trained on (the held-out part
may then be a few records larger).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from tpuforge_workloads.data.records import DatasetError, Record


def record_key(record: Record, seed: int) -> bytes:
    text = json.dumps([seed, [[m.role, m.content, m.thinking] for m in record.messages]], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).digest()


def held_out_count(records: int, fraction: float) -> int:
    return max(1, round(fraction * records)) if fraction > 0 else 0


def split(records: Sequence[Record], fraction: float, seed: int, where: str) -> tuple[list[Record], list[Record]]:
    """(records to train on, records held out). Raises DatasetError, naming `where`, when nothing would be
    left to train on."""
    k = held_out_count(len(records), fraction)
    if k == 0:
        return list(records), []
    if k >= len(records):
        raise DatasetError(
            f"{where}: dataset.evalFraction={fraction} of {len(records)} records leaves none to train on; "
            "add records, lower evalFraction or give an evalUri"
        )
    keys = [record_key(r, seed) for r in records]
    order = sorted(range(len(records)), key=lambda i: (keys[i], i))
    while k < len(order) and keys[order[k]] == keys[order[k - 1]]:
        k += 1
    if k >= len(records):
        raise DatasetError(
            f"{where}: dataset.evalFraction={fraction} holds out every record: the {len(records)} records are copies "
            "of a few, and copies stay on one side of the split; add other records or give an evalUri"
        )
    held = set(order[:k])
    return [r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held]
