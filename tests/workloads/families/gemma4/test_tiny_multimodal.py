"""gemma4-tiny-mm, the tiny decoder in the real 31B checkpoint's layout: transformers loads it with its Gemma 4
multimodal class, every tensor accounted for, and the trainer's Tunix load computes the same logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from tpuforge.api.catalog import model_shape
from tpuforge_workloads.families import decoder
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.families.gemma4 import model as gemma4_model
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.mesh import make_mesh

pytestmark = pytest.mark.slow


def test_the_layout_is_the_31b_checkpoints(tiny_mm_model_dir: Path) -> None:
    config = json.loads((tiny_mm_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma4ForConditionalGeneration"] and "vision_config" in config
    text = gemma4_config.parse_config(config)
    gemma4_config.check_against_catalog(text, model_shape("gemma4-tiny-mm"), "tiny-mm")
    assert text.multimodal and text.dtype == "bfloat16" and text.hf_prefix == "model.language_model."
    index = json.loads((tiny_mm_model_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == sorted(p.name for p in tiny_mm_model_dir.glob("*.safetensors")) and len(shards) == 2
    names: list[str] = []
    for shard in shards:
        header = [t.name for t in checkpoint_read.read_header(str(tiny_mm_model_dir / shard))]
        assert all(index["weight_map"][n] == shard for n in header)
        names += header
    gemma4_model.check_tensors(names, text, "tiny-mm")
    assert any(n.startswith("model.vision_tower.") for n in names)
    assert "model.embed_vision.embedding_projection.weight" in names
    for name in ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tiny_mm_model_dir / name).is_file(), name
    # The processor (loaded by vLLM and AutoProcessor: test_vllm_lora) and vLLM agree on tokens per image.
    processor = json.loads((tiny_mm_model_dir / "processor_config.json").read_text())
    assert processor["processor_class"] == "Gemma4Processor"
    soft = config["vision_config"]["default_output_length"]
    assert processor["image_seq_length"] == processor["image_processor"]["max_soft_tokens"] == soft
    # Every token Gemma4Processor looks up by name is in the vocabulary, with the ids config.json gives.
    vocab = json.loads((tiny_mm_model_dir / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in vocab}
    named = json.loads((tiny_mm_model_dir / "tokenizer_config.json").read_text())
    for attr in ("boi_token", "eoi_token", "image_token", "boa_token", "eoa_token", "audio_token"):
        assert ids[named[attr]] < text.vocab_size, attr
    assert (ids[named["boi_token"]], ids[named["eoi_token"]]) == (config["boi_token_id"], config["eoi_token_id"])
    assert ids[named["image_token"]] == config["image_token_id"] and ids["<|video|>"] == config["video_token_id"]


def test_transformers_multimodal_class_and_the_tunix_load_agree(tiny_mm_model_dir: Path, jax_devices: Any) -> None:
    import torch
    from transformers import AutoModelForImageTextToText

    hf, info = AutoModelForImageTextToText.from_pretrained(
        str(tiny_mm_model_dir), dtype=torch.float32, output_loading_info=True
    )
    assert type(hf).__name__ == "Gemma4ForConditionalGeneration"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    text = gemma4_config.parse_config(decoder.read_config(str(tiny_mm_model_dir)))
    tokens = np.random.default_rng(0).integers(12, text.vocab_size, (2, text.sliding_window + 16))
    with torch.no_grad():
        want = hf.eval()(input_ids=torch.tensor(tokens)).logits.numpy()
    mesh = make_mesh(1, 4)
    with jax.set_mesh(mesh):
        model = checkpoint_read.load_model(tiny_mm_model_dir, text, gemma4_model.tunix_config(text), mesh)
        got = lora.logits(model, tokens)
    # The trainer computes in bfloat16 (the checkpoint's dtype); transformers here in float32.
    assert np.abs(got - want).max() < 0.15 * np.abs(want).max()
    assert np.mean(got.argmax(-1) == want.argmax(-1)) > 0.9


def test_train_merge_verify_and_export_on_the_multimodal_layout(
    tiny_mm_model_dir: Path, chat_dataset: Path, tmp_path: Path
) -> None:
    """The trainer CLI fine-tunes gemma4-tiny-mm (bfloat16 base), and the merge of its checkpoint passes the
    logit check through Gemma4ForConditionalGeneration and exports an adapter; the vision tower and the
    processor files come through untouched (byte for byte: test_merge_models)."""
    from tests.fixtures.models import TrainerProcess, tiny_train_config
    from tpuforge.api.configs import MergeConfig
    from tpuforge_workloads.merge.merge import run_merge
    from tpuforge_workloads.storage import commit

    config = tiny_train_config(
        str(tiny_mm_model_dir), str(chat_dataset), str(tmp_path / "ckpt"), max_steps=2, warmup_steps=1
    )
    config.model_name = "gemma4-tiny-mm"
    trainer = TrainerProcess(config, tmp_path / "train")
    assert trainer.run() == 0, trainer.output()
    out = tmp_path / "merged"
    run_merge(
        MergeConfig(
            model_name="gemma4-tiny-mm",
            base_model_uri=str(tiny_mm_model_dir),
            checkpoint_uri=config.checkpoint.uri,
            output_uri=str(out),
            lora=config.lora,
            write_adapter=True,
            verify=True,
        )
    )
    commit.require_complete(str(out), checksums=True)
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert isinstance(adapter["target_modules"], str) and "language_model" in adapter["target_modules"]
    assert (out / "chat_template.jinja").read_bytes() == (tiny_mm_model_dir / "chat_template.jinja").read_bytes()
