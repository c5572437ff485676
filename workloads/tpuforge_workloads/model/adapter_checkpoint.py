"""The LoRA adapters inside a training run's Orbax checkpoints, as the trainer writes them and as readers
outside the trainer (the merge's verification, the evaluation, `lora.load_lora_model`) restore them.

Below both `lora` (the model and its manifest) and `train.checkpoints` (the trainer's checkpoint manager):
the item name is part of the manifest, and the restore is what every reader does. Orbax and Flax are
imported where they are used, so that importing the item name costs nothing.
"""

from __future__ import annotations

from typing import Any

# The checkpoint item holding the adapters (the name Tunix's PeftTrainer uses).
PARAMS_ITEM = "model_params"


def pytree_restore(target: Any, shardings: Any | None = None) -> Any:
    """Orbax restore arguments that put each array of `target` back with its sharding (or `shardings`)."""
    import orbax.checkpoint as ocp

    return ocp.args.PyTreeRestore(
        item=target,
        restore_args=ocp.checkpoint_utils.construct_restore_args(target=target, sharding_tree=shardings),
    )


def restore_lora_params(uri: str, model: Any, step: int | None = None) -> int:
    """Load only the LoRA adapters of step `step` (default: latest) into `model`; returns the step."""
    import orbax.checkpoint as ocp
    from flax import nnx

    manager = ocp.CheckpointManager(
        uri,
        item_handlers={PARAMS_ITEM: ocp.PyTreeCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(read_only=True),
    )
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{uri}: no finished checkpoint")
        params = nnx.state(model, nnx.LoRAParam)
        restored = manager.restore(step, args=ocp.args.Composite(**{PARAMS_ITEM: pytree_restore(params)}))
        nnx.update(model, restored[PARAMS_ITEM])
        return int(step)
    finally:
        manager.close()
