"""What the backward pass recomputes: rematerialisation of the decoder layers, on or off, and what it keeps.

Tunix's decoder layers read `remat_config` from their config at call time (DECODER: the whole layer under
nnx.remat, which keeps only the layer's input and recomputes the rest in the backward pass). That is the
`full` policy. The others keep more of the forward pass where HBM allows, so that less is recomputed:

- `saveAttention`: also the attention's q, k, v and its output, before and after the output projection (the
  names attention.py gives them on the splash path). The backward pass recomputes the MLP, the norms and the
  attention kernel's forward (for its softmax statistics), not the four projections.
- `saveMatmuls`: every matmul's output (JAX's `dots_with_no_batch_dims_saveable`): nothing but the elementwise
  work and the attention kernel is recomputed; the most memory of the three.

A policy other than `full` makes each decoder layer an instance of a subclass of Tunix's (one per policy)
whose call runs the same `block` under nnx.remat with that policy: the parameters, their paths and the
checkpoints are the same. LoRA adapters must be added with remat off (variables created inside nnx.remat are
discarded), so the trainer builds without it and turns it on afterwards.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from tpuforge.api.finetune import REMAT_POLICIES

# The names attention.py gives the activations `saveAttention` keeps.
ATTENTION_SAVES = ("attention_q", "attention_k", "attention_v", "attention_encoded", "attention_out")


def checkpoint_policy(name: str) -> Any:
    """JAX's checkpoint policy for a remat policy name; None for `full` (keep nothing but the layer input)."""
    import jax

    if name == "full":
        return None
    if name == "saveAttention":
        return jax.checkpoint_policies.save_only_these_names(*ATTENTION_SAVES)
    if name == "saveMatmuls":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    raise ValueError(f"spec.training.rematPolicy: {name!r} is not one of {', '.join(REMAT_POLICIES)}")


@functools.cache
def _layer_class(base: Any, policy: str) -> Any:
    """`base` (a Tunix decoder layer class) whose call runs its block under nnx.remat with `policy`."""
    from flax import nnx

    jax_policy = checkpoint_policy(policy)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self.config.remat_config, "name", None) != "DECODER":
            return base.__call__(self, *args, **kwargs)
        return nnx.remat(base.block, graph_updates=False, policy=jax_policy)(self, *args, **kwargs)

    name = f"{base.__name__}{policy[0].upper()}{policy[1:]}"
    return type(name, (base,), {"__call__": __call__, "__module__": __name__})


def set_remat(model: Any, remat: bool, policy: str, config_type: type[Any], remat_type: Any, layer_type: Any) -> None:
    """Rematerialisation of the decoder layers (`layer_type`, holding a `config_type` config) on or off, keeping
    what `policy` names; in place."""
    checkpoint_policy(policy)  # a bad name fails before anything changes
    wanted = remat_type.DECODER if remat else remat_type.NONE
    for _, module in model.iter_modules():
        cfg = getattr(module, "config", None)
        if isinstance(cfg, config_type) and cfg.remat_config != wanted:
            module.config = dataclasses.replace(cfg, remat_config=wanted)
        if isinstance(module, layer_type):
            module.__class__ = layer_type if policy == "full" else _layer_class(layer_type, policy)
