"""The preflight compiles the trainer's step for real TPU topologies here (libtpu, no TPU): the `tpuforge
preflight` command on a job, and the 31B's layer with its weights sharded over a v5p-8's chips. (A job
that cannot fit is refused after one compile of one layer; a compile big enough to outgrow a chip takes too
long for this suite, so that path is covered by the estimate's unit tests and by benchmarks/preflight_31b.py.)

Compiles for TPU are slow on a small CPU host (a 31B layer takes minutes), so each case compiles the
fewest layers that prove its point, once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tpuforge.api import CheckpointSpec, LoraSpec, MeshSpec, TrainConfig, TrainingSpec
from tpuforge.api.catalog import TPU_SLICES, model_shape
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.families.gemma4 import tiny as tiny_model
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight.step import GIB, compile_train_step, with_layers
from tpuforge_workloads.preflight.topology import slice_devices

pytestmark = pytest.mark.slow


def job_yaml(tmp: Path, model: str, slice_id: str, training: dict[str, object]) -> Path:
    job = {
        "apiVersion": "tpuforge.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "preflight-test"},
        "spec": {
            "model": {"name": model, "uri": "gs://models/m"},
            "dataset": {"uri": "gs://data/train.jsonl"},
            "training": training,
            "tpu": {"slice": slice_id},
            "checkpoint": {"uri": "gs://runs/checkpoints"},
            "output": {"uri": "gs://runs/merged"},
            "serviceAccountName": "default",
        },
    }
    path = tmp / "finetune.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_tpuforge_preflight_compiles_a_job_for_its_slice(tmp_path: Path) -> None:
    config_json = tmp_path / "config.json"
    config_json.write_text(json.dumps(tiny_model.hf_config(model_shape("gemma4-tiny"))))
    job = job_yaml(tmp_path, "gemma4-tiny", "v5p-8", {"maxSeqLen": 128, "warmupSteps": 1})
    cmd = [sys.executable, "-m", "tpuforge.cli", "preflight", "-f", str(job), "--model-config", str(config_json)]

    # --whole: one compile of both layers (the extrapolation from three probes is the estimate's unit tests').
    done = subprocess.run([*cmd, "--steps", "50", "--whole", "--json"], capture_output=True, text=True, timeout=1200)

    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["slice"] == "v5p-8" and report["fits"] is True
    assert report["compiledLayers"] == [2] and report["extrapolated"] is False
    # On TPU the step runs splash attention with the rows' segment ids (attention.py), not the dense mask.
    assert report["attention"] == "splash"
    assert 0 < report["hbmPerChipGiB"] < report["hbmCapacityGiB"] == 95.74
    assert report["tflopsPerStep"] > 0 and report["tokensPerStep"] == 128 * 8  # 1 row x 8 micro-batches
    assert report["estimatedSeconds"] > 0 and report["estimatedUSD"] > 0 and report["totalSteps"] == 50
    assert report["headline"].startswith("fits: ")
    # spec.training.remat unset: the step without remat fits the chips, so that is the one compiled and chosen.
    assert report["remat"] is False and report["rematOffGiB"] is None
    # The model build (adapters added to the base in place) is compiled too, and needs no more than the step
    # (the tiny model's build rounds to 0.00 GiB).
    assert 0 <= report["buildGiB"] <= report["hbmPerChipGiB"]
    assert report["assumedMFU"] == 0.72 and report["mfuSource"].startswith("assumed equal to TPU v5e's measured")


@pytest.mark.parametrize(("slice_id", "hosts"), [("v5litepod-1", 1), ("v5litepod-8", 1), ("v5litepod-16", 4)])
def test_v5e_slices_are_described_as_gke_builds_them(slice_id: str, hosts: int) -> None:
    devices = slice_devices(TPU_SLICES[slice_id])
    assert len(devices) == TPU_SLICES[slice_id].chips
    assert {d.device_kind for d in devices} == {"TPU v5 lite"}
    assert len({d.process_index for d in devices}) == hosts


def test_a_bad_job_is_refused_before_any_compile(tmp_path: Path) -> None:
    job = job_yaml(tmp_path, "gemma4-31b", "v5p-8", {"maxSeqLen": 4096})
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["tpu"]["mesh"] = {"fsdp": 1, "tp": 8}
    job.write_text(yaml.safe_dump(doc))

    done = subprocess.run(
        [sys.executable, "-m", "tpuforge.cli", "preflight", "-f", str(job)], capture_output=True, text=True, timeout=120
    )

    assert done.returncode == 2
    assert "spec.tpu.mesh" in done.stderr


@pytest.mark.parametrize("slice_id", ["v5p-8", "v5p-16"])
def test_31b_layer_compiles_for_the_slice_with_its_weights_sharded_over_the_chips(slice_id: str) -> None:
    """v5p-8: one host, fsdp=1 x tp=4; v5p-16: two hosts' chips in one compile (v5p:2x2x2), fsdp=2 x tp=4."""
    slc = TPU_SLICES[slice_id]
    text = gemma4_config.parse_config(tiny_model.hf_config(model_shape("gemma4-31b")))
    one = with_layers(text, ("sliding_attention",))
    config = TrainConfig(
        model_name="gemma4-31b",
        model_uri="gs://models/gemma4-31b",
        dataset_uri="gs://data/train.jsonl",
        lora=LoraSpec(rank=64, alpha=64),
        training=TrainingSpec(max_seq_len=256, warmup_steps=1),
        mesh=MeshSpec(fsdp=slc.default_fsdp, tp=slc.default_tp),
        checkpoint=CheckpointSpec(uri="gs://runs/checkpoints"),
    )

    mesh = make_mesh(slc.default_fsdp, slc.default_tp, slice_devices(slc))
    step = compile_train_step(one, config, mesh, total_steps=10)

    assert step.platform == "tpu" and step.layers == 1
    # The bfloat16 base: the embedding (tied to the output layer) and one sliding layer's attention and MLP.
    d, f, v = text.embed_dim, text.hidden_dim, text.vocab_size
    attn = d * text.num_heads * text.head_dim * 2 + d * text.num_kv_heads * text.head_dim * 2
    base_bytes = 2 * (v * d + attn + 3 * d * f)
    # Spread over the chips, plus the replicated LoRA adapters and their AdamW moments (float32): well under
    # one chip's share of twice the base.
    share = base_bytes / slc.chips
    assert share <= step.argument_bytes <= 2 * share, (step.argument_bytes / GIB, base_bytes / GIB)
    assert step.flops > 0
    assert step.hbm_bytes < slc.hbm_gib_per_chip * GIB, f"{step.hbm_bytes / GIB:.2f} GiB per chip"


@pytest.mark.parametrize("accelerator", sorted({s.accelerator for s in TPU_SLICES.values()}))
def test_each_chip_s_capacity_is_the_hbm_libtpu_refuses_against(accelerator: str) -> None:
    # The preflight's verdict sets the step against the catalog's HBM per chip; libtpu refuses a compile
    # against its own "available HBM" (below the datasheet's for v5e and v6e): the two must be one figure.
    import re

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    slc = next(s for s in TPU_SLICES.values() if s.accelerator == accelerator)
    one = NamedSharding(Mesh(np.array(slice_devices(slc)[:1]), ("x",)), P())
    too_big = jax.jit(lambda x: jnp.cumsum(jnp.outer(x, x), axis=0)[::1000, ::1000], in_shardings=one)
    with pytest.raises(jax.errors.JaxRuntimeError) as refused:
        too_big.lower(jax.ShapeDtypeStruct((200_000,), jnp.float32, sharding=one)).compile()
    available = re.search(r"available HBM \(([\d.]+)G\)", str(refused.value))
    assert available, str(refused.value)[:500]
    assert slc.hbm_gib_per_chip == float(available.group(1))
