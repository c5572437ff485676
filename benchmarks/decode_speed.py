"""The decode of GRPO's rollouts and the evaluation samples (train/decode.py), with its KV cache against whole-row
forward passes (the decode before the cache, the baseline), measured in the same process on the devices at
hand, for a model of the catalog, whole or cut to its first layers, with random weights and LoRA adapters
(the trainer's model, as benchmarks/train_throughput.py builds it).

`--rows` prompts of `--prompt` random tokens each, `--new` tokens decoded after each, greedy. Per mode: the first
call's seconds (compile included), the median of `--repeats` calls after it, new tokens per second, and how
many leading tokens the two modes agree on (bf16 on a chip rounds the two attention paths differently, so a
long answer may part; in float32 on CPU they agree: tests/workloads/train/test_decode.py). The ratio printed
last is the baseline's time over the cache's.

    python benchmarks/decode_speed.py [--model gemma4-tiny] [--layers 0] [--rows 8] [--prompt 40] [--new 56]
        [--repeats 3] [--no-baseline] [--base-quantization none|int8|int4] [--written] [--json out.jsonl]

Without arguments: the tiny model at the GRPO benchmark's shapes (8 answers of up to 56 tokens). On a chip:
`--model gemma4-31b --layers 6 --rows 8 --prompt 256 --new 128` (benchmarks/chip/session.py: decode-31b-6).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
import numpy as np
from benchmarks.rows import emit
from benchmarks.train_throughput import decoder, layer_kinds, random_model, train_config

from tpuforge.api.finetune import BASE_QUANTIZATIONS
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.train.decode import Decoder, left_padded, prompt_room


def timed(decode: Decoder, model: Any, tokens: np.ndarray, lengths: np.ndarray, repeats: int) -> dict[str, Any]:
    started = time.perf_counter()
    out = decode(model, tokens, lengths)
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        out = decode(model, tokens, lengths)
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    return {
        "firstCallSeconds": round(first, 3),
        "seconds": round(seconds, 4),
        "newTokensPerSecond": round(out.size / seconds, 1),
        "tokens": out,
    }


def written_model(model_name: str, config: Any, mesh: Any) -> Any:
    """A tiny model's checkpoint as its family's writer makes it (weights ~ N(0, 1/fan_in): logits with clear
    winners, where random_model's tiny uniform weights leave near ties that rounding decides), loaded as the
    trainer loads it, with adapters that shift its answers."""
    import tempfile

    from flax import nnx

    from tpuforge_workloads import families
    from tpuforge_workloads.families.gemma4 import tiny as tiny_gemma4
    from tpuforge_workloads.families.qwen3 import tiny as tiny_qwen3
    from tpuforge_workloads.model import checkpoint_read, lora

    folder = tempfile.mkdtemp(prefix="decode-speed-")
    (tiny_gemma4 if model_name.startswith("gemma4") else tiny_qwen3).write(folder, model_name=model_name)
    text = families.read_decoder(folder)
    with jax.set_mesh(mesh):
        base = checkpoint_read.load_model(folder, text, families.of(text).tunix_config(text), mesh)
        model = lora.apply_lora(base, config.lora, mesh, seed=0)
        stored = nnx.state(model, nnx.LoRAParam)
        keys = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(stored))))
        nnx.update(model, jax.tree.map(lambda x: x + 0.2 * jax.random.normal(next(keys), x.shape), stored))
    return model


def measure(
    model_name: str,
    layers: int,
    rows: int,
    prompt: int,
    new: int,
    repeats: int,
    baseline: bool = True,
    quantization: str = "none",
    written: bool = False,
) -> dict[str, Any]:
    device = jax.local_devices()[0]
    mesh = make_mesh(1, 1, [device])
    text = decoder(model_name, layers)
    config = train_config(model_name, prompt + new, rows, "off", 1, quantization)
    model = written_model(model_name, config, mesh) if written else random_model(text, config, mesh)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, text.vocab_size, prompt).astype(np.int32) for _ in range(rows)]
    tokens, lengths = left_padded(prompts, prompt_room(prompts), 0)
    row: dict[str, Any] = {
        "benchmark": "decode_speed",
        "model": model_name,
        "layers": text.num_layers,
        "layerTypes": layer_kinds(text),
        "rows": rows,
        "prompt": prompt,
        "newTokens": new,
        "baseQuantization": quantization,
        "weights": "written" if written else "random",
        "device": str(device.device_kind),
        "platform": device.platform,
        "jax": jax.__version__,
    }
    with jax.set_mesh(mesh):
        cached = timed(Decoder(mesh, new), model, tokens, lengths, repeats)
        row["kvCache"] = cached
        if baseline:
            whole = timed(Decoder(mesh, new, kv_cache=False), model, tokens, lengths, repeats)
            same = (cached["tokens"] == whole.pop("tokens")).all(axis=0)
            row["wholeRows"] = whole
            row["leadingTokensAgreed"] = int(np.argmin(same)) if not same.all() else new
            row["ratio"] = round(whole["seconds"] / cached["seconds"], 2)
    del cached["tokens"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma4-tiny")
    p.add_argument("--layers", type=int, default=0, help="the model's first N layers (0: all)")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=40)
    p.add_argument("--new", type=int, default=56)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True, help="time whole rows too")
    p.add_argument("--base-quantization", default="none", choices=BASE_QUANTIZATIONS, help="QLoRA's base")
    p.add_argument("--written", action="store_true", help="a tiny model's written checkpoint, not random weights")
    p.add_argument("--json", help="append the row to this JSON-lines file")
    args = p.parse_args(argv)
    row = measure(
        args.model,
        args.layers,
        args.rows,
        args.prompt,
        args.new,
        args.repeats,
        args.baseline,
        args.base_quantization,
        args.written,
    )
    emit(row, args.json)
    if "ratio" in row:
        print(f"decode of {args.rows} x {args.new} tokens: whole rows / KV cache = {row['ratio']}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
