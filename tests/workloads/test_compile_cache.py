"""The compiled train step kept in fake GCS (compile_cache.py): stored by one compile, loaded by the next
with the same key (JAX's own cache-hit event, not timing), compiled again under a changed key; a damaged
entry is compiled and replaced instead of breaking the compile.

The step is the trainer's (`compile_train_step` jits `make_trainer(...).create_train_step_fn()`), on the 4
virtual CPU devices, cut to one layer to keep the compiles short."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from tests.fixtures.models import tiny_train_config
from tpuforge.api.catalog import model_shape
from tpuforge_workloads import compile_cache, gemma4, storage, tiny_model
from tpuforge_workloads.mesh import make_mesh
from tpuforge_workloads.preflight.step import compile_train_step, with_layers


def _step_entries(uri: str) -> dict[str, list[str]]:
    """key directory -> the train-step entries stored in it."""
    out: dict[str, list[str]] = {}
    for name in storage.list_files(uri):
        key, _, entry = name.partition("/")
        out.setdefault(key, [])
        if entry.startswith("jit__train_step-"):
            out[key].append(entry)
    return out


@pytest.mark.slow
def test_the_train_step_is_stored_and_loaded_by_key(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A local cache of this test's own, so that nothing compiled by other tests on this machine is hit.
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "local"))
    root = f"{bucket}/checkpoints/compile-cache"
    text = with_layers(gemma4.parse_config(tiny_model.hf_config(model_shape("gemma4-tiny"))), ("sliding_attention",))
    config = tiny_train_config("gs://m/gemma4-tiny", "gs://d/train.jsonl", f"{bucket}/checkpoints", max_seq_len=32)
    config.compile_cache_uri = root
    mesh = make_mesh(1, 4, jax.devices())

    first = compile_train_step(text, config, mesh, total_steps=16)
    stored = _step_entries(root)
    assert not first.cache_hit
    assert len(stored) == 1 and len(next(iter(stored.values()))) == 1, stored
    key = next(iter(stored))
    assert key == compile_cache.key_name(compile_cache.key_inputs(text, config, 16, mesh.devices))
    assert '"maxSeqLen": 32' in storage.read_text(f"{root}/{key}/{compile_cache.KEY_FILE}")

    # A new process's view: an empty local cache, the entry only in GCS.
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "local-2"))
    again = compile_train_step(text, config, mesh, total_steps=16)
    assert again.cache_hit
    assert _step_entries(root) == stored  # loaded, not compiled and stored again

    # Another maxSeqLen is another key: compiled and stored beside the first.
    longer = config.model_copy(deep=True)
    longer.training.max_seq_len = 48
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "local-3"))
    other = compile_train_step(text, longer, mesh, total_steps=16)
    assert not other.cache_hit
    assert set(_step_entries(root)) == {
        key,
        compile_cache.key_name(compile_cache.key_inputs(text, longer, 16, mesh.devices)),
    }


def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, inputs = str(tmp_path / "remote"), {"program": "3x+1"}

    def compile_in(local: str) -> compile_cache.CompileCache:
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / local))
        with compile_cache.open_cache(root, inputs) as cache:
            assert cache is not None
            jax.jit(lambda x: 3 * x + 1).lower(jax.ShapeDtypeStruct((8,), jnp.float32)).compile()
        return cache

    first = compile_in("a")
    assert first.counts["hits"] == 0 and len(first.pushed) == 1, first.stats()
    entry = f"{first.uri}/{first.pushed[0]}"
    whole = storage.read_bytes(entry)
    storage.write_bytes(entry, whole[: len(whole) // 2])  # an upload cut short by another writer

    second = compile_in("b")
    assert second.rejected == first.pushed and second.counts["hits"] == 0
    assert second.pushed == first.pushed and compile_cache.valid_entry(storage.read_bytes(entry))
    assert compile_in("c").counts["hits"] == 1
