"""LoRA on a Tunix model (any family of the registry, families/) with Qwix, the adapter manifest written beside the
checkpoints, and the JAX LoRA model rebuilt from a base model + a training checkpoint (for checks against a
merged model).

Qwix adds `<weight>_lora_a` / `<weight>_lora_b` (nnx.LoRAParam) next to each targeted weight; their
sharding follows the weight's: A keeps the sharding of the contracted axes, B that of the output axes, and
the rank axis is never split, so any rank fits any mesh.

Qwix creates the adapters in the base weight's dtype. We keep them (and so the optimizer's moments and the
gradient accumulator) in float32: in bfloat16 an AdamW update of ~1e-4 of a weight's size is rounded away.
The forward pass computes with them cast to the base's dtype (`adapters_in_compute_dtype`), so activations
stay bfloat16 on a bfloat16 model; the gradient flows through the cast to the float32 weights.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from tpuforge.api import LoraSpec
from tpuforge.api.quantization import contracted_sizes, tile_size
from tpuforge_workloads import storage
from tpuforge_workloads.families.decoder import ModelError
from tpuforge_workloads.model.adapter_checkpoint import PARAMS_ITEM, restore_lora_params

if TYPE_CHECKING:
    import jax
    import numpy as np

    from tpuforge_workloads.model.lora_provider import Partitions

# Beside the Orbax step directories under checkpoint.uri.
MANIFEST_FILE = "lora.json"
# The adapters' storage dtype (whatever the base's); see the module docstring.
ADAPTER_DTYPE = "float32"


class LoraManifest(BaseModel):
    """What a reader needs to use the LoRA checkpoints without the training config."""

    model_config = ConfigDict(extra="forbid")

    model_name: str
    base_model_uri: str
    rank: int
    alpha: float
    dropout: float
    target_modules: list[str]
    module_regex: str
    params_item: str
    layout: str
    # What the adapters were trained against (QLoRA); left out when none, as manifests were written before.
    base_quantization: str = Field(default="none", exclude_if=lambda v: v == "none")

    def differences(self, other: LoraManifest) -> list[str]:
        """What would make `other`'s run resume these checkpoints as another adapter, each naming the
        config field: the model and the shapes (a restore fails deep inside Orbax otherwise) and alpha
        (the restored weights would silently be scaled by another alpha / rank). Dropout may change."""
        fields = {
            "modelName": (self.model_name, other.model_name),
            "lora.rank": (self.rank, other.rank),
            "lora.alpha": (self.alpha, other.alpha),
            "lora.targetModules": (sorted(self.target_modules), sorted(other.target_modules)),
            # The same shapes, but adapters trained against another forward than the one they would resume in.
            "lora.baseQuantization": (self.base_quantization, other.base_quantization),
        }
        return [
            f"{name} {mine} (checkpoints) vs {theirs} (this run)"
            for name, (mine, theirs) in fields.items()
            if mine != theirs
        ]


def module_regex(targets: Sequence[str]) -> str:
    """Qwix matches this against module paths such as `layers/3/attn/q_einsum` (full match)."""
    return r"layers/\d+/(?:attn|mlp)/(?:" + "|".join(re.escape(t) for t in targets) + ")"


def manifest(model_name: str, base_model_uri: str, lora: LoraSpec) -> LoraManifest:
    return LoraManifest(
        model_name=model_name,
        base_model_uri=base_model_uri,
        rank=lora.rank,
        alpha=lora.alpha,
        dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        module_regex=module_regex(lora.target_modules),
        params_item=PARAMS_ITEM,
        base_quantization=lora.base_quantization,
        layout=(
            f"<step>/{PARAMS_ITEM}: nnx.state(model, nnx.LoRAParam) of the Tunix model, leaves "
            "layers/<i>/<attn|mlp>/<module>/<w|kernel>_lora_<a|b>/value; update = (alpha / rank) * A @ B "
            "following each module's einsum"
        ),
    )


def read_manifest(checkpoint_uri: str) -> LoraManifest | None:
    uri = storage.join(checkpoint_uri, MANIFEST_FILE)
    if not storage.is_file(uri):
        return None
    return LoraManifest.model_validate_json(storage.read_text(uri))


def write_manifest(checkpoint_uri: str, m: LoraManifest) -> None:
    storage.write_text(storage.join(checkpoint_uri, MANIFEST_FILE), m.model_dump_json(indent=2))


def add_adapters(base: Any, lora: LoraSpec, batch: int, seed: int, adapter_dtype: str = ADAPTER_DTYPE) -> Any:
    """Qwix's LoRA adapters on `lora.target_modules` of `base`, in `adapter_dtype`, created by running the
    model once on a 2-token batch of `batch` rows. Traceable: `apply_lora` runs it under jit, the preflight
    under nnx.eval_shape (no weights)."""
    import jax
    import jax.numpy as jnp
    import qwix
    from flax import nnx

    from tpuforge_workloads.model.lora_provider import LoraProvider

    # Ours: dropout off where the trainer evaluates (lora_provider.without_dropout).
    regex = module_regex(lora.target_modules)
    provider = LoraProvider(
        module_path=regex,
        rank=lora.rank,
        alpha=lora.alpha,
        dropout=lora.dropout,
        partitions=weight_partitions(base, regex) if lora.base_quantization != "none" else None,
        **quantization_rule(lora, base.config),
    )
    # Positional: every family's model takes (tokens, positions, cache, attention_mask), under its own names.
    inputs = (jnp.ones((batch, 2), jnp.int32), jnp.zeros((batch, 2), jnp.int32), None, jnp.ones((batch, 2, 2), bool))
    model = qwix.apply_lora_to_model(base, provider, *inputs, rngs=nnx.Rngs(params=seed, dropout=seed))
    nnx.update(model, jax.tree.map(lambda x: x.astype(adapter_dtype), nnx.state(model, nnx.LoRAParam)))
    return model


def weight_partitions(base: Any, regex: str) -> Partitions:
    """The shape and partition of each weight of the modules `regex` targets in `base` (arrays or shapes), by
    module path as Qwix keeps it: what LoraProvider gathers a quantized weight over fsdp by."""
    from flax import nnx

    pattern = re.compile(regex)
    out: dict[tuple[str, ...], list[tuple[tuple[int, ...], tuple[str | None, ...]]]] = {}
    for path, module in nnx.iter_modules(base):
        key = tuple(str(p) for p in path)
        if not pattern.fullmatch("/".join(key)):
            continue
        out[key] = [(tuple(v.shape), partition_of(v)) for v in vars(module).values() if isinstance(v, nnx.Param)]
    return out


def partition_of(variable: Any) -> tuple[str | None, ...]:
    """The mesh axis names a parameter is laid out by, one per dimension (its sharding metadata)."""
    from flax import nnx

    return tuple(nnx.get_partition_spec(variable).get_value())


def quantization_rule(lora: LoraSpec, config: Any) -> dict[str, Any]:
    """The LoRA rule's weight quantization for `lora.base_quantization` on a model of Tunix config `config`
    (nothing for none): Qwix quantizes each targeted weight (absmax, weight only) the first time the model
    runs, and computes with it from then on; the adapters stay in their own dtype."""
    import jax.numpy as jnp

    if lora.base_quantization == "none":
        return {}
    heads = [config.head_dim] + ([config.global_key_size] if getattr(config, "global_key_size", None) else [])
    sizes = contracted_sizes(config.embed_dim, config.hidden_dim, heads)
    try:
        tile = tile_size(lora.base_quantization, sizes)
    except ValueError as e:
        raise ModelError(f"lora.baseQuantization: {e}; use int8 or none") from None
    return {"weight_qtype": jnp.dtype(lora.base_quantization), "tile_size": tile}


def quantized_weights(model: Any) -> list[tuple[tuple[Any, ...], str, Any]]:
    """(module path, attribute, value) of each weight Qwix holds quantized in `model` (its value a
    ptq.WithAux: the QArray, whose leaves are the Params, and how it was quantized)."""
    from flax import nnx
    from qwix._src.providers.ptq import WithAux  # Qwix's box of a quantized weight; not exported

    return [
        (path, name, value)
        for path, module in nnx.iter_modules(model)
        for name, value in vars(module).items()
        if isinstance(value, WithAux)
    ]


class AdapterBuild:
    """How the LoRA model is built from its base without a second copy of the base, in the trainer and in the
    preflight alike.

    Qwix inserts adapters into a clone of the model (`nnx.clone`) and creates their values by running it
    once. Under jit that clone is an output of its own beside the donated input: compiled for one TPU v5e,
    2 layers of the 31B took 4.41 GiB of arguments and returned 8.88 GiB with only 4.41 aliased, and at 6
    layers the build did not fit a chip whose train step did. So the build is split: Qwix's insertion runs on
    shapes alone (nnx.eval_shape: the LoRA model's structure), and one jitted function (`init`) takes what the
    LoRA model holds besides the adapters, runs the insertion and returns only the adapters' values, created
    on the devices where their partition specs put them. The LoRA model is then those arrays plus the
    adapters: the base exists once, as the function's argument (read by nothing: A is random and B zero), and
    its output is the adapters alone (`lower` gives XLA's memory analysis of it: the preflight adds it to its
    figures, tests check it).

    With a quantized base (lora.baseQuantization), Qwix's insertion also replaces each targeted weight by its
    quantized form, and the base is quantized while it is loaded: the loader hands each parameter to `placed`
    as soon as it is laid out, and a targeted weight is replaced there by its quantized form (one jitted
    program per kind of weight, `quantizers`), its full-precision array dropped before the next is placed. So
    the build never holds the base in full precision: at most the quantized base so far, the tensors the
    loader reads ahead and one weight in full precision beside its quantized copy. `init` then takes the
    quantized base as its (unused) argument and runs the insertion on zeros of the base's shapes inside the
    program (its adapters depend on no weight's value; XLA drops the rest). `run` quantizes whatever targeted
    weight is still in full precision (a base loaded without `placed`) the same way, one at a time."""

    def __init__(self, base: Any, lora: LoraSpec, mesh: jax.sharding.Mesh, seed: int, adapter_dtype: str):
        """`base`: the base model, with weights or abstract (its state ShapeDtypeStructs)."""
        import jax
        import jax.numpy as jnp
        from flax import nnx

        self.lora = lora
        self.mesh = mesh
        batch = mesh.shape["fsdp"]
        base_graph, base_state = nnx.split(base)
        self.base_graph = base_graph
        base_shapes = _abstract(base_state)

        def adapted(state: Any) -> Any:
            return add_adapters(nnx.merge(base_graph, state), lora, batch, seed, adapter_dtype)

        with jax.set_mesh(mesh):
            abstract = nnx.eval_shape(adapted, base_shapes)
        parts: Any = nnx.split(abstract, nnx.LoRAParam, ...)
        self.graph: Any = parts[0]
        self.adapters: Any = parts[1]  # the adapters' ShapeDtypeStructs
        self.rest: Any = parts[2]
        self.quantized = quantized_weights(abstract)
        # Each quantized weight by its parameter's path in the base's state.
        self.targets: dict[tuple[Any, ...], tuple[Any, ...]] = {(*p, n): (p, n, b) for p, n, b in self.quantized}
        self._quantizers: dict[str, Any] = {}
        shardings = nnx.get_named_sharding(self.adapters, mesh)
        # keep_unused: the adapters' values need none of the base's, but the base is held while they are made,
        # and so counted as the program's arguments in its memory analysis.
        if not self.quantized:
            self.init = jax.jit(
                lambda state: nnx.state(adapted(state), nnx.LoRAParam), out_shardings=shardings, keep_unused=True
            )
        else:  # the argument is the quantized base; the insertion runs on zeros of the full-precision one's
            # shapes, made by a program of their own: Qwix finds the parameter a weight is by tracing its value
            # back (flax_util.find_param), and from zeros made in the same trace it walks off to the constant.
            zeros = jax.jit(lambda: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), base_shapes))

            def made(held: Any) -> Any:
                return nnx.state(adapted(zeros()), nnx.LoRAParam)

            self.init = jax.jit(made, out_shardings=shardings, keep_unused=True)

    def abstract_model(self) -> Any:
        """The LoRA model of shapes alone (the preflight's)."""
        from flax import nnx

        return nnx.merge(self.graph, self.adapters, self.rest)

    def lower(self, base_state: Any) -> Any:
        """`init` lowered for what it takes: the base's state (arrays, or ShapeDtypeStructs with shardings), or
        with a quantized base, that base quantized and placed by its partition specs."""
        import jax

        from tpuforge_workloads.model.mesh import placed_shapes

        held = placed_shapes(self.rest, self.mesh) if self.quantized else base_state
        with jax.set_mesh(self.mesh):
            return self.init.lower(held)

    def lower_quantizers(self, base_state: Any) -> list[Any]:
        """Each program that quantizes a targeted weight (one per kind of weight), lowered for that weight in
        full precision as `base_state` (ShapeDtypeStructs with shardings) holds it."""
        import jax
        from flax import nnx

        weights = dict(nnx.to_flat_state(base_state))
        programs: dict[int, Any] = {}
        for path, (_, _, boxed) in self.targets.items():
            quantize = self._quantizer(boxed)
            programs.setdefault(id(quantize), (quantize, value_of(weights[path])))
        with jax.set_mesh(self.mesh):
            return [quantize.lower(weight) for quantize, weight in programs.values()]

    def placed(self, base: Any, path: tuple[Any, ...]) -> None:
        """The loader's hook, called as soon as parameter `path` of `base` has its array: a weight the LoRA
        model holds quantized is replaced by its quantized form (the others are left as they are)."""
        target = self.targets.get(tuple(path))
        if target is not None:
            self._quantize(base, *target)

    def run(self, base: Any) -> Any:
        """The LoRA model on `base`'s own arrays (nothing of the base is copied; use the result, not `base`)."""
        import jax
        from flax import nnx

        for path, name, boxed in self.quantized:  # what the loader did not quantize (none when it did)
            self._quantize(base, path, name, boxed)
        base_state = nnx.state(base)
        with jax.set_mesh(self.mesh):
            adapters = self.init(base_state)
        return nnx.merge(self.graph, adapters, base_state)

    def _quantize(self, base: Any, path: tuple[Any, ...], name: str, boxed: Any) -> None:
        """Replace weight `name` of `base`'s module at `path`, if still in full precision, by its quantized form
        (as Qwix quantizes it in the forward), laid out by its partition specs."""
        import jax
        from flax import nnx

        module = base
        for key in path:
            module = module[key] if isinstance(key, int) else getattr(module, key)
        weight = getattr(module, name)
        if not isinstance(weight, nnx.Variable):
            return  # quantized already
        quantized = self._quantizer(boxed)(weight.get_value())
        del weight
        # The abstract model's Params carry the quantized arrays' sharding metadata.
        setattr(
            module,
            name,
            jax.tree.map(lambda p, v: p.replace(v), boxed, quantized, is_leaf=lambda x: isinstance(x, nnx.Variable)),
        )

    def _quantizer(self, boxed: Any) -> Any:
        """A jitted function from a full-precision weight to the unboxed quantized form of `boxed` (one per
        way of quantizing, shape and layout, so that layers of one shape share a compiled program)."""
        import jax
        import qwix
        from flax import nnx
        from jax.sharding import NamedSharding, PartitionSpec

        def sharding(p: Any) -> Any:
            return NamedSharding(self.mesh, PartitionSpec(*partition_of(p)))  # type: ignore[no-untyped-call]

        shardings = jax.tree.map(sharding, boxed, is_leaf=lambda x: isinstance(x, nnx.Variable))
        key = repr((boxed.how, boxed.shape, shardings))
        if key not in self._quantizers:
            how = boxed.how

            def quantize(w: Any) -> Any:
                q = qwix.quantize(
                    w.reshape(boxed.shape),
                    how.qtype,
                    channelwise_axes=how.channelwise_axes,
                    tiled_axes=how.tiled_axes,
                    calibration_method=how.calibration_method,
                )
                return boxed.replace(array=q)

            self._quantizers[key] = jax.jit(quantize, out_shardings=shardings)
        return self._quantizers[key]


def value_of(x: Any) -> Any:
    """A Variable's value, or `x` itself when it is a plain value."""
    return x.get_value() if hasattr(x, "get_value") else x


def abstract_base(text: Any) -> Any:
    """The base model of `text`'s family from shapes alone, its attention installed as the loader installs it
    (checkpoint_read.load_model): what an AdapterBuild is set up from before the base's weights exist. Call
    under `jax.set_mesh`."""
    from flax import nnx

    from tpuforge_workloads import families
    from tpuforge_workloads.families import attention

    fam = families.of(text)
    return nnx.eval_shape(lambda: attention.install(fam.build(text)))


def _abstract(state: Any) -> Any:
    import jax

    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),  # type: ignore[no-untyped-call]
        state,
    )


def apply_lora(
    model: Any,
    lora: LoraSpec,
    mesh: jax.sharding.Mesh,
    seed: int,
    adapter_dtype: str = ADAPTER_DTYPE,
    build: AdapterBuild | None = None,
) -> Any:
    """The model with LoRA adapters on `lora.target_modules`, initialised from `seed` (A random, B zero, so
    training starts from the base model's outputs), stored in `adapter_dtype` and placed on `mesh`, built on
    `model`'s own weights (AdapterBuild: the base is never held twice; use the result, not `model`). `build`:
    the AdapterBuild of these arguments, made before the base was loaded so that the loader could quantize it
    as it read it (checkpoint_read.load_model's `placed`); made here if None."""
    from flax import nnx

    build = build or AdapterBuild(model, lora, mesh, seed, adapter_dtype)
    lora_model = build.run(model)
    state = nnx.state(lora_model, nnx.LoRAParam)
    found = {str(path[-2]) for path, _ in nnx.to_flat_state(state)}
    missing = [t for t in lora.target_modules if t not in found]
    if missing:
        raise ModelError(f"lora.targetModules: {missing} match no module of the model; adapted: {sorted(found)}")
    if lora.dropout > 0:
        set_dropout_seed(lora_model, seed, mesh)
    return lora_model


def attach_dropout_stream(model: Any, seed: int) -> None:
    """The stream Qwix draws LoRA dropout masks from (traceable; `set_dropout_seed` also places it)."""
    from flax import nnx

    model.set_attributes(qwix_rngs=nnx.Rngs(dropout=seed + 1))


def set_dropout_seed(model: Any, seed: int, mesh: jax.sharding.Mesh) -> None:
    """Qwix draws LoRA dropout masks from `qwix_rngs` on each module: one stream for the whole model, whose
    counter is part of the model state (and of the checkpoint, so a resumed run draws the same masks).
    The stream is replicated on the mesh, as a restored one is, so fresh and resumed runs compile the same
    train step."""
    import jax
    import numpy as np
    from flax import nnx

    attach_dropout_stream(model, seed)
    rng = nnx.state(model, nnx.RngState)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())  # type: ignore[no-untyped-call]

    # Through host memory: the stream starts on one local device, and on a multi-host mesh an array can
    # only be placed from the same host values on every process.
    def place(x: Any) -> Any:
        if jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = jax.device_put(np.asarray(jax.random.key_data(x)), replicated)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        return jax.device_put(np.asarray(x), replicated)

    nnx.update(model, jax.tree.map(place, rng))


@contextlib.contextmanager
def adapters_in_compute_dtype(model: Any) -> Iterator[None]:
    """Within the block the model's LoRA weights are cast to the model's compute dtype (a no-op when they
    share it); the stored weights are put back on exit. Works eagerly and under jit/grad."""
    import jax
    from flax import nnx

    # A copy: nnx.state's variables are the model's own, so without it the cast values would be "put back".
    stored = nnx.clone(nnx.state(model, nnx.LoRAParam))
    dtype = model.config.dtype
    nnx.update(model, jax.tree.map(lambda x: x.astype(dtype), stored))
    try:
        yield
    finally:
        nnx.update(model, stored)


def causal_inputs(tokens: np.ndarray) -> dict[str, Any]:
    """Positions and a causal mask for unpadded rows of tokens [B, T]."""
    import jax.numpy as jnp

    b, t = tokens.shape
    return {
        "positions": jnp.tile(jnp.arange(t, dtype=jnp.int32)[None], (b, 1)),
        "attention_mask": jnp.tile(jnp.tril(jnp.ones((t, t), bool))[None], (b, 1, 1)),
    }


def logits(model: Any, tokens: np.ndarray) -> np.ndarray:
    """Float32 logits [B, T, V] of unpadded rows of token ids [B, T] (no dropout is applied when the model
    was built by `load_lora_model`)."""
    import jax.numpy as jnp
    import numpy as np

    x = causal_inputs(tokens)
    with adapters_in_compute_dtype(model):
        out, _ = model(jnp.asarray(tokens, jnp.int32), x["positions"], None, x["attention_mask"])
    return np.asarray(out, dtype=np.float32)


def load_lora_model(
    base_model_uri: str,
    checkpoint_uri: str,
    step: int | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[Any, int]:
    """The trained JAX LoRA model: the base from `base_model_uri` (HF safetensors, gs:// or local), adapters
    from `checkpoint_uri` at `step` (default: the latest). LoRA settings come from the manifest beside the
    checkpoints; dropout is off. Returns (model, step). `mesh` defaults to one device."""
    model = untrained_lora_model(base_model_uri, checkpoint_uri, mesh=mesh)
    restored = restore_lora_params(checkpoint_uri, model, step)
    return model, restored


def untrained_lora_model(
    base_model_uri: str,
    checkpoint_uri: str,
    *,
    mesh: jax.sharding.Mesh | None = None,
    base_quantization: str = "none",
) -> Any:
    """The base with the adapters that `checkpoint_uri`'s manifest describes, as training creates them (B is
    zero: the model computes exactly what the base does) and without dropout; restore a step into it. The base
    is the full-precision one even when the adapters were trained on a quantized base (the manifest's
    base_quantization): the merge adds them to that base, and this model computes what the merged one does;
    `base_quantization` quantizes it instead (the forward a QLoRA run trained against)."""

    import jax

    from tpuforge_workloads import families
    from tpuforge_workloads.model import checkpoint_read
    from tpuforge_workloads.model.mesh import make_mesh

    m = read_manifest(checkpoint_uri)
    if m is None:
        raise ModelError(f"{checkpoint_uri}: no {MANIFEST_FILE}; not a tpuforge training checkpoint directory")
    text = families.read_decoder(base_model_uri)
    mesh = mesh or make_mesh(1, 1, jax.local_devices()[:1])
    lora = LoraSpec(
        rank=m.rank,
        alpha=m.alpha,
        dropout=0.0,
        target_modules=m.target_modules,
        base_quantization=base_quantization,
    )
    with jax.set_mesh(mesh):
        build = AdapterBuild(abstract_base(text), lora, mesh, 0, ADAPTER_DTYPE)
        base = checkpoint_read.load_model(
            base_model_uri, text, families.of(text).tunix_config(text), mesh, placed=build.placed
        )
    return apply_lora(base, lora, mesh, seed=0, build=build)
