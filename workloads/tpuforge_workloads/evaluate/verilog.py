"""python -m tpuforge_workloads.evaluate.verilog: the Verilog checker (spec.evaluation.code.checker.command).

Run by evaluate.check in a sample's scratch directory (sample.txt, test.json and the test's files). The verdict
comes from the compiled design, not from the sample's text:
  1. the sample is preprocessed on its own (iverilog -E: no macro or `ifdef of the test's reaches it; `include
     is refused, the one way it could read the test's files) and compiled on its own (iverilog -g2012, with
     -s <module> when the test names the module under test). Every module it instantiates must be one it
     defines: the test's modules, the reference among them, are out of its reach whatever their names, and a
     hierarchical reference that leaves its own design does not resolve. Modules of the answer that the module
     under test does not instantiate (a testbench of its own) are dropped, not judged;
  2. what the compiled design does is read from the vvp file (evaluate.vvp): the system tasks and functions
     it calls, by the name the compiler resolved (no spelling, macro or escape hides one), may be pure
     functions ($signed, $clog2, ...) and output ($display, $write, $strobe, $monitor, $info, $warning,
     $error: debug prints and the assertions' messages) and nothing else (no $finish/$stop/$fatal, files,
     $random, dumps); no force/release, no bidirectional switch, no inout port on the module under test;
  3. the test's files are compiled with the sample last (its preprocessed text, the dropped modules left out)
     and the design the testbench instantiates is checked to be the one judged on its own;
  4. the simulation (vvp -n) decides. With a test "verdict" ({"mismatches": "stats1.errors", "samples":
     "stats1.clocks"}: the testbench's own counters, relative to its top), a module of the checker's reads
     them at the end of the simulation and writes them to a file: the design can neither reach the counters
     (1) nor write a file (2), so its output, printed for the report, never decides. Without one, the
     simulation must exit 0 (the testbench ends with $fatal on a mismatch) and, with a "passPattern", print
     a line that matches it; a design may then not print (it could print the pattern).
A sample whose combined compile fails is the sample's failure, unless the test's "reference" (a right answer,
as a sample would give it) fails to compile with the test too: then the problem is broken for this simulator
(exit 6, a problem of the task set, kept out of pass@k). The simulator's version goes to stderr as
"simulator: ...", which the runner keeps in the verdict.
The test object: {"files": {"tb.sv": ...}, "top": "tb" (default), "module": "TopModule" (optional: by default
the one module the test's files instantiate without defining it),
"verdict": {...} (optional), "passPattern": "..." (optional), "reference": "..." (optional)}.
Exit codes as evaluate.check's protocol: 0 passed, 1 the simulation failed, 3 compile error, 4 syntax error,
5 refused, 6 the problem is broken. Stdlib only (the checker image).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tpuforge_workloads.evaluate import vvp
from tpuforge_workloads.evaluate.check import (
    EXIT_COMPILE,
    EXIT_MISMATCH,
    EXIT_REFUSED,
    EXIT_SYNTAX,
    EXIT_TASK,
    SAMPLE_FILE,
    TEST_FILE,
)

DEFAULT_TOP = "tb"
IVERILOG = ["iverilog", "-g2012"]
PREPROCESSED = "sample.expanded.sv"
DESIGN = "sample.design.sv"
ALONE = "sample.alone.vvp"
REFERENCE = "reference.sv"
SIMULATION = "sim"
SIMULATION_OUTPUT = "sim.out"
# The checker's own module that reads the testbench's counters at the end (test "verdict"), and its file.
VERDICT_MODULE = "tpuforge_verdict"
VERDICT_SOURCE = "tpuforge_verdict.sv"
VERDICT_FILE = "tpuforge-verdict.txt"
OUTPUT_SHOWN = 4096
COMPILE_SECONDS = 60
# System functions a design may use: they compute a value and touch nothing else.
PURE_SYSTEM_FUNCTIONS = frozenset(
    [
        "$signed", "$unsigned", "$clog2", "$bits", "$size", "$high", "$low", "$left", "$right", "$increment",
        "$dimensions", "$unpacked_dimensions", "$countones", "$countbits", "$onehot", "$onehot0", "$isunknown",
        "$rtoi", "$itor", "$realtobits", "$bitstoreal", "$shortrealtobits", "$bitstoshortreal", "$floor",
        "$ceil", "$ln", "$log10", "$exp", "$sqrt", "$pow", "$sin", "$cos", "$tan", "$asin", "$acos", "$atan",
        "$atan2", "$hypot", "$sinh", "$cosh", "$tanh", "$asinh", "$acosh", "$atanh", "$time", "$stime",
        "$realtime", "$simtime",
    ]
)  # fmt: skip
# System tasks that only print (to the simulation's output, which decides nothing when the test has a
# "verdict"): debug output and the messages of assertions.
OUTPUT_TASKS = frozenset(
    [
        f"${task}{radix}" for task in ("display", "write", "strobe", "monitor") for radix in ("", "b", "h", "o")
    ] + ["$info", "$warning", "$error"]
)  # fmt: skip
_WHY_SYSTEM = {
    **dict.fromkeys(("$finish", "$stop", "$exit", "$fatal"), "ends the simulation: the testbench decides when"),
    **dict.fromkeys(
        ("$random", "$urandom", "$urandom_range", "$dist_uniform", "$dist_normal", "$dist_exponential",
         "$dist_poisson", "$dist_chi_square", "$dist_t", "$dist_erlang"),
        "draws from the random stream the testbench's stimulus comes from",
    ),
    **dict.fromkeys(
        ("$deposit", "$dumpvars", "$dumpfile", "$dumpon", "$dumpoff", "$dumpall", "$dumplimit", "$dumpflush"),
        "touches the simulation state or files from outside the design",
    ),
    **dict.fromkeys(("$monitoron", "$monitoroff"), "switches the testbench's $monitor"),
}  # fmt: skip
_UNKNOWN_MODULE = re.compile(r"Unknown module type: (?P<name>\S+)")
# What iverilog says of a name the design refers to that is not in it (a hierarchical reference to the
# testbench, upward, a defparam into another module: the last only a warning, so read whatever the exit code).
_OUT_OF_DESIGN = re.compile(
    r"Unable to bind [\w/]+ `(?P<a>[^']+)'|Could not find variable ``(?P<b>[^']+)''|Cannot find scope (?P<c>\S+)"
    r"|Enable of unknown task ``(?P<d>[^']+)''|event <(?P<e>[^>]+)> not found|Scope of (?P<f>\S+) not found"
)
_NO_ROOT = re.compile(r'Unable to find the root module "(?P<name>[^"]+)"')
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*$")
# Design units, in the test's files and the sample: a sample's may not take a name the test gives one.
_UNITS = {"module", "macromodule", "primitive", "interface", "program", "package", "checker", "config", "class"}
# Units of an answer the module under test may not need, with the keyword that ends each.
_DROPPABLE = {"module": "endmodule", "macromodule": "endmodule", "program": "endprogram"}
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


class CompileFailed(ValueError):
    """iverilog did not compile it; `output` is what iverilog said."""

    def __init__(self, what: str, output: str) -> None:
        super().__init__(what)
        self.output = output

    @property
    def exit_code(self) -> int:
        return EXIT_SYNTAX if "syntax error" in self.output else EXIT_COMPILE


class BrokenProblem(ValueError):
    """The test itself cannot be used with this simulator (a problem of the task set, not of the sample)."""


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    line: int
    start: int = 0
    end: int = 0


def tokens(text: str) -> list[Token]:
    """The tokens of `text` but spaces and comments (an escaped identifier by its name)."""
    out: list[Token] = []
    line = 1
    for m in _TOKEN.finditer(text):
        kind, value = m.lastgroup or "other", m.group()
        if kind not in ("space", "line_comment", "block_comment"):
            if kind == "escaped":
                kind, value = "ident", value[1:]
            out.append(Token(kind, value, line, m.start(), m.end()))
        line += m.group().count("\n")
    return out


def declared_units(toks: list[Token]) -> set[str]:
    return {toks[i + 1].text for i, t in enumerate(toks[:-1]) if t.kind == "ident" and t.text in _UNITS}


@dataclass(frozen=True)
class TestSpec:
    files: list[str]
    top: str = DEFAULT_TOP
    module: str | None = None  # the module under test
    verdict: dict[str, str] = field(default_factory=dict)  # mismatches, samples: the testbench's counters
    pass_pattern: str | None = None
    reference: str | None = None  # a right answer, to tell a broken problem from a failing sample

    @classmethod
    def of(cls, test: dict[str, Any]) -> TestSpec:
        """Raises BrokenProblem for a test object the checker cannot use."""
        verdict = test.get("verdict") or {}
        if verdict and (set(verdict) != {"mismatches", "samples"} or not all(
            isinstance(v, str) and _PATH.match(v) for v in verdict.values()
        )):  # fmt: skip
            raise BrokenProblem(
                f"test.verdict {verdict!r}: expected {{'mismatches': NAME, 'samples': NAME}}, each a "
                "hierarchical name below the top module (e.g. stats1.errors)"
            )
        module = test.get("module")
        return cls(
            files=list(test.get("files", {})),
            top=str(test.get("top", DEFAULT_TOP)),
            module=str(module) if module else None,
            verdict=dict(verdict),
            pass_pattern=str(test["passPattern"]) if test.get("passPattern") else None,
            reference=str(test["reference"]) if test.get("reference") else None,
        )


def _iverilog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IVERILOG, *args], capture_output=True, text=True, check=False, timeout=COMPILE_SECONDS)


def simulator_version() -> str:
    run = subprocess.run(["iverilog", "-V"], capture_output=True, text=True, check=False)
    first = (run.stdout or run.stderr).splitlines()
    return first[0].strip() if first else "iverilog (version unknown)"


def check_text(text: str) -> None:
    """The one rule on the sample's text: no `include (in a macro's body too), which would read the test's
    files into the design. Everything else is judged from what the compiler makes of it."""
    for t in tokens(text):
        if t.kind == "directive" and t.text == "`include":
            raise Refused(f"sample:{t.line}: `include reads a file: a design under test is one text")
        if t.kind == "open_comment":
            break  # the preprocessor says what is wrong with it


def preprocess(sample: Path) -> str:
    """The sample with its macros expanded and its conditionals decided, by iverilog's own preprocessor, on
    its own: the test's macros (compiled before it) can no longer choose what it holds."""
    out = sample.with_name(PREPROCESSED)
    run = subprocess.run(
        ["iverilog", "-E", "-o", str(out), str(sample)], capture_output=True, text=True, check=False,
        timeout=COMPILE_SECONDS,
    )  # fmt: skip
    if run.returncode != 0:
        raise CompileFailed("the preprocessor refused it", "syntax error (preprocessor): " + run.stdout + run.stderr)
    return out.read_text(encoding="utf-8", errors="replace")


def unit_spans(text: str) -> list[tuple[str, str, int, int]]:
    """(keyword, name, start, end) of each module or program of `text`, its end label included."""
    toks = tokens(text)
    spans = []
    i = 0
    while i < len(toks) - 1:
        t = toks[i]
        if t.kind == "ident" and t.text in _DROPPABLE and toks[i + 1].kind == "ident":
            end_kw = _DROPPABLE[t.text]
            j = next((j for j in range(i + 1, len(toks)) if toks[j].kind == "ident" and toks[j].text == end_kw), None)
            if j is None:
                break
            end = toks[j].end
            if j + 2 < len(toks) and toks[j + 1].text == ":" and toks[j + 2].kind == "ident":
                end = toks[j + 2].end
            spans.append((t.text, toks[i + 1].text, t.start, end))
            i = j + 1
            continue
        i += 1
    return spans


def drop_units(text: str, keep: set[str]) -> tuple[str, list[str]]:
    """`text` without the modules and programs whose names are not in `keep`; and their names."""
    dropped = [(name, start, end) for _, name, start, end in unit_spans(text) if name not in keep]
    for _, start, end in reversed(dropped):
        text = text[:start] + "\n" * text.count("\n", start, end) + text[end:]
    return text, [name for name, _, _ in dropped]


def compile_alone(source: Path, module: str | None) -> vvp.Design:
    """The sample's design compiled on its own. Raises Refused when it instantiates a module it does not
    define, CompileFailed when it does not compile."""
    run = _iverilog("-o", ALONE, *(["-s", module] if module else []), str(source))
    said = run.stdout + run.stderr
    outside = sorted({next(g for g in m.groups() if g) for m in _OUT_OF_DESIGN.finditer(said)})
    if outside:
        raise Refused(
            f"{', '.join(outside)}: a reference to what is not in its own design (the testbench, or above it); "
            "a design under test reaches only its own ports and modules"
        )
    if run.returncode != 0:
        missing = sorted(set(_UNKNOWN_MODULE.findall(said)))
        if missing:
            raise Refused(
                f"it instantiates {', '.join(missing)}, which it does not define: a design under test is complete "
                "on its own (the test's modules, the reference among them, are not part of it)"
            )
        root = _NO_ROOT.search(said)
        if root:
            raise CompileFailed(f"it does not define module {root.group('name')}", said)
        raise CompileFailed("it does not compile on its own", said)
    try:
        return vvp.parse(Path(ALONE).read_text(encoding="utf-8", errors="replace"))
    except vvp.Unreadable as e:
        raise Refused(str(e)) from e


def check_design(design: vvp.Design, may_print: bool) -> None:
    """The rules on the compiled design (see the module's docstring). Raises Refused naming the first broken."""
    allowed = PURE_SYSTEM_FUNCTIONS | (OUTPUT_TASKS if may_print else frozenset())
    for name in sorted(design.calls):
        if name in allowed:
            continue
        if name in OUTPUT_TASKS:
            why = "prints, and this test's verdict is read from the simulation's output (its passPattern)"
        else:
            why = _WHY_SYSTEM.get(name, "only pure functions ($signed, $clog2, ...) and output ($display, "
                                  "$error, ...) are allowed in a design under test")  # fmt: skip
        where = sorted(design.path(design.scopes[s]) for s in design.calls_in.get(name, ()) if s in design.scopes)
        raise Refused(f"{name} (in {', '.join(where) or 'the design'}): {name} {why}")
    for op in sorted(design.forces):
        raise Refused(f"{op}: force/release overrides a signal from outside its drivers (an input port too)")
    for op in sorted(design.switches):
        raise Refused(f"{op}: a bidirectional switch could drive the testbench's nets through a port")
    for root in design.roots():
        inout = [name for direction, name in design.ports.get(root.id, []) if direction == "INOUT"]
        if inout:
            raise Refused(f"{root.type}: inout port {inout[0]} could drive the testbench's stimulus")


def judge_sample(sample: Path, spec: TestSpec, test_units: set[str]) -> tuple[Path, vvp.Design]:
    """Steps 1-2 of the module's docstring. Returns the file the test is compiled with, and its design."""
    check_text(sample.read_text(encoding="utf-8", errors="replace"))
    text = preprocess(sample)
    source = Path(DESIGN)
    source.write_text(text, encoding="utf-8")
    design = compile_alone(source, spec.module)
    if spec.module:
        text, dropped = drop_units(text, design.module_types())
        if dropped:
            source.write_text(text, encoding="utf-8")
            print(f"not judged (not part of {spec.module}): {', '.join(dropped)}", file=sys.stderr)
            design = compile_alone(source, spec.module)
    check_design(design, may_print=bool(spec.verdict) or spec.pass_pattern is None)
    clash = (design.module_types() | declared_units(tokens(text))) & (test_units | {VERDICT_MODULE})
    if clash:
        name = sorted(clash)[0]
        raise Refused(f"module {name}: the test defines {name}; a sample may not replace it")
    return source, design


def verdict_module(spec: TestSpec) -> str:
    """The checker's module that writes the testbench's counters to VERDICT_FILE when the simulation ends."""
    mismatches, samples = (f"{spec.top}.{spec.verdict[k]}" for k in ("mismatches", "samples"))
    return (
        f"module {VERDICT_MODULE};\n  integer fd;\n  final begin\n"
        f'    fd = $fopen("{VERDICT_FILE}", "w");\n'
        f'    $fdisplay(fd, "%0d %0d", {mismatches}, {samples});\n    $fclose(fd);\n  end\nendmodule\n'
    )


def compile_test(spec: TestSpec, design: Path) -> subprocess.CompletedProcess[str]:
    extra = []
    if spec.verdict:
        Path(VERDICT_SOURCE).write_text(verdict_module(spec), encoding="utf-8")
        extra = ["-s", VERDICT_MODULE, VERDICT_SOURCE]
    return _iverilog("-o", SIMULATION, "-s", spec.top, *extra[:2], *spec.files, *extra[2:], str(design))


def check_reference(spec: TestSpec) -> None:
    """Raises BrokenProblem when the test's own reference answer does not compile with the test."""
    if spec.reference is None:
        return
    Path(REFERENCE).write_text(spec.reference, encoding="utf-8")
    run = compile_test(spec, Path(REFERENCE))
    if run.returncode != 0:
        raise BrokenProblem(
            "the problem's own reference does not compile with this simulator (a problem of the task set, not "
            f"of the sample):\n{(run.stdout + run.stderr).strip()[:1500]}"
        )


def same_design(alone: vvp.Design, spec: TestSpec) -> None:
    """The module under test, as the testbench instantiates it, is the design judged on its own."""
    if not spec.module:
        return
    combined = vvp.parse(Path(SIMULATION).read_text(encoding="utf-8", errors="replace"), strict=False)
    roots = [s for s in alone.roots() if s.type == spec.module]
    want = alone.subtree(roots[0]) if roots else Counter()
    for s in combined.scopes.values():
        if s.kind == "module" and s.type == spec.module and combined.subtree(s) != want:
            raise Refused(f"{combined.path(s)}: the design the testbench instantiates is not the one compiled alone")


def _show(text: str) -> None:
    print(
        text[:OUTPUT_SHOWN] + ("\n[... cut]" if len(text) > OUTPUT_SHOWN else ""),
        end="" if text.endswith("\n") else "\n",
    )


def decide(spec: TestSpec, returncode: int, output: str) -> int:
    """The verdict from the simulation: the checker's channel with a test "verdict", else the exit code and
    the passPattern."""
    if spec.verdict:
        try:
            mismatches, samples = map(int, Path(VERDICT_FILE).read_text().split())
        except (OSError, ValueError):
            print("the simulation ended without the testbench's counters (it never reached its end)", file=sys.stderr)
            return EXIT_MISMATCH
        print(f"verdict: {mismatches} mismatches in {samples} samples (read from the testbench)", file=sys.stderr)
        return 0 if returncode == 0 and mismatches == 0 and samples > 0 else EXIT_MISMATCH
    if returncode != 0:
        return EXIT_MISMATCH
    if spec.pass_pattern and re.search(spec.pass_pattern, output, re.MULTILINE) is None:
        print(f"the simulation ended without printing what passing prints ({spec.pass_pattern!r})", file=sys.stderr)
        return EXIT_MISMATCH
    return 0


def run(test: dict[str, Any]) -> int:
    print(f"simulator: {simulator_version()}", file=sys.stderr)
    try:
        spec = TestSpec.of(test)
        build(spec)
        return simulate(spec)
    except Refused as e:
        print(f"refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except CompileFailed as e:
        try:
            check_reference(spec)
        except BrokenProblem as broken:
            print(f"broken problem: {broken}", file=sys.stderr)
            return EXIT_TASK
        _show(e.output)
        print(f"{e}", file=sys.stderr)
        return e.exit_code
    except BrokenProblem as e:
        print(f"broken problem: {e}", file=sys.stderr)
        return EXIT_TASK


def module_under_test(spec: TestSpec) -> TestSpec:
    """`spec` with its module under test: the test's "module", else the one module its files instantiate but do
    not define (iverilog names it when the test's files are compiled alone), else none (every module of the
    sample is then judged)."""
    if spec.module:
        return spec
    run = _iverilog("-o", "/dev/null", "-s", spec.top, *spec.files)
    missing = sorted(set(_UNKNOWN_MODULE.findall(run.stdout + run.stderr)))
    return replace(spec, module=missing[0]) if len(missing) == 1 else spec


def build(spec: TestSpec) -> None:
    """Steps 1-3 of the module's docstring: the simulation, compiled. Raises Refused or CompileFailed."""
    spec = module_under_test(spec)
    test_toks = [t for f in spec.files for t in tokens(Path(f).read_text(encoding="utf-8", errors="replace"))]
    design, alone = judge_sample(Path(SAMPLE_FILE), spec, declared_units(test_toks))
    compiled = compile_test(spec, design)
    if compiled.returncode != 0:
        raise CompileFailed("it does not compile with the test", compiled.stdout + compiled.stderr)
    same_design(alone, spec)


def simulate(spec: TestSpec) -> int:
    with open(SIMULATION_OUTPUT, "wb") as out:
        sim = subprocess.run(["vvp", "-n", SIMULATION], stdout=out, stderr=subprocess.STDOUT, check=False)
    output = Path(SIMULATION_OUTPUT).read_text(encoding="utf-8", errors="replace")
    _show(output)
    return decide(spec, sim.returncode, output)


def main() -> int:
    return run(json.loads(Path(TEST_FILE).read_text()))


if __name__ == "__main__":
    sys.exit(main())
