"""Remat policies (families/remat.py) on the tiny Gemma 4 with LoRA, on the splash path with segment ids (the
kernel in interpret mode): each policy keeps what it says from the forward pass, and the gradients do not
depend on the policy."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tpuforge.api import LoraSpec
from tpuforge.api.catalog import MODELS
from tpuforge.api.finetune import REMAT_POLICIES
from tpuforge_workloads import families
from tpuforge_workloads.families import attention
from tpuforge_workloads.families.remat import ATTENTION_SAVES, checkpoint_policy
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.loss import nll_sum_and_count
from tpuforge_workloads.model.mesh import MESH_AXES

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _saved(f: Any, *args: Any) -> list[str]:
    """JAX's account of what the backward pass of `f` keeps from the forward pass, a line per residual."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(f, *args)
    return out.getvalue().splitlines()


def test_each_policy_keeps_what_it_names_and_the_gradients_do_not_change(tiny_model_dir: Path) -> None:
    text = families.read_decoder(str(tiny_model_dir))
    fam = families.of(text)
    mesh = jax.make_mesh((1, 1), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(tiny_model_dir, text, fam.tunix_config(text), mesh)
    spec = LoraSpec(rank=4, alpha=8.0, dropout=0.0, target_modules=list(MODELS["gemma4-tiny"].lora_targets))
    model = lora.apply_lora(base, spec, mesh, seed=0)
    rng = np.random.default_rng(0)
    adapters = jax.tree.map(
        lambda x: jnp.asarray(rng.normal(0, 0.05, x.shape), x.dtype), nnx.state(model, nnx.LoRAParam)
    )
    nnx.update(model, adapters)
    t = 128
    segments = np.ones((2, t), np.int32)
    segments[0, 60:] = 2  # two packed examples in the first row
    positions = np.stack([np.r_[np.arange(60), np.arange(t - 60)], np.arange(t)]).astype(np.int32)
    inputs = {
        "input_tokens": jnp.asarray(rng.integers(5, 200, (2, t)), jnp.int32),
        "input_mask": jnp.ones((2, t), bool),
        "positions": jnp.asarray(positions),
        "attention_mask": attention.Segments(jnp.asarray(segments)),
    }

    saved: dict[str, list[str]] = {}
    grads: dict[str, Any] = {}
    for policy in REMAT_POLICIES:
        fam.set_remat(model, True, policy)
        graph, lora_state, rest = nnx.split(model, nnx.LoRAParam, ...)

        def loss(adapters: Any, graph: Any = graph, rest: Any = rest) -> jax.Array:
            total, count = nll_sum_and_count(nnx.merge(graph, adapters, rest), **inputs)
            return total / count

        with jax.set_mesh(mesh):
            saved[policy] = _saved(loss, lora_state)
            grads[policy] = jax.jit(jax.grad(loss))(lora_state)

    def named(lines: list[str]) -> set[str]:
        return {line.split("named '")[1].split("'")[0] for line in lines if "named '" in line}

    assert named(saved["full"]) == set()
    assert named(saved["saveAttention"]) == set(ATTENTION_SAVES)
    assert len(saved["full"]) < len(saved["saveAttention"]) < len(saved["saveMatmuls"])
    for policy in REMAT_POLICIES:
        worst = max(
            jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), grads["full"], grads[policy]))
        )
        assert worst < 1e-5, (policy, worst)

    fam.set_remat(model, False, "full")  # off again: Tunix's own class, no remat
    assert all(
        type(m).__module__.startswith("tunix") for _, m in model.iter_modules() if "DecoderLayer" in type(m).__name__
    )
    with pytest.raises(ValueError, match=r"spec.training.rematPolicy: 'some' is not one of full, saveAttention"):
        checkpoint_policy("some")
