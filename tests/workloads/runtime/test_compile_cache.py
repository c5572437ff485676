"""The compiled train step kept in fake GCS (compile_cache.py): the preflight's compile of the trainer's step
(`compile_train_step` jits `make_trainer(...).create_train_step_fn()`, here on the 4 virtual CPU devices)
is stored under its key, the trainer with the same key loads it (JAX's own cache-hit event, not timing),
a changed key compiles; a damaged entry is compiled and replaced instead of breaking the compile."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from tests.fixtures.models import TrainerProcess, read_summary, tiny_train_config
from tpuforge_workloads import storage
from tpuforge_workloads.families import decoder
from tpuforge_workloads.families.gemma4 import config as gemma4_config
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.preflight.step import compile_train_step
from tpuforge_workloads.runtime import compile_cache


def _step_entries(uri: str) -> dict[str, list[str]]:
    """key directory -> the train-step entries stored in it."""
    out: dict[str, list[str]] = {}
    for name in storage.list_files(uri):
        key, _, entry = name.partition("/")
        out.setdefault(key, [])
        if entry.startswith("jit_train_step-"):
            out[key].append(entry)
    return out


@pytest.mark.slow
def test_the_trainer_loads_the_step_the_preflight_stored(
    bucket: str, tiny_model_gs: str, chat_dataset_gs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Empty: each compile gets a local cache of its own, so nothing compiled by other tests is hit.
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")
    config = tiny_train_config(tiny_model_gs, chat_dataset_gs, f"{bucket}/checkpoints", max_steps=4)
    root = config.compile_cache_uri = f"{bucket}/checkpoints/compile-cache"
    text = gemma4_config.parse_config(decoder.read_config(tiny_model_gs), tiny_model_gs)
    mesh = make_mesh(1, 4, jax.devices())

    preflight = compile_train_step(text, config, mesh, total_steps=4)
    stored = _step_entries(root)
    assert not preflight.cache_hit
    assert len(stored) == 1 and len(next(iter(stored.values()))) == 1, stored
    key, _ = next(iter(stored.items()))
    assert key == compile_cache.key_name(compile_cache.key_inputs(text, config, 4, mesh.devices))
    assert '"maxSeqLen": 64' in storage.read_text(f"{root}/{key}/{compile_cache.KEY_FILE}")

    trainer = TrainerProcess(config, tmp_path / "run")
    assert trainer.run() == 0, trainer.output()
    cache = read_summary(config.checkpoint.uri)["attempts"][-1]["compile_cache"]
    # The preflight's step was the one entry there, and JAX loaded it: the trainer compiled no train step at
    # all, since every later step takes what the first one returns, laid out as it came in.
    assert cache["pulled"] == 1 and cache["hits"] >= 1, cache
    assert not [e for e in cache["stored"] if e.startswith("jit_train_step-")], cache

    # Another maxSeqLen is another key: compiled and stored beside the first.
    longer = config.model_copy(deep=True)
    longer.training.max_seq_len = 96
    other = compile_train_step(text, longer, mesh, total_steps=4)
    assert not other.cache_hit
    assert compile_cache.key_name(compile_cache.key_inputs(text, longer, 4, mesh.devices)) in _step_entries(root)


def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, inputs = str(tmp_path / "remote"), {"program": "3x+1"}

    def compile_in(local: str) -> compile_cache.CompileCache:
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / local))
        with compile_cache.open_cache(root, inputs) as cache:
            assert cache is not None
            jax.jit(lambda x: 3 * x + 1).lower(jax.ShapeDtypeStruct((8,), jnp.float32)).compile()  # type: ignore[no-untyped-call]
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
