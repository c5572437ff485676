"""The merge job: a Tunix/Qwix LoRA checkpoint folded into its HuggingFace base, streamed tensor by tensor
from gs:// or local storage into sharded safetensors, committed with a `_COMPLETE` manifest.
Entry point: `python -m tpuforge_workloads.merge --config PATH`; see docs/merge.md."""
