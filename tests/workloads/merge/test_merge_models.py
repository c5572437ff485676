"""The merged tiny Gemma 4 and Qwen3 in the real consumers: transformers' logits against the JAX LoRA model, Tunix's own
safetensors loader, PEFT loading the adapter; and Qwix's parameter layout against what the merge reads."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.adapters import save_lora_checkpoint
from tests.fixtures.merge_inputs import DELTA_EINSUM  # Qwix's LoRA einsums, in Tunix's layout
from tpuforge.api import LoraSpec
from tpuforge.api.catalog import model_shape
from tpuforge.api.configs import MergeConfig
from tpuforge.api.constants import ADAPTER_SUBDIR
from tpuforge_workloads import families
from tpuforge_workloads.families.decoder import Decoder, read_config
from tpuforge_workloads.families.gemma4 import tiny as tiny_model
from tpuforge_workloads.families.qwen3 import tiny as tiny_qwen3
from tpuforge_workloads.merge import synthetic, verify
from tpuforge_workloads.merge.lora_checkpoint import LoraCheckpoint
from tpuforge_workloads.merge.merge import run_merge
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.adapters import read_adapter_manifest
from tpuforge_workloads.model.mesh import MESH_AXES
from tpuforge_workloads.storage import commit

# Tunix reads parameters with `.value`, which flax deprecates: one warning per access.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SPEC = LoraSpec(rank=4, alpha=8.0, dropout=0.0)
STEP = 3
# Qwix's LoRA delta of each Tunix Qwen3 module, in its weight's layout (Gemma 4's: DELTA_EINSUM).
QWEN3_DELTA_EINSUM = {
    **dict.fromkeys(("q_proj", "k_proj", "v_proj"), "Dr,rNH->DNH"),
    "o_proj": "NHr,rD->NHD",
    **dict.fromkeys(("gate_proj", "up_proj"), "Dr,rF->DF"),
    "down_proj": "Fr,rD->FD",
}


@dataclasses.dataclass
class Trained:
    name: str  # catalog id
    base: Path
    ckpt: Path
    text: Decoder
    spec: LoraSpec  # SPEC on the family's LoRA targets
    model: Any  # the JAX LoRA model
    tokens: np.ndarray
    logits: np.ndarray  # of the JAX LoRA model on `tokens`


def _flat(state: Any) -> dict[str, np.ndarray]:
    return {
        "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path): np.asarray(v)
        for path, v in jax.tree_util.tree_flatten_with_path(state)[0]
    }


@pytest.fixture(scope="module", params=["gemma4-tiny", "gemma4-tiny-mm", "qwen3-tiny"])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The tiny base (text-only float32, and in the 31B's multimodal bfloat16 layout), Qwix adapters on every
    target with random B (training starts B at zero, which would hide any mapping error), saved by the
    trainer's checkpoint code with its manifest."""
    name = request.param
    root = tmp_path_factory.mktemp("trained")
    spec = SPEC.model_copy(update={"target_modules": list(model_shape(name).lora_targets)})
    if model_shape(name).family == "qwen3":
        tiny_qwen3.write(str(root / "base"), model_name=name)
    else:
        tiny_model.write(str(root / "base"), model_name=name)
    text = families.read_decoder(str(root / "base"))
    model = save_lora_checkpoint(root / "base", root / "ckpt", name, spec, STEP)
    tokens = verify.fixed_tokens(read_config(str(root / "base")))
    return Trained(name, root / "base", root / "ckpt", text, spec, model, tokens, lora.logits(model, tokens))


def _config(trained: Trained, out: Path, **kw: Any) -> MergeConfig:
    return MergeConfig(
        model_name=trained.name,
        base_model_uri=str(trained.base),
        checkpoint_uri=str(trained.ckpt),
        output_uri=str(out),
        lora=trained.spec,
        **kw,
    )


@pytest.fixture(scope="module")
def merged(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("merged")
    # verify=True: the merge itself reloads the output with transformers and checks it against the JAX
    # LoRA model (rebuilt from the checkpoint) before committing.
    run_merge(_config(trained, out, write_adapter=True, verify=True))
    commit.require_complete(str(out), checksums=True)
    return out


def test_transformers_on_the_merged_output_matches_the_jax_lora_model(trained: Trained, merged: Path) -> None:
    """Through the class users load the model with: Gemma4ForConditionalGeneration for the multimodal layout."""
    got = verify.hf_logits(merged, trained.tokens)
    verify.compare_logits(got, trained.logits, "merged", trained.text.dtype)
    if trained.text.dtype == "float32":
        assert np.max(np.abs(got - trained.logits)) <= 1e-4
        assert np.array_equal(got.argmax(-1), trained.logits.argmax(-1))
    # The adapters matter: the base alone fails the same check.
    base = verify.hf_logits(trained.base, trained.tokens)
    with pytest.raises(verify.VerifyError):
        verify.compare_logits(base, trained.logits, "base", trained.text.dtype)


def test_tunix_loader_reads_the_output_back_exactly(trained: Trained, merged: Path) -> None:
    mesh = jax.make_mesh((1, 1), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)
    cfg = families.of(trained.text).tunix_config(trained.text)
    einsums = QWEN3_DELTA_EINSUM if trained.text.family == "qwen3" else DELTA_EINSUM
    with jax.set_mesh(mesh):
        loaded = _flat(nnx.state(checkpoint_read.load_model(merged, trained.text, cfg, mesh)))
    params = _flat(nnx.state(trained.model, nnx.Param))
    scale = SPEC.alpha / SPEC.rank
    base = {k: v for k, v in params.items() if "_lora_" not in k}
    assert set(loaded) == set(base)
    adapted = 0
    for name, value in base.items():
        module, param = name.removesuffix("/value").rsplit("/", 1)
        a = params.get(f"{module}/{param}_lora_a/value")
        if a is None:
            np.testing.assert_array_equal(loaded[name], value, err_msg=name)
            continue
        b = params[f"{module}/{param}_lora_b/value"]
        delta = np.einsum(einsums[module.rsplit("/", 1)[1]], a.astype(np.float64), b.astype(np.float64))
        want = value.astype(np.float64) + scale * delta
        adapted += 1
        if trained.text.dtype == "float32":
            np.testing.assert_allclose(loaded[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
            continue
        # bfloat16: rounded once to the output (half an epsilon), the factors possibly as the forward uses them
        # (rounded to bfloat16: an epsilon of the delta's magnitude).
        magnitude = np.einsum(
            einsums[module.rsplit("/", 1)[1]], np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64))
        )
        bound = 2.0**-8 * np.abs(want) + 2.0**-7 * scale * magnitude + 1e-12
        assert (np.abs(loaded[name].astype(np.float64) - want) <= bound).all(), name
    # Gemma 4: q, kv or k, o, gate, up, down; Qwen3: q, k, v, o, gate, up, down; on each of 2 layers.
    assert adapted == 2 * (7 if trained.text.family == "qwen3" else 6)


def test_peft_loads_the_adapter_to_the_merged_models_logits(trained: Trained, merged: Path, tmp_path: Path) -> None:
    import torch
    from peft import PeftModel

    # The adapter-only export: the committed adapter directory and nothing else.
    out = tmp_path / "adapter-only"
    run_merge(_config(trained, out, write_merged=False))
    _, info = read_adapter_manifest(str(out / ADAPTER_SUBDIR))
    assert (info.step, info.rank, info.alpha) == (STEP, SPEC.rank, SPEC.alpha)
    base = verify.hf_model_class(trained.base).from_pretrained(str(trained.base), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out / ADAPTER_SUBDIR))
    model.eval()
    # Every tensor of the adapter found its module (on the multimodal model: the decoder's, not the vision
    # tower's modules of the same names).
    adapted = {n for n, _ in model.named_parameters() if ".lora_" in n}
    # q, k, v, o, gate, up, down on the sliding layer; no v_proj on Gemma 4's global layer (keys = values).
    modules = 7 + 7 if trained.text.family == "qwen3" else 7 + 6
    assert len(adapted) == 2 * modules and not any("vision" in n for n in adapted)
    with torch.no_grad():
        got = model(input_ids=torch.from_numpy(trained.tokens)).logits.numpy()
    # In float32 to 1e-4 with the same argmax; in bfloat16 the merged model holds W + delta rounded once, so
    # they agree to the dtype's tolerance (0.16 of a largest logit of 6.8 measured).
    verify.compare_logits(got, verify.hf_logits(merged, trained.tokens), "PEFT vs merged", trained.text.dtype)
    verify.compare_logits(got, trained.logits, "PEFT vs JAX", trained.text.dtype)
    # The adapter beside the merged model is the same one, byte for byte.
    assert (
        read_adapter_manifest(str(merged / ADAPTER_SUBDIR))[0].files
        == commit.require_complete(str(out / ADAPTER_SUBDIR), checksums=True).files
    )


def test_qwix_layout_is_what_the_merge_and_the_synthetic_inputs_use(trained: Trained) -> None:
    if trained.text.family != "gemma4":
        pytest.skip("the synthetic inputs are Gemma 4's")
    saved = LoraCheckpoint.open(str(trained.ckpt))
    assert saved.step == STEP and saved.rank == SPEC.rank
    qwix = {k.removesuffix("/value"): v.shape for k, v in _flat(nnx.state(trained.model, nnx.LoRAParam)).items()}
    ours = {
        k.removesuffix("/value"): v.shape
        for k, v in _flat(synthetic.lora_tree(trained.text, SPEC.rank, SPEC.target_modules)).items()
    }
    assert ours == qwix
    read = {"/".join(p.a_path[:-2]): (p.a_shape, p.b_shape) for p in saved.params.values()}
    assert read == {k.rsplit("/", 1)[0]: (qwix[k], qwix[k[:-1] + "b"]) for k in qwix if k.endswith("_lora_a")}


def test_everything_but_the_adapted_weights_is_the_bases_byte_for_byte(trained: Trained, merged: Path) -> None:
    """The vision tower, its projector, norms and embeddings are copied, not rewritten; the config, tokenizer
    and chat template files are kept."""
    from safetensors import safe_open

    def tensors(root: Path) -> dict[str, bytes]:
        out = {}
        for path in sorted(root.glob("*.safetensors")):
            with safe_open(str(path), framework="numpy") as f:
                out.update({k: f.get_slice(k)[:].tobytes() for k in f.keys()})  # noqa: SIM118
        return out

    base, out = tensors(trained.base), tensors(merged)
    assert set(out) == set(base)
    changed = {k for k in base if base[k] != out[k]}
    adapted = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert changed == {k for k in base if ".language_model." in k or k.startswith("model.layers.")} & {
        k for k in base if k.removesuffix(".weight").rsplit(".", 1)[-1] in adapted and "vision" not in k
    }
    assert len(changed) == (14 if trained.text.family == "qwen3" else 13)  # Gemma 4's global layer: no v_proj
    if trained.text.multimodal:
        assert sum(k.startswith(("model.vision_tower.", "model.embed_vision.")) for k in base) == 16
    for name in (p.name for p in trained.base.iterdir() if not p.name.endswith(".safetensors")):
        if name != "model.safetensors.index.json":
            assert (merged / name).read_bytes() == (trained.base / name).read_bytes(), name
