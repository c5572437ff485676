"""QLoRA (spec.lora.baseQuantization) on the tiny Gemma 4, on CPU: the base quantized as it is loaded (and
in place, for a base loaded whole) as Qwix quantizes it in the forward, training on it through the trainer
CLI (loss down, only adapters saved, a kill resumed from its checkpoint), the preflight's compiled step and
build holding the quantized base, and the merge of such an adapter into the full-precision base."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from flax import nnx

from tests.fixtures.models import TrainerProcess, read_summary, tiny_train_config
from tpuforge.api import LoraSpec
from tpuforge.api.catalog import model_shape
from tpuforge_workloads import families, storage
from tpuforge_workloads.families import decoder
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.model import checkpoint_read, lora
from tpuforge_workloads.model.mesh import make_mesh

pytestmark = pytest.mark.slow

TOKENS = np.arange(1, 33).reshape(2, 16) % 300


def _base(model_dir: Path, mesh: jax.sharding.Mesh) -> Any:
    text = families.read_decoder(str(model_dir))
    with jax.set_mesh(mesh):
        return checkpoint_read.load_model(model_dir, text, families.of(text).tunix_config(text), mesh)


def _bytes(state: Any) -> int:
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(state))


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_the_base_is_quantized_in_place_as_qwix_quantizes_it(
    quantization: str, tiny_model_dir: Path, jax_devices: Any
) -> None:
    """The in-place build (lora.AdapterBuild) gives the model Qwix's own insertion gives (which quantizes each
    weight in its first forward and keeps the full-precision one until then): the same logits, every targeted
    weight held as integers, the adapters in float32, B zero."""
    mesh = make_mesh(1, 1, jax_devices[:1])
    spec = LoraSpec(rank=4, alpha=8.0, dropout=0.0, base_quantization=quantization)  # type: ignore[arg-type]
    full = _bytes(nnx.state(_base(tiny_model_dir, mesh)))
    model = lora.apply_lora(_base(tiny_model_dir, mesh), spec, mesh, seed=0)
    reference = lora.add_adapters(_base(tiny_model_dir, mesh), spec, batch=1, seed=0)
    np.testing.assert_array_equal(lora.logits(model, TOKENS), lora.logits(reference, TOKENS))

    held = lora.quantized_weights(model)
    assert len(held) == 2 * 6  # per layer: q, kv or k, attn_vec, gate, up, down
    assert {str(leaf.dtype) for _, _, w in held for leaf in jax.tree.leaves(w) if leaf.ndim} >= {quantization}
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))
    base_bytes = _bytes(nnx.state(model, nnx.Not(nnx.LoRAParam)))
    assert base_bytes < 0.4 * full  # the tiny model is float32: its targeted weights take a byte (or less) each


def _streamed(model_dir: Path, spec: LoraSpec, mesh: jax.sharding.Mesh, live: list[int]) -> Any:
    """The LoRA model as the trainer builds it: the base quantized as it is loaded (lora.AdapterBuild.placed,
    checkpoint_read.load_model), the device bytes alive after each parameter is placed appended to `live`."""

    text = families.read_decoder(str(model_dir))
    fam = families.of(text)

    def placed(model: Any, path: tuple[Any, ...]) -> None:
        build.placed(model, path)
        live.append(sum(x.nbytes for x in jax.live_arrays()))

    with jax.set_mesh(mesh):
        build = lora.AdapterBuild(lora.abstract_base(text), spec, mesh, 0, "float32")
        base = checkpoint_read.load_model(model_dir, text, fam.tunix_config(text), mesh, placed=placed)
    return lora.apply_lora(base, spec, mesh, seed=0, build=build)


@pytest.mark.parametrize("model", ["gemma4", "qwen3"])
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_the_base_quantized_as_it_is_loaded_is_the_same_model(
    model: str, quantization: str, tiny_model_dir: Path, tiny_qwen3_model_dir: Path, jax_devices: Any
) -> None:
    """The trainer's build (each targeted weight quantized as soon as the loader places it) gives the model the
    build on a base loaded whole gives, array for array (adapters included) and logit for logit, on 4 devices;
    and it never holds the base in full precision: the device bytes alive while it loads stay below the
    full-precision base's (the old build held the base read and the base laid out, twice that)."""
    import gc

    model_dir = tiny_model_dir if model == "gemma4" else tiny_qwen3_model_dir
    mesh = make_mesh(2, 2, jax_devices[:4])
    targets = list(model_shape(f"{model}-tiny").lora_targets)
    spec = LoraSpec(rank=4, alpha=8.0, dropout=0.0, target_modules=targets, base_quantization=quantization)  # type: ignore[arg-type]
    whole = lora.apply_lora(_base(model_dir, mesh), spec, mesh, seed=0)
    full = _bytes(nnx.state(_base(model_dir, mesh)))
    gc.collect()
    before = sum(x.nbytes for x in jax.live_arrays())
    live: list[int] = []
    streamed = _streamed(model_dir, spec, mesh, live)
    assert len(live) == len(jax.tree.leaves(nnx.state(_base(model_dir, mesh))))
    assert max(live) - before < 0.9 * full, (max(live) - before, full)

    ours, theirs = nnx.to_flat_state(nnx.state(streamed)), nnx.to_flat_state(nnx.state(whole))
    assert [p for p, _ in ours] == [p for p, _ in theirs]
    for (path, a), (_, b) in zip(ours, theirs, strict=True):
        a, b = a.get_value(), b.get_value()
        assert a.dtype == b.dtype and a.sharding == b.sharding, path
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), path
    np.testing.assert_array_equal(lora.logits(streamed, TOKENS), lora.logits(whole, TOKENS))


def test_qwen3_takes_a_quantized_base_too(tiny_qwen3_model_dir: Path, jax_devices: Any) -> None:
    mesh = make_mesh(1, 1, jax_devices[:1])
    targets = list(model_shape("qwen3-tiny").lora_targets)
    spec = LoraSpec(rank=4, alpha=8.0, dropout=0.0, target_modules=targets, base_quantization="int8")
    model = lora.apply_lora(_base(tiny_qwen3_model_dir, mesh), spec, mesh, seed=0)
    reference = lora.add_adapters(_base(tiny_qwen3_model_dir, mesh), spec, batch=1, seed=0)
    np.testing.assert_array_equal(lora.logits(model, TOKENS), lora.logits(reference, TOKENS))
    assert len(lora.quantized_weights(model)) == len(model.layers) * len(targets)


def test_qlora_trains_resumes_and_merges_with_only_adapters_saved(
    tiny_model_dir: Path, chat_dataset: Path, tmp_path: Path
) -> None:
    """The trainer CLI on an int8 base (4 virtual devices, tp=4): killed after a checkpoint and run again, it
    resumes there and finishes with a lower loss; each checkpoint holds the adapters alone, and the manifest
    says what base they trained against. The adapters then merge into the full-precision base."""
    ckpt = str(tmp_path / "checkpoints")
    config = tiny_train_config(str(tiny_model_dir), str(chat_dataset), ckpt, max_steps=12)
    config.lora = config.lora.model_copy(update={"base_quantization": "int8"})
    first = TrainerProcess(config, tmp_path / "first").start()
    first.wait_for_line("step 7/12")
    assert first.proc is not None
    first.proc.send_signal(signal.SIGKILL)
    first.wait()
    from tpuforge_workloads.train.checkpoints import latest_step

    resumed_at = latest_step(ckpt)
    assert resumed_at is not None and 2 <= resumed_at < 12
    second = TrainerProcess(config, tmp_path / "second")
    assert second.run() == 0, second.output()

    attempts = read_summary(ckpt)["attempts"]
    assert attempts[-1]["start_step"] == resumed_at
    losses = {int(k): v for a in attempts for k, v in a["losses"].items()}
    assert np.mean([losses[11], losses[12]]) < 0.8 * np.mean([losses[1], losses[2]]), losses

    manifest = lora.read_manifest(ckpt)
    assert manifest is not None and manifest.base_quantization == "int8"
    import orbax.checkpoint as ocp
    from etils import epath

    tree = ocp.PyTreeCheckpointer().restore(epath.Path(storage.join(ckpt, "12", manifest.params_item)))
    names = {str(p[-2].key) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}
    assert names and all(n.endswith(("_lora_a", "_lora_b")) for n in names), names
    assert all(np.asarray(x).dtype == np.float32 for x in jax.tree.leaves(tree))
    _merges_into_the_full_precision_base(config, tmp_path / "merged")


def _merges_into_the_full_precision_base(config: Any, out: Path) -> None:
    """The merge adds the adapters to the full-precision base, as for any adapter: the merged model computes
    what the adapters do on that base. It differs from the quantized forward they trained against by the
    base's quantization error (what the logits below measure, printed for docs/training.md)."""
    from tpuforge.api.configs import MergeConfig
    from tpuforge_workloads.merge.merge import run_merge

    ckpt = config.checkpoint.uri
    run_merge(
        MergeConfig(
            model_name=config.model_name,
            base_model_uri=config.model_uri,
            checkpoint_uri=ckpt,
            output_uri=str(out),
            lora=config.lora,
        )
    )
    mesh = make_mesh(1, 1, jax.devices()[:1])
    merged = lora.logits(_base(out, mesh), TOKENS)
    full, _ = lora.load_lora_model(config.model_uri, ckpt, mesh=mesh)
    trained = lora.untrained_lora_model(config.model_uri, ckpt, mesh=mesh, base_quantization="int8")
    from tpuforge_workloads.model.adapter_checkpoint import restore_lora_params

    restore_lora_params(ckpt, trained)
    on_full, on_int8 = lora.logits(full, TOKENS), lora.logits(trained, TOKENS)
    np.testing.assert_allclose(merged, on_full, atol=1e-4)
    drift = float(np.abs(merged - on_int8).max())
    agree = float((merged.argmax(-1) == on_int8.argmax(-1)).mean())
    print(
        f"merged vs int8 forward: max |logit diff| {drift:.4f} of max |logit| {np.abs(merged).max():.2f}, "
        f"argmax agreement {agree:.3f}"
    )
    assert 0 < drift < 0.2 * float(np.abs(merged).max())


def test_a_manifest_from_a_quantized_base_differs_from_a_full_precision_run() -> None:
    spec = LoraSpec(rank=8)
    int8 = lora.manifest("gemma4-tiny", "gs://m", spec.model_copy(update={"base_quantization": "int8"}))
    plain = lora.manifest("gemma4-tiny", "gs://m", spec)
    assert "base_quantization" not in plain.model_dump_json()  # manifests of LoRA runs are written as before
    assert int8.differences(plain) == ["lora.baseQuantization int8 (checkpoints) vs none (this run)"]


def test_the_preflight_compiles_the_step_on_the_quantized_base(tiny_model_dir: Path, jax_devices: Any) -> None:
    """The compiled train step's arguments (model, optimizer state, batch) with an int8 base against the same
    step on the model's own dtype (float32 here, bfloat16 on the 31B: the ratio on a chip is larger)."""
    from tpuforge_workloads.preflight.step import compile_train_step

    text = gemma4_config.parse_config(decoder.read_config(str(tiny_model_dir)))
    mesh = make_mesh(1, 4, jax_devices[:4])
    config = tiny_train_config(str(tiny_model_dir), "unused.jsonl", "unused")
    full = compile_train_step(text, config, mesh, total_steps=4)
    config.lora = config.lora.model_copy(update={"base_quantization": "int8"})
    int8 = compile_train_step(text, config, mesh, total_steps=4)
    # Measured: 0.63 MB against 1.17 MB per device (the unquantized embedding and the rank-8 adapters with
    # their optimizer state are the rest, large beside a 128-wide model).
    assert int8.argument_bytes < 0.6 * full.argument_bytes, (int8, full)
    assert int8.hbm_bytes < full.hbm_bytes
    # The build as the trainer runs it: the quantized base (each weight quantized as it is loaded) beside the
    # adapters being made, or beside one weight's quantization. Measured: 0.43 MB against 0.97 MB per device.
    assert int8.build_bytes < 0.6 * full.build_bytes, (int8, full)


def _all_gathers(text: Any, config: Any, mesh: jax.sharding.Mesh) -> list[str]:
    """The element type of each all-gather in the compiled train step."""
    from tpuforge_workloads.preflight.step import lower_train_step

    with jax.set_mesh(mesh), mesh:
        hlo = lower_train_step(text, config, mesh, 4)[0].compile().as_text()
    return re.findall(r"= (\w+)\[[\d,]*\](?:\{[^}]*\})? all-gather(?:-start)?\(", hlo)


def test_a_quantized_weight_is_gathered_over_fsdp_as_integers(
    tiny_model_dir: Path, jax_devices: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a mesh with fsdp > 1 the step gathers each quantized weight's integers and dequantizes the whole
    (lora_provider.LoraProvider.gathered); left to XLA, it gathers the dequantized floats instead (twice the
    bytes in bf16, and on the 31B a layer's gathered weights held per layer: docs/performance.md)."""
    text = gemma4_config.parse_config(decoder.read_config(str(tiny_model_dir)))
    mesh = make_mesh(2, 2, jax_devices[:4])
    config = tiny_train_config(str(tiny_model_dir), "unused.jsonl", "unused")
    config.mesh = config.mesh.model_copy(update={"fsdp": 2, "tp": 2})
    config.lora = config.lora.model_copy(update={"base_quantization": "int8"})
    gathered = _all_gathers(text, config, mesh)
    monkeypatch.setattr(lora, "weight_partitions", lambda base, regex: {})
    left = _all_gathers(text, config, mesh)
    assert "s8" in gathered and "s8" not in left, (gathered, left)


def test_a_gathered_partition_drops_fsdp_and_what_the_scale_does_not_share() -> None:
    from tpuforge_workloads.model.lora_provider import gathered_partition

    assert gathered_partition(("tp", "fsdp", None), (8, 128, 64), (8, 128, 64)) == ("tp", None, None)
    # The scale of a weight tiled along its contracted (fsdp) axis, and one whose tp axis is tiled.
    assert gathered_partition(("fsdp", "tp"), (128, 256), (1, 256)) == (None, "tp")
    assert gathered_partition(("tp", "fsdp"), (256, 128), (2, 128)) == (None, None)
