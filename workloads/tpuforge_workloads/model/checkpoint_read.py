"""Loading the base model's HF safetensors onto the mesh, each process reading only its share of the bytes.

The model shards the embedding axis over fsdp, and fsdp is the axis that spans hosts; in the HF layout that
axis is the inner one of most tensors (q_proj is (heads*head_dim, D), row-major), so a host's share of the
final layout is half of every row: strided bytes, one request per row. Instead each tensor is read, in its
stored layout, split by rows over every device of the mesh: devices are host-major (mesh.py), so a
process's rows are one contiguous byte range (one ranged read per tensor per process, about 1/hosts of the
checkpoint). A jit per tensor shape then transposes/reshapes it (the key mapping's transforms) and combines
q/k/v on the devices, with the model's own parameter shardings as output: XLA's collectives move the data.
Tensors whose first axis the device count does not divide (layer scalars, some norms) are read whole by
every process; they are tiny. Files are read where they are (local paths or gs://): nothing is staged.
Tensors are read a few at a time ahead of the one being laid out, and each read array is dropped as soon as
its parameter is laid out: the load holds the model plus those few tensors, and a hook sees each parameter
as it is placed (QLoRA quantizes its base there, lora.AdapterBuild).
"""

from __future__ import annotations

import functools
import json
import logging
import struct
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tpuforge_workloads import families, storage
from tpuforge_workloads.families.decoder import CombinedQkv, Decoder, ModelError

if TYPE_CHECKING:
    import jax

log = logging.getLogger(__name__)

_NP_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
_READERS = 8  # ranged reads in flight: one stream does not fill a TPU host's network


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file: where its bytes are and what they hold."""

    uri: str
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy name
    start: int  # absolute byte offset in the file
    nbytes: int


def read_header(uri: str) -> list[StoredTensor]:
    """The tensors of safetensors file `uri`, from its header alone (8-byte length + JSON)."""
    (n,) = struct.unpack("<Q", storage.read_range(uri, 0, 8))
    header = json.loads(storage.read_range(uri, 8, n))
    out = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _NP_DTYPES:
            raise ModelError(f"{uri}: tensor {name} has dtype {meta['dtype']}; expected one of {list(_NP_DTYPES)}")
        begin, end = meta["data_offsets"]
        out.append(StoredTensor(uri, name, tuple(meta["shape"]), _NP_DTYPES[meta["dtype"]], 8 + n + begin, end - begin))
    return out


def list_tensors(model_uri: str) -> list[StoredTensor]:
    files = sorted(storage.join(model_uri, n) for n in storage.list_files(model_uri) if n.endswith(".safetensors"))
    if not files:
        raise ModelError(f"{model_uri}: no *.safetensors files")
    return [t for f in files for t in read_header(f)]


def row_split(shape: tuple[int, ...], devices: int) -> bool:
    """Whether a tensor is read split by rows over `devices` (else whole, by every process)."""
    return len(shape) >= 1 and shape[0] % devices == 0


def process_rows(sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> tuple[int, int]:
    """The first-axis range [start, stop) this process's devices hold of an array of `shape`."""
    indices = sharding.addressable_devices_indices_map(shape).values()
    spans = [idx[0].indices(shape[0])[:2] if idx else (0, shape[0]) for idx in indices]
    return min(s for s, _ in spans), max(e for _, e in spans)


def _read(t: StoredTensor, rows: tuple[int, int]) -> np.ndarray:
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

    row_bytes = t.nbytes // t.shape[0] if t.shape else t.nbytes
    start, stop = rows
    data = np.empty((stop - start, *t.shape[1:]) if t.shape else (), dtype=np.dtype(t.dtype))
    got = storage.read_range_into(t.uri, t.start + start * row_bytes, data.reshape(-1).view(np.uint8).data)
    if got != data.nbytes:
        raise ModelError(f"{t.uri}: tensor {t.name} is cut short ({got} of {data.nbytes} bytes)")
    return data


@functools.cache
def _transform(permute: tuple[int, ...] | None, reshape: tuple[int, ...] | None, out: Any) -> Callable[..., Any]:
    """A jit laying out one tensor as the key mapping says, straight into the parameter's sharding."""
    import jax

    def f(x: Any) -> Any:
        if permute:
            x = x.transpose(permute)
        return x.reshape(reshape) if reshape else x

    return jax.jit(f, out_shardings=out)


@functools.cache
def _qkv(
    combine: CombinedQkv, transforms: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...], shared: bool, out: Any
) -> Any:
    """A jit laying out one layer's q, k(, v) and combining them (the family's `combine`); `out` holds the
    output shardings as (name, sharding) pairs."""
    import jax
    import jax.numpy as jnp

    def f(*xs: Any) -> Any:
        laid = {n: x.transpose(p).reshape(r) for n, x, (p, r) in zip("qkv", xs, transforms, strict=False)}
        return combine.combine(laid, shared, jnp)

    return jax.jit(f, out_shardings=dict(out))


def load_model(
    model_uri: str | Path,
    text: Decoder,
    cfg: Any,
    mesh: jax.sharding.Mesh,
    stats: dict[str, float] | None = None,
    placed: Callable[[Any, tuple[Any, ...]], None] | None = None,
) -> Any:
    """The base model of `text`'s family with the checkpoint's weights from `model_uri` (a local directory or
    gs://), every parameter placed by the model's sharding rules, its attention set up by its family (Gemma 4's
    takes segment ids, attention.py).
    Tensors are read at most `_READERS` ahead of the one being laid out, and each read array is dropped once
    its parameter is laid out, so the load holds the model plus those few tensors. `placed(model, path)` is
    called as soon as the parameter at `path` (of nnx.state(model)) has its array, before the next is laid
    out: QLoRA's build quantizes the targeted weights there (lora.AdapterBuild.placed).
    `stats` gets `model_bytes_read` (by this process) and `model_bytes` (the decoder's tensors)."""
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec
    from tunix.utils.torch_utils import torch_key_to_jax_key

    from tpuforge_workloads.families import attention

    fam = families.of(text)
    uri = str(model_uri)
    stored = list_tensors(uri)
    fam.check_tensors([t.name for t in stored], text, uri)
    key_map = fam.key_mapping(cfg)
    mapped: dict[str, tuple[StoredTensor, Any]] = {}
    for t in stored:
        try:
            key, transform = torch_key_to_jax_key(key_map, t.name)
        except ValueError:
            continue  # not the text decoder's (vision tower, lm_head): never read
        mapped[key.removesuffix(".value")] = (t, transform)

    with jax.set_mesh(mesh):
        model = nnx.eval_shape(lambda: fam.model_class()(cfg, rngs=nnx.Rngs(params=0)))
    # The model's parameters, each given its array as it is laid out (the model's own Variables).
    params = {_dotted(path): (path, v) for path, v in nnx.to_flat_state(nnx.state(model))}
    shardings = nnx.get_named_sharding(nnx.state(model), mesh).to_pure_dict()
    targets = {_dotted(p): s for p, s in jax.tree_util.tree_flatten_with_path(shardings)[0]}
    by_rows = NamedSharding(mesh, PartitionSpec(mesh.axis_names))  # type: ignore[no-untyped-call]
    whole = NamedSharding(mesh, PartitionSpec())  # type: ignore[no-untyped-call]

    def fetch(t: StoredTensor) -> tuple[Any, int]:
        split = row_split(t.shape, mesh.devices.size)
        rows = process_rows(by_rows, t.shape) if split else (0, t.shape[0] if t.shape else 0)
        data = _read(t, rows)

        def local(index: tuple[slice, ...] | None) -> np.ndarray:
            if not split or index is None:
                return data if index is None else data[index]
            start, stop, _ = index[0].indices(t.shape[0])
            first = slice(start - rows[0], stop - rows[0])
            return data[(first, *index[1:])]

        return jax.make_array_from_callback(t.shape, by_rows if split else whole, local), data.nbytes

    def put(key: str, array: Any) -> None:
        path, variable = params.pop(key)  # not held here after: `placed` may replace it in the model
        variable.set_value(array)
        del variable
        if placed is not None:
            placed(model, path)

    qkv_of = fam.combined_qkv
    parts_of = {key: qkv_of.part(key) if qkv_of else None for key in mapped}  # Gemma 4's q, k, v: one per layer
    expected: dict[int, int] = {}
    for found in filter(None, parts_of.values()):
        expected[found[0]] = expected.get(found[0], 0) + 1
    layers: dict[int, dict[str, Any]] = {}
    read = 0
    with ThreadPoolExecutor(_READERS) as pool:
        arrays = _in_order(pool, fetch, [t for t, _ in mapped.values()], _READERS)
        for (key, (_, transform)), (array, nbytes) in zip(mapped.items(), arrays, strict=True):
            read += nbytes
            part = parts_of[key]
            if part is None:
                permute, reshape = transform or (None, None)
                put(key, _transform(_tuple(permute), _tuple(reshape), targets[key])(array))
                del array
                continue
            i = part[0]
            qkv = layers.setdefault(i, {})
            qkv[part[1]] = (array, transform)
            del array
            if len(qkv) < expected[i]:
                continue
            assert qkv_of is not None
            shared = qkv_of.keys_are_values(text, i)
            names = ("q_einsum.w", "k_einsum.w") if shared else ("q_einsum.w", "kv_einsum.w")
            out = tuple((n, targets[f"layers.{i}.attn.{n}"]) for n in names)
            qkv = layers.pop(i)
            ordered = [qkv[n] for n in "qkv" if n in qkv]
            transforms = tuple((tuple(p), tuple(r)) for _, (p, r) in ordered)
            combined = _qkv(qkv_of, transforms, shared, out)(*(a for a, _ in ordered))
            del ordered, qkv
            for n in names:
                put(f"layers.{i}.attn.{n}", combined.pop(n))
    missing = sorted(params)
    if missing:
        raise ModelError(f"{uri}: no tensor for the model parameters {', '.join(missing[:5])}")

    total = sum(t.nbytes for t, _ in mapped.values())
    log.info("read %d of the checkpoint's %d bytes of decoder tensors (%.0f%%)", read, total, 100 * read / total)
    if stats is not None:
        stats.update(model_bytes_read=float(read), model_bytes=float(total))
    return attention.install(model)


def _in_order(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: list[Any], ahead: int) -> Iterator[Any]:
    """fn of each of `items`, in order, run on `pool` at most `ahead` items before the one taken."""
    pending: deque[Future[Any]] = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) > ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _tuple(x: Any) -> tuple[int, ...] | None:
    return tuple(x) if x else None


def _dotted(path: Any) -> str:
    import jax

    return jax.tree_util.keystr(path, simple=True, separator=".")
