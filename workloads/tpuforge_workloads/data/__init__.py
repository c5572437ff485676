"""Training data: chat records (JSONL) -> Gemma turn-format tokens with loss masks -> Grain batches."""
