"""The merge job from config to committed output.

1. Plan from metadata; every input check happens here (MergeInputError), before anything is written.
2. Stage every output file under <output>/_staging (a crashed run's leftovers are deleted first).
3. Un-commit (delete the old _COMPLETE), publish the staged files, delete stale shards of older runs.
4. Check the published output (a few merged rows always; full logits with `verify`).
5. Commit: write _COMPLETE with the manifest. Any failure before this leaves no marker: absent to readers.

The PEFT adapter (merge.writeAdapter, or alone when merge.writeMerged is false) is a committed directory of its
own, <output>/adapter, with its own marker and manifest (metadata: adapters.AdapterInfo), so that serving and
evaluation can take it without the merged model; it goes through the same steps beside the merged model.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from tpuforge.api.configs import MergeConfig
from tpuforge_workloads import storage
from tpuforge_workloads.merge.peft import adapter_info, write_adapter
from tpuforge_workloads.merge.plan import make_plan
from tpuforge_workloads.merge.safetensors_io import SINGLE_FILE
from tpuforge_workloads.merge.stream import CHUNK_BYTES, StagedFile, write_base_files, write_weights
from tpuforge_workloads.merge.verify import spot_check, verify_logits
from tpuforge_workloads.model import adapters
from tpuforge_workloads.storage import commit
from tpuforge_workloads.storage.commit import Manifest

log = logging.getLogger(__name__)
_OUR_WEIGHTS = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def _previous_manifest(output: str) -> Manifest | None:
    try:
        return commit.read_manifest(output)
    except commit.CommitError:
        return None  # unreadable: nothing to learn from it; the stale-shard pattern still applies


def _remove_stale(output: str, manifest: Manifest, previous: Manifest | None) -> None:
    """Delete weight files an earlier run left that this output does not list (only names this tool
    writes, never anything else that may share the directory, such as the adapter's own directory)."""
    keep = manifest.names()
    stale = {f.name for f in previous.files if "/" not in f.name} - keep if previous else set()
    for name in storage.list_files(output):
        if "/" not in name and name not in keep and (_OUR_WEIGHTS.match(name) or name == SINGLE_FILE):
            stale.add(name)
    for name in sorted(stale):
        log.info("deleting stale %s", name)
        storage.delete(storage.join(output, name))


@dataclass
class _Output:
    """One committed directory this run writes: the merged model, or the adapter."""

    uri: str
    metadata: dict[str, Any]
    staged: list[StagedFile] = field(default_factory=list)

    @property
    def staging(self) -> str:
        return commit.staging_uri(self.uri)

    def manifest(self) -> Manifest:
        return Manifest(files=[f.entry() for f in self.staged], metadata=self.metadata)


def run_merge(cfg: MergeConfig, verify: bool = False, chunk_bytes: int = CHUNK_BYTES) -> Manifest:
    """Merge (unless cfg.write_merged is false), export the adapter (when asked, or alone), check and commit;
    returns the merged model's manifest, or the adapter's on an adapter-only run."""
    started = time.monotonic()
    plan = make_plan(cfg)
    log.info(
        "%s %d LoRA targets (step %d, rank %d, scale %.4g)%s at %s",
        "merging" if cfg.write_merged else "exporting the adapter of",
        len(plan.targets),
        plan.lora.step,
        plan.lora.rank,
        plan.scale,
        f" into {len(plan.jobs)} base tensors -> {len(plan.shards)} shards" if cfg.write_merged else "",
        cfg.output_uri,
    )
    outputs: list[_Output] = []
    if cfg.write_adapter or not cfg.write_merged:
        outputs.append(_Output(adapters.adapter_uri(cfg.output_uri), adapter_info(plan).metadata()))
    merged = _Output(cfg.output_uri, plan.provenance()) if cfg.write_merged else None
    if merged is not None:
        outputs.append(merged)
    for out in outputs:
        storage.delete_dir(out.staging)
    try:
        for out in outputs:
            if out is merged:
                out.staged += write_weights(plan, out.uri, out.staging, chunk_bytes)
                out.staged += write_base_files(plan, out.uri, out.staging)
            else:
                out.staged += write_adapter(plan, out.uri, out.staging)
        manifests = {out.uri: out.manifest() for out in outputs}
        previous = {out.uri: _previous_manifest(out.uri) for out in outputs}
        # Nothing is presented as complete from here until each directory's own marker is written again.
        for out in outputs:
            commit.remove_marker(out.uri)
        for out in outputs:
            for f in out.staged:
                f.writer.publish()
            _remove_stale(out.uri, manifests[out.uri], previous[out.uri])
        if merged is not None:
            spot_check(plan, merged.uri)
            if verify or cfg.verify:
                verify_logits(plan, merged.uri, sorted(manifests[merged.uri].names()))
        for out in outputs:
            commit.write_marker(out.uri, manifests[out.uri])
    except BaseException:
        for out in outputs:
            for f in out.staged:
                f.writer.discard()
        raise
    finally:
        for out in outputs:
            with contextlib.suppress(Exception):
                storage.delete_dir(out.staging)
    for out in outputs:
        _log_committed(out.uri, manifests[out.uri], started)
    return manifests[outputs[-1].uri]


def _log_committed(uri: str, manifest: Manifest, started: float) -> None:
    seconds = time.monotonic() - started
    size = manifest.total_size()
    log.info(
        "committed %s: %d files, %.1f MB in %.1f s (%.1f MB/s)",
        uri,
        len(manifest.files),
        size / 1e6,
        seconds,
        size / 1e6 / max(seconds, 1e-9),
    )
