"""python -m tpuforge_workloads.evaluate.loss --config PATH --out PATH [--termination-log PATH]

Held-out loss of the base and of base + adapter: teacher-forced, on the assistant tokens, with the trainer's
own code: its chat encoding and loss masks (data.chat and data.pipeline, with the job's maxSeqLen, lossOn and
overLength), its model and LoRA as training builds them (lora.untrained_lora_model), the adapter restored from
the Orbax checkpoint at the adapter's step, and the loss training minimises (train/loss.py: summed NLL and
count of loss targets on float32 logits). The base is scored as the untrained LoRA model: B is zero, so it
computes exactly what the base does, as the trainer's step-0 evaluation sees it.

Each record is scored alone, in a padded batch of the trainer's shape (empty rows carry no loss): its loss is
the mean over its loss tokens, and the set's the mean over all of them (summed NLL over summed count, as the
evaluation during training computes it). A record training would drop (too
long, or nothing to learn within maxSeqLen) is listed as skipped with the reason.

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
from tpuforge_workloads import families, storage
from tpuforge_workloads.data.chat import ChatEncoder, TokenizerError, read_tokenizer
from tpuforge_workloads.data.pipeline import Example, eval_batches, prepare_examples, to_global
from tpuforge_workloads.data.records import DatasetError
from tpuforge_workloads.evaluate.config import (
    EvalInputError,
    check_adapter,
    load_config,
)
from tpuforge_workloads.evaluate.records import EvalExample, config_examples
from tpuforge_workloads.families.attention import model_inputs
from tpuforge_workloads.families.decoder import ModelError, mesh_errors
from tpuforge_workloads.model import lora
from tpuforge_workloads.model.adapters import AdapterError
from tpuforge_workloads.model.mesh import make_mesh
from tpuforge_workloads.runtime import termination

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

        from tpuforge_workloads.train.loss import nll_sum_and_count

        self.rows = cfg.mesh.fsdp  # one row per data-parallel replica, as a micro-batch of one
        self.length = cfg.training.max_seq_len
        self.pad_id = pad_id
        self.sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))  # type: ignore[no-untyped-call]
        self._loss = nnx.jit(lambda model, batch: nll_sum_and_count(model, **model_inputs(batch)))

    def __call__(self, model: Any, example: Example) -> tuple[float, float]:
        (batch,) = eval_batches([example], self.rows, self.length, self.pad_id)
        total, count = self._loss(model, to_global(batch, self.sharding, self.rows))
        return float(total), float(count)


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
    losses: dict[str, list[tuple[float, float]]] = {}
    for which in ("base", "adapter"):
        t0 = time.monotonic()
        if which == "adapter":
            restore_lora_params(cfg.checkpoint_uri, model, step)
        with jax.set_mesh(mesh):
            losses[which] = [scorer(model, p.tokens) for p in scored if p.tokens is not None]
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
    return {
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
    sys.exit(main())
