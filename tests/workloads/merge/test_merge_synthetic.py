"""The merge on synthetic Gemma 4 checkpoints (random base + LoRA factors laid out as Tunix/Qwix save them):
exact values against a reference computed in Tunix's layout, sharded and single-file bases, bf16,
multimodal prefixes, gs:// on fake-gcs-server, re-runs, crashes and every input error."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.fixtures.merge_inputs import (
    ALPHA,
    DELTA_EINSUM,
    RANK,
    STEP,
    TARGETS,
    TINY,
    Inputs,
    config,
    make_inputs,
    trained_with,
)
from tpuforge.api.configs import MergeConfig
from tpuforge.api.constants import COMPLETE_MARKER, EXIT_BAD_CONFIG
from tpuforge_workloads import storage
from tpuforge_workloads.merge import synthetic
from tpuforge_workloads.merge.errors import MergeInputError
from tpuforge_workloads.merge.merge import run_merge
from tpuforge_workloads.merge.plan import read_base_config
from tpuforge_workloads.model import lora
from tpuforge_workloads.model.adapters import AdapterError, AdapterInfo, read_adapter_manifest
from tpuforge_workloads.storage import commit

REPO = Path(__file__).resolve().parents[3]


def _heads_to_hf(w: np.ndarray) -> np.ndarray:  # (N, D, h) -> (N*h, D)
    n, d, h = w.shape
    return w.transpose(0, 2, 1).reshape(n * h, d)


def tunix_delta_to_hf(module: str, delta: np.ndarray) -> dict[str, np.ndarray]:
    if module == "q_einsum":
        return {"self_attn.q_proj": _heads_to_hf(delta)}
    if module == "kv_einsum":
        return {"self_attn.k_proj": _heads_to_hf(delta[0]), "self_attn.v_proj": _heads_to_hf(delta[1])}
    if module == "k_einsum":
        return {"self_attn.k_proj": _heads_to_hf(delta)}
    if module == "attn_vec_einsum":
        n, h, d = delta.shape
        return {"self_attn.o_proj": delta.reshape(n * h, d).T}
    return {f"mlp.{module}": delta.T}


def reference_deltas(tree: dict[str, Any], prefix: str, scale: float) -> dict[str, np.ndarray]:
    """HF tensor name -> scale * delta, in float64."""
    out = {}
    for layer, blocks in tree["layers"].items():
        for modules in blocks.values():
            for module, params in modules.items():
                (a,) = (v["value"] for k, v in params.items() if k.endswith("_lora_a"))
                (b,) = (v["value"] for k, v in params.items() if k.endswith("_lora_b"))
                delta = np.einsum(DELTA_EINSUM[module], a.astype(np.float64), b.astype(np.float64))
                for name, d in tunix_delta_to_hf(module, delta).items():
                    out[f"{prefix}layers.{layer}.{name}.weight"] = scale * d
    return out


def load_dir(uri: str, tmp: Path) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint directory (downloaded first when on GCS)."""
    local = Path(uri) if not storage.is_gcs(uri) else tmp / "download"
    if storage.is_gcs(uri):
        storage.download_dir(uri, local)
    out: dict[str, np.ndarray] = {}
    for f in sorted(local.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    """Sharded float32 text-only base (3 shards) and its LoRA checkpoint, on a local disk."""
    return make_inputs(str(tmp_path_factory.mktemp("tiny")))


def test_sharded_base_merges_exactly_and_copies_the_rest(tiny: Inputs, tmp_path: Path) -> None:
    out = str(tmp_path / "merged")
    manifest = run_merge(config(tiny, out, write_adapter=True), chunk_bytes=8192)  # many row blocks per tensor
    base, merged = load_dir(tiny.base, tmp_path), load_dir(out, tmp_path)
    deltas = reference_deltas(tiny.tree, tiny.prefix, ALPHA / RANK)
    assert len(deltas) == 2 * 7 - 1  # 2 layers x (q, k, v, o, gate, up, down) minus v on the keys=values layer
    assert set(merged) == set(base)
    for name, w in base.items():
        assert merged[name].dtype == w.dtype and merged[name].shape == w.shape
        if name in deltas:
            np.testing.assert_allclose(merged[name], w + deltas[name], rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            assert merged[name].tobytes() == w.tobytes(), name
    assert len([f for f in manifest.names() if f.startswith("model-")]) > 1
    assert commit.require_complete(out, checksums=True) == manifest
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        assert (tmp_path / "merged" / name).read_bytes() == Path(tiny.base, name).read_bytes()
    assert not (tmp_path / "merged" / commit.STAGING_DIR).exists()

    # The adapter is committed on its own, and the merged model's manifest does not list its files.
    assert not [n for n in manifest.names() if n.startswith("adapter/")]
    assert manifest.metadata["kind"] == "merged"
    adapter_manifest, info = read_adapter_manifest(str(tmp_path / "merged/adapter"))
    assert commit.require_complete(str(tmp_path / "merged/adapter"), checksums=True) == adapter_manifest
    assert adapter_manifest.names() == {"adapter_model.safetensors", "adapter_config.json"}
    assert info == AdapterInfo(
        model_name="gemma4-tiny",
        base_model_uri=tiny.base,
        base_config_sha256=hashlib.sha256(Path(tiny.base, "config.json").read_bytes()).hexdigest(),
        checkpoint_uri=tiny.ckpt,
        step=STEP,
        rank=RANK,
        alpha=ALPHA,
    )
    assert adapter_manifest.metadata == {
        "kind": "adapter",
        "modelName": "gemma4-tiny",
        "baseModelUri": tiny.base,
        "baseConfigSha256": info.base_config_sha256,
        "checkpointUri": tiny.ckpt,
        "step": STEP,
        "rank": RANK,
        "alpha": ALPHA,
    }
    assert not (tmp_path / "merged/adapter" / commit.STAGING_DIR).exists()

    # The PEFT adapter holds the same update: W + (alpha / r) * lora_B @ lora_A.
    adapter = load_file(str(tmp_path / "merged/adapter/adapter_model.safetensors"))
    peft_config = json.loads((tmp_path / "merged/adapter/adapter_config.json").read_text())
    assert peft_config["r"] == RANK and peft_config["lora_alpha"] == ALPHA
    assert sorted(peft_config["target_modules"]) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    # Plus k_proj's factors again under v_proj on the keys = values layer (layer 1), for vLLM's packed qkv_proj.
    assert len(adapter) == 2 * len(deltas) + 2
    for name, delta in deltas.items():
        module = "base_model.model." + name.removesuffix(".weight")
        a, b = adapter[module + ".lora_A.weight"], adapter[module + ".lora_B.weight"]
        assert a.shape[0] == RANK and b.shape[1] == RANK
        np.testing.assert_allclose((ALPHA / RANK) * (b.astype(np.float64) @ a), delta, rtol=1e-5, atol=1e-7)


def test_kv_adapter_shares_one_a_between_k_and_v(tiny: Inputs, tmp_path: Path) -> None:
    run_merge(config(tiny, str(tmp_path), write_adapter=True))
    adapter = load_file(str(tmp_path / "adapter/adapter_model.safetensors"))
    k = adapter["base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"]
    v = adapter["base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight"]
    np.testing.assert_array_equal(k, v)


def test_keys_equal_values_layer_has_k_projs_factors_under_v_proj(tiny: Inputs, tmp_path: Path) -> None:
    # The base's layer 1 has no v_proj (values are keys): vLLM applies a LoRA to the values of its packed
    # qkv_proj only when the adapter names v_proj, so k_proj's factors are written under both names.
    assert f"{tiny.prefix}layers.1.self_attn.v_proj.weight" not in load_dir(tiny.base, tmp_path / "base")
    run_merge(config(tiny, str(tmp_path), write_adapter=True))
    adapter = load_file(str(tmp_path / "adapter/adapter_model.safetensors"))
    attn = "base_model.model.model.layers.1.self_attn."
    for factor in ("lora_A", "lora_B"):
        k, v = adapter[f"{attn}k_proj.{factor}.weight"], adapter[f"{attn}v_proj.{factor}.weight"]
        np.testing.assert_array_equal(v, k)


def test_adapter_only_writes_no_merged_files(tiny: Inputs, tmp_path: Path) -> None:
    out = tmp_path / "out"
    manifest = run_merge(config(tiny, str(out), write_merged=False))
    assert [p.relative_to(out).as_posix() for p in sorted(out.rglob("*"))] == [
        "adapter",
        f"adapter/{COMPLETE_MARKER}",
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
    ]
    assert read_adapter_manifest(str(out / "adapter"))[0] == manifest
    # The same bytes as the adapter exported beside a merged model.
    both = run_merge(config(tiny, str(tmp_path / "both"), write_adapter=True))
    assert both.metadata["kind"] == "merged"
    assert read_adapter_manifest(str(tmp_path / "both/adapter"))[0].files == manifest.files


def test_adapter_only_on_gcs_then_rerun_with_the_merge(bucket: str) -> None:
    inputs = make_inputs(storage.join(bucket, "in"))
    out = storage.join(bucket, "adapter-only")
    first = run_merge(config(inputs, out, write_merged=False))
    assert sorted(storage.list_files(out)) == [f"adapter/{n}" for n in (COMPLETE_MARKER, *sorted(first.names()))]
    assert not commit.is_complete(out)
    commit.require_complete(storage.join(out, "adapter"), checksums=True)
    # A re-run that also merges keeps the adapter committed (same bytes) and commits the merged model beside it.
    merged = run_merge(config(inputs, out, write_adapter=True))
    assert read_adapter_manifest(storage.join(out, "adapter"))[0] == first
    assert commit.require_complete(out, checksums=True) == merged
    assert not [n for n in storage.list_files(out) if n.startswith(commit.STAGING_DIR) or "/_staging" in n]


def test_a_directory_without_its_marker_is_not_an_adapter(tiny: Inputs, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_merge(config(tiny, str(out), write_adapter=True))
    with pytest.raises(AdapterError, match="describes a 'merged', not an adapter"):
        read_adapter_manifest(str(out))
    (out / "adapter" / COMPLETE_MARKER).unlink()
    with pytest.raises(AdapterError, match=r"adapter .*/adapter has no _COMPLETE marker: the export has not"):
        read_adapter_manifest(str(out / "adapter"))


def test_bf16_multimodal_single_file_on_gcs(bucket: str, tmp_path: Path) -> None:
    shape = dataclasses.replace(TINY, multimodal=True)
    inputs = make_inputs(bucket, shape, dtype="BF16", shard_bytes=None)
    assert storage.is_file(f"{bucket}/base/model.safetensors")
    out = f"{bucket}/merged"
    run_merge(config(inputs, out))
    assert commit.require_complete(out, checksums=True)
    base, merged = load_dir(inputs.base, tmp_path / "b"), load_dir(out, tmp_path / "m")
    deltas = reference_deltas(inputs.tree, "model.language_model.", ALPHA / RANK)
    assert set(deltas) <= set(base) and set(merged) == set(base)
    for name, w in base.items():
        assert merged[name].dtype == ml_dtypes.bfloat16
        if name not in deltas:
            assert merged[name].tobytes() == w.tobytes(), name  # vision tower included
            continue
        exact = w.astype(np.float64) + deltas[name]
        got = merged[name].astype(np.float64)
        # Rounding to bf16 (half an ulp), plus float32 arithmetic before it; almost always the same bits.
        tol = 2.0**-8 * np.abs(exact) + 1e-6 * (np.abs(w.astype(np.float64)) + np.abs(deltas[name]))
        assert np.all(np.abs(got - exact) <= tol), name
        same = merged[name] == exact.astype(np.float32).astype(ml_dtypes.bfloat16)
        assert np.mean(same) > 0.99, name


def test_output_dtype_cast_updates_config(tiny: Inputs, tmp_path: Path) -> None:
    run_merge(config(tiny, str(tmp_path), dtype="bfloat16"))
    merged = load_dir(str(tmp_path), tmp_path)
    assert {a.dtype for a in merged.values()} == {np.dtype(ml_dtypes.bfloat16)}
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    norm = load_dir(tiny.base, tmp_path)["model.norm.weight"]
    assert merged["model.norm.weight"].tobytes() == norm.astype(ml_dtypes.bfloat16).tobytes()


def test_rerun_replaces_a_committed_output_and_its_stale_shards(tiny: Inputs, tmp_path: Path) -> None:
    out = str(tmp_path)
    first = run_merge(config(tiny, out, shard_size_mb=1))
    second = run_merge(config(tiny, out, shard_size_mb=64))
    assert len([n for n in first.names() if n.startswith("model-")]) > 1
    assert [n for n in second.names() if n.startswith("model-")] == ["model-00001-of-00001.safetensors"]
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model-00001-of-00001.safetensors"]
    assert commit.require_complete(out, checksums=True) == second


def test_latest_or_given_step(tiny: Inputs, tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    shutil.copytree(tiny.ckpt, ckpt)
    text = read_base_config(tiny.base)
    synthetic.write_lora_checkpoint(ckpt, synthetic.lora_tree(text, RANK, TARGETS, seed=7), step=20)
    latest = run_merge(config(tiny, str(tmp_path / "a"), checkpoint_uri=ckpt))
    given = run_merge(config(tiny, str(tmp_path / "b"), checkpoint_uri=ckpt, step=STEP))
    reference = run_merge(config(tiny, str(tmp_path / "c")))
    assert latest.metadata["step"] == 20 and given.metadata["step"] == STEP
    assert {f.sha256 for f in given.files} == {f.sha256 for f in reference.files}
    assert {f.sha256 for f in latest.files} != {f.sha256 for f in reference.files}
    with pytest.raises(MergeInputError, match=r"step 5: not a finished checkpoint .* finished steps: \[10, 20\]"):
        run_merge(config(tiny, str(tmp_path / "d"), checkpoint_uri=ckpt, step=5))


# ---- input errors: named, before anything is written -----------------------------------------------------


def _broken_copy(tiny: Inputs, tmp_path: Path) -> Inputs:
    root = tmp_path / "inputs"
    shutil.copytree(tiny.base, root / "base")
    shutil.copytree(tiny.ckpt, root / "ckpt")
    return Inputs(str(root / "base"), str(root / "ckpt"), tiny.tree, tiny.prefix)


def _no_manifest(inputs: Inputs) -> None:
    Path(inputs.ckpt, lora.MANIFEST_FILE).unlink()


def _missing_layer(inputs: Inputs) -> None:
    text = read_base_config(inputs.base)
    shutil.rmtree(inputs.ckpt)
    tree = synthetic.lora_tree(text, RANK, TARGETS, skip=[(1, "q_einsum")])
    synthetic.write_lora_checkpoint(inputs.ckpt, tree, STEP, trained_with(inputs.base))


def _truncated_checkpoint(inputs: Inputs) -> None:
    Path(inputs.ckpt, str(STEP), "model_params", "_METADATA").unlink()


def _truncated_base(inputs: Inputs) -> None:
    shard = sorted(Path(inputs.base).glob("model-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-64])


def _other_architecture(inputs: Inputs) -> None:
    path = Path(inputs.base, "config.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "llama", "architectures": ["Llama"]}))


def _other_shapes(inputs: Inputs) -> None:
    """A LoRA checkpoint trained on a model of another width."""
    text = read_base_config(inputs.base)
    shutil.rmtree(inputs.ckpt)
    wider = dataclasses.replace(text, embed_dim=text.embed_dim * 2)
    synthetic.write_lora_checkpoint(
        inputs.ckpt, synthetic.lora_tree(wider, RANK, TARGETS), STEP, trained_with(inputs.base)
    )


@pytest.mark.parametrize(
    ("breakage", "overrides", "message"),
    [
        (None, {"lora": {"rank": 8, "alpha": ALPHA}}, r"lora.rank is 8 but training used 4 \(from .*lora.json\)"),
        (None, {"lora": {"rank": RANK, "alpha": 16.0}}, r"lora.alpha is 16.0 but training used 8.0"),
        (_no_manifest, {"lora": {"rank": 8, "alpha": ALPHA}}, r"lora.rank is 8 but the adapters .* have rank 4"),
        (_no_manifest, {"lora": {"rank": RANK, "alpha": ALPHA, "target_modules": ["q_einsum"]}}, "the config does not"),
        (None, {"model_name": "llama-7b"}, "modelName: .*unknown model"),
        (_missing_layer, {}, r"lacks 1 adapters the config expects \(layer 1 q_einsum\)"),
        (_truncated_checkpoint, {}, "cannot read the LoRA parameters' metadata"),
        (_truncated_base, {}, "truncated"),
        (_other_architecture, {}, r"model_type 'llama' is not a supported family.*\[Llama\]"),
        (_other_shapes, {}, r"weight is \[\d+, \d+\] but the layer 0 \w+ adapter"),
    ],
    ids=[
        "rank",
        "alpha",
        "rank-by-shape",
        "targets",
        "model",
        "missing-layer",
        "truncated-ckpt",
        "truncated-base",
        "arch",
        "shapes",
    ],
)
def test_bad_input_is_named_and_nothing_is_written(
    tiny: Inputs, tmp_path: Path, breakage: Any, overrides: dict[str, Any], message: str
) -> None:
    inputs = _broken_copy(tiny, tmp_path) if breakage else tiny
    if breakage:
        breakage(inputs)
    out = tmp_path / "merged"
    with pytest.raises(MergeInputError, match=message):
        run_merge(config(inputs, str(out), **overrides))
    assert not out.exists()


def test_output_inside_an_input_is_refused(tiny: Inputs) -> None:
    with pytest.raises(MergeInputError, match=r"outputUri .* overlaps checkpointUri"):
        run_merge(config(tiny, storage.join(tiny.ckpt, "merged")))


# ---- the CLI: exit codes, termination log, crashes ----------------------------------------------------------


def _cli(cfg: MergeConfig, tmp_path: Path, wait: bool = True) -> Any:
    path = tmp_path / "merge.json"
    path.write_text(cfg.model_dump_json(by_alias=True))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "workloads")])}
    args = [sys.executable, "-m", "tpuforge_workloads.merge", "--config", str(path)]
    args += ["--termination-log", str(tmp_path / "termination.log")]
    if not wait:
        return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_exit_codes_and_termination_log(tiny: Inputs, tmp_path: Path) -> None:
    bad = _cli(config(tiny, str(tmp_path / "a"), lora={"rank": 8, "alpha": ALPHA}), tmp_path)
    assert bad.returncode == EXIT_BAD_CONFIG, bad.stderr
    assert "lora.rank is 8" in (tmp_path / "termination.log").read_text()

    # A failure once writing has begun (here: the output's parent is a file): exit 1, the reason logged.
    (tmp_path / "not-a-dir").write_text("")
    failed = _cli(config(tiny, str(tmp_path / "not-a-dir" / "out")), tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert "NotADirectoryError" in (tmp_path / "termination.log").read_text()

    ok = _cli(config(tiny, str(tmp_path / "c")), tmp_path)
    assert ok.returncode == 0, ok.stderr
    commit.require_complete(str(tmp_path / "c"), checksums=True)


@pytest.mark.slow
def test_killed_mid_write_then_rerun_gives_the_complete_output(tmp_path: Path) -> None:
    # A large vocabulary makes the embedding 128 MB: long enough to kill the merge while it writes.
    inputs = make_inputs(str(tmp_path / "in"), dataclasses.replace(TINY, vocab_size=262_144), shard_bytes=None)
    out = tmp_path / "merged"
    proc = _cli(config(inputs, str(out), shard_size_mb=8), tmp_path, wait=False)
    try:
        deadline = time.monotonic() + 120
        while not any((out / commit.STAGING_DIR).glob("model-*")):
            assert proc.poll() is None and time.monotonic() < deadline, "the merge ended before it could be killed"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert not (out / COMPLETE_MARKER).exists()
    assert any((out / commit.STAGING_DIR).iterdir())  # what the crash left

    rerun = run_merge(config(inputs, str(out), shard_size_mb=8))
    clean = run_merge(config(inputs, str(tmp_path / "clean"), shard_size_mb=8))
    assert rerun.files == clean.files  # same bytes as a merge that never crashed
    assert commit.require_complete(str(out), checksums=True) == rerun
    assert not (out / commit.STAGING_DIR).exists()


@pytest.mark.parametrize(("out_dtype", "in_place"), [("BF16", True), ("BF16", False), ("F32", False)])
def test_row_blocks_in_place_equal_the_whole_chunk_product(out_dtype: str, in_place: bool) -> None:
    """A chunk merged in many small row blocks, in place in the base's own buffer (or into another bfloat16 or
    a float32 output), is the float32 sum of the whole chunk rounded once: bit for bit in bfloat16; in float32
    within the rounding of the product's terms, since the BLAS's sums for a block of rows and for the whole
    chunk may round apart on some CPUs (an AMD EPYC's OpenBLAS kernel does)."""
    from tpuforge_workloads.merge.safetensors_io import FLOAT_DTYPES
    from tpuforge_workloads.merge.stream import add_delta

    rng = np.random.default_rng(7)
    rows, cols, rank = 37, 96, 8
    base = rng.standard_normal((rows, cols), dtype=np.float32).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((rows, rank), dtype=np.float32)
    a = rng.standard_normal((rank, cols), dtype=np.float32) * np.float32(0.1)
    want = (base.astype(np.float32) + b @ a).astype(FLOAT_DTYPES[out_dtype])
    buffer = bytearray(base.tobytes())
    chunk = np.frombuffer(buffer, ml_dtypes.bfloat16).reshape(rows, cols)
    out = chunk if in_place else np.empty((rows, cols), FLOAT_DTYPES[out_dtype])
    add_delta(chunk, b, a, out, np.empty(5 * cols + 3, np.float32))  # 8 blocks of 5 rows, the last of 2
    if out_dtype == "F32":
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    else:
        assert out.tobytes() == want.tobytes()
    if not in_place:
        assert chunk.tobytes() == base.tobytes()  # the base is left as it was
