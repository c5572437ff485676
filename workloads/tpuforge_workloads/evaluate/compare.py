"""Greedy answers from HuggingFace model directories, for comparing a base model with its fine-tuned merge.

    python -m tpuforge_workloads.evaluate.compare --model base=gs://b/models/gemma4-tiny \\
        --model fine-tuned=gs://b/runs/demo/merged "What is the capital of Peru?"

Each model is loaded with transformers, as any user of the merged output would, and each prompt is
formatted as one user turn by the trainer's own chat encoder, so the model sees exactly the format it was
trained on. Decoding is greedy and stops at the end of the model's turn. One JSON object per answer goes
to stdout ({"model", "prompt", "answer"}); with --text, one readable line instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tpuforge_workloads import storage
from tpuforge_workloads.data.chat import ChatEncoder
from tpuforge_workloads.data.records import Message

MAX_NEW_TOKENS = 32


class GenerateError(RuntimeError):
    """A model directory that cannot be loaded; the message names it."""


def local_dir(uri: str, tmp: Path) -> Path:
    """`uri` itself when it is local, else a downloaded copy under `tmp`."""
    if not storage.is_gcs(uri):
        return Path(uri)
    names = storage.download_dir(uri, tmp)
    if "config.json" not in names:
        raise GenerateError(f"{uri}: no config.json; point --model at a HuggingFace model directory")
    return tmp


class Generator:
    """One model and its tokenizer, loaded from a local HuggingFace directory."""

    def __init__(self, model_dir: Path):
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModelForCausalLM

        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise GenerateError(f"{model_dir}: no tokenizer.json")
        self.encoder = ChatEncoder(Tokenizer.from_file(str(tokenizer_file)))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.eval()  # type: ignore[no-untyped-call]

    def answer(self, prompt: str, max_new_tokens: int = MAX_NEW_TOKENS) -> str:
        import torch

        t = self.encoder.tokens
        ids = torch.from_numpy(self.encoder.prompt([Message("user", prompt)]).astype("int64"))[None]
        with torch.no_grad():
            out = self.model.generate(  # type: ignore[misc]
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=[t.turn_end, t.eos],
                pad_token_id=t.pad,
            )
        new = [int(x) for x in out[0, ids.shape[1] :]]
        return str(self.encoder.tokenizer.decode(new, skip_special_tokens=True)).strip()


def parse_model(value: str) -> tuple[str, str]:
    name, sep, uri = value.partition("=")
    if not sep or not name or not uri:
        raise argparse.ArgumentTypeError(f"--model {value!r}: expected NAME=URI, e.g. base=gs://bucket/models/x")
    return name, uri


def answers(models: list[tuple[str, str]], prompts: list[str], max_new_tokens: int) -> list[dict[str, Any]]:
    out = []
    for name, uri in models:
        with tempfile.TemporaryDirectory(prefix="generate-") as tmp:
            gen = Generator(local_dir(uri, Path(tmp)))
        out += [{"model": name, "prompt": p, "answer": gen.answer(p, max_new_tokens)} for p in prompts]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuforge_workloads.evaluate.compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="a user message")
    parser.add_argument(
        "--model", type=parse_model, action="append", required=True, help="NAME=URI (gs:// or local); repeatable"
    )
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--text", action="store_true", help="readable lines instead of JSON")
    args = parser.parse_args(argv)
    try:
        rows = answers(args.model, args.prompts, args.max_new_tokens)
    except (GenerateError, storage.StorageError) as e:
        print(f"generate: {e}", file=sys.stderr)
        return 1
    for r in rows:
        print(f"[{r['model']}] {r['prompt']} -> {r['answer']}" if args.text else json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
