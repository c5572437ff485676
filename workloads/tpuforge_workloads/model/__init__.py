"""The model: config, attention, LoRA, adapters, checkpoint reading, the device mesh."""
