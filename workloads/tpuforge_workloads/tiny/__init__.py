"""Tiny random-weight checkpoints in the real models' layouts, for tests and the demo."""
