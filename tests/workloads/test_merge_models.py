"""The merged tiny Gemma 4 in the real consumers: transformers' logits against the JAX LoRA model, Tunix's own
safetensors loader, PEFT loading the adapter; and Qwix's parameter layout against what the merge reads."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from tpuforge.api import LoraSpec
from tpuforge.api.configs import MergeConfig
from tpuforge.api.constants import ADAPTER_SUBDIR
from tpuforge_workloads import commit, gemma4, lora, tiny_model
from tpuforge_workloads.adapters import read_adapter_manifest
from tpuforge_workloads.merge import synthetic, verify
from tpuforge_workloads.merge.lora_checkpoint import LoraCheckpoint
from tpuforge_workloads.merge.merge import run_merge
from tpuforge_workloads.mesh import MESH_AXES
from tpuforge_workloads.train.checkpoints import TrainCheckpoints

# Tunix reads parameters with `.value`, which flax deprecates: one warning per access.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SPEC = LoraSpec(rank=4, alpha=8.0, dropout=0.0)
STEP = 3
# Qwix's LoRA einsums with the delta in the Tunix weight's own layout (see test_merge_synthetic).
DELTA_EINSUM = {
    "q_einsum": "Dr,rNH->NDH",
    "kv_einsum": "Dr,rCKH->CKDH",
    "k_einsum": "Dr,rKH->KDH",
    "attn_vec_einsum": "NHr,rD->NHD",
    "gate_proj": "Dr,rF->DF",
    "up_proj": "Dr,rF->DF",
    "down_proj": "Fr,rD->FD",
}


@dataclasses.dataclass
class Trained:
    base: Path
    ckpt: Path
    text: gemma4.Gemma4Text
    model: Any  # the JAX LoRA model
    tokens: np.ndarray
    logits: np.ndarray  # of the JAX LoRA model on `tokens`


def _flat(state: Any) -> dict[str, np.ndarray]:
    return {
        "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path): np.asarray(v)
        for path, v in jax.tree_util.tree_flatten_with_path(state)[0]
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The tiny base, Qwix adapters on every target with random B (training starts B at zero, which would
    hide any mapping error), saved by the trainer's checkpoint code with its manifest."""
    root = tmp_path_factory.mktemp("trained")
    tiny_model.write(str(root / "base"))
    text = gemma4.parse_config(gemma4.read_config(str(root / "base")))
    mesh = jax.make_mesh((1, 1), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        base = gemma4.load_model(root / "base", text, gemma4.tunix_config(text), mesh)
    model = lora.apply_lora(base, SPEC, mesh, seed=0)
    rng = np.random.default_rng(0)
    state = nnx.state(model, nnx.LoRAParam)
    nnx.update(
        model,
        jax.tree_util.tree_map_with_path(
            lambda path, x: (
                jax.numpy.asarray(rng.standard_normal(x.shape).astype(np.float32) * 0.05)
                if "_lora_b" in jax.tree_util.keystr(path)
                else x
            ),
            state,
        ),
    )
    checkpoints = TrainCheckpoints(str(root / "ckpt"), every_steps=1, keep=1, data_iterator=None)
    checkpoints.save(STEP, model, force=True)
    checkpoints.close()
    lora.write_manifest(str(root / "ckpt"), lora.manifest("gemma4-tiny", str(root / "base"), SPEC))
    tokens = verify.fixed_tokens(text.vocab_size)
    return Trained(root / "base", root / "ckpt", text, model, tokens, lora.logits(model, tokens))


def _config(trained: Trained, out: Path, **kw: Any) -> MergeConfig:
    return MergeConfig(
        model_name="gemma4-tiny",
        base_model_uri=str(trained.base),
        checkpoint_uri=str(trained.ckpt),
        output_uri=str(out),
        lora=SPEC,
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
    got = verify.hf_logits(merged, trained.tokens)
    assert np.max(np.abs(got - trained.logits)) <= 1e-4
    assert np.array_equal(got.argmax(-1), trained.logits.argmax(-1))
    # The adapters matter: the base alone is far from the LoRA model.
    base = verify.hf_logits(trained.base, trained.tokens)
    assert np.max(np.abs(base - trained.logits)) > 0.1


def test_tunix_loader_reads_the_output_back_exactly(trained: Trained, merged: Path) -> None:
    mesh = jax.make_mesh((1, 1), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2)
    cfg = gemma4.tunix_config(trained.text)
    with jax.set_mesh(mesh):
        loaded = _flat(nnx.state(gemma4.load_model(merged, trained.text, cfg, mesh)))
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
        delta = np.einsum(DELTA_EINSUM[module.rsplit("/", 1)[1]], a.astype(np.float64), b.astype(np.float64))
        np.testing.assert_allclose(loaded[name], value + scale * delta, rtol=1e-5, atol=1e-6, err_msg=name)
        adapted += 1
    assert adapted == 2 * 6  # q, kv or k, o, gate, up, down on each of 2 layers


def test_peft_loads_the_adapter_to_the_merged_models_logits(trained: Trained, merged: Path, tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    # The adapter-only export: the committed adapter directory and nothing else.
    out = tmp_path / "adapter-only"
    run_merge(_config(trained, out, write_merged=False))
    _, info = read_adapter_manifest(str(out / ADAPTER_SUBDIR))
    assert (info.step, info.rank, info.alpha) == (STEP, SPEC.rank, SPEC.alpha)
    base = AutoModelForCausalLM.from_pretrained(str(trained.base), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out / ADAPTER_SUBDIR))
    model.eval()
    with torch.no_grad():
        got = model(input_ids=torch.from_numpy(trained.tokens)).logits.numpy()
    merged_logits = verify.hf_logits(merged, trained.tokens)
    assert np.max(np.abs(got - merged_logits)) <= 1e-4
    assert np.array_equal(got.argmax(-1), merged_logits.argmax(-1))
    assert np.max(np.abs(got - trained.logits)) <= 1e-4
    # The adapter beside the merged model is the same one, byte for byte.
    assert (
        read_adapter_manifest(str(merged / ADAPTER_SUBDIR))[0].files
        == commit.require_complete(str(out / ADAPTER_SUBDIR), checksums=True).files
    )


def test_qwix_layout_is_what_the_merge_and_the_synthetic_inputs_use(trained: Trained) -> None:
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
