"""benchmarks/decode_speed.py at a tiny shape (a smoke test of the script; its times are not asserted): both
decodes run on the trainer's model, and in float32 on CPU they agree on every token."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import decode_speed


def test_the_decode_benchmark_times_the_cache_against_whole_rows(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    argv = ["--rows", "2", "--prompt", "9", "--new", "6", "--repeats", "1", "--json", str(out)]
    assert decode_speed.main(argv) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["model"] == "gemma4-tiny" and row["rows"] == 2 and row["newTokens"] == 6
    assert row["kvCache"]["seconds"] > 0 and row["wholeRows"]["seconds"] > 0 and row["ratio"] > 0
    assert row["leadingTokensAgreed"] == 6
