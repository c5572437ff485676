"""Gemma 4 (dense decoders, text-only or multimodal layout)."""
