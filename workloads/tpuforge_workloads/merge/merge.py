"""The merge job from config to committed output.

1. Plan from metadata; every input check happens here (MergeInputError), before anything is written.
2. Stage every output file under <output>/_staging (a crashed run's leftovers are deleted first).
3. Un-commit (delete the old _COMPLETE), publish the staged files, delete stale shards of older runs.
4. Check the published output (a few merged rows always; full logits with `verify`).
5. Commit: write _COMPLETE with the manifest. Any failure before this leaves no marker: absent to readers.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time

from tpuforge.api.configs import MergeConfig
from tpuforge_workloads import commit, storage
from tpuforge_workloads.commit import Manifest
from tpuforge_workloads.merge.peft import write_adapter
from tpuforge_workloads.merge.plan import make_plan
from tpuforge_workloads.merge.safetensors_io import SINGLE_FILE
from tpuforge_workloads.merge.stream import CHUNK_BYTES, StagedFile, write_base_files, write_weights
from tpuforge_workloads.merge.verify import spot_check, verify_logits

log = logging.getLogger(__name__)
_OUR_WEIGHTS = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def _previous_manifest(output: str) -> Manifest | None:
    try:
        return commit.read_manifest(output)
    except commit.CommitError:
        return None  # unreadable: nothing to learn from it; the stale-shard pattern still applies


def _remove_stale(output: str, manifest: Manifest, previous: Manifest | None) -> None:
    """Delete weight files an earlier run left that this output does not list (only names this tool
    writes, never anything else that may share the directory)."""
    keep = manifest.names()
    stale = {f.name for f in previous.files} - keep if previous else set()
    for name in storage.list_files(output):
        if "/" not in name and name not in keep and (_OUR_WEIGHTS.match(name) or name == SINGLE_FILE):
            stale.add(name)
    for name in sorted(stale):
        log.info("deleting stale %s", name)
        storage.delete(storage.join(output, name))


def run_merge(cfg: MergeConfig, verify: bool = False, chunk_bytes: int = CHUNK_BYTES) -> Manifest:
    """Merge, check and commit; returns the committed manifest."""
    started = time.monotonic()
    plan = make_plan(cfg)
    log.info(
        "merging %d LoRA targets (step %d, rank %d, scale %.4g) into %d base tensors -> %d shards at %s",
        len(plan.targets),
        plan.lora.step,
        plan.lora.rank,
        plan.scale,
        len(plan.jobs),
        len(plan.shards),
        cfg.output_uri,
    )
    output = cfg.output_uri
    staging = commit.staging_uri(output)
    storage.delete_dir(staging)
    staged: list[StagedFile] = []
    try:
        staged += write_weights(plan, output, staging, chunk_bytes)
        staged += write_base_files(plan, output, staging)
        if cfg.write_adapter:
            staged += write_adapter(plan, output, staging)
        manifest = Manifest(files=[f.entry() for f in staged], metadata=plan.provenance())
        previous = _previous_manifest(output)
        commit.remove_marker(output)
        for f in staged:
            f.writer.publish()
        _remove_stale(output, manifest, previous)
        spot_check(plan, output)
        if verify or cfg.verify:
            verify_logits(plan, output, sorted(manifest.names()))
        commit.write_marker(output, manifest)
    except BaseException:
        for f in staged:
            f.writer.discard()
        raise
    finally:
        with contextlib.suppress(Exception):
            storage.delete_dir(staging)
    seconds = time.monotonic() - started
    size = manifest.total_size()
    log.info(
        "committed %s: %d files, %.1f MB in %.1f s (%.1f MB/s)",
        output,
        len(staged),
        size / 1e6,
        seconds,
        size / 1e6 / max(seconds, 1e-9),
    )
    return manifest
