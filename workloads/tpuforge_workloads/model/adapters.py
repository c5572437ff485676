"""The exported LoRA adapter as readers see it: a committed directory <output>/adapter (PEFT format) whose
`_COMPLETE` manifest carries what the adapter was made from.

Shared by everything that takes an adapter from GCS: the evaluation, and the serving pods' adapter fetch.
Light on purpose (pydantic, storage, commit): it runs in the vLLM image too, where there is no JAX.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from tpuforge.api.constants import ADAPTER_SUBDIR, COMPLETE_MARKER
from tpuforge_workloads import storage
from tpuforge_workloads.storage import commit

KIND = "adapter"
WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
BASE_CONFIG_FILE = "config.json"
# An adapter's key and value projection factors on a text decoder layer (Gemma4ForCausalLM or the multimodal
# checkpoint's language model).
_KV_LORA = re.compile(
    r"^base_model\.model\.model\.(?:language_model\.)?layers\.(\d+)\.self_attn\.([kv])_proj\.lora_A\."
)


class AdapterError(RuntimeError):
    """An adapter directory that cannot be used; the message says why and what to do."""


class AdapterInfo(BaseModel):
    """The `metadata` of an adapter's `_COMPLETE` manifest."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    kind: Literal["adapter"] = "adapter"
    model_name: str = Field(description="Catalog id of the base model.")
    base_model_uri: str
    base_config_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the base's config.json.")
    checkpoint_uri: str
    step: int = Field(ge=0, description="The training checkpoint step the adapter holds.")
    rank: int = Field(ge=1)
    alpha: float

    def metadata(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


def adapter_uri(output_uri: str) -> str:
    """Where a merge job with output `output_uri` exports the adapter."""
    return storage.join(output_uri, ADAPTER_SUBDIR)


def config_sha256(model_uri: str) -> str:
    """sha256 of a model directory's config.json: what ties an adapter to the base it was trained on."""
    return hashlib.sha256(storage.read_bytes(storage.join(model_uri, BASE_CONFIG_FILE))).hexdigest()


def read_adapter_manifest(uri: str) -> tuple[commit.Manifest, AdapterInfo]:
    """The manifest of the committed adapter at `uri` and what it was made from. Raises AdapterError for a
    directory without `_COMPLETE` (an export that has not finished, or failed) or one that is not an adapter."""
    try:
        manifest = commit.read_manifest(uri)
    except commit.CommitError as e:
        raise AdapterError(f"adapter {uri}: {e}") from e
    if manifest is None:
        raise AdapterError(
            f"adapter {uri} has no {COMPLETE_MARKER} marker: the export has not finished or failed; wait for the "
            "FineTuneJob's merge step (or point at a committed adapter directory, <output>/adapter)"
        )
    if manifest.metadata.get("kind") != KIND:
        raise AdapterError(
            f"adapter {uri}: its {COMPLETE_MARKER} describes a {manifest.metadata.get('kind', 'merged model')!r}, "
            f"not an adapter; adapters live in <output>/{ADAPTER_SUBDIR}"
        )
    try:
        info = AdapterInfo.model_validate(manifest.metadata)
    except ValidationError as e:
        first = e.errors()[0]
        raise AdapterError(
            f"adapter {uri}: {COMPLETE_MARKER} metadata {'.'.join(str(x) for x in first['loc'])}: {first['msg']}; "
            "re-export the adapter with this version of tpuforge"
        ) from e
    missing = {WEIGHTS_FILE, CONFIG_FILE} - manifest.names()
    if missing:
        raise AdapterError(f"adapter {uri}: {COMPLETE_MARKER} lists no {', '.join(sorted(missing))}")
    return manifest, info


def keys_as_values_layers(base_config: Mapping[str, Any]) -> set[int]:
    """The base's decoder layers whose values are their keys (a k_proj and no v_proj): Gemma 4's full-attention
    layers under attention_k_eq_v, bar the KV-shared ones, which project neither."""
    text = base_config.get("text_config") or base_config
    if not text.get("attention_k_eq_v"):
        return set()
    types = list(text.get("layer_types") or [])
    first_shared = len(types) - int(text.get("num_kv_shared_layers") or 0)
    return {i for i, kind in enumerate(types[:first_shared]) if kind == "full_attention"}


def values_without_lora(tensor_names: Iterable[str], base_config: Mapping[str, Any]) -> list[int]:
    """The keys = values layers where an adapter changes k_proj and has no v_proj factors. HF computes values
    with k_proj there, so the update reaches them; vLLM loads the base k_proj into both the key and the value
    slot of its packed qkv_proj but gives the value slot only a LoRA named v_proj, so it would serve such an
    adapter with keys and values that disagree. tpuforge's export writes k_proj's factors under v_proj too."""
    projs: dict[int, set[str]] = {}
    for name in tensor_names:
        if m := _KV_LORA.match(name):
            projs.setdefault(int(m.group(1)), set()).add(m.group(2))
    shared = keys_as_values_layers(base_config)
    return sorted(layer for layer, p in projs.items() if layer in shared and p == {"k"})
