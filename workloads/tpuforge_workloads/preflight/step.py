"""The trainer's train step, compiled for a mesh of compile-only devices, from the model's config alone.

Nothing here has its own step: the model is the trainer's (the family's Tunix model with Qwix adapters, remat as
configured), the trainer is `train.trainer.make_trainer` (optimizer, gradient accumulation, model inputs), and
the compiled function is that trainer's `create_train_step_fn()`, jitted as the trainer jits it
(`jit_train_step`: model and optimizer donated). The model and optimizer are built inside nnx.eval_shape, so
no weight is read or allocated: only shapes, dtypes and the shardings the run would give them.

The model build is compiled too: the adapters are added to the base as the trainer adds them
(lora.AdapterBuild), and the build's peak is part of what must fit, so "fits" means the whole attempt does.
With a quantized base (QLoRA) the build is the programs the trainer runs: each targeted weight quantized as it
is loaded, then the adapters made beside the quantized base (`build_bytes`).
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass
from typing import Any

from tpuforge.api import TrainConfig, resolved_remat
from tpuforge_workloads import families
from tpuforge_workloads.data.pipeline import BATCH_ARRAYS
from tpuforge_workloads.data.preference import rows_per_example
from tpuforge_workloads.families.decoder import Decoder, check_sharding
from tpuforge_workloads.model import lora
from tpuforge_workloads.model.mesh import placed_shapes
from tpuforge_workloads.runtime import compile_cache

GIB = 1024**3
# Splash attention's forward kernel with segment ids, as named in the lowered program.
SPLASH_KERNEL = "splash_mha_fwd_segmented"
# libtpu refuses to compile a step whose buffers cannot fit a chip ("RESOURCE_EXHAUSTED: Ran out of memory on
# HBM, the total memory required for HLO temporaries (72.16G) exceeds available HBM (31.25G)"): the job does
# not fit, and the message holds the one figure known, a lower bound of the step's need.
_OUT_OF_HBM = re.compile(r"Ran out of memory .*?HBM.*?\(([\d.]+)([KMGTP]?)\) exceeds available HBM")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": GIB, "T": 1024**4, "P": 1024**5}


def out_of_hbm_bytes(message: str) -> int | None:
    """The bytes a step needs by libtpu's refusal to compile it (None: the message is not that refusal)."""
    found = _OUT_OF_HBM.search(message)
    return None if found is None else int(float(found.group(1)) * _UNITS[found.group(2)])


@dataclass(frozen=True)
class CompiledStep:
    """What XLA says of one compiled train step, per chip."""

    layers: int
    argument_bytes: int  # model, optimizer state and batch held while the step runs
    output_bytes: int
    alias_bytes: int  # outputs that reuse donated arguments (the optimizer state)
    temp_bytes: int  # activations and other buffers the step allocates
    code_bytes: int
    flops: float  # per chip, one micro-batch
    compile_seconds: float
    platform: str
    out_of_hbm: bool = False  # libtpu refused to compile it: temp_bytes is what it said was needed, a lower bound
    cache_hit: bool = False  # loaded from the compile cache instead of compiled
    attention: str = "masked"  # "splash": the program runs splash attention with segment ids (attention.py)
    build_bytes: int = 0  # peak HBM per chip of the model build (lora.AdapterBuild, `build_bytes`), 0: not compiled

    @property
    def hbm_bytes(self) -> int:
        """Peak HBM per chip while the step runs: arguments, outputs that are not written in place of a
        donated argument, temporaries and the program."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes


def peak_bytes(mem: Any) -> int:
    """Peak HBM per chip of a compiled program by XLA's memory analysis: arguments, outputs not written in
    place of a donated argument, temporaries and the program."""
    return int(
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
        + mem.generated_code_size_in_bytes
    )


def with_layers(text: Decoder, layer_types: tuple[str, ...]) -> Decoder:
    """The same decoder with these layers only (the preflight compiles small decoders and extrapolates). A
    decoder whose config states no layer types (Qwen3: all global) takes its own kind only."""
    unknown = set(layer_types) - {"sliding_attention", "full_attention"}
    if not layer_types or unknown:
        raise ValueError(f"layer_types must be sliding_attention/full_attention, at least one; got {layer_types}")
    if "layer_types" in {f.name for f in dataclasses.fields(text)}:  # type: ignore[arg-type]
        return dataclasses.replace(text, num_layers=len(layer_types), layer_types=tuple(layer_types))  # type: ignore[type-var]
    if set(layer_types) != set(text.layer_types):
        raise ValueError(f"a {text.family} decoder has {set(text.layer_types)} layers only; got {layer_types}")
    return dataclasses.replace(text, num_layers=len(layer_types))  # type: ignore[type-var]


class NoCheckpoints:
    """A trainer with nothing to restore (the preflight's)."""

    restored_metadata: dict[str, Any] = {}

    def maybe_restore(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        return 0, {}


def lower_train_step(
    text: Decoder, config: TrainConfig, mesh: Any, total_steps: int
) -> tuple[Any, tuple[Any, list[Any]]]:
    """The trainer's step for `text` (config.json's decoder, possibly cut to fewer layers), traced and
    lowered for `mesh` (real devices, or a TPU topology's compile-only devices) at the job's micro-batch
    shape, from shapes alone; and the model build's programs lowered for the same mesh (`build_programs`).
    Call under `jax.set_mesh(mesh)` and `mesh` (compile_train_step does)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tpuforge_workloads.train.trainer import jit_train_step, make_trainer

    fam = families.of(text)
    t = config.training
    trainers: list[Any] = []
    base = lora.abstract_base(text)
    build = lora.AdapterBuild(base, config.lora, mesh, t.seed, lora.ADAPTER_DTYPE)

    def finish(model: Any) -> tuple[Any, Any]:
        if config.lora.dropout > 0:
            lora.attach_dropout_stream(model, t.seed)
        fam.set_remat(model, resolved_remat(t, None), t.remat_policy)
        trainer = make_trainer(model, config, total_steps, NoCheckpoints())
        trainers.append(trainer)
        return model, trainer.optimizer

    model, optimizer = nnx.eval_shape(finish, build.abstract_model())
    check_sharding(nnx.state(model), mesh)
    graph_m, state_m = nnx.split(model)
    graph_o, state_o = nnx.split(optimizer)
    model = nnx.merge(graph_m, placed_shapes(state_m, mesh))
    optimizer = nnx.merge(graph_o, placed_shapes(state_o, mesh))
    rows = t.micro_batch_size * mesh.shape["fsdp"] * rows_per_example(config.method, config.grpo)
    batch_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
    dtypes = {"input_mask": jnp.bool_}
    batch = {
        k: jax.ShapeDtypeStruct((rows, t.max_seq_len), dtypes.get(k, jnp.int32), sharding=batch_sharding)  # type: ignore[no-untyped-call]
        for k in BATCH_ARRAYS
    }
    # The data feed adds each row's loss denominator (model/loss.py) before a batch reaches the step.
    batch["loss_denominator"] = jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=batch_sharding)  # type: ignore[no-untyped-call]
    if config.method == "grpo":  # each sampled answer's advantage (train/grpo.py)
        batch["advantages"] = jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=batch_sharding)  # type: ignore[no-untyped-call]
        if config.grpo is not None and config.grpo.iterations > 1:  # pi_old's log-probabilities, kept with the rows
            shape = (rows, t.max_seq_len)
            batch["old_logps"] = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=batch_sharding)  # type: ignore[no-untyped-call]
    step = jit_train_step(trainers[0].create_train_step_fn()).lower(model, optimizer, batch)
    return step, build_programs(build, base, mesh)


def build_programs(build: lora.AdapterBuild, base: Any, mesh: Any) -> tuple[Any, list[Any]]:
    """The model build's programs lowered for the abstract `base` placed on `mesh`: the one that makes the
    adapters beside what the LoRA model holds (`init`), and with a quantized base each program that quantizes
    a targeted weight as it is loaded (`build_bytes` adds them up)."""
    from flax import nnx

    base_state = placed_shapes(nnx.state(base), mesh)
    return build.lower(base_state), build.lower_quantizers(base_state)


def lowered_flops(lowered: Any) -> float:
    """XLA's FLOP count of a lowered (or compiled) step; 0 where the backend gives none."""
    cost = lowered.cost_analysis()
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    return float((cost or {}).get("flops", 0.0))


def compile_train_step(text: Decoder, config: TrainConfig, mesh: Any, total_steps: int) -> CompiledStep:
    """Compile the trainer's step (`lower_train_step`) for `mesh`, and say what XLA says of it per chip.
    With config.compile_cache_uri set, the compiled step is stored there under the run's key
    (compile_cache.py), where the trainer looks for it (and loaded from there if already stored)."""
    import jax

    started = time.monotonic()
    with jax.set_mesh(mesh), mesh:  # Tunix's kernels read the legacy mesh context, the model the new one
        lowered, programs = lower_train_step(text, config, mesh, total_steps)
        attention_kind = "splash" if SPLASH_KERNEL in lowered.as_text() else "masked"
        inputs = compile_cache.key_inputs(text, config, total_steps, mesh.devices)
        try:
            with compile_cache.open_cache(config.compile_cache_uri, inputs) as cache:
                compiled = lowered.compile()
            build_peak = build_bytes(programs)
        except jax.errors.JaxRuntimeError as e:
            needed = out_of_hbm_bytes(str(e))
            if needed is None:
                raise
            platform = mesh.devices.flat[0].platform
            seconds = time.monotonic() - started
            return CompiledStep(
                text.num_layers, 0, 0, 0, needed, 0, 0.0, seconds, platform, True, attention=attention_kind
            )
    seconds = time.monotonic() - started
    mem = compiled.memory_analysis()
    if mem is None:
        raise RuntimeError(f"XLA gave no memory analysis for the {mesh.devices.flat[0].platform} step")
    return CompiledStep(
        layers=text.num_layers,
        argument_bytes=int(mem.argument_size_in_bytes),
        output_bytes=int(mem.output_size_in_bytes),
        alias_bytes=int(mem.alias_size_in_bytes),
        temp_bytes=int(mem.temp_size_in_bytes),
        code_bytes=int(mem.generated_code_size_in_bytes),
        flops=lowered_flops(compiled),
        compile_seconds=seconds,
        platform=mesh.devices.flat[0].platform,
        cache_hit=bool(cache and cache.counts["hits"]),
        attention=attention_kind,
        build_bytes=build_peak,
    )


def build_bytes(programs: tuple[Any, list[Any]]) -> int:
    """The model build's peak per chip (`build_programs`), as the trainer runs it: `init`'s (its arguments are
    what the LoRA model holds besides the adapters, its output the adapters); with a quantized base, also the
    quantized base beside the largest program that quantizes one weight (that weight in full precision, its
    quantized copy and the program's temporaries), whichever is more. A slight overcount: the quantized base
    is taken whole while its last weight is quantized. The tensors the loader reads ahead (checkpoint_read) are
    not counted, with a quantized base or without. libtpu's refusal to compile a program gives the bytes it
    needs instead."""
    init, quantizers = programs
    init_mem = _memory(init)
    if init_mem is None:
        return 0
    if isinstance(init_mem, int):
        return init_mem
    peak = peak_bytes(init_mem)
    for lowered in quantizers:
        mem = _memory(lowered)
        one = mem if isinstance(mem, int) else peak_bytes(mem) if mem is not None else 0
        peak = max(peak, int(init_mem.argument_size_in_bytes) + one)
    return peak


def _memory(lowered: Any) -> Any:
    """XLA's memory analysis of a lowered program once compiled (None where the backend gives none), or the
    bytes libtpu said it needs where it refused to compile it."""
    import jax

    try:
        return lowered.compile().memory_analysis()
    except jax.errors.JaxRuntimeError as e:
        needed = out_of_hbm_bytes(str(e))
        if needed is None:
            raise
        return needed
