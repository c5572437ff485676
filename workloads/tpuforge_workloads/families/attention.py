"""Attention over packed rows: splash attention with segment ids on TPU, Tunix's masked path elsewhere (Gemma 4
and Qwen3).

Tunix's Gemma 4 attention has two paths. The default one takes the [B, T, T] mask the trainer builds from the
segment ids (data/pipeline.py: causal, block-diagonal per example) and computes every T x T score, sliding
layers included. Its TPU path (`use_flash_attention`) runs splash attention but builds its own causal or
local mask and ignores the trainer's, so packed examples would see each other. Splash attention itself takes
segment ids; Tunix offers no hook to hand them through.

So the model's attention modules become the family's own (`install`: each family's `attention.py`, Gemma 4's
`SegmentAttention`, Qwen3's `Qwen3SegmentAttention`, named by the registry): given a `Segments` in place of the
mask it projects q, k and v with the module's own weights (LoRA included), as Tunix does, and runs splash
attention with the segment ids and the layer's mask (causal on global layers, causal within the sliding
window on sliding ones); given anything else (a dense mask, a KV cache) it is Tunix's attention unchanged.
`model_inputs` (below) chooses at trace time: `Segments` when the step is traced for TPU devices
and the row length suits the kernel's blocks (`use_splash`), the dense mask otherwise. On CPU the kernel runs
in Pallas interpret mode, which is how the tests compare both paths.

Gemma 4's projection restates Tunix's (q/k/v einsums, norms, RoPE, value normalisation). If a Tunix release
changes its own, the two paths differ and tests/workloads/train/test_train_loss.py (segment-id path = masked path)
fails; `install` refuses a model whose attention modules lack the parts it uses.

Qwen3 takes the same kernel (`Qwen3SegmentAttention`): Tunix's Qwen3 (google-tunix 0.1.7) has a splash path of
its own that takes segment ids (`use_flash_attention`), but its blocks are one configured size (1024 by default,
which outgrows scoped VMEM on the 31B's backward kernels), it reads the legacy mesh context, and it has no
interpret mode, so nothing could check it on a CPU; this module's kernel runs in interpret mode in the tests
(tests/workloads/families/qwen3/test_model.py: segment-id path = masked path).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

from tpuforge_workloads import families
from tpuforge_workloads.data.pipeline import RL_ARRAYS

# Splash's key/value blocks are multiples of the TPU's 128 lanes; larger blocks run faster until the
# backward kernels outgrow scoped VMEM (Tunix's 1024 does for the 31B's 512-wide global heads).
_BLOCKS = (512, 256, 128)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Segments:
    """The model's `attention_mask` on the splash path: segment ids [B, T] (1, 2, ... per packed example,
    0 on padding). Padding attends to padding only, which no loss target reads."""

    ids: jax.Array


def block_size(seq_len: int) -> int | None:
    """The splash block for rows of `seq_len` tokens; None when no block divides it (the masked path)."""
    return next((b for b in _BLOCKS if seq_len % b == 0), None)


# The kernels' block layouts, by name; `layout` is the one the trainer's kernels are built with. Each names the
# forward's query and key/value blocks and the backward's: `uniform` one block everywhere and the two backward
# kernels (dk/dv, then dq); `fused` one backward kernel computing dq with dk and dv; the `wide...` layouts take
# 1024-token query and key/value blocks where the row length allows (computing 512 keys at a time), in the
# forward only or in the fused backward as well. benchmarks/chip/splash_speed.py times each on a chip.
LAYOUTS = ("uniform", "fused", "wideForward", "wideFused")
layout = "fused"


@contextlib.contextmanager
def blocks_layout(name: str) -> Iterator[None]:
    """Within the block, the kernels traced are built with the block layout `name` (one of LAYOUTS)."""
    global layout
    if name not in LAYOUTS:
        raise ValueError(f"splash block layout {name!r} unknown; known: {', '.join(LAYOUTS)}")
    before, layout = layout, name
    try:
        yield
    finally:
        layout = before


def block_sizes(seq_len: int, name: str | None = None) -> splash.BlockSizes:
    """The kernels' blocks for rows of `seq_len` tokens in the layout `name` (default: `layout`)."""
    b = block_size(seq_len)
    if b is None:
        raise ValueError(f"splash attention needs a row length divisible by {_BLOCKS[-1]}; got {seq_len}")
    name = name or layout
    wide = 1024 if name.startswith("wide") and seq_len % 1024 == 0 else b
    if name in ("fused", "wideFused"):
        return splash.BlockSizes(
            block_q=wide,
            block_kv=wide,
            block_kv_compute=b,
            block_q_dkv=wide,
            block_kv_dkv=wide,
            block_kv_dkv_compute=b,
            use_fused_bwd_kernel=True,
        )
    return splash.BlockSizes(
        block_q=wide,
        block_kv=wide,
        block_kv_compute=b,
        block_q_dkv=b,
        block_kv_dkv=b,
        block_kv_dkv_compute=b,
        block_q_dq=b,
        block_kv_dq=b,
    )


def target_platform() -> str:
    """The platform the current trace is for: the mesh's devices under `jax.set_mesh` (a TPU topology's
    compile-only devices in the preflight), else JAX's default backend."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return device.platform if device is not None else jax.default_backend()


def use_splash(seq_len: int) -> bool:
    """Whether a step over rows of `seq_len` tokens takes the splash path: on TPU, when a block fits."""
    return target_platform() == "tpu" and block_size(seq_len) is not None


def _kernel(seq_len: int, heads: int, window: int | None, interpret: bool) -> Any:
    """Splash attention for one example's `heads` query heads: causal, within `window` tokens back when
    given. Built inside the trace that uses it (its mask tables become that trace's constants); the numpy
    work on the mask is cached by splash itself."""
    shape = (seq_len, seq_len)
    mask = mask_lib.CausalMask(shape) if window is None else mask_lib.LocalMask(shape, (window - 1, 0), offset=0)
    blocks = block_sizes(seq_len)
    return splash.make_splash_mha(
        mask_lib.MultiHeadMask([mask] * heads), block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret
    )


def splash_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, window: int | None, btnh: tuple[Any, ...]
) -> jax.Array:
    """softmax(q k^T) v per example of each row: q [B, T, N, H], k and v [B, T, K, H] (N a multiple of K),
    segment_ids [B, T]. Under a mesh, each device runs the kernel on its rows and heads (`btnh`: the
    activations' partition axes, sequence unsharded)."""
    interpret = target_platform() != "tpu"
    seq_len = q.shape[1]

    def local(q: jax.Array, k: jax.Array, v: jax.Array, ids: jax.Array) -> jax.Array:
        kernel = _kernel(seq_len, q.shape[1], window, interpret)
        out: jax.Array = jax.vmap(lambda q, k, v, s: kernel(q, k, v, splash.SegmentIds(q=s, kv=s)))(q, k, v, ids)
        return out

    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # the kernel's [heads, T, H] per example
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out = local(q, k, v, segment_ids)
    else:
        batch, seq, heads, _ = (a if a in mesh.axis_names else None for a in btnh)
        if seq is not None:
            raise ValueError(f"splash attention here keeps the sequence whole; activations shard it over {seq!r}")
        P = jax.sharding.PartitionSpec
        qkv = P(batch, heads, None, None)  # type: ignore[no-untyped-call]
        ids = P(batch, None)  # type: ignore[no-untyped-call]
        out = jax.shard_map(local, in_specs=(qkv, qkv, qkv, ids), out_specs=qkv, check_vma=False)(q, k, v, segment_ids)
    return out.transpose(0, 2, 1, 3)


def name(x: jax.Array, what: str) -> jax.Array:
    """`x` named for remat's saveAttention policy (remat.py: ATTENTION_SAVES); the identity otherwise."""
    out: jax.Array = checkpoint_name(x, f"attention_{what}")  # type: ignore[no-untyped-call]
    return out


def named(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    return name(q, "q"), name(k, "k"), name(v, "v")


def for_model(model: Any, attention_mask: Any) -> Any:
    """The attention mask as `model` takes it: segment ids become the dense packing mask for a model whose
    attention modules are Tunix's own (not installed: a model loaded outside the trainer). Decided at trace
    time."""
    if not isinstance(attention_mask, Segments):
        return attention_mask
    ours = tuple(_segment_attention().values())
    if any(isinstance(m, ours) for _, m in model.iter_modules()):
        return attention_mask
    return dense_mask(attention_mask.ids)


def dense_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T, T] bool from segment ids [B, T]: causal, within one example; padding (0) sees nothing."""
    t = segment_ids.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return same & causal[None] & (segment_ids[:, None, :] != 0)


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch -> the keyword arguments of the loss functions (model/loss.py). The model's attention mask
    is the segment ids themselves where the step is traced for TPU (splash attention), else
    the dense mask."""
    segment_ids = batch["segment_ids"]
    inputs = {
        "input_tokens": batch["input_tokens"],
        "input_mask": batch["input_mask"],
        "positions": batch["positions"],
        "attention_mask": (Segments(segment_ids) if use_splash(segment_ids.shape[-1]) else dense_mask(segment_ids)),
    }
    for extra in ("loss_denominator", *RL_ARRAYS):
        if extra in batch:
            inputs[extra] = batch[extra]
    return inputs


def _segment_attention() -> dict[type, type]:
    """Tunix's attention module of each family -> ours (the family's `segment_attention`)."""
    return dict(f.segment_attention() for f in families.FAMILIES.values())


def install(model: Any) -> Any:
    """Make every attention module of `model` that a family has a segment-id version of ours (Gemma 4's
    SegmentAttention, Qwen3's), in place; returns `model`."""
    table = _segment_attention()
    ours = tuple(table.values())
    found = 0
    for _, module in model.iter_modules():
        if type(module) in table:
            cls: Any = table[type(module)]  # a family's class (its missing_parts)
            missing = cls.missing_parts(module)
            if missing:
                raise TypeError(
                    f"{type(module).__module__}.{type(module).__name__} changed (no {missing}); "
                    f"update {cls.__module__} for this google-tunix version"
                )
            module.__class__ = cls
            found += 1
        elif isinstance(module, ours):
            found += 1
    if not found:
        raise TypeError(
            f"{type(model).__name__} has no Gemma 4 or Qwen3 attention module to install splash attention in"
        )
    return model
