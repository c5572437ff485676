"""python -m tpuforge_workloads.evaluate.loss --config PATH --out PATH [--termination-log PATH]

Held-out loss of the base and of base + adapter: teacher-forced, on the assistant tokens, with the trainer's
own code: its chat encoding and loss masks (data.chat and data.pipeline, with the job's maxSeqLen, lossOn and
overLength), its model and LoRA as training builds them (lora.untrained_lora_model), the adapter restored from
the Orbax checkpoint at the adapter's step, and the loss training minimises (model/loss.py: summed NLL and
count of loss targets on float32 logits). The base is scored as the untrained LoRA model: B is zero, so it
computes exactly what the base does, as the trainer's step-0 evaluation sees it.

Each record is scored alone, in a padded batch of the trainer's shape (empty rows carry no loss): its loss is
the mean over its loss tokens, and the set's the mean over all of them (summed NLL over summed count, as the
evaluation during training computes it). A record training would drop (too
long, or nothing to learn within maxSeqLen) is listed as skipped with the reason.

With preferenceAccuracy among the metrics it also scores the job's held-out preference pairs (pairsUri, split
as the trainer splits them, rendered as it renders them) with the base and with base + adapter, per token as
evaluate/preference.py does (model/loss.answer_logps: each answer's summed log-probability and token
count), and adds {"preference": {"pairs", "accuracy", "margin", "baseAccuracy", "baseMargin"}}.

Writes {"step", "loss", "baseLoss", "tokens", "examples", "skipped", "perExample": [...], "seconds"} to
--out. Exit 0; EXIT_BAD_CONFIG (2) for a config or input rejected before any model was loaded; 1 otherwise
(an adapter not committed yet included). The reason goes to the termination log.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from tpuforge.api.configs import EvalConfig
from tpuforge.api.constants import EXIT_BAD_CONFIG, TERMINATION_LOG
from tpuforge.api.finetune import PREFERENCE_ACCURACY
from tpuforge_workloads import families, storage
from tpuforge_workloads.data.chat import ChatEncoder, TokenizerError, read_tokenizer
from tpuforge_workloads.data.pipeline import Example, eval_batches, prepare_examples, to_global
from tpuforge_workloads.data.records import DatasetError
from tpuforge_workloads.evaluate.config import (
    EvalInputError,
    check_adapter,
    load_config,
)
from tpuforge_workloads.evaluate.preference import ranking
from tpuforge_workloads.evaluate.records import EvalExample, config_examples
from tpuforge_workloads.families.attention import model_inputs
from tpuforge_workloads.families.decoder import ModelError, mesh_errors
from tpuforge_workloads.model import lora
from tpuforge_workloads.model.adapters import AdapterError
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.runtime import tensorboard, termination

log = logging.getLogger("tpuforge_workloads.evaluate.loss")


@dataclass(frozen=True)
class Prepared:
    """One record as training would see it, or why training would not use it."""

    example: EvalExample
    tokens: Example | None
    skipped: str | None = None

    @property
    def loss_tokens(self) -> int:
        return 0 if self.tokens is None else int(self.tokens["loss_mask"][1:].sum())


def prepare(cfg: EvalConfig, examples: list[EvalExample], encoder: ChatEncoder) -> list[Prepared]:
    """Each record through the trainer's own preparation (one at a time, to know which ones it drops)."""
    t = cfg.training
    out = []
    for ex in examples:
        try:
            (tokens,), _ = prepare_examples([ex.record], encoder, t.max_seq_len, t.over_length, cfg.dataset_uri)
        except DatasetError as e:
            out.append(Prepared(ex, None, str(e).split(": ", 1)[-1]))
            continue
        out.append(Prepared(ex, tokens))
    if not any(p.tokens is not None for p in out):
        raise EvalInputError(
            f"datasetUri {cfg.dataset_uri}: none of the {len(out)} records has a loss token within "
            f"training.maxSeqLen={t.max_seq_len} ({out[0].skipped})"
        )
    return out


def check_inputs(cfg: EvalConfig) -> tuple[int, list[Prepared], int]:
    """Everything checked before JAX loads a model: (the adapter's step, the prepared records, the pad id)."""
    info = check_adapter(cfg)
    text = families.read_decoder(cfg.base_model_uri)
    problems = mesh_errors(text, cfg.mesh.fsdp, cfg.mesh.tp)
    if problems:
        raise EvalInputError("; ".join(problems))
    encoder = ChatEncoder(
        read_tokenizer(cfg.base_model_uri, "baseModelUri"), cfg.training.loss_on, cfg.data.keep_thinking
    )
    return info.step, prepare(cfg, config_examples(cfg), encoder), encoder.tokens.pad


class Scorer:
    """The training loss's (NLL sum, loss-target count) of one example at a time, jitted once for the
    trainer's batch shape."""

    def __init__(self, cfg: EvalConfig, mesh: Any, pad_id: int):
        import jax
        from flax import nnx

        from tpuforge_workloads.model.loss import nll_sum_and_count

        self.rows = cfg.mesh.fsdp  # one row per data-parallel replica, as a micro-batch of one
        self.length = cfg.training.max_seq_len
        self.pad_id = pad_id
        self.sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
        self._loss = nnx.jit(lambda model, batch: nll_sum_and_count(model, **model_inputs(batch)))

    def __call__(self, model: Any, example: Example) -> tuple[float, float]:
        (batch,) = eval_batches([example], self.rows, self.length, self.pad_id)
        total, count = self._loss(model, to_global(batch, self.sharding, self.rows))
        return float(total), float(count)


def held_out_pairs(cfg: EvalConfig) -> tuple[list[Example], int]:
    """For preferenceAccuracy: the job's held-out preference pairs as the trainer renders them (chosen row, then
    rejected row, the loss mask on the answer alone), and the pad id."""
    from tpuforge_workloads.data.preference import parse_preference, prepare_pairs
    from tpuforge_workloads.data.records import read_dataset
    from tpuforge_workloads.data.split import split

    if cfg.pairs_uri is None:
        raise EvalInputError("metrics asks for preferenceAccuracy but the config names no pairsUri")
    encoder = ChatEncoder(read_tokenizer(cfg.base_model_uri, "baseModelUri"), "assistant", cfg.data.keep_thinking)
    d = cfg.data
    records: list[Any] = read_dataset(cfg.pairs_uri, "pairsUri", d.format, d.skip_invalid, parse_preference).records
    if cfg.pairs_held_out:
        records = split(records, d.eval_fraction, d.split_seed, cfg.pairs_uri)[1]
    t = cfg.training
    rows, _ = prepare_pairs(records, encoder, t.max_seq_len, t.over_length, cfg.pairs_uri)
    return rows, encoder.tokens.pad


class PairScorer:
    """Each row's (summed log-probability of its answer, its token count), with the trainer's own
    model/loss.answer_logps, jitted once for a batch of one pair per data-parallel replica."""

    def __init__(self, cfg: EvalConfig, mesh: Any, pad_id: int):
        import jax
        from flax import nnx

        from tpuforge_workloads.model.loss import answer_logps

        self.rows = 2 * cfg.mesh.fsdp
        self.length = cfg.training.max_seq_len
        self.pad_id = pad_id
        self.sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
        self._logps = nnx.jit(lambda model, batch: answer_logps(model, **model_inputs(batch)))

    def __call__(self, model: Any, rows: list[Example]) -> tuple[list[float], list[float]]:
        import numpy as np

        logps: list[float] = []
        counts: list[float] = []
        for batch in eval_batches(rows, self.rows, self.length, self.pad_id):
            logp, count = self._logps(model, to_global(batch, self.sharding, self.rows))
            real = np.asarray(count) > 0
            logps += np.asarray(logp)[real].tolist()
            counts += np.asarray(count)[real].tolist()
        return logps, counts


def mean_loss(scores: list[tuple[float, float]]) -> float:
    """The set's loss: summed NLL over summed loss targets (each example weighted by its loss tokens)."""
    return sum(s for s, _ in scores) / sum(n for _, n in scores)


def run_loss(cfg: EvalConfig) -> dict[str, Any]:
    import jax

    from tpuforge_workloads.model.adapter_checkpoint import restore_lora_params

    seconds: dict[str, float] = {}
    started = time.monotonic()
    step, prepared, pad_id = check_inputs(cfg)
    scored = [p for p in prepared if p.tokens is not None]
    mesh = make_mesh(cfg.mesh.fsdp, cfg.mesh.tp)
    model = lora.untrained_lora_model(cfg.base_model_uri, cfg.checkpoint_uri, mesh=mesh)
    seconds["load"] = time.monotonic() - started
    scorer = Scorer(cfg, mesh, pad_id)
    pairs, pair_scorer = None, None
    if PREFERENCE_ACCURACY in cfg.metrics:
        pair_rows, pair_pad = held_out_pairs(cfg)
        pairs, pair_scorer = pair_rows, PairScorer(cfg, mesh, pair_pad)
    losses: dict[str, list[tuple[float, float]]] = {}
    ranked: dict[str, dict[str, float]] = {}
    for which in ("base", "adapter"):
        t0 = time.monotonic()
        if which == "adapter":
            restore_lora_params(cfg.checkpoint_uri, model, step)
        with jax.set_mesh(mesh):
            losses[which] = [scorer(model, p.tokens) for p in scored if p.tokens is not None]
            if pairs is not None and pair_scorer is not None:
                logps, counts = pair_scorer(model, pairs)
                ranked[which] = ranking(logps[0::2], counts[0::2], logps[1::2], counts[1::2])
        seconds[which] = time.monotonic() - t0
        log.info("%s loss over %d examples in %.1f s", which, len(scored), seconds[which])
    tokens = [p.loss_tokens for p in scored]
    per_example: list[dict[str, Any]] = []
    it = iter(zip(losses["adapter"], losses["base"], strict=True))
    for p in prepared:
        if p.tokens is None:
            per_example.append({"index": p.example.index, "skipped": p.skipped})
            continue
        (adapter_sum, n), (base_sum, _) = next(it)
        per_example.append(
            {"index": p.example.index, "loss": adapter_sum / n, "baseLoss": base_sum / n, "tokens": p.loss_tokens}
        )
    seconds["total"] = time.monotonic() - started
    preference = {}
    if ranked:  # the base: the untrained LoRA model (B is zero), where DPO and ORPO start
        base, adapter = ranked["base"], ranked["adapter"]
        preference = {
            "preference": {
                "pairs": adapter["pairs"],
                "accuracy": adapter["accuracy"],
                "margin": adapter["margin"],
                "baseAccuracy": base["accuracy"],
                "baseMargin": base["margin"],
            }
        }
    return {
        **preference,
        "step": step,
        "loss": mean_loss(losses["adapter"]),
        "baseLoss": mean_loss(losses["base"]),
        "tokens": sum(tokens),
        "examples": len(scored),
        "skipped": len(prepared) - len(scored),
        "perExample": per_example,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuforge_workloads.evaluate.loss", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", required=True, help="EvalConfig JSON file")
    parser.add_argument("--out", required=True, help="where the losses go (JSON; local path or gs://)")
    parser.add_argument("--termination-log", default=TERMINATION_LOG, help="where the failure reason goes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax: each restore at INFO
    try:
        result = run_loss(load_config(args.config))
        storage.write_text(args.out, json.dumps(result, indent=1) + "\n")
    except (EvalInputError, DatasetError, TokenizerError, ModelError) as e:
        return termination.fail(args.termination_log, e, EXIT_BAD_CONFIG)
    except AdapterError as e:
        return termination.fail(args.termination_log, e, 1)
    except Exception as e:
        return termination.fail(args.termination_log, e, 1, unexpected="evaluation loss failed")
    log.info(
        "loss %.4f (base %.4f) over %d examples -> %s", result["loss"], result["baseLoss"], result["examples"], args.out
    )
    return 0


if __name__ == "__main__":
    tensorboard.without_torch()  # it runs in the trainer's image, as the trainer does
    sys.exit(main())
