"""Kubernetes' rules for label keys and values, for every label the operator writes from a spec (node selectors,
the Kueue queue, the reservation's). The apiserver refuses a Job or Deployment whose labels break them; checking
here turns that into InvalidSpec naming the field, before anything is created."""

from __future__ import annotations

import re
from collections.abc import Mapping

# The longest label value, and the longest name part of a key.
MAX_LABEL_VALUE = 63
# A label key: an optional DNS-subdomain prefix (at most 253 characters), then a name of at most 63 characters.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$"
)
# A label value: empty, or alphanumerics with - _ . inside, at most 63 characters.
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
_MAX_PREFIX = 253
_KEY = re.compile(LABEL_KEY_PATTERN)
_VALUE = re.compile(LABEL_VALUE_PATTERN)


def label_value_problem(value: str) -> str | None:
    """Why `value` cannot be a label value, or None when it can."""
    if len(value) > MAX_LABEL_VALUE:
        return f"{value!r} is {len(value)} characters; a label value holds at most {MAX_LABEL_VALUE}"
    if not _VALUE.match(value):
        return (
            f"{value!r} is not a label value: use letters, digits, '-', '_' and '.', starting and ending with a "
            "letter or digit (no '/', ':' or spaces)"
        )
    return None


def label_key_problem(key: str) -> str | None:
    """Why `key` cannot be a label key, or None when it can."""
    prefix = key.rpartition("/")[0]
    if not _KEY.match(key) or len(prefix) > _MAX_PREFIX:
        return (
            f"{key!r} is not a label key: an optional DNS-subdomain prefix and '/', then at most "
            f"{MAX_LABEL_VALUE} letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    return None


def label_errors(field: str, labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """(field, message) for each key or value of `labels` (at `field`) that Kubernetes would refuse."""
    errors: list[tuple[str, str]] = []
    for key, value in labels.items():
        at = f"{field}[{key}]"
        for problem in (label_key_problem(key), label_value_problem(value)):
            if problem:
                errors.append((at, problem))
    return errors


__all__ = [
    "LABEL_KEY_PATTERN",
    "LABEL_VALUE_PATTERN",
    "MAX_LABEL_VALUE",
    "label_errors",
    "label_key_problem",
    "label_value_problem",
]
