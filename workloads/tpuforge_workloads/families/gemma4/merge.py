"""Which HuggingFace tensors each of Gemma 4's Tunix LoRA modules stands for (merge/mapping.py reduces every
adapter to the PEFT form by this table).

| Tunix module     | A         | B           | HF tensor(s)                         |
|------------------|-----------|-------------|--------------------------------------|
| q_einsum         | (D, r)    | (r, N, h)   | self_attn.q_proj                     |
| kv_einsum        | (D, r)    | (r, 2, K, h)| self_attn.k_proj (B[:, 0]), v_proj (B[:, 1]): one shared A |
| k_einsum         | (D, r)    | (r, K, h)   | self_attn.k_proj; global layers with keys = values: no v_proj |
| attn_vec_einsum  | (N, h, r) | (r, D)      | self_attn.o_proj                     |
| gate/up_proj     | (D, r)    | (r, F)      | mlp.gate_proj / mlp.up_proj          |
| down_proj        | (F, r)    | (r, D)      | mlp.down_proj                        |
"""

from __future__ import annotations

# Tunix LoRA module -> (HF block, HF projections) it stands for (merge/mapping.py). kv_einsum's B stacks keys
# then values on its axis 1; k_einsum is a global layer's one projection when keys = values.
LORA_MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "q_einsum": ("self_attn", ("q_proj",)),
    "kv_einsum": ("self_attn", ("k_proj", "v_proj")),
    "k_einsum": ("self_attn", ("k_proj",)),
    "attn_vec_einsum": ("self_attn", ("o_proj",)),
    "gate_proj": ("mlp", ("gate_proj",)),
    "up_proj": ("mlp", ("up_proj",)),
    "down_proj": ("mlp", ("down_proj",)),
}
