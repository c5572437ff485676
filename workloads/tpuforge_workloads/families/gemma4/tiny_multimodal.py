"""`gemma4-tiny-mm`: the tiny decoder in the real 31B checkpoint's layout, so that the path users take (a
multimodal `Gemma4ForConditionalGeneration` checkpoint in bfloat16) runs in tests.

Against `gemma4-tiny` it differs only where the 31B differs: config.json nests the decoder's config under
`text_config` beside a `vision_config`; the decoder's tensors are under `model.language_model.`; a small vision
tower (`model.vision_tower.*`, one encoder layer) and its projector (`model.embed_vision.*`) sit beside it; every
tensor is bfloat16; the weights are two safetensors shards with `model.safetensors.index.json`; the tokenizer
has Gemma 4's image, audio and video tokens, named in tokenizer_config.json as the processor looks them up; the
chat template is also shipped as `chat_template.jinja`; `processor_config.json` configures transformers'
`Gemma4Processor` (image, video and audio sub-processors), which vLLM and `AutoProcessor` load. The decoder's
weights are gemma4-tiny's for the same seed, rounded to bfloat16.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tpuforge.api.catalog import ModelShape
from tpuforge_workloads import storage

IMAGE_TOKENS = ("<|image>", "<image|>", "<|image|>")  # begin, end, soft-token placeholder
AUDIO_TOKENS = ("<|audio>", "<audio|>", "<|audio|>")
VIDEO_TOKEN = "<|video|>"
# Gemma 4's tokenizer has these whatever the size: Gemma4Processor refuses a tokenizer without the audio
# markers (even for images) and adds the video token when it is missing, past the model's vocabulary.
MM_TOKENS = (*IMAGE_TOKENS, *AUDIO_TOKENS, VIDEO_TOKEN)
# The attribute names Gemma4Processor reads each token under (tokenizer_config.json keys ending in _token).
NAMED_TOKENS = {
    **dict(zip(("boi_token", "eoi_token", "image_token"), IMAGE_TOKENS, strict=True)),
    **dict(zip(("boa_token", "eoa_token", "audio_token"), AUDIO_TOKENS, strict=True)),
}
# Soft tokens per image: the smallest budget Gemma4ImageProcessor accepts (70, 140, 280, 560, 1120; the 31B
# ships 280). The vision config's default_output_length (vLLM's budget) and the processor's max_soft_tokens
# (transformers') must agree, as they do in the real checkpoint.
SOFT_TOKENS = 70
PATCH, POOL = 4, 2
# A vision tower as small as transformers' Gemma 4 vision encoder allows: 1 layer, width 32, 2 heads of 16.
VISION: dict[str, Any] = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "patch_size": PATCH,
    "pooling_kernel_size": POOL,
    # Patch positions per axis: the longest side the processor may produce is SOFT_TOKENS x POOL patches
    # (an extreme aspect ratio keeps POOL patches across).
    "position_embedding_size": SOFT_TOKENS * POOL,
    # Soft tokens per image: vLLM's Gemma 4 sizes its multimodal budget from it and transformers' config has
    # no default for it, so a checkpoint without it does not load in vLLM.
    "default_output_length": SOFT_TOKENS,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
}
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def hf_config(shape: ModelShape, text: dict[str, Any], first_special: int) -> dict[str, Any]:
    """config.json of a Gemma4ForConditionalGeneration around the text decoder's config `text`."""
    ids = {t: first_special + i for i, t in enumerate(MM_TOKENS)}
    boi, eoi, image = (ids[t] for t in IMAGE_TOKENS)
    inner = {k: v for k, v in text.items() if k != "architectures"}
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "dtype": shape.dtype,
        "text_config": {**inner, "dtype": shape.dtype},
        "vision_config": VISION,
        "audio_config": None,
        "boi_token_id": boi,
        "eoi_token_id": eoi,
        "image_token_id": image,
        "video_token_id": ids[VIDEO_TOKEN],
        "audio_token_id": None,
        "boa_token_id": None,
        "eoa_token_index": None,
        "tie_word_embeddings": True,
    }


def processor_config() -> dict[str, Any]:
    """processor_config.json: Gemma4Processor with its image, video and audio sub-processors, each with the
    values transformers' classes default to except the vision tower's patch and pooling sizes and the soft-token
    budget (as the real checkpoint's differ from the class defaults only where its vision tower does)."""
    rgb = {
        "do_convert_rgb": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_resize": True,
        "resample": 3,  # bicubic
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "patch_size": PATCH,
        "pooling_kernel_size": POOL,
        "max_soft_tokens": SOFT_TOKENS,
    }
    return {
        "processor_class": "Gemma4Processor",
        "image_seq_length": SOFT_TOKENS,
        "audio_seq_length": 750,
        "audio_ms_per_token": 40,
        "image_processor": {"image_processor_type": "Gemma4ImageProcessor", **rgb, "do_normalize": False},
        "video_processor": {
            "video_processor_type": "Gemma4VideoProcessor",
            **rgb,
            "do_normalize": True,
            "do_sample_frames": True,
            "num_frames": 32,
            "return_metadata": False,
        },
        "feature_extractor": {
            "feature_extractor_type": "Gemma4AudioFeatureExtractor",
            "sampling_rate": 16000,
            "feature_size": 128,
            "frame_length": 320,
            "hop_length": 160,
            "fft_length": 512,
            "min_frequency": 0.0,
            "max_frequency": 8000.0,
            "mel_floor": 0.001,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": True,
        },
    }


def vision_weights(shape: ModelShape, seed: int) -> dict[str, np.ndarray]:
    """The vision tower's and projector's tensors, random (float32; rounded when written)."""
    rng = np.random.default_rng(seed + 1)
    h, f, hd = VISION["hidden_size"], VISION["intermediate_size"], VISION["head_dim"]
    heads, kv = VISION["num_attention_heads"], VISION["num_key_value_heads"]

    def normal(*dims: int) -> np.ndarray:
        return rng.normal(0.0, dims[-1] ** -0.5, dims).astype(np.float32)

    def around_one(n: int) -> np.ndarray:
        return rng.uniform(0.5, 1.5, n).astype(np.float32)

    v = "model.vision_tower."
    out = {
        v + "patch_embedder.position_embedding_table": normal(2, VISION["position_embedding_size"], h),
        v + "patch_embedder.input_proj.weight": normal(h, 3 * VISION["patch_size"] ** 2),
    }
    for i in range(VISION["num_hidden_layers"]):
        a = f"{v}encoder.layers.{i}."
        out[a + "self_attn.q_proj.linear.weight"] = normal(heads * hd, h)
        out[a + "self_attn.k_proj.linear.weight"] = normal(kv * hd, h)
        out[a + "self_attn.v_proj.linear.weight"] = normal(kv * hd, h)
        out[a + "self_attn.o_proj.linear.weight"] = normal(h, heads * hd)
        out[a + "self_attn.q_norm.weight"] = around_one(hd)
        out[a + "self_attn.k_norm.weight"] = around_one(hd)
        out[a + "mlp.gate_proj.linear.weight"] = normal(f, h)
        out[a + "mlp.up_proj.linear.weight"] = normal(f, h)
        out[a + "mlp.down_proj.linear.weight"] = normal(h, f)
        for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            out[f"{a}{norm}_layernorm.weight"] = around_one(h)
    out["model.embed_vision.embedding_projection.weight"] = normal(shape.embed_dim, h)
    return out


def write_weights(out: str, weights: dict[str, np.ndarray]) -> None:
    """bfloat16 tensors in two shards (the first layer's decoder tensors, the embedding and the vision tower;
    then the rest) and the index that maps each tensor to its shard, as HuggingFace writes sharded models."""
    import ml_dtypes
    from safetensors.numpy import save_file

    groups: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] = ({}, {})
    for name, w in weights.items():
        first = ".layers.0." in name or "embed_tokens" in name or name.startswith("model.vision_tower.")
        groups[0 if first else 1][name] = w.astype(ml_dtypes.bfloat16)
    index = {
        "metadata": {"total_size": sum(w.nbytes for g in groups for w in g.values())},
        "weight_map": {name: shard for shard, g in zip(SHARDS, groups, strict=True) for name in sorted(g)},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for shard, group in zip(SHARDS, groups, strict=True):
            path = Path(tmp) / shard
            save_file(group, str(path), metadata={"format": "pt"})
            storage.upload_file(path, storage.join(out, shard))
    storage.write_text(storage.join(out, "model.safetensors.index.json"), json.dumps(index, indent=2))
