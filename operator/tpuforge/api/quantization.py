"""QLoRA's base quantization (spec.lora.baseQuantization): which tile each quantized type uses, decided from the
model's shape alone, so that the operator refuses what the trainer could not build and both agree on the tile."""

from __future__ import annotations

from collections.abc import Iterable

# int4 scales each tile of the contracted axis on its own (one scale per channel loses too much at 4 bits on
# a wide axis); the largest of these that divides every contracted size of the targeted weights.
INT4_TILE_SIZES = (128, 64, 32)


def tile_size(quantization: str, contracted: Iterable[int]) -> int | None:
    """The tile along the innermost contracted axis for `quantization`: None for int8 (per channel) and
    none; for int4 the largest of INT4_TILE_SIZES dividing every size in `contracted`. Raises ValueError
    when int4 has no such tile."""
    if quantization != "int4":
        return None
    sizes = sorted(set(contracted))
    for tile in INT4_TILE_SIZES:
        if all(s % tile == 0 for s in sizes):
            return tile
    raise ValueError(f"int4 needs the contracted sizes {sizes} to be multiples of {INT4_TILE_SIZES[-1]}")


def contracted_sizes(embed_dim: int, hidden_dim: int, head_dims: Iterable[int]) -> tuple[int, ...]:
    """The innermost contracted axis of each targeted weight: the model width (q/k/v projections, gate and
    up), the MLP width (down) and the head dimension (the attention output's heads x head dim)."""
    return (embed_dim, hidden_dim, *head_dims)
