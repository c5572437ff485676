"""Everything checked and prepared before JAX starts: the config, the model's config.json against the
catalog and the mesh, the tokenizer, every dataset record, the step count, and the checkpoint directory.

Any problem here is the user's input, reported as BadInput (the CLI exits with EXIT_BAD_CONFIG) with the
field or file and the fix; nothing expensive has happened yet and nothing is left half-done.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tpuforge.api import GrpoSpec, SpecError, TrainConfig, parse
from tpuforge.api.catalog import MODELS, ModelShape
from tpuforge_workloads import families, storage
from tpuforge_workloads.data.chat import ChatEncoder, TokenizerError, read_tokenizer
from tpuforge_workloads.data.pipeline import BatchSpec, DataStats, Example, count_batches, prepare_examples
from tpuforge_workloads.data.preference import parse_preference, prepare_pairs, rows_per_example
from tpuforge_workloads.data.records import DatasetError, parse_object, read_dataset
from tpuforge_workloads.data.split import split
from tpuforge_workloads.families.decoder import Decoder, ModelError, mesh_errors
from tpuforge_workloads.model import lora
from tpuforge_workloads.train import grpo
from tpuforge_workloads.train.grpo import RlProblem
from tpuforge_workloads.train.samples import SamplePrompt, pick_prompts


class BadInput(ValueError):
    """Config or input the run cannot use, found before training."""


@dataclass
class Plan:
    config: TrainConfig
    shape: ModelShape
    text: Decoder
    tokenizer: Tokenizer
    encoder: ChatEncoder
    examples: list[Example]
    stats: DataStats
    eval_examples: list[Example]
    eval_stats: DataStats | None
    batch: BatchSpec
    rows: int  # rows per micro-batch: micro_batch_size (pairs for dpo/orpo: 2 rows each) per fsdp replica
    total_steps: int
    manifest: lora.LoraManifest
    skipped: list[str]  # malformed records left out (dataset.skipInvalid), one message each
    samples: list[SamplePrompt] = field(default_factory=list)  # held-out prompts answered at each evaluation
    # spec.method grpo: the problems rollouts are drawn from, and the held-out ones (train/grpo.py)
    problems: list[RlProblem] = field(default_factory=list)
    eval_problems: list[RlProblem] = field(default_factory=list)

    @property
    def examples_per_step(self) -> int:
        """The effective batch: rows of one optimizer step, microBatchSize x fsdp x gradientAccumulationSteps."""
        return self.rows * self.config.training.gradient_accumulation_steps

    @property
    def prompts_per_micro_batch(self) -> int:
        """GRPO: the prompts of one micro-batch (microBatchSize x fsdp), groupSize rows each."""
        return self.config.training.micro_batch_size * self.config.mesh.fsdp

    @property
    def skipped_records(self) -> int | None:
        """For status.progress: None unless the job skips malformed records."""
        return len(self.skipped) if self.config.data.skip_invalid else None


def load_config(path: str | Path) -> TrainConfig:
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise BadInput(f"--config {path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"--config {path}: not JSON ({e})") from None
    try:
        return parse(TrainConfig, raw, root="config")
    except SpecError as e:
        raise BadInput(f"--config {path}: {e}") from None


def total_steps(config: TrainConfig, micro_batches: int | None) -> int:
    t = config.training
    if t.max_steps is not None:
        return t.max_steps
    assert micro_batches is not None
    return micro_batches // t.gradient_accumulation_steps


def make_plan(config: TrainConfig, write_manifest: bool = True) -> Plan:
    """`write_manifest`: False on all but one process of a multi-host slice (they only check it)."""
    try:
        return _make_plan(config, write_manifest)
    except (ModelError, DatasetError, TokenizerError) as e:
        raise BadInput(str(e)) from e


def _make_plan(config: TrainConfig, write_manifest: bool) -> Plan:
    t = config.training
    shape = MODELS.get(config.model_name)
    if shape is None:
        raise BadInput(f"modelName {config.model_name!r} is not in the model catalog; use one of {sorted(MODELS)}")
    if not shape.supports("finetune"):
        raise BadInput(f"modelName {shape.id}: the trainer does not support it yet: {shape.unsupported_because}")
    unknown = [m for m in config.lora.target_modules if m not in shape.lora_targets]
    if unknown:
        raise BadInput(f"lora.targetModules: {unknown} are not {shape.family} modules; use {list(shape.lora_targets)}")

    config_uri = storage.join(config.model_uri, "config.json")
    text = families.read_decoder(config.model_uri)
    families.check_against_catalog(text, shape, config_uri)
    mesh_problems = mesh_errors(text, config.mesh.fsdp, config.mesh.tp)
    if mesh_problems:
        raise BadInput("; ".join(mesh_problems))

    tokenizer = read_tokenizer(config.model_uri)
    if tokenizer.get_vocab_size() > text.vocab_size:
        raise BadInput(
            f"model.uri: tokenizer.json has {tokenizer.get_vocab_size()} tokens but the model only {text.vocab_size}"
        )
    d = config.data
    encoder = ChatEncoder(tokenizer, t.loss_on, d.keep_thinking)
    if config.method == "grpo":
        return _rl_plan(config, shape, text, tokenizer, encoder, write_manifest)
    group = rows_per_example(config.method)  # a preference pair's chosen and rejected rows
    pairs = group > 1
    if pairs and t.packing:
        raise BadInput(f"training.packing: {config.method} compares each pair's rows; set packing: false")
    parse, prepare = (parse_preference, prepare_pairs) if pairs else (parse_object, prepare_examples)
    train = read_dataset(config.dataset_uri, "dataset.uri", d.format, d.skip_invalid, parse)
    records, held = train.records, list[Any]()  # Records, or PreferenceRecords for dpo/orpo
    if not config.eval_uri:
        records, held = split(train.records, d.eval_fraction, d.split_seed, config.dataset_uri)
    examples, stats = prepare(records, encoder, t.max_seq_len, t.over_length, config.dataset_uri)
    stats.skipped_invalid, stats.held_out = len(train.skipped), len(held)
    skipped = list(train.skipped)
    eval_examples: list[Example] = []
    eval_stats = None
    samples: list[SamplePrompt] = []
    if config.eval_uri:
        evals = read_dataset(config.eval_uri, "dataset.evalUri", d.format, d.skip_invalid, parse)
        skipped += evals.skipped
        held = evals.records
    if held:
        where = config.eval_uri or f"{config.dataset_uri} (held out)"
        eval_examples, eval_stats = prepare(held, encoder, t.max_seq_len, t.over_length, where)
        eval_stats.skipped_invalid = len(skipped) - len(train.skipped)
        asked = [r.rows()[0] for r in held] if pairs else held  # a pair's prompt with its chosen answer
        samples = pick_prompts(asked, encoder, t.eval_samples, t.max_seq_len)

    rows = t.micro_batch_size * config.mesh.fsdp * group
    batch = BatchSpec(
        max_seq_len=t.max_seq_len,
        rows=rows,
        packing=t.packing,
        seed=t.seed,
        pad_id=encoder.tokens.pad,
        epochs=None if t.max_steps is not None else t.epochs,
        group=group,
    )
    micro_batches = None if t.max_steps is not None else count_batches(examples, batch)
    steps = total_steps(config, micro_batches)
    per_step = rows * t.gradient_accumulation_steps
    if steps < 1:
        raise BadInput(
            f"{config.dataset_uri}: {stats.examples} usable examples make {micro_batches} micro-batches of {rows} "
            f"rows, less than one step of {t.gradient_accumulation_steps}; add data or epochs, or lower "
            "training.microBatchSize / gradientAccumulationSteps"
        )
    if t.warmup_steps >= steps:
        why = "maxSteps" if t.max_steps else f"{t.epochs} epoch(s) of {stats.examples} examples, {per_step} rows a step"
        raise BadInput(
            f"training.warmupSteps ({t.warmup_steps}) must be shorter than the run: {steps} steps ({why}); "
            f"lower warmupSteps to at most {max(0, math.ceil(steps / 10))} or train longer"
        )

    manifest = lora.manifest(config.model_name, config.model_uri, config.lora)
    _check_checkpoint_dir(config, manifest, write_manifest)
    return Plan(
        config=config,
        shape=shape,
        text=text,
        tokenizer=tokenizer,
        encoder=encoder,
        examples=examples,
        stats=stats,
        eval_examples=eval_examples,
        eval_stats=eval_stats,
        batch=batch,
        rows=rows,
        total_steps=steps,
        manifest=manifest,
        skipped=skipped,
        samples=samples,
    )


def _rl_plan(
    config: TrainConfig,
    shape: ModelShape,
    text: Decoder,
    tokenizer: Tokenizer,
    encoder: ChatEncoder,
    write_manifest: bool,
) -> Plan:
    """spec.method grpo: problems (chat records with a test, or a directory in VerilogEval's layout), the
    held-out ones split off as for every method; a step's rows are its rollouts (microBatchSize prompts x fsdp
    x groupSize answers each, per micro-batch)."""
    t, d, spec = config.training, config.data, config.grpo or GrpoSpec()
    if t.packing:
        raise BadInput("training.packing: grpo scores each sampled answer in a row of its own; set packing: false")
    layout = grpo.problem_records(config.dataset_uri)
    if layout is not None:
        records = [parse_object(r, f"{config.dataset_uri} problem {i}", i) for i, r in enumerate(layout)]
        skipped: list[str] = []
    else:
        read = read_dataset(config.dataset_uri, "dataset.uri", d.format, d.skip_invalid, parse_object)
        records, skipped = read.records, list(read.skipped)
    held: list[Any] = []
    if config.eval_uri:
        held = read_dataset(config.eval_uri, "dataset.evalUri", d.format, d.skip_invalid, parse_object).records
    else:
        records, held = split(records, d.eval_fraction, d.split_seed, config.dataset_uri)
    try:
        problems = grpo.rl_problems(records, encoder, t.max_seq_len, spec)
        eval_problems = grpo.rl_problems(held, encoder, t.max_seq_len, spec)
    except grpo.ProblemError as e:
        raise BadInput(str(e)) from None
    if not problems:
        raise BadInput(f"{config.dataset_uri}: no problem to train on")
    stats = DataStats(records=len(records) + len(held), examples=len(problems), held_out=len(held))
    stats.skipped_invalid = len(skipped)
    prompts = t.micro_batch_size * config.mesh.fsdp
    rows = prompts * spec.group_size
    batch = BatchSpec(t.max_seq_len, rows, False, t.seed, encoder.tokens.pad, epochs=None)
    per_step = prompts * t.gradient_accumulation_steps
    steps = t.max_steps if t.max_steps is not None else t.epochs * grpo.ceil_div(len(problems), per_step)
    if t.warmup_steps >= steps:
        raise BadInput(
            f"training.warmupSteps ({t.warmup_steps}) must be shorter than the run: {steps} steps; lower warmupSteps "
            f"to at most {max(0, math.ceil(steps / 10))} or train longer"
        )
    manifest = lora.manifest(config.model_name, config.model_uri, config.lora)
    _check_checkpoint_dir(config, manifest, write_manifest)
    return Plan(
        config=config,
        shape=shape,
        text=text,
        tokenizer=tokenizer,
        encoder=encoder,
        examples=[],
        stats=stats,
        eval_examples=[],
        eval_stats=None,
        batch=batch,
        rows=rows,
        total_steps=steps,
        manifest=manifest,
        skipped=skipped,
        problems=problems,
        eval_problems=eval_problems,
    )


def _check_checkpoint_dir(config: TrainConfig, manifest: lora.LoraManifest, write: bool) -> None:
    """The checkpoint directory must be writable, and hold (if anything) this same adapter: resuming a
    different rank or model into it would fail deep inside Orbax. Writes the manifest (when `write`)."""
    uri = config.checkpoint.uri
    try:
        existing = lora.read_manifest(uri)
    except storage.StorageError as e:
        raise BadInput(f"checkpoint.uri: cannot read {uri} ({e})") from e
    except ValueError as e:
        raise BadInput(f"checkpoint.uri: {uri}/{lora.MANIFEST_FILE} is not a LoRA manifest ({e})") from e
    differences = [] if existing is None else existing.differences(manifest)
    if differences:
        raise BadInput(
            f"checkpoint.uri {uri} holds checkpoints of another adapter: {'; '.join(differences)}; use a new "
            "checkpoint.uri or the checkpoints' settings"
        )
    if not write:
        return
    try:
        lora.write_manifest(uri, manifest)
    except storage.StorageError as e:
        raise BadInput(f"checkpoint.uri: cannot write to {uri} ({e})") from e
