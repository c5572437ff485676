"""The one error the merge raises for bad input."""

from __future__ import annotations


class MergeInputError(ValueError):
    """A config, base model or LoRA checkpoint the merge cannot use, found before anything is written.

    The message names the field or file and what to change; the CLI exits with EXIT_BAD_CONFIG."""
