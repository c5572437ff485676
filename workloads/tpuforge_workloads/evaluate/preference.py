"""How strongly HuggingFace model directories prefer the chosen answers of held-out preference pairs.

    python -m tpuforge_workloads.evaluate.preference --pairs gs://b/demo/datasets/demo-preferences.jsonl \\
        --eval-fraction 0.25 --model start=gs://b/models/gemma4-tiny --model tuned=gs://b/runs/demo-dpo/merged

The pairs are read and held out exactly as the trainer holds them out (spec.dataset.evalFraction and
splitSeed, data/split.py), or all of them with --eval-fraction 0 (a file of held-out pairs), and each is
rendered as the trainer renders it (data/preference.py: the prompt in the model's chat format, the answer as
the final assistant turn, the log-probability counted on the answer's tokens alone). Each model is loaded
with transformers, as any user of a merged output would. Per model, one JSON line to stdout:

- accuracy, margin: per token, as benchmarks/preference.py measures them: the share of pairs whose chosen
  answer has the higher mean log-probability per token, and the mean of (chosen - rejected) mean per-token
  log-probabilities, nats/token. Per token, so that an answer is not preferred for being shorter.
- summedAccuracy, summedMargin: the same on the answers' summed log-probabilities (what DPO's rewards sum).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpuforge_workloads import storage
from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.pipeline import Example
from tpuforge_workloads.data.records import DatasetError
from tpuforge_workloads.evaluate.compare import GenerateError, local_dir, parse_model

MAX_SEQ_LEN = 128


def ranking(
    chosen_logp: Sequence[float],
    chosen_tokens: Sequence[float],
    rejected_logp: Sequence[float],
    rejected_tokens: Sequence[float],
) -> dict[str, float]:
    """Preference accuracy and mean margin of pairs from their answers' summed log-probabilities and token
    counts: per token (`accuracy`, `margin`) and summed (`summedAccuracy`, `summedMargin`). A tie counts as
    not preferred."""
    c, r = np.asarray(chosen_logp, np.float64), np.asarray(rejected_logp, np.float64)
    nc, nr = np.asarray(chosen_tokens, np.float64), np.asarray(rejected_tokens, np.float64)
    if not len(c) or len(c) != len(r) or len(c) != len(nc) or len(c) != len(nr):
        raise ValueError(f"ranking needs as many chosen as rejected answers, at least one ({len(c)}, {len(r)})")
    if (nc <= 0).any() or (nr <= 0).any():
        raise ValueError("every answer needs at least one token")
    per_token = c / nc - r / nr
    summed = c - r
    return {
        "pairs": len(c),
        "accuracy": round(float((per_token > 0).mean()), 4),
        "margin": round(float(per_token.mean()), 4),
        "summedAccuracy": round(float((summed > 0).mean()), 4),
        "summedMargin": round(float(summed.mean()), 4),
    }


def held_out_pairs(
    pairs_uri: str, encoder: ChatEncoder, eval_fraction: float, split_seed: int, max_seq_len: int
) -> list[Example]:
    """The pairs the trainer holds out of `pairs_uri` (all of them when `eval_fraction` is 0), as its rows:
    chosen then rejected, each with its answer-only loss mask."""
    from tpuforge_workloads.data.preference import parse_preference, prepare_pairs
    from tpuforge_workloads.data.records import read_dataset
    from tpuforge_workloads.data.split import split

    records = read_dataset(pairs_uri, "--pairs", None, False, parse_preference).records
    held: list[Any] = split(records, eval_fraction, split_seed, pairs_uri)[1] if eval_fraction > 0 else records
    examples, _ = prepare_pairs(held, encoder, max_seq_len, "drop", pairs_uri)
    return examples


def answer_logps(model: Any, rows: Sequence[Example]) -> tuple[list[float], list[float]]:
    """Each row's summed log-probability of its masked target tokens, and their count (a transformers model)."""
    import torch

    logps, counts = [], []
    with torch.no_grad():
        for row in rows:
            tokens = torch.from_numpy(np.asarray(row["tokens"]).astype("int64"))[None]
            mask = torch.from_numpy(np.asarray(row["loss_mask"]).astype("bool"))[1:]
            logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits[0, :-1].float()
            token_logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[0, 1:, None])[:, 0]
            logps.append(float(token_logp[mask].sum()))
            counts.append(float(mask.sum()))
    return logps, counts


def score(model_dir: Path, pairs_uri: str, eval_fraction: float, split_seed: int, max_seq_len: int) -> dict[str, Any]:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise GenerateError(f"{model_dir}: no tokenizer.json")
    encoder = ChatEncoder(Tokenizer.from_file(str(tokenizer_file)))
    rows = held_out_pairs(pairs_uri, encoder, eval_fraction, split_seed, max_seq_len)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()  # type: ignore[no-untyped-call]
    logps, counts = answer_logps(model, rows)
    return ranking(logps[0::2], counts[0::2], logps[1::2], counts[1::2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuforge_workloads.evaluate.preference", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--pairs", required=True, help="preference records (JSONL or Parquet; gs:// or local)")
    parser.add_argument("--eval-fraction", type=float, default=0.0, help="as spec.dataset.evalFraction (0: all)")
    parser.add_argument("--split-seed", type=int, default=0, help="as spec.dataset.splitSeed")
    parser.add_argument("--max-seq-len", type=int, default=MAX_SEQ_LEN, help="as spec.training.maxSeqLen")
    parser.add_argument(
        "--model", type=parse_model, action="append", required=True, help="NAME=URI (gs:// or local); repeatable"
    )
    args = parser.parse_args(argv)
    try:
        for name, uri in args.model:
            with tempfile.TemporaryDirectory(prefix="preference-") as tmp:
                row = score(
                    local_dir(uri, Path(tmp)), args.pairs, args.eval_fraction, args.split_seed, args.max_seq_len
                )
            print(json.dumps({"model": name, **row}), flush=True)
    except (GenerateError, DatasetError, storage.StorageError) as e:
        print(f"preference: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
