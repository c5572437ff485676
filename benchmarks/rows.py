"""A benchmark's result rows: each printed as a JSON line as it is made, and appended to a JSON-lines file when
one is named, so a run that dies keeps what it measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(row: dict[str, Any], path: str | Path | None = None) -> None:
    """Print `row` as one JSON line; append it to `path` too when given."""
    line = json.dumps(row)
    print(line, flush=True)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
