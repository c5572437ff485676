"""python -m tpuforge_workloads.evaluate.verilog: the Verilog checker (spec.evaluation.code.checker.command).

Run by evaluate.check in a sample's scratch directory (sample.txt, test.json and the test's files). It
  1. refuses, before anything is compiled, a sample that uses what a design under test never needs and a
     testbench's verdict could be forged with: system tasks other than pure functions ($finish, $stop,
     $fatal, $display, $fopen, $readmemh, $deposit, ... : ending or steering the simulation, printing what the
     testbench prints, touching files), `force`/`release`, hierarchical references to anything it does not
     declare itself ($root, the testbench's names, upward references), design units named as the test's own
     (`module tb`), `bind`, DPI imports, inout ports, `include, unterminated comments, strings or `ifdef
     blocks, and macros it does not define (the testbench's macros could steer its `ifdef`s). The rules read
     the sample after iverilog's own preprocessor has expanded its macros, so a macro cannot hide a token;
  2. compiles the test's files first and the sample last (iverilog -g2012 -s <top>), so that nothing in the
     sample can swallow the testbench;
  3. simulates (vvp -n) and passes when the simulation exits 0 and, when the test sets "passPattern", its
     output matches that regular expression.
The test object: {"files": {"tb.v": ...}, "top": "tb" (default), "passPattern": "..." (optional)}.
Exit codes as evaluate.check's protocol: 0 passed, 1 the simulation failed, 3 compile error, 4 syntax error,
5 refused. Stdlib only (the checker image).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tpuforge_workloads.evaluate.check import (
    EXIT_COMPILE,
    EXIT_MISMATCH,
    EXIT_REFUSED,
    EXIT_SYNTAX,
    SAMPLE_FILE,
    TEST_FILE,
)

DEFAULT_TOP = "tb"
SIMULATION = "sim"
SIMULATION_OUTPUT = "sim.out"
PREPROCESSED = "sample.expanded.v"
OUTPUT_SHOWN = 4096
# System functions a design may use: they compute a value and touch nothing else.
PURE_SYSTEM_FUNCTIONS = frozenset(
    [
        "$signed",
        "$unsigned",
        "$clog2",
        "$bits",
        "$size",
        "$high",
        "$low",
        "$left",
        "$right",
        "$increment",
        "$dimensions",
        "$unpacked_dimensions",
        "$countones",
        "$countbits",
        "$onehot",
        "$onehot0",
        "$isunknown",
        "$rtoi",
        "$itor",
        "$realtobits",
        "$bitstoreal",
        "$shortrealtobits",
        "$bitstoshortreal",
        "$floor",
        "$ceil",
        "$ln",
        "$log10",
        "$exp",
        "$sqrt",
        "$pow",
        "$sin",
        "$cos",
        "$tan",
        "$asin",
        "$acos",
        "$atan",
        "$atan2",
        "$hypot",
        "$sinh",
        "$cosh",
        "$tanh",
        "$asinh",
        "$acosh",
        "$atanh",
        "$time",
        "$stime",
        "$realtime",
        "$random",
        "$urandom",
        "$urandom_range",
        "$dist_uniform",
        "$dist_normal",
        "$dist_exponential",
        "$dist_poisson",
        "$dist_chi_square",
        "$dist_t",
        "$dist_erlang",
    ]
)
_WHY_SYSTEM = {
    **dict.fromkeys(("$finish", "$stop", "$exit", "$fatal"), "ends the simulation: the testbench decides when"),
    **dict.fromkeys(
        ("$deposit", "$dumpvars", "$dumpfile", "$dumpon", "$dumpoff", "$dumpall"),
        "touches the simulation state or files from outside the design",
    ),
}
# Compiler directives a sample may use (macro definitions are checked separately).
ALLOWED_DIRECTIVES = frozenset(
    [
        "timescale",
        "default_nettype",
        "define",
        "undef",
        "ifdef",
        "ifndef",
        "elsif",
        "else",
        "endif",
        "resetall",
        "celldefine",
        "endcelldefine",
        "unconnected_drive",
        "nounconnected_drive",
    ]
)
_CONDITIONALS = {"ifdef", "ifndef", "elsif", "else", "endif"}
# Design units: a sample's may not take a name the test's files give one of theirs.
_UNITS = {"module", "macromodule", "primitive", "interface", "program", "package", "checker", "config", "class"}
_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<line_comment>//[^\n]*)
      | (?P<block_comment>/\*.*?\*/)
      | (?P<open_comment>/\*)
      | (?P<string>"(?:[^"\\\n]|\\.)*")
      | (?P<open_string>")
      | (?P<directive>`[A-Za-z_][A-Za-z0-9_$]*)
      | (?P<system>\$[A-Za-z0-9_$]+)
      | (?P<escaped>\\\S+)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_$]*)
      | (?P<number>[0-9][0-9_]*(?:\.[0-9_]+)?|'[sS]?[bBoOdDhH]\s*[0-9a-fA-FxXzZ?_]+)
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


class Refused(ValueError):
    """The sample uses something a design under test never needs; the message names it, where, and why."""


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    line: int


def tokens(text: str, what: str) -> list[Token]:
    """The tokens of `text` but spaces and comments. Raises Refused for an unterminated comment or string."""
    out: list[Token] = []
    line = 1
    for m in _TOKEN.finditer(text):
        kind, value = m.lastgroup or "other", m.group()
        if kind == "open_comment":
            raise Refused(f"{what}:{line}: a /* comment that never ends (it would swallow what follows it)")
        if kind == "open_string":
            raise Refused(f"{what}:{line}: a string that never ends")
        if kind not in ("space", "line_comment", "block_comment"):
            if kind == "escaped":
                kind, value = "ident", value[1:]
            out.append(Token(kind, value, line))
        line += value.count("\n")
    return out


def check_directives(raw: list[Token], what: str) -> None:
    """The sample's directives before expansion: only the allowed ones, conditionals balanced and about its
    own macros, no macro it does not define."""
    defined: set[str] = set()
    depth = 0
    for i, t in enumerate(raw):
        if t.kind != "directive":
            continue
        name = t.text[1:]
        after = raw[i + 1].text if i + 1 < len(raw) else ""
        if name == "define":
            defined.add(after)
        elif name in _CONDITIONALS:
            if name in ("ifdef", "ifndef", "elsif") and after not in defined:
                raise Refused(
                    f"{what}:{t.line}: `{name} {after}: a condition on a macro the sample does not define (the "
                    "testbench's macros would choose what is compiled)"
                )
            depth += {"ifdef": 1, "ifndef": 1, "endif": -1}.get(name, 0)
            if depth < 0:
                raise Refused(f"{what}:{t.line}: `{name} without its `ifdef")
        elif name not in ALLOWED_DIRECTIVES:
            if name in defined:
                continue
            if name == "include":
                raise Refused(f"{what}:{t.line}: `include reads a file: a design under test is one text")
            raise Refused(f"{what}:{t.line}: `{name}: a directive or macro the sample does not define")
    if depth:
        raise Refused(f"{what}: an `ifdef or `ifndef without its `endif (it would swallow what follows it)")


def declared_units(toks: list[Token]) -> set[str]:
    return {toks[i + 1].text for i, t in enumerate(toks[:-1]) if t.kind == "ident" and t.text in _UNITS}


def check_constructs(toks: list[Token], test_names: set[str], test_units: set[str], what: str) -> None:
    """The expanded sample: see the module's docstring for what is refused."""
    own = {
        t.text for i, t in enumerate(toks) if t.kind == "ident" and not (i + 1 < len(toks) and toks[i + 1].text == ".")
    }
    for i, t in enumerate(toks):
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        where = f"{what}:{t.line}"
        if t.kind == "system" and t.text not in PURE_SYSTEM_FUNCTIONS:
            if t.text in ("$root", "$unit"):
                raise Refused(f"{where}: {t.text}: a reference outside the design")
            why = _WHY_SYSTEM.get(t.text, "only pure functions ($signed, $clog2, ...) are allowed in a design "
                                  "under test: no output, files or control of the simulation")  # fmt: skip
            raise Refused(f"{where}: {t.text} {why}")
        if t.kind != "ident":
            continue
        if t.text in ("force", "release"):
            raise Refused(f"{where}: {t.text} overrides a signal from outside the normal drivers")
        if t.text == "bind":
            raise Refused(f"{where}: bind puts code into another module")
        if t.text == "inout":
            raise Refused(f"{where}: an inout port could drive the testbench's stimulus")
        if t.text in ("import", "export") and nxt is not None and nxt.kind == "string":
            raise Refused(f"{where}: {t.text} {nxt.text}: foreign code (DPI)")
        if t.text in _UNITS and nxt is not None and nxt.text in test_units:
            raise Refused(f"{where}: {t.text} {nxt.text}: the test defines {nxt.text}; a sample may not replace it")
        if nxt is not None and nxt.text == "." and (i == 0 or toks[i - 1].text != "."):
            after = toks[i + 2].text if i + 2 < len(toks) else ""
            if t.text in test_names or t.text not in own:
                raise Refused(
                    f"{where}: {t.text}.{after}: a hierarchical reference to something the sample does not "
                    "declare (the testbench, or above the design)"
                )


def preprocess(path: Path) -> str:
    """The sample with its macros expanded, by iverilog's own preprocessor."""
    expanded = path.with_name(PREPROCESSED)
    run = subprocess.run(
        ["iverilog", "-E", "-o", str(expanded), str(path)], capture_output=True, text=True, check=False
    )
    if run.returncode != 0:
        raise Refused(f"{path.name}: the preprocessor refused it: {run.stderr.strip()[:500]}")
    return expanded.read_text(encoding="utf-8", errors="replace")


def check_sample(sample: Path, test_files: list[Path]) -> None:
    """Raises Refused when the sample breaks a rule; the test's files are trusted."""
    what = sample.name
    check_directives(tokens(sample.read_text(encoding="utf-8", errors="replace"), what), what)
    test_toks = [t for f in test_files for t in tokens(f.read_text(encoding="utf-8", errors="replace"), f.name)]
    test_names = {t.text for t in test_toks if t.kind == "ident"}
    check_constructs(tokens(preprocess(sample), what), test_names, declared_units(test_toks), what)


def _show(text: str) -> None:
    print(
        text[:OUTPUT_SHOWN] + ("\n[... cut]" if len(text) > OUTPUT_SHOWN else ""),
        end="" if text.endswith("\n") else "\n",
    )


def main() -> int:
    test = json.loads(Path(TEST_FILE).read_text())
    top = str(test.get("top", DEFAULT_TOP))
    test_files = [Path(name) for name in test.get("files", {})]
    try:
        check_sample(Path(SAMPLE_FILE), test_files)
    except Refused as e:
        print(f"refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    compile_ = subprocess.run(
        ["iverilog", "-g2012", "-o", SIMULATION, "-s", top, *map(str, test_files), SAMPLE_FILE],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if compile_.returncode != 0:
        _show(compile_.stdout + compile_.stderr)
        return EXIT_SYNTAX if "syntax error" in compile_.stderr + compile_.stdout else EXIT_COMPILE
    with open(SIMULATION_OUTPUT, "wb") as out:
        sim = subprocess.run(["vvp", "-n", SIMULATION], stdout=out, stderr=subprocess.STDOUT, check=False)
    output = Path(SIMULATION_OUTPUT).read_text(encoding="utf-8", errors="replace")
    _show(output)
    if sim.returncode != 0:
        return EXIT_MISMATCH
    pattern = test.get("passPattern")
    if pattern and re.search(str(pattern), output, re.MULTILINE) is None:
        print(f"the simulation ended without printing what passing prints ({pattern!r})", file=sys.stderr)
        return EXIT_MISMATCH
    return 0


if __name__ == "__main__":
    sys.exit(main())
