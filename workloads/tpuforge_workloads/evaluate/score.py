"""python -m tpuforge_workloads.evaluate.score --config PATH [--loss loss.json] [--samples S --verdicts V]
    [--answers answers.json] [--termination-log PATH]

Runs in the evaluator image (vLLM + tpuforge; no JAX). Copies the base (as uploaded: no marker needed) and
the committed adapter (its `_COMPLETE` required) to workDir, asks vLLM for greedy answers from the base and
from base + adapter, scores exact match (the answer equals the record's last assistant turn, surrounding
whitespace aside), takes the held-out loss from `--loss` (what evaluate.loss wrote) and, for passAtK, the
checked samples from `--samples` (evaluate.sample) and `--verdicts` (evaluate.check) (with `--answers`, the
greedy answers evaluate.sample drew in the same engine, so vLLM is not loaded here), and commits the report
at reportUri: report.jsonl (one line per record) and summary.json, with `_COMPLETE`.

On success the termination log holds exactly the result the operator reads:
    {"metrics": {...}, "baseMetrics": {...}, "examples": n, "reportUri": "..."}
with the metrics the config asks for; with passAtK also "intervals" and "baseIntervals" (each pass@k's
confidence interval, {"low", "high", "method"}), "failures" and "baseFailures" (failed samples by category,
those seen), "standardErrors" (the adapter's), "sampling" (how the samples were drawn) and
"excludedProblems" (problems the checker found broken, kept out of pass@k). summary.json has the same, each
model's failures in every category, how the intervals were made, which problems were kept out and the
simulators the checker named.
Failures exit nonzero with the reason, in plain text, in the termination log: EXIT_BAD_CONFIG (2) for a
config or input that cannot be used, 1 otherwise (an adapter without `_COMPLETE` included). Nothing is
committed at reportUri unless the whole report was written.

The scores also go to TensorBoard, at the adapter's training step, in the run `eval` beside the trainer's
(<checkpointUri>/tensorboard/eval: tags eval/<metric> for base + adapter, eval_base/<metric> for the base),
so the evaluation's held-out loss is drawn on the same chart as the loss measured during training. That is
a view, not the result: a failure to write it is logged and the evaluation still succeeds.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

from tpuforge.api.code_eval import CONFIDENCE_LEVEL, INTERVAL_METHOD, PASS_AT_K
from tpuforge.api.configs import EvalConfig
from tpuforge.api.constants import EXIT_BAD_CONFIG, TENSORBOARD_EVAL_RUN, TENSORBOARD_SUBDIR, TERMINATION_LOG
from tpuforge.api.finetune import PREFERENCE_ACCURACY
from tpuforge_workloads import storage
from tpuforge_workloads.data.records import DatasetError
from tpuforge_workloads.evaluate.answers import AnswerError, Answers, generate
from tpuforge_workloads.evaluate.config import EvalInputError, check_adapter, fetch_models, load_config
from tpuforge_workloads.evaluate.functional import (
    Checked,
    broken_problems,
    checked_samples,
    failure_counts,
    pass_intervals,
    pass_metrics,
    report_fields,
    rises,
    sampling,
    standard_errors,
)
from tpuforge_workloads.evaluate.records import EvalExample, config_examples
from tpuforge_workloads.model.adapters import AdapterError, AdapterInfo
from tpuforge_workloads.runtime import tensorboard as tensorboard_log
from tpuforge_workloads.runtime import termination
from tpuforge_workloads.serve.fetch import FetchError
from tpuforge_workloads.storage import commit

log = logging.getLogger("tpuforge_workloads.evaluate.score")
# Beside preferenceAccuracy: the held-out pairs' mean (chosen - rejected) log-probability per token, nats.
PREFERENCE_MARGIN = "preferenceMargin"
REPORT_FILE = "report.jsonl"
SUMMARY_FILE = "summary.json"


def exact_match(answer: str, reference: str) -> bool:
    return answer.strip() == reference.strip()


def _overlaps(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def read_losses(path: str | None, cfg: EvalConfig, examples: list[EvalExample]) -> dict[str, Any] | None:
    """evaluate.loss's output, checked to be about these records; None when not given."""
    if path is None:
        for metric in ("loss", PREFERENCE_ACCURACY):
            if metric in cfg.metrics:
                raise EvalInputError(
                    f"metrics asks for {metric} but no --loss file was given (evaluate.loss writes it)"
                )
        return None
    try:
        losses = json.loads(storage.read_text(path))
        per = losses["perExample"]
        indices = [p["index"] for p in per]
        float(losses["loss"]), float(losses["baseLoss"])
        if PREFERENCE_ACCURACY in cfg.metrics:
            p = losses["preference"]
            float(p["accuracy"]), float(p["margin"]), float(p["baseAccuracy"]), float(p["baseMargin"])
    except (storage.StorageError, ValueError, KeyError, TypeError) as e:
        raise EvalInputError(f"--loss {path}: not what evaluate.loss writes ({type(e).__name__}: {e})") from e
    if indices != [ex.index for ex in examples]:
        raise EvalInputError(
            f"--loss {path}: covers {len(indices)} records but this config evaluates {len(examples)}: the loss "
            "was computed with another datasetUri or maxExamples"
        )
    return dict(losses)


def read_answers(path: str, examples: list[EvalExample]) -> Answers:
    """evaluate.sample's greedy answers (--answers), checked to be one per record for base and adapter."""
    try:
        got = json.loads(storage.read_text(path))
        answers = Answers(base=list(got["base"]), adapter=list(got["adapter"]), seconds=float(got["seconds"]))
    except (storage.StorageError, ValueError, KeyError, TypeError) as e:
        raise EvalInputError(f"--answers {path}: not what evaluate.sample writes ({type(e).__name__}: {e})") from e
    if not len(answers.base) == len(answers.adapter) == len(examples):
        raise EvalInputError(
            f"--answers {path}: {len(answers.adapter)} answers but this config evaluates {len(examples)} records"
        )
    return answers


def report_lines(
    examples: list[EvalExample], answers: Answers | None, losses: dict[str, Any] | None, checked: Checked | None
) -> list[dict[str, Any]]:
    lines = []
    per_loss = {p["index"]: p for p in losses["perExample"]} if losses else {}
    for i, ex in enumerate(examples):
        line: dict[str, Any] = {"index": ex.index, "prompt": ex.prompt_json(), "reference": ex.reference}
        if answers is not None:
            line.update(
                answer=answers.adapter[i],
                baseAnswer=answers.base[i],
                exactMatch=exact_match(answers.adapter[i], ex.reference),
                baseExactMatch=exact_match(answers.base[i], ex.reference),
            )
        if ex.index in per_loss:
            line.update({k: v for k, v in per_loss[ex.index].items() if k != "index"})
        if checked is not None:
            line.update(report_fields(checked, ex.index))
        lines.append(line)
    return lines


def metrics_of(
    cfg: EvalConfig,
    examples: list[EvalExample],
    lines: list[dict[str, Any]],
    losses: dict[str, Any] | None,
    checked: Checked | None,
) -> dict[str, Any]:
    metrics: dict[str, float] = {}
    base: dict[str, float] = {}
    code: dict[str, Any] = {}
    if checked is not None:
        metrics, base = pass_metrics(cfg, examples, checked)
        intervals, base_intervals = pass_intervals(cfg, examples, checked)
        failures, base_failures = (failure_counts(checked, m) for m in ("adapter", "base"))
        code = {
            "intervals": intervals,
            "baseIntervals": base_intervals,
            "failures": {k: v for k, v in failures.items() if v},
            "baseFailures": {k: v for k, v in base_failures.items() if v},
            "standardErrors": standard_errors(cfg, examples, checked, "adapter"),
            "sampling": sampling(cfg),
            "excludedProblems": len(broken_problems(examples, checked)),
        }
    if "loss" in cfg.metrics and losses is not None:
        metrics["loss"], base["loss"] = float(losses["loss"]), float(losses["baseLoss"])
    if PREFERENCE_ACCURACY in cfg.metrics and losses is not None:
        p = losses["preference"]
        metrics[PREFERENCE_ACCURACY], base[PREFERENCE_ACCURACY] = float(p["accuracy"]), float(p["baseAccuracy"])
        metrics[PREFERENCE_MARGIN], base[PREFERENCE_MARGIN] = float(p["margin"]), float(p["baseMargin"])
    if "exactMatch" in cfg.metrics:
        metrics["exactMatch"] = sum(line["exactMatch"] for line in lines) / len(lines)
        base["exactMatch"] = sum(line["baseExactMatch"] for line in lines) / len(lines)
    return {"metrics": metrics, "baseMetrics": base, **code, "examples": len(lines), "reportUri": cfg.report_uri}


def code_summary(cfg: EvalConfig, examples: list[EvalExample], checked: Checked) -> dict[str, Any]:
    """summary.json's passAtK fields: the sampling and checker settings (the temperature as drawn at), how the
    intervals were made, each model's failed samples in every category, the problems kept out of pass@k as
    broken (their record indices), each pass@k's rise over the base with its paired interval and the
    simulators the checker named."""
    assert cfg.code is not None
    return {
        "code": cfg.code.to_wire(),
        "confidence": {
            "method": INTERVAL_METHOD,
            "description": "exact binomial interval over the problems, their pass@k estimates summed as successes",
            "level": CONFIDENCE_LEVEL,
            "gate": "minPassAt is held against the interval's low bound",
        },
        "failureCounts": {model: failure_counts(checked, model) for model in ("adapter", "base")},
        "excludedProblems": broken_problems(examples, checked),
        "baseStandardErrors": standard_errors(cfg, examples, checked, "base"),
        "rise": rises(cfg, examples, checked),
        "simulators": sorted({s["simulator"] for drawn in checked.values() for s in drawn if s.get("simulator")}),
    }


def read_checked(
    cfg: EvalConfig, examples: list[EvalExample], samples: str | None, verdicts: str | None
) -> Checked | None:
    """The checked samples when the config asks for passAtK (both files needed), else None."""
    if PASS_AT_K not in cfg.metrics:
        return None
    if samples is None or verdicts is None:
        raise EvalInputError(
            "metrics asks for passAtK but --samples and --verdicts were not both given (evaluate.sample and "
            "evaluate.check write them)"
        )
    return checked_samples(cfg, examples, samples, verdicts)


def run_score(
    cfg: EvalConfig,
    loss_path: str | None = None,
    samples: str | None = None,
    verdicts: str | None = None,
    answers_path: str | None = None,
) -> dict[str, Any]:
    """Score, commit the report; returns the result for the termination log."""
    started = time.monotonic()
    for field, uri in (("adapterUri", cfg.adapter_uri), ("baseModelUri", cfg.base_model_uri)):
        if _overlaps(cfg.report_uri, uri):
            raise EvalInputError(f"reportUri {cfg.report_uri} overlaps {field} {uri}; give the report its own place")
    info: AdapterInfo = check_adapter(cfg)
    examples = config_examples(cfg)
    losses = read_losses(loss_path, cfg, examples)
    checked = read_checked(cfg, examples, samples, verdicts)
    answers = None
    if "exactMatch" in cfg.metrics and answers_path is not None:
        answers = read_answers(answers_path, examples)
        log.info("%d x 2 greedy answers from evaluate.sample's engine (%s)", len(examples), answers_path)
    elif "exactMatch" in cfg.metrics:
        base_dir, adapter_dir = fetch_models(cfg)
        prompts = [ex.prompt_json() for ex in examples]
        answers = generate(base_dir, adapter_dir, info.rank, prompts, cfg.max_new_tokens, cfg.data.keep_thinking)
        log.info("%d x 2 greedy answers in %.1f s", len(examples), answers.seconds)
    lines = report_lines(examples, answers, losses, checked)
    result = metrics_of(cfg, examples, lines, losses, checked)
    summary = {
        **result,
        "modelName": cfg.model_name,
        "baseModelUri": cfg.base_model_uri,
        "adapterUri": cfg.adapter_uri,
        "step": info.step,
        "datasetUri": cfg.dataset_uri,
        "maxNewTokens": cfg.max_new_tokens,
        **(code_summary(cfg, examples, checked) if checked is not None else {}),
        "seconds": {"answers": answers.seconds if answers else 0.0, "total": time.monotonic() - started},
    }
    report = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
    files = {REPORT_FILE: report, SUMMARY_FILE: (json.dumps(summary, indent=1) + "\n").encode()}
    commit.commit_small_files(cfg.report_uri, files, {"kind": "evaluation", "adapterUri": cfg.adapter_uri})
    write_tensorboard(cfg, result, info.step)
    return result


def tensorboard_uri(cfg: EvalConfig) -> str:
    return storage.join(cfg.checkpoint_uri, TENSORBOARD_SUBDIR, TENSORBOARD_EVAL_RUN)


def write_tensorboard(cfg: EvalConfig, result: dict[str, Any], step: int) -> None:
    """The result's scores as TensorBoard scalars at `step` (the adapter's training step), with a text
    summary naming the report; logged, never raised, when it cannot be written."""
    scalars = {f"eval/{k}": float(v) for k, v in result["metrics"].items()}
    scalars |= {f"eval_base/{k}": float(v) for k, v in result["baseMetrics"].items()}
    text = f"{result['examples']} records of {cfg.dataset_uri}; report: {cfg.report_uri}"
    uri = tensorboard_uri(cfg)
    if tensorboard_log.write_scalars(uri, scalars, step, {"eval/report": text}):
        log.info("scores at step %d in TensorBoard event files at %s", step, uri)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuforge_workloads.evaluate.score", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", required=True, help="EvalConfig JSON file")
    parser.add_argument("--loss", help="evaluate.loss's output (needed when metrics include loss)")
    parser.add_argument("--samples", help="evaluate.sample's output (needed when metrics include passAtK)")
    parser.add_argument("--verdicts", help="evaluate.check's output on those samples (with --samples)")
    parser.add_argument("--answers", help="evaluate.sample's greedy answers (exactMatch without a second vLLM)")
    parser.add_argument("--termination-log", default=TERMINATION_LOG, help="where the result or the reason goes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        result = run_score(load_config(args.config), args.loss, args.samples, args.verdicts, args.answers)
    except (EvalInputError, DatasetError) as e:
        return termination.fail(args.termination_log, e, EXIT_BAD_CONFIG)
    except (AdapterError, FetchError, AnswerError, commit.CommitError, storage.StorageError) as e:
        return termination.fail(args.termination_log, e, 1)
    except Exception as e:
        return termination.fail(args.termination_log, e, 1, unexpected="evaluation failed")
    message = json.dumps(result, separators=(",", ":"))
    termination.write(args.termination_log, message)
    print(message)
    return 0


if __name__ == "__main__":
    termination.exit_now(main())
