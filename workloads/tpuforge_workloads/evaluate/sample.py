"""python -m tpuforge_workloads.evaluate.sample --config PATH --out samples.jsonl [--answers answers.json]
    [--termination-log PATH]

The first step of functional evaluation (the passAtK metric), in the evaluator image: n answers sampled per
problem from the base and from base + adapter (evaluate.answers.sample), the code taken from each
(passk.extract_code, guided by the test's language and codePattern), written as the checker's input, one line
per sample, with why vLLM stopped the answer ("length": cut at maxNewTokens, which evaluate.score fails):
    {"id": "adapter/3/0", "model": "adapter", "index": 3, "sample": 0, "answer": ..., "code": ...,
     "finishReason": "stop", "test": {...}}
The checker (evaluate.check, in the checker image) runs them; evaluate.score turns the verdicts into pass@k.
With `--answers` (exactMatch asked too), the same vLLM engine also writes the greedy answers there, which
evaluate.score reads instead of loading the model a second time:
    {"base": [...], "adapter": [...], "seconds": s}
Exit codes as evaluate.score's: EXIT_BAD_CONFIG (2) for a config or input that cannot be used, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path
from typing import Any

from tpuforge.api.configs import EvalConfig
from tpuforge.api.constants import EXIT_BAD_CONFIG, TERMINATION_LOG
from tpuforge_workloads.data.records import DatasetError
from tpuforge_workloads.evaluate.answers import AnswerError, Samples, sample
from tpuforge_workloads.evaluate.config import EvalInputError, check_adapter, fetch_models, load_config
from tpuforge_workloads.evaluate.passk import code_hint, extract_code
from tpuforge_workloads.evaluate.records import EvalExample, config_examples
from tpuforge_workloads.model.adapters import AdapterError
from tpuforge_workloads.runtime import termination
from tpuforge_workloads.serve.fetch import FetchError

log = logging.getLogger("tpuforge_workloads.evaluate.sample")
MODELS = ("adapter", "base")


def problems(cfg: EvalConfig) -> list[EvalExample]:
    """The evaluation set's records, each with its test object (checked here, before any model loads)."""
    examples = config_examples(cfg)
    for ex in examples:
        if not isinstance(ex.test, dict):
            raise EvalInputError(
                f'{ex.record.where}: no "test" object beside "messages": passAtK hands each '
                'record\'s test to the checker (for Verilog {"files": {"tb.v": "..."}}); add one to every record'
            )
        pattern = ex.test.get("codePattern")
        if pattern is not None:
            try:
                re.compile(pattern)
            except (re.error, TypeError) as e:
                raise EvalInputError(
                    f"{ex.record.where}: test.codePattern {pattern!r} is not a regular "
                    f"expression ({e}); it picks the code block out of an answer"
                ) from None
    return examples


def sample_lines(examples: list[EvalExample], samples: Samples) -> list[dict[str, Any]]:
    lines = []
    models = (
        ("adapter", samples.adapter, samples.adapter_finish),
        ("base", samples.base, samples.base_finish),
    )
    for model, answers, finish in models:
        reasons = finish or [[None] * len(drawn) for drawn in answers]
        for ex, drawn, why in zip(examples, answers, reasons, strict=True):
            hint = code_hint(ex.test)
            for j, (answer, reason) in enumerate(zip(drawn, why, strict=True)):
                lines.append(
                    {
                        "id": f"{model}/{ex.index}/{j}",
                        "model": model,
                        "index": ex.index,
                        "sample": j,
                        "answer": answer,
                        "code": extract_code(answer, hint),
                        "finishReason": reason,
                        "test": ex.test,
                    }
                )
    return lines


def run_sample(cfg: EvalConfig, out: Path, answers_out: Path | None = None) -> int:
    if cfg.code is None:
        raise EvalInputError("code is unset: passAtK needs spec.evaluation.code")
    if answers_out is not None and "exactMatch" not in cfg.metrics:
        raise EvalInputError("--answers writes the greedy answers for exactMatch, which metrics does not ask for")
    info = check_adapter(cfg)
    examples = problems(cfg)
    base_dir, adapter_dir = fetch_models(cfg)
    prompts = [ex.prompt_json() for ex in examples]
    greedy_tokens = cfg.max_new_tokens if answers_out is not None else None
    drawn = sample(base_dir, adapter_dir, info.rank, prompts, cfg.code, greedy_tokens, cfg.data.keep_thinking)
    lines = sample_lines(examples, drawn)
    out.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    if answers_out is not None and drawn.greedy is not None:
        g = drawn.greedy
        answers_out.write_text(json.dumps({"base": g.base, "adapter": g.adapter, "seconds": g.seconds}))
    log.info("%d samples (%d problems x %d x 2 models) in %.1f s", len(lines), len(examples),
             cfg.code.samples_per_problem, drawn.seconds)  # fmt: skip
    return len(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuforge_workloads.evaluate.sample", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--config", required=True, help="EvalConfig JSON file")
    parser.add_argument("--out", required=True, help="the samples, JSONL (a local path)")
    parser.add_argument("--answers", help="also write the greedy answers for exactMatch here (JSON, a local path)")
    parser.add_argument("--termination-log", default=TERMINATION_LOG, help="where the failure reason goes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run_sample(load_config(args.config), Path(args.out), Path(args.answers) if args.answers else None)
    except (EvalInputError, DatasetError) as e:
        return termination.fail(args.termination_log, e, EXIT_BAD_CONFIG)
    except (AdapterError, FetchError, AnswerError) as e:
        return termination.fail(args.termination_log, e, 1)
    except Exception as e:
        return termination.fail(args.termination_log, e, 1, unexpected="sampling failed")
    return 0


if __name__ == "__main__":
    termination.exit_now(main())
