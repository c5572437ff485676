"""The decode of evaluation samples and GRPO rollouts (train/decode.py): with its KV cache it gives the tokens
that whole-row forward passes give, greedy and sampled, on both tiny families with LoRA adapters that matter,
for prompts of different lengths (one longer than Gemma 4's sliding window, so the ring cache wraps), with the
rows split over fsdp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from tpuforge.api import LoraSpec
from tpuforge.api.catalog import model_shape
from tpuforge_workloads import families
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.train.decode import Decoder, left_padded, prompt_room

MAX_NEW = 24


def _adapted(model_dir: Path, mesh: Any) -> Any:
    text = families.read_decoder(str(model_dir))
    targets = list(model_shape(model_dir.name).lora_targets)
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(model_dir, text, families.of(text).tunix_config(text), mesh)
        spec = LoraSpec(rank=4, alpha=8.0, dropout=0.0, target_modules=targets)
        model = lora.apply_lora(base, spec, mesh, seed=0)
        stored = nnx.state(model, nnx.LoRAParam)
        keys = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(stored))))
        nnx.update(model, jax.tree.map(lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape), stored))
    return model


def _prompts(lengths: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(10, 500, n).astype(np.int32) for n in lengths]


@pytest.mark.parametrize(
    ("model_fixture", "lengths"),
    [("tiny_model_dir", (5, 70, 12, 33)), ("tiny_qwen3_model_dir", (9, 3, 20, 14))],
)
def test_the_cached_decode_gives_the_tokens_of_whole_row_passes(
    model_fixture: str, lengths: tuple[int, ...], request: pytest.FixtureRequest, jax_devices: Any
) -> None:
    mesh = make_mesh(2, 1, jax_devices[:2])
    model = _adapted(request.getfixturevalue(model_fixture), mesh)
    prompts = _prompts(lengths)
    tokens, counts = left_padded(prompts, prompt_room(prompts), 0)
    key = jax.random.key(7)
    with jax.set_mesh(mesh):
        cached, whole = Decoder(mesh, MAX_NEW), Decoder(mesh, MAX_NEW, kv_cache=False)
        for temperature in (0.0, 1.0):
            got = cached(model, tokens, counts, temperature, key)
            want = whole(model, tokens, counts, temperature, key)
            assert got.shape == (len(prompts), MAX_NEW)
            np.testing.assert_array_equal(got, want)
    # The adapters are in the decode: without them the greedy answers differ.
    with jax.set_mesh(mesh):
        nnx.update(model, jax.tree.map(lambda x: x * 0, nnx.state(model, nnx.LoRAParam)))
        assert not np.array_equal(Decoder(mesh, MAX_NEW)(model, tokens, counts), got)


def test_prompts_are_left_padded_into_a_room_rounded_up() -> None:
    prompts = [np.array([4, 5, 6], np.int32), np.array([7], np.int32)]
    assert prompt_room(prompts) == 64 and prompt_room(prompts, at_least=65) == 128
    tokens, lengths = left_padded(prompts, 4, pad=0, rows=3)
    np.testing.assert_array_equal(tokens, [[0, 4, 5, 6], [0, 0, 0, 7], [0, 4, 5, 6]])
    np.testing.assert_array_equal(lengths, [3, 1, 3])
    with pytest.raises(ValueError, match="does not fit the decode's room of 2"):
        left_padded(prompts, 2, pad=0)
