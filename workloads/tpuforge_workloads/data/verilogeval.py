"""python -m tpuforge_workloads.data.verilogeval DIR --out eval.jsonl [--instruction TEXT] [--system TEXT]

Converts problems in VerilogEval's layout (its spec-to-RTL task) into the chat records functional evaluation
reads. A problem is three files in DIR, sharing a name:
  <name>_prompt.txt   the specification a person would read: a module named TopModule, its ports, what it does
  <name>_ref.sv       a reference solution, the module named RefModule
  <name>_test.sv      the stimulus testbench, module tb: it instantiates RefModule and TopModule side by side,
                      drives both with the same inputs, counts the samples where their outputs differ and
                      prints "Mismatches: <count> in <samples> samples" before it ends
Each problem becomes one record (problems in name order):
  {"messages": [{"role": "user", "content": <the spec, then the instruction>},
                {"role": "assistant", "content": <the reference renamed TopModule, fenced>}],
   "test": {"files": {"tb.sv": <testbench>, "ref.sv": <reference>}, "top": "tb", "module": "TopModule",
            "verdict": VERDICT, "reference": <the reference renamed TopModule>}}
The Verilog checker (tpuforge_workloads.evaluate.verilog) compiles the sample on its own as module TopModule
(so it cannot use RefModule or anything else of the test's), then with the test's files, runs the simulation
from `top`, and passes a sample when the testbench's own counters, read by the checker at the end (`verdict`:
the layout's stats1.errors and stats1.clocks), say no mismatch in at least one sample: what the design prints
decides nothing. `reference` lets the checker tell a problem its simulator cannot compile (a problem of the
task set) from a sample that does not compile. `module` also tells evaluate.sample which code block of an
answer is the sample: the one that defines TopModule.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPT_SUFFIX, REF_SUFFIX, TEST_SUFFIX = "_prompt.txt", "_ref.sv", "_test.sv"
TB_FILE, REF_FILE, TOP = "tb.sv", "ref.sv", "tb"
# The testbench's counters the checker reads (below module tb): what it prints in that line.
VERDICT = {"mismatches": "stats1.errors", "samples": "stats1.clocks"}
MODULE = "TopModule"
INSTRUCTION = (
    "Answer with the complete Verilog code of module TopModule, in one ```verilog fenced block; the code must "
    "compile on its own (no testbench, no `include)."
)
_DECLARES = re.compile(r"^[ \t]*module\s+(?P<name>[A-Za-z_]\w*)", re.MULTILINE)


class ConvertError(ValueError):
    """A problem directory this converter cannot use; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Problem:
    name: str
    prompt: str
    ref: str
    test: str


def _modules(text: str) -> set[str]:
    return {m.group("name") for m in _DECLARES.finditer(text)}


def _instantiates(text: str, module: str) -> bool:
    return (
        re.search(rf"^[ \t]*{module}\s+(#\s*\(.*?\)\s*)?[A-Za-z_]\w*\s*\(", text, re.MULTILINE | re.DOTALL) is not None
    )


def check_problem(p: Problem, where: Path) -> None:
    """The layout's promises: the reference defines RefModule (and not TopModule), the testbench defines the
    top module and instantiates both. Raises ConvertError naming the file."""
    ref, test = where / f"{p.name}{REF_SUFFIX}", where / f"{p.name}{TEST_SUFFIX}"
    if "RefModule" not in _modules(p.ref) or "TopModule" in _modules(p.ref):
        raise ConvertError(f"{ref}: must define module RefModule (and not TopModule, which the answer defines)")
    if TOP not in _modules(p.test):
        raise ConvertError(f"{test}: must define the testbench as module {TOP}")
    for module in ("RefModule", "TopModule"):
        if not _instantiates(p.test, module):
            raise ConvertError(f"{test}: module {TOP} must instantiate {module} (it compares the two)")
    if "Mismatches:" not in p.test or not all(f"{c}++" in p.test for c in VERDICT.values()):
        raise ConvertError(
            f"{test}: must count its samples and mismatches in {' and '.join(VERDICT.values())} and print "
            '"Mismatches: <count> in <samples> samples" at its end'
        )
    if not p.prompt.strip():
        raise ConvertError(f"{where / (p.name + PROMPT_SUFFIX)}: empty specification")


def read_problems(directory: Path) -> list[Problem]:
    """Every problem in `directory` (one per <name>_prompt.txt), in name order, each checked."""
    if not directory.is_dir():
        raise ConvertError(f"{directory}: not a directory")
    names = sorted(p.name.removesuffix(PROMPT_SUFFIX) for p in directory.glob(f"*{PROMPT_SUFFIX}"))
    if not names:
        raise ConvertError(f"{directory}: no *{PROMPT_SUFFIX}; expected <name>{PROMPT_SUFFIX}, _ref.sv, _test.sv")
    problems = []
    for name in names:
        files = [directory / f"{name}{suffix}" for suffix in (PROMPT_SUFFIX, REF_SUFFIX, TEST_SUFFIX)]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ConvertError(f"{directory}: problem {name} lacks {', '.join(missing)}")
        prompt, ref, test = (f.read_text(encoding="utf-8") for f in files)
        problem = Problem(name, prompt, ref, test)
        check_problem(problem, directory)
        problems.append(problem)
    return problems


def reference_code(p: Problem) -> str:
    """The reference as a sample would be: renamed TopModule."""
    return re.sub(r"\bRefModule\b", MODULE, p.ref).strip("\n") + "\n"


def reference_answer(p: Problem) -> str:
    """The reference as an answer would give it: renamed TopModule, in a fenced block."""
    return f"```verilog\n{reference_code(p)}```"


def to_record(p: Problem, instruction: str = INSTRUCTION, system: str | None = None) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {"role": "user", "content": f"{p.prompt.strip()}\n\n{instruction}".strip()},
        {"role": "assistant", "content": reference_answer(p)},
    ]
    test = {
        "files": {TB_FILE: p.test, REF_FILE: p.ref},
        "top": TOP,
        "module": MODULE,
        "verdict": VERDICT,
        "reference": reference_code(p),
    }
    return {"messages": messages, "test": test}


def convert(directory: Path, out: Path, instruction: str = INSTRUCTION, system: str | None = None) -> int:
    """Writes one record per problem to `out` (JSONL); returns how many."""
    records = [to_record(p, instruction, system) for p in read_problems(directory)]
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return len(records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuforge_workloads.data.verilogeval", description=__doc__.split("\n")[2]
    )
    parser.add_argument("directory", type=Path, help="the problems: <name>_prompt.txt, _ref.sv, _test.sv")
    parser.add_argument("--out", type=Path, required=True, help="the chat records with their tests (JSONL)")
    parser.add_argument("--instruction", default=INSTRUCTION, help="appended to each specification")
    parser.add_argument("--system", help="a system message put first in each record")
    args = parser.parse_args(argv)
    try:
        count = convert(args.directory, args.out, args.instruction, args.system)
    except (ConvertError, OSError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{count} problems from {args.directory} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
