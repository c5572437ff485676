"""Checks of a published (not yet committed) output.

spot_check (always, cheap): a few rows of a few merged tensors are read back from the output and compared
with the same rows recomputed in float64 from the base and the LoRA factors; the start of one copied
tensor is compared byte for byte.

verify_logits (`--verify`, for tests and the demo; loads the whole model twice): transformers loads the
output as any user would (the multimodal Gemma4ForConditionalGeneration for a multimodal checkpoint), and its
logits on fixed tokens must match the JAX LoRA model's (base + adapters, unmerged): for a float32 model to 1e-4
with the same argmax; for a bfloat16 one, which the JAX model computes in bfloat16, to 8% of the largest logit
with the same argmax on 95% of positions (near-ties flip under rounding). On gemma4-tiny-mm the base alone
differs by 3.3% (transformers in float32 against Tunix in bfloat16) and the merged model by 5.3%; a wrong
mapping is off by the logits' own size, and the base without its adapters fails the check.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tpuforge_workloads import families, storage
from tpuforge_workloads.families.decoder import read_config
from tpuforge_workloads.merge.mapping import LoraTarget, peft_factors
from tpuforge_workloads.merge.plan import MergePlan
from tpuforge_workloads.merge.safetensors_io import FLOAT_DTYPES, ITEM_SIZES

log = logging.getLogger(__name__)
LOGIT_TOLERANCE = 1e-4  # float32: absolute, every logit; and the same argmax everywhere
# bfloat16: the JAX model computes in bfloat16 and transformers here in float32, and the merge rounds base +
# delta to bfloat16, which the unmerged model never does; the error grows along the sequence, so one logit
# of 16k may be far off while the rest agree. The check is statistical, over 256 positions (4 rows of 64):
# the RMS of the difference within 15% of the logits' RMS (a correct gemma4-tiny-mm merge: 5.2%; the base
# without its adapters: 94%), and the same argmax on 85% of positions (after 100 steps on gemma4-tiny-mm
# rounding swapped close top-two logits at 2 of 32 positions).
BF16_RELATIVE_RMS = 0.15
BF16_SAME_ARGMAX = 0.85
_COPY_PROBE_BYTES = 1 << 16


class VerifyError(RuntimeError):
    """The output does not hold what the merge meant to write."""


def output_location(plan: MergePlan, tensor: str) -> tuple[str, int]:
    """(shard file name, byte offset of the tensor's data) in the output."""
    for shard in plan.shards:
        offset = len(shard.header)
        for t in shard.tensors:
            if t.name == tensor:
                return shard.name, offset
            offset += t.nbytes
    raise KeyError(tensor)


def _row(uri: str, offset: int, row: int, cols: int, dtype: str) -> np.ndarray:
    size = cols * ITEM_SIZES[dtype]
    return np.frombuffer(storage.read_range(uri, offset + row * size, size), dtype=FLOAT_DTYPES[dtype]).astype(
        np.float64
    )


def _check_target(plan: MergePlan, output: str, target: LoraTarget) -> None:
    job = plan.jobs[target.tensor]
    shard, offset = output_location(plan, target.tensor)
    out_uri = storage.join(output, shard)
    lora_a, lora_b = (x.astype(np.float64) for x in peft_factors(target, *plan.lora.layer(target.layer)[target.module]))
    rows, cols = job.source.shape
    eps_out = float(np.finfo(FLOAT_DTYPES[job.out.dtype]).eps)
    eps_f32 = float(np.finfo(np.float32).eps)
    for r in sorted({0, rows // 2, rows - 1}):
        base = _row(job.source.file, job.source.start, r, cols, job.source.dtype)
        got = _row(out_uri, offset, r, cols, job.out.dtype)
        want = base + plan.scale * (lora_b[r] @ lora_a)
        # Rounding to the output dtype, plus float32 accumulation over the rank.
        tol = eps_out * np.abs(want) + 8 * eps_f32 * (np.abs(base) + plan.scale * (np.abs(lora_b[r]) @ np.abs(lora_a)))
        bad = np.abs(got - want) > tol + 1e-30
        if bad.any():
            i = int(np.argmax(bad))
            raise VerifyError(
                f"{out_uri}: {target.tensor} row {r} column {i} is {got[i]!r}, expected {want[i]!r} "
                f"(base {base[i]!r} + LoRA delta): the merged tensor is wrong"
            )


def spot_check(plan: MergePlan, output: str) -> None:
    targets = plan.targets
    for target in {id(t): t for t in (targets[0], targets[len(targets) // 2], targets[-1])}.values():
        _check_target(plan, output, target)
    copied = next((j for j in plan.jobs.values() if j.is_byte_copy), None)
    if copied is not None:
        shard, offset = output_location(plan, copied.out.name)
        n = min(copied.source.nbytes, _COPY_PROBE_BYTES)
        if storage.read_range(storage.join(output, shard), offset, n) != storage.read_range(
            copied.source.file, copied.source.start, n
        ):
            raise VerifyError(f"{output}/{shard}: {copied.out.name} differs from the base: copy is wrong")
    log.info("spot check passed (%d merged tensors, 1 copied tensor)", min(3, len(targets)))


def local_copy(output: str, names: list[str], tmp: Path) -> Path:
    """A local directory with the output's files (the output itself when it is local)."""
    if not storage.is_gcs(output):
        return Path(output)
    for name in names:
        storage.download_file(storage.join(output, name), tmp / name)
    return tmp


def special_ids(config: Mapping[str, Any]) -> set[int]:
    """The token ids config.json names (`*_token_id`, `*_token_index`, at the top and in text_config): bos, eos
    and pad, and on the multimodal checkpoint the image, video and audio markers, which transformers' multimodal
    class treats otherwise than text (an image token's position attends both ways) and training data never
    holds."""
    out: set[int] = set()
    for section in (config, config.get("text_config") or {}):
        for key, value in section.items():
            if key.endswith(("_token_id", "_token_index")):
                out.update(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int))
    return out


def fixed_tokens(config: Mapping[str, Any], batch: int = 4, length: int = 64) -> np.ndarray:
    """The same rows of ordinary tokens for every check of a model (none of its special_ids)."""
    text = families.parse_config(config)
    ordinary = np.setdiff1d(np.arange(text.vocab_size), sorted(special_ids(config)))
    return np.random.default_rng(1234).choice(ordinary, size=(batch, length)).astype(np.int64)


def hf_model_class(model_dir: Path) -> Any:
    """The transformers class users load the model with: the multimodal Gemma4ForConditionalGeneration (through
    AutoModelForImageTextToText) for a checkpoint whose config nests text_config, else the causal LM."""
    import json

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = json.loads((model_dir / "config.json").read_text())
    return AutoModelForImageTextToText if "text_config" in config else AutoModelForCausalLM


def hf_logits(model_dir: Path, tokens: np.ndarray) -> np.ndarray:
    """Logits of the merged output as transformers computes them, in float32."""
    import torch

    model = hf_model_class(model_dir).from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(tokens), attention_mask=torch.ones_like(torch.from_numpy(tokens)))
    return np.asarray(out.logits.float().numpy())


def compare_logits(got: np.ndarray, want: np.ndarray, what: str, dtype: str = "float32") -> float:
    """Max |difference|; raises VerifyError past the model dtype's tolerance (see LOGIT_TOLERANCE)."""
    diff = float(np.max(np.abs(got - want)))
    same_argmax = float(np.mean(np.argmax(got, -1) == np.argmax(want, -1)))
    if dtype == "float32":
        if diff > LOGIT_TOLERANCE or same_argmax < 1.0:
            raise VerifyError(
                f"{what}: max |logit diff| {diff:.3g} (limit {LOGIT_TOLERANCE:.3g} for float32), same argmax on "
                f"{same_argmax:.0%} of positions (needs all): the merged model does not compute what the LoRA "
                "model does"
            )
        return diff
    rms = float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2)))
    if rms > BF16_RELATIVE_RMS or same_argmax < BF16_SAME_ARGMAX:
        raise VerifyError(
            f"{what}: logit difference {rms:.1%} of the logits' RMS (limit {BF16_RELATIVE_RMS:.0%} for {dtype}; max "
            f"|diff| {diff:.3g}), same argmax on {same_argmax:.0%} of positions (needs {BF16_SAME_ARGMAX:.0%}): "
            "the merged model does not compute what the LoRA model does"
        )
    return diff


def lora_model_logits(plan: MergePlan, tokens: np.ndarray) -> np.ndarray:
    """Logits of the JAX LoRA model the merge started from: the base plus the step's adapters, unmerged."""
    from tpuforge_workloads.model import lora

    model, _ = lora.load_lora_model(plan.config.base_model_uri, plan.config.checkpoint_uri, plan.lora.step)
    return lora.logits(model, tokens)


def verify_logits(plan: MergePlan, output: str, names: list[str]) -> float:
    tokens = fixed_tokens(read_config(plan.config.base_model_uri))
    want = lora_model_logits(plan, tokens)
    with tempfile.TemporaryDirectory(prefix="merge-verify-") as tmp:
        got = hf_logits(local_copy(output, names, Path(tmp)), tokens)
    diff = compare_logits(got, want, f"{output} vs the JAX LoRA model", plan.text.dtype)
    log.info("verify passed: max |logit diff| %.3g", diff)
    return diff
