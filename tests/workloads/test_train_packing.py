"""Packing changes nothing but speed: the loss of packed rows equals the loss of the same examples padded
one per row, because the block-diagonal mask keeps examples apart and positions restart in each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx
from tokenizers import Tokenizer
from tunix.sft.peft_trainer import _default_loss_fn as tunix_loss

from tpuforge.api import LoraSpec
from tpuforge_workloads import gemma4, lora
from tpuforge_workloads.data import demo
from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.pipeline import BatchSpec, batches, model_inputs, pad_example, prepare_examples
from tpuforge_workloads.data.records import parse_line
from tpuforge_workloads.mesh import make_mesh

pytestmark = pytest.mark.slow
SEQ = 64


@pytest.fixture(scope="module")
def lora_model(tiny_model_dir: Path, jax_devices: Any) -> tuple[Any, jax.sharding.Mesh]:
    """The tiny model with adapters whose B is random, so that they take part in the loss."""
    text = gemma4.parse_config(gemma4.read_config(str(tiny_model_dir)))
    mesh = make_mesh(1, 4)
    with jax.set_mesh(mesh):
        base = gemma4.load_model(tiny_model_dir, text, gemma4.tunix_config(text), mesh)
    model = lora.apply_lora(base, LoraSpec(rank=4, alpha=8.0, dropout=0.0), mesh, seed=0)
    state = nnx.state(model, nnx.LoRAParam)
    rng = np.random.default_rng(0)
    nnx.update(
        model,
        jax.tree.map(lambda x: x + jax.numpy.asarray(rng.normal(0, 0.05, x.shape), x.dtype), state),
    )
    return model, mesh


@nnx.jit
def _jitted_loss(model: Any, batch: dict[str, Any]) -> Any:
    return tunix_loss(model, **model_inputs(batch))


def _loss(model: Any, mesh: jax.sharding.Mesh, batch: dict[str, np.ndarray]) -> float:
    """Tunix's PEFT loss (the one training minimises) on a batch, as the train step computes it."""
    with jax.set_mesh(mesh):
        return float(_jitted_loss(model, {k: jax.numpy.asarray(v) for k, v in batch.items()}))


def test_packed_loss_equals_unpacked_loss(lora_model: tuple[Any, jax.sharding.Mesh], tiny_model_dir: Path) -> None:
    model, mesh = lora_model
    encoder = ChatEncoder(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")))
    for loss_on in ("assistant", "all"):
        encoder.loss_on = loss_on  # type: ignore[assignment]
        records = [parse_line(json.dumps(r), "demo", i + 1) for i, r in enumerate(demo.records()[:24])]
        examples, _ = prepare_examples([r for r in records if r], encoder, SEQ, "drop", "demo")
        spec = BatchSpec(max_seq_len=SEQ, rows=4, packing=True, seed=0, pad_id=0, epochs=1)
        packed = next(iter(batches(examples, spec)))
        assert packed["segment_ids"].max() >= 2  # examples share rows

        # The same examples, one per row, in packing order.
        rows = []
        for tokens, segments in zip(packed["input_tokens"], packed["segment_ids"], strict=True):
            for seg in range(1, segments.max() + 1):
                ex = next(e for e in examples if np.array_equal(e["tokens"], tokens[segments == seg]))
                rows.append(pad_example(ex, SEQ, 0))
        unpacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
        assert unpacked["input_mask"].sum() == packed["input_mask"].sum()

        packed_loss = _loss(model, mesh, packed)
        unpacked_loss = _loss(model, mesh, unpacked)
        np.testing.assert_allclose(packed_loss, unpacked_loss, rtol=1e-5, err_msg=loss_on)

        # Without the block-diagonal mask, examples would see each other: the loss would change.
        leaky = dict(packed, segment_ids=(packed["segment_ids"] > 0).astype(np.int32))
        leaky["positions"] = np.tile(np.arange(SEQ, dtype=np.int32), (len(leaky["positions"]), 1))
        assert abs(_loss(model, mesh, leaky) - packed_loss) > 1e-3
