"""What every model family's decoder shares: the error a bad base model raises, reading its config.json, and
the mesh checks that hold for any Tunix decoder (heads, MLP width and vocabulary over tp, the embedding axis
over fsdp). Each family has its folder beside this module; the registry is families/__init__.py."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tpuforge_workloads import storage

if TYPE_CHECKING:
    import jax


class ModelError(ValueError):
    """A base model the trainer cannot use; the message names the file or field and the fix."""


class Decoder(Protocol):
    """A text decoder's shape as config.json states it: the fields every family's parser gives."""

    @property
    def family(self) -> str: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def embed_dim(self) -> int: ...
    @property
    def hidden_dim(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def multimodal(self) -> bool: ...
    @property
    def layer_types(self) -> tuple[str, ...]: ...
    @property
    def hf_prefix(self) -> str: ...
    def head_counts(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class CombinedQkv:
    """How a family whose key mapping leaves each layer's q, k(, v) apart (Gemma 4's) combines them into the
    layer's attention weights; the checkpoint reader (model/checkpoint_read.py) asks the family for it."""

    part: Callable[[str], tuple[int, str] | None]  # (layer, "q" | "k" | "v") of such a mapped key, else None
    keys_are_values: Callable[[Any, int], bool]  # (decoder, layer): one projection stands for keys and values
    combine: Callable[[Mapping[str, Any], bool, Any], dict[str, Any]]  # (laid-out q/k/v, keys = values, xp)


def read_config(model_uri: str) -> dict[str, Any]:
    """config.json of the base model; a missing or unreadable file names the URI."""
    uri = storage.join(model_uri, "config.json")
    try:
        text = storage.read_text(uri)
    except storage.StorageError as e:
        raise ModelError(f"model.uri: cannot read {uri} ({e}); point model.uri at a HuggingFace model directory") from e
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelError(f"{uri}: not JSON ({e})") from e
    if not isinstance(raw, dict):
        raise ModelError(f"{uri}: expected a JSON object")
    return raw


def mesh_errors(text: Decoder, fsdp: int, tp: int) -> list[str]:
    """Why a (fsdp, tp) mesh cannot hold this model; empty when it can. Mirrors the models' sharding rules:
    heads, the MLP hidden axis and the vocabulary split over tp; the embedding axis over fsdp."""
    errors = []
    counts = text.head_counts()
    bad = {k: v for k, v in counts.items() if v % tp}
    if bad:
        fits = [d for d in range(1, text.num_heads + 1) if all(v % d == 0 for v in counts.values())]
        errors.append(
            f"mesh.tp={tp} does not divide the model's {', '.join(f'{v} {k}' for k, v in bad.items())}; "
            f"use tp in {fits}"
        )
    for what, size, axis, n in (
        ("intermediate_size", text.hidden_dim, "tp", tp),
        ("vocab_size", text.vocab_size, "tp", tp),
        ("hidden_size", text.embed_dim, "fsdp", fsdp),
    ):
        if size % n:
            errors.append(f"mesh.{axis}={n} does not divide the model's {what} {size}")
    return errors


def check_sharding(state: Any, mesh: jax.sharding.Mesh) -> None:
    """Every parameter's sharded axes must divide evenly over the mesh (JAX refuses uneven shards; better
    to name the parameter now than to fail halfway through loading). Works on abstract states too."""
    import jax
    from flax import nnx

    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    specs = jax.tree.leaves(nnx.get_partition_spec(state), is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    problems = []
    for (path, leaf), spec in zip(leaves, specs, strict=True):
        for dim, axes in zip(leaf.shape, spec, strict=False):
            names = axes if isinstance(axes, tuple) else (axes,)
            size = 1
            for a in names:
                if a is not None:
                    size *= mesh.shape[a]
            if dim % size:
                name = jax.tree_util.keystr(path, simple=True, separator=".").removesuffix(".value")
                problems.append(f"{name} {tuple(leaf.shape)}: axis of {dim} over {'x'.join(map(str, names))}={size}")
    if problems:
        raise ModelError(f"mesh {dict(mesh.shape)} does not divide the parameters: {'; '.join(problems[:5])}")
