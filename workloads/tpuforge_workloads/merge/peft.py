"""The unmerged adapter in PEFT's format, for multi-LoRA serving: adapter_model.safetensors and
adapter_config.json, in a directory of their own (<output>/adapter, committed apart from the merged model).

Tensors are named base_model.model.<HF module>.lora_A.weight (rank, in) and .lora_B.weight (out, rank), so
that W' = W + (lora_alpha / r) * lora_B @ lora_A, the same update the merge applies. kv_einsum's one A
becomes the lora_A of both k_proj and v_proj.

target_modules names the module types (q_proj, ...) for a text-only model. On the multimodal checkpoint the
vision tower has modules of the same names (wrappers PEFT cannot adapt), so there it is a regular expression
that PEFT matches against full module names: the text decoder's modules only. vLLM takes the modules from the
tensor names.
"""

from __future__ import annotations

import json
import re
from itertools import groupby

from tpuforge_workloads.merge.mapping import LoraTarget, peft_factors
from tpuforge_workloads.merge.plan import MergePlan
from tpuforge_workloads.merge.safetensors_io import OutTensor, encode_header
from tpuforge_workloads.merge.stream import StagedFile, as_bytes, open_staged, write_small
from tpuforge_workloads.model.adapters import CONFIG_FILE, WEIGHTS_FILE, AdapterInfo


def peft_modules(target: LoraTarget) -> list[str]:
    """The HF modules a target's factors are written for: k_proj and v_proj on a keys = values layer."""
    module = target.tensor.removesuffix(".weight")
    if target.module == "k_einsum":
        return [module, module.removesuffix(".k_proj") + ".v_proj"]
    return [module]


def peft_name(module: str, factor: str) -> str:
    return f"base_model.model.{module}.lora_{factor}.weight"


def target_modules(plan: MergePlan) -> list[str] | str:
    """PEFT's target_modules: module types, or for the multimodal layout a pattern over the decoder's modules."""
    kinds = sorted({m.split(".")[-1] for t in plan.targets for m in peft_modules(t)})
    if not plan.text.multimodal:
        return kinds
    return rf"{re.escape(plan.text.hf_prefix)}layers\.\d+\.(?:self_attn|mlp)\.(?:{'|'.join(kinds)})"


def adapter_config(plan: MergePlan) -> dict[str, object]:
    lora = plan.config.lora
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": plan.config.base_model_uri,
        "r": plan.lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": target_modules(plan),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
        "init_lora_weights": True,
    }


def adapter_info(plan: MergePlan) -> AdapterInfo:
    """What the adapter was made from; its commit manifest's metadata."""
    return AdapterInfo(
        model_name=plan.config.model_name,
        base_model_uri=plan.config.base_model_uri,
        base_config_sha256=plan.base_config_sha256,
        checkpoint_uri=plan.config.checkpoint_uri,
        step=plan.lora.step,
        rank=plan.lora.rank,
        alpha=plan.config.lora.alpha,
    )


def write_adapter(plan: MergePlan, output: str, staging: str) -> list[StagedFile]:
    """The adapter's files, staged under `staging` for the adapter directory `output`."""
    targets = sorted(plan.targets, key=lambda t: (t.layer, t.tensor))
    rank = plan.lora.rank
    tensors = []
    for t in targets:
        for m in peft_modules(t):
            tensors.append(OutTensor(peft_name(m, "A"), "F32", (rank, t.in_features)))
            tensors.append(OutTensor(peft_name(m, "B"), "F32", (t.out_features, rank)))
    header = encode_header(tensors)
    f = open_staged(output, staging, WEIGHTS_FILE, len(header) + sum(x.nbytes for x in tensors))
    try:
        f.write(header)
        for layer, group in groupby(targets, key=lambda t: t.layer):
            params = plan.lora.layer(layer)  # one restore per layer
            for t in group:
                lora_a, lora_b = peft_factors(t, *params[t.module])
                for _ in peft_modules(t):
                    f.write(as_bytes(lora_a))
                    f.write(as_bytes(lora_b))
        f.writer.close()
    except BaseException:
        f.writer.discard()
        raise
    config = (json.dumps(adapter_config(plan), indent=2) + "\n").encode()
    return [f, write_small(output, staging, CONFIG_FILE, config)]
