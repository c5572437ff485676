"""Qwen3 (dense decoders)."""
