"""What both evaluation programs share: reading the EvalConfig, checking the adapter, the scratch directory."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from tpuforge.api.configs import EvalConfig, ServeConfig
from tpuforge.api.constants import EVAL_WORK_DIR_ENV
from tpuforge_workloads import storage
from tpuforge_workloads.model.adapters import AdapterInfo, config_sha256, read_adapter_manifest
from tpuforge_workloads.runtime.config_file import read_config
from tpuforge_workloads.serve.fetch import fetch

log = logging.getLogger(__name__)


class EvalInputError(ValueError):
    """A config or input the evaluation cannot use, found before anything is written; the CLI exits with
    EXIT_BAD_CONFIG and the message names the field or file and the fix."""


def load_config(path: str) -> EvalConfig:
    return read_config(EvalConfig, path, EvalInputError)


def check_adapter(cfg: EvalConfig) -> AdapterInfo:
    """The committed adapter's provenance, checked against the config: the same base (catalog id and
    config.json), rank and checkpoints. Raises AdapterError (not committed) or EvalInputError (mismatch)."""
    _, info = read_adapter_manifest(cfg.adapter_uri)
    problems = []
    if info.model_name != cfg.model_name:
        problems.append(f"modelName is {cfg.model_name} but the adapter was trained on {info.model_name}")
    try:
        base_sha = config_sha256(cfg.base_model_uri)
    except storage.StorageError as e:
        raise EvalInputError(f"baseModelUri: cannot read its config.json ({e})") from e
    if base_sha != info.base_config_sha256:
        problems.append(
            f"baseModelUri {cfg.base_model_uri} has another config.json than the adapter's base {info.base_model_uri}"
        )
    if info.rank != cfg.lora.rank:
        problems.append(f"lora.rank is {cfg.lora.rank} but the adapter has rank {info.rank}")
    if info.checkpoint_uri.rstrip("/") != cfg.checkpoint_uri.rstrip("/"):
        problems.append(f"checkpointUri is {cfg.checkpoint_uri} but the adapter came from {info.checkpoint_uri}")
    if problems:
        raise EvalInputError(f"adapterUri {cfg.adapter_uri}: {'; '.join(problems)}; evaluate it with its own base")
    return info


def scratch_dir(cfg: EvalConfig) -> Path:
    """Where the evaluation keeps its local copies (created): the config's workDir, else the directory the pod
    names (EVAL_WORK_DIR_ENV: its sized model volume), else under TMPDIR."""
    own = cfg.work_dir or os.environ.get(EVAL_WORK_DIR_ENV)
    path = Path(own) if own else Path(tempfile.gettempdir()) / "tpuforge-eval"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_models(cfg: EvalConfig) -> tuple[Path, Path]:
    """Local copies of the base (no marker needed: uploaded by hand) and of the committed adapter."""
    work = scratch_dir(cfg)
    base, adapter = work / "base", work / "adapter"
    for uri, target, committed in ((cfg.base_model_uri, base, False), (cfg.adapter_uri, adapter, True)):
        done = fetch(ServeConfig(model_uri=uri, target_dir=str(target), require_marker=committed))
        log.info("fetched %s: %d files, %.1f MB in %.1f s", uri, done["files"], done["bytes"] / 1e6, done["seconds"])
    return base, adapter
