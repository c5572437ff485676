"""What the training benchmarks share: `tiny_config` (the tiny Gemma 4 LoRA run that train_overhead.py and
train_multihost.py time)."""
