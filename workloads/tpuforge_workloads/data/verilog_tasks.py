"""A dozen small Verilog problems with testbenches, for functional evaluation (pass@k) in tests and the demo.

Each problem is a chat record whose answer is a fenced Verilog module, with a `test` object the Verilog
checker receives: {"files": {"tb.v": <testbench>}}. Every testbench instantiates the module under test as
`dut`, checks it exhaustively (combinational) or over a fixed stimulus (sequential), ends with `$fatal` on a
mismatch and with `$finish` otherwise. `records()` holds the right solutions, `records(broken=True)` a
plausible wrong one per problem (an adapter trained on those must fail the threshold). The solutions are a
few lines each, so that the tiny test model can learn them by heart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The Verilog checker's command (the checker image has iverilog and vvp; so does a `make setup` machine).
VERILOG_CHECK_COMMAND = ["python3", "-m", "tpuforge_workloads.evaluate.verilog"]
_PASS = '    if (errors) $fatal(1, "FAIL: %0d mismatches", errors);\n    $display("PASS");\n    $finish;\n'


@dataclass(frozen=True)
class Problem:
    name: str
    ask: str  # the user turn
    solution: str
    broken: str  # a plausible wrong solution
    testbench: str


def _comb(decls: str, ports: str, bits: int, drive: str, check: str) -> str:
    """A testbench that drives every input combination (`bits` wide) and checks each output."""
    return (
        f"module tb;\n  {decls}\n  integer i, errors = 0;\n  dut_t dut({ports});\n  initial begin\n"
        f"    for (i = 0; i < {2**bits}; i = i + 1) begin\n      {drive} = i; #1;\n"
        f"      if ({check}) errors = errors + 1;\n    end\n{_PASS}  end\nendmodule\n"
    )


def _seq(decls: str, ports: str, step: str, check: str) -> str:
    """A testbench with a clock: reset, then 40 cycles of `step` stimulus, a reference model checked each one."""
    return (
        f"module tb;\n  reg clk = 0, rst = 1;\n  {decls}\n  integer i, errors = 0;\n  dut_t dut({ports});\n"
        "  always #1 clk = ~clk;\n  initial begin\n    @(negedge clk); rst = 0;\n"
        f"    for (i = 0; i < 40; i = i + 1) begin\n      {step}\n      @(negedge clk);\n"
        f"      if ({check}) errors = errors + 1;\n    end\n{_PASS}  end\nendmodule\n"
    )


def _module(name: str, ports: str, body: str) -> str:
    return f"module {name}({ports});\n{body}\nendmodule"


def _problem(name: str, ask: str, ports: str, body: str, broken: str, tb: str) -> Problem:
    return Problem(
        name,
        f"Write a Verilog module {name}({ask}). Answer with the module only.",
        _module(name, ports, body),
        _module(name, ports, broken),
        tb.replace("dut_t", name),
    )


PROBLEMS: tuple[Problem, ...] = (
    _problem("mux2", "a, b, s, y: y is b when s is 1, else a", "input a, b, s, output y",
             "  assign y = s ? b : a;", "  assign y = s ? a : b;",
             _comb("reg a, b, s; wire y;", ".a(a), .b(b), .s(s), .y(y)", 3, "{a, b, s}", "y !== (s ? b : a)")),
    _problem("half_adder", "a, b, sum, carry", "input a, b, output sum, carry",
             "  assign sum = a ^ b;\n  assign carry = a & b;", "  assign sum = a | b;\n  assign carry = a & b;",
             _comb("reg a, b; wire sum, carry;", ".a(a), .b(b), .sum(sum), .carry(carry)", 2, "{a, b}",
                   "{carry, sum} !== a + b")),
    _problem("full_adder", "a, b, cin, sum, cout", "input a, b, cin, output sum, cout",
             "  assign {cout, sum} = a + b + cin;", "  assign {cout, sum} = a + b;",
             _comb("reg a, b, cin; wire sum, cout;", ".a(a), .b(b), .cin(cin), .sum(sum), .cout(cout)", 3,
                   "{a, b, cin}", "{cout, sum} !== a + b + cin")),
    _problem("adder4", "4-bit a and b, 5-bit sum = a + b", "input [3:0] a, b, output [4:0] sum",
             "  assign sum = a + b;", "  assign sum = a - b;",
             _comb("reg [3:0] a, b; wire [4:0] sum;", ".a(a), .b(b), .sum(sum)", 8, "{a, b}", "sum !== a + b")),
    _problem("decoder2to4", "2-bit in, 4-bit one-hot out", "input [1:0] in, output [3:0] out",
             "  assign out = 4'b1 << in;", "  assign out = 4'b1 << ~in;",
             _comb("reg [1:0] in; wire [3:0] out;", ".in(in), .out(out)", 2, "in", "out !== (4'b1 << in)")),
    _problem("parity8", "8-bit d, p = XOR of its bits", "input [7:0] d, output p",
             "  assign p = ^d;", "  assign p = |d;",
             _comb("reg [7:0] d; wire p;", ".d(d), .p(p)", 8, "d", "p !== ^d")),
    _problem("mux4", "4-bit d, 2-bit sel, y = d[sel]", "input [3:0] d, input [1:0] sel, output y",
             "  assign y = d[sel];", "  assign y = d[3 - sel];",
             _comb("reg [3:0] d; reg [1:0] sel; wire y;", ".d(d), .sel(sel), .y(y)", 6, "{d, sel}", "y !== d[sel]")),
    _problem("compare4", "4-bit a and b, eq, lt, gt", "input [3:0] a, b, output eq, lt, gt",
             "  assign eq = a == b;\n  assign lt = a < b;\n  assign gt = a > b;",
             "  assign eq = a == b;\n  assign lt = a > b;\n  assign gt = a < b;",
             _comb("reg [3:0] a, b; wire eq, lt, gt;", ".a(a), .b(b), .eq(eq), .lt(lt), .gt(gt)", 8, "{a, b}",
                   "{eq, lt, gt} !== {a == b, a < b, a > b}")),
    _problem("popcount4", "4-bit d, 3-bit count of its ones", "input [3:0] d, output [2:0] count",
             "  assign count = d[0] + d[1] + d[2] + d[3];", "  assign count = d[0] + d[1] + d[2];",
             _comb("reg [3:0] d; wire [2:0] count;", ".d(d), .count(count)", 4, "d",
                   "count !== d[0] + d[1] + d[2] + d[3]")),
    _problem("dff", "clk, rst, d, q: q takes d at each rising clk edge, 0 while rst",
             "input clk, rst, d, output reg q",
             "  always @(posedge clk) q <= rst ? 1'b0 : d;", "  always @(posedge clk) q <= rst ? 1'b0 : ~d;",
             _seq("reg d = 0; reg want = 0; wire q;", ".clk(clk), .rst(rst), .d(d), .q(q)",
                  "d = i[1] ^ i[0]; want = d;", "q !== want")),
    _problem("counter4", "clk, rst, en, 4-bit q: q counts up at each rising clk edge when en, 0 while rst",
             "input clk, rst, en, output reg [3:0] q",
             "  always @(posedge clk) q <= rst ? 4'd0 : q + en;", "  always @(posedge clk) q <= rst ? 4'd0 : q + 1;",
             _seq("reg en = 0; reg [3:0] want = 0; wire [3:0] q;", ".clk(clk), .rst(rst), .en(en), .q(q)",
                  "en = i[0] | i[2]; want = want + en;", "q !== want")),
    _problem("shift4", "clk, rst, din, 4-bit q: q shifts left taking din at bit 0 each rising clk edge, 0 while rst",
             "input clk, rst, din, output reg [3:0] q",
             "  always @(posedge clk) q <= rst ? 4'd0 : {q[2:0], din};",
             "  always @(posedge clk) q <= rst ? 4'd0 : {din, q[3:1]};",
             _seq("reg din = 0; reg [3:0] want = 0; wire [3:0] q;", ".clk(clk), .rst(rst), .din(din), .q(q)",
                  "din = i[0] ^ i[3]; want = {want[2:0], din};", "q !== want")),
)  # fmt: skip


# 28 more, written like the dozen: with them, benchmarks/grpo.py holds out 40 problems, not 12. Kept apart
# from PROBLEMS so that what the tests, the demo and the Verilog tokenizer's corpus use stays the dozen.
MORE_PROBLEMS: tuple[Problem, ...] = (
    _problem("xor2", "a, b, y: y is a XOR b", "input a, b, output y",
             "  assign y = a ^ b;", "  assign y = a | b;",
             _comb("reg a, b; wire y;", ".a(a), .b(b), .y(y)", 2, "{a, b}", "y !== (a ^ b)")),
    _problem("and4", "4-bit d, y = AND of its bits", "input [3:0] d, output y",
             "  assign y = &d;", "  assign y = |d;",
             _comb("reg [3:0] d; wire y;", ".d(d), .y(y)", 4, "d", "y !== &d")),
    _problem("sub4", "4-bit a and b, 4-bit diff = a - b", "input [3:0] a, b, output [3:0] diff",
             "  assign diff = a - b;", "  assign diff = b - a;",
             _comb("reg [3:0] a, b; wire [3:0] diff;", ".a(a), .b(b), .diff(diff)", 8, "{a, b}",
                   "diff !== ((a - b) & 4'hf)")),
    _problem("max4", "4-bit a and b, 4-bit y = the larger", "input [3:0] a, b, output [3:0] y",
             "  assign y = a > b ? a : b;", "  assign y = a < b ? a : b;",
             _comb("reg [3:0] a, b; wire [3:0] y;", ".a(a), .b(b), .y(y)", 8, "{a, b}", "y !== (a > b ? a : b)")),
    _problem("gray4", "4-bit b, 4-bit Gray code g", "input [3:0] b, output [3:0] g",
             "  assign g = b ^ (b >> 1);", "  assign g = b ^ (b << 1);",
             _comb("reg [3:0] b; wire [3:0] g;", ".b(b), .g(g)", 4, "b", "g !== (b ^ (b >> 1))")),
    _problem("rev4", "4-bit d, 4-bit y = d with its bits reversed", "input [3:0] d, output [3:0] y",
             "  assign y = {d[0], d[1], d[2], d[3]};", "  assign y = {d[3], d[2], d[1], d[0]};",
             _comb("reg [3:0] d; wire [3:0] y;", ".d(d), .y(y)", 4, "d", "y !== {d[0], d[1], d[2], d[3]}")),
    _problem("tff", "clk, rst, t, q: q toggles at each rising clk edge when t, 0 while rst",
             "input clk, rst, t, output reg q",
             "  always @(posedge clk) q <= rst ? 1'b0 : q ^ t;", "  always @(posedge clk) q <= rst ? 1'b0 : t;",
             _seq("reg t = 0; reg want = 0; wire q;", ".clk(clk), .rst(rst), .t(t), .q(q)",
                  "t = i[0] | i[1]; want = want ^ t;", "q !== want")),
    _problem("down4", "clk, rst, 4-bit q: q counts down at each rising clk edge, 0 while rst",
             "input clk, rst, output reg [3:0] q",
             "  always @(posedge clk) q <= rst ? 4'd0 : q - 1;", "  always @(posedge clk) q <= rst ? 4'd0 : q + 1;",
             _seq("reg [3:0] want = 0; wire [3:0] q;", ".clk(clk), .rst(rst), .q(q)",
                  "want = want - 1;", "q !== want")),
    _problem("nand2", "a, b, y: y is a NAND b", "input a, b, output y",
             "  assign y = ~(a & b);", "  assign y = ~(a | b);",
             _comb("reg a, b; wire y;", ".a(a), .b(b), .y(y)", 2, "{a, b}", "y !== ~(a & b)")),
    _problem("nor2", "a, b, y: y is a NOR b", "input a, b, output y",
             "  assign y = ~(a | b);", "  assign y = ~(a ^ b);",
             _comb("reg a, b; wire y;", ".a(a), .b(b), .y(y)", 2, "{a, b}", "y !== ~(a | b)")),
    _problem("xnor2", "a, b, y: y is a XNOR b", "input a, b, output y",
             "  assign y = ~(a ^ b);", "  assign y = a ^ b;",
             _comb("reg a, b; wire y;", ".a(a), .b(b), .y(y)", 2, "{a, b}", "y !== ~(a ^ b)")),
    _problem("maj3", "a, b, c, y: y is 1 when at least two inputs are 1", "input a, b, c, output y",
             "  assign y = a & b | a & c | b & c;", "  assign y = a & b | b & c;",
             _comb("reg a, b, c; wire y;", ".a(a), .b(b), .c(c), .y(y)", 3, "{a, b, c}", "y !== (a + b + c > 1)")),
    _problem("min4", "4-bit a and b, 4-bit y = the smaller", "input [3:0] a, b, output [3:0] y",
             "  assign y = a < b ? a : b;", "  assign y = a < b ? b : a;",
             _comb("reg [3:0] a, b; wire [3:0] y;", ".a(a), .b(b), .y(y)", 8, "{a, b}", "y !== (a < b ? a : b)")),
    _problem("eq4", "4-bit a and b, eq is 1 when a equals b", "input [3:0] a, b, output eq",
             "  assign eq = a == b;", "  assign eq = a >= b;",
             _comb("reg [3:0] a, b; wire eq;", ".a(a), .b(b), .eq(eq)", 8, "{a, b}", "eq !== (a == b)")),
    _problem("bitand4", "4-bit a and b, 4-bit y = a AND b bitwise", "input [3:0] a, b, output [3:0] y",
             "  assign y = a & b;", "  assign y = a | b;",
             _comb("reg [3:0] a, b; wire [3:0] y;", ".a(a), .b(b), .y(y)", 8, "{a, b}", "y !== (a & b)")),
    _problem("inc4", "4-bit a, 4-bit y = a + 1", "input [3:0] a, output [3:0] y",
             "  assign y = a + 1;", "  assign y = a - 1;",
             _comb("reg [3:0] a; wire [3:0] y;", ".a(a), .y(y)", 4, "a", "y !== ((a + 1) & 4'hf)")),
    _problem("neg4", "4-bit a, 4-bit y = -a", "input [3:0] a, output [3:0] y",
             "  assign y = ~a + 1;", "  assign y = ~a;",
             _comb("reg [3:0] a; wire [3:0] y;", ".a(a), .y(y)", 4, "a", "y !== ((0 - a) & 4'hf)")),
    _problem("zero4", "4-bit d, z is 1 when d is 0", "input [3:0] d, output z",
             "  assign z = ~|d;", "  assign z = ~&d;",
             _comb("reg [3:0] d; wire z;", ".d(d), .z(z)", 4, "d", "z !== (d == 0)")),
    _problem("rotl4", "4-bit d, 4-bit y = d rotated left by one", "input [3:0] d, output [3:0] y",
             "  assign y = {d[2:0], d[3]};", "  assign y = {d[0], d[3:1]};",
             _comb("reg [3:0] d; wire [3:0] y;", ".d(d), .y(y)", 4, "d", "y !== {d[2:0], d[3]}")),
    _problem("sext4", "4-bit a, 8-bit y = a sign-extended", "input [3:0] a, output [7:0] y",
             "  assign y = {{4{a[3]}}, a};", "  assign y = {4'b0, a};",
             _comb("reg [3:0] a; wire [7:0] y;", ".a(a), .y(y)", 4, "a", "y !== {{4{a[3]}}, a}")),
    _problem("prio4", "4-bit d, 2-bit y = index of its highest 1, 0 if none", "input [3:0] d, output [1:0] y",
             "  assign y = d[3] ? 3 : d[2] ? 2 : d[1] ? 1 : 0;", "  assign y = d[0] ? 0 : d[1] ? 1 : d[2] ? 2 : 3;",
             _comb("reg [3:0] d; wire [1:0] y;", ".d(d), .y(y)", 4, "d",
                   "y !== (d[3] ? 3 : d[2] ? 2 : d[1] ? 1 : 0)")),
    _problem("decoder3to8", "3-bit in, 8-bit one-hot out", "input [2:0] in, output [7:0] out",
             "  assign out = 8'b1 << in;", "  assign out = 8'b1 << in[1:0];",
             _comb("reg [2:0] in; wire [7:0] out;", ".in(in), .out(out)", 3, "in", "out !== (8'b1 << in)")),
    _problem("dffe", "clk, rst, en, d, q: q takes d at each rising clk edge when en, 0 while rst",
             "input clk, rst, en, d, output reg q",
             "  always @(posedge clk) q <= rst ? 1'b0 : en ? d : q;", "  always @(posedge clk) q <= rst ? 1'b0 : d;",
             _seq("reg en = 0, d = 0; reg want = 0; wire q;", ".clk(clk), .rst(rst), .en(en), .d(d), .q(q)",
                  "en = i[1]; d = i[0] ^ i[2]; if (en) want = d;", "q !== want")),
    _problem("updown4", "clk, rst, up, 4-bit q: q counts up at each rising clk edge when up, else down, 0 while rst",
             "input clk, rst, up, output reg [3:0] q",
             "  always @(posedge clk) q <= rst ? 4'd0 : up ? q + 1 : q - 1;",
             "  always @(posedge clk) q <= rst ? 4'd0 : up ? q - 1 : q + 1;",
             _seq("reg up = 0; reg [3:0] want = 0; wire [3:0] q;", ".clk(clk), .rst(rst), .up(up), .q(q)",
                  "up = i[0] | i[1]; want = up ? want + 1 : want - 1;", "q !== want")),
    _problem("sat2", "clk, rst, en, 2-bit q: q counts up at each rising clk edge when en, stopping at 3, 0 while rst",
             "input clk, rst, en, output reg [1:0] q",
             "  always @(posedge clk) q <= rst ? 2'd0 : q + (en && q != 3);",
             "  always @(posedge clk) q <= rst ? 2'd0 : q + en;",
             _seq("reg en = 0; reg [1:0] want = 0; wire [1:0] q;", ".clk(clk), .rst(rst), .en(en), .q(q)",
                  "en = i[0] | i[1]; if (en && want != 3) want = want + 1;", "q !== want")),
    _problem("acc4", "clk, rst, 4-bit d, 4-bit q: q adds d at each rising clk edge, 0 while rst",
             "input clk, rst, input [3:0] d, output reg [3:0] q",
             "  always @(posedge clk) q <= rst ? 4'd0 : q + d;", "  always @(posedge clk) q <= rst ? 4'd0 : q | d;",
             _seq("reg [3:0] d = 0; reg [3:0] want = 0; wire [3:0] q;", ".clk(clk), .rst(rst), .d(d), .q(q)",
                  "d = i * 3; want = want + d;", "q !== want")),
    _problem("rise", "clk, rst, d, p: p is 1 for one cycle after d rises, 0 while rst",
             "input clk, rst, d, output reg p",
             "  reg prev;\n  always @(posedge clk) {prev, p} <= rst ? 2'd0 : {d, d & ~prev};",
             "  reg prev;\n  always @(posedge clk) {prev, p} <= rst ? 2'd0 : {d, ~d & prev};",
             _seq("reg d = 0, last = 0; reg want = 0; wire p;", ".clk(clk), .rst(rst), .d(d), .p(p)",
                  "d = i[1] ^ i[3]; want = d & ~last; last = d;", "p !== want")),
    _problem("johnson4", "clk, rst, 4-bit q: q shifts left taking ~q[3] at bit 0 each rising clk edge, 0 while rst",
             "input clk, rst, output reg [3:0] q",
             "  always @(posedge clk) q <= rst ? 4'd0 : {q[2:0], ~q[3]};",
             "  always @(posedge clk) q <= rst ? 4'd0 : {q[2:0], q[3]};",
             _seq("reg [3:0] want = 0; wire [3:0] q;", ".clk(clk), .rst(rst), .q(q)",
                  "want = {want[2:0], ~want[3]};", "q !== want")),
)  # fmt: skip


def fenced(code: str) -> str:
    return f"```verilog\n{code}\n```"


# Four of the shortest problems: what the e2e test and `make demo EVAL=code` train on (examples/data/verilog-*.jsonl
# are their records written out, right, broken and for evaluation; a test keeps them equal).
SHORT = ("mux2", "half_adder", "adder4", "parity8")


def records(
    broken: bool = False, names: tuple[str, ...] | None = None, problems: tuple[Problem, ...] = PROBLEMS
) -> list[dict[str, Any]]:
    """One chat record per problem of `problems` (those in `names`, else all): the ask, the (right or broken)
    solution fenced, the testbench as `test`."""
    unknown = set(names or ()) - {p.name for p in problems}
    if unknown:
        raise ValueError(f"no Verilog problem named {sorted(unknown)}; the problems: {[p.name for p in problems]}")
    return [
        {
            "messages": [
                {"role": "user", "content": p.ask},
                {"role": "assistant", "content": fenced(p.broken if broken else p.solution)},
            ],
            "test": {"files": {"tb.v": p.testbench}},
        }
        for p in problems
        if names is None or p.name in names
    ]


def corpus() -> list[str]:
    """Text for training a tiny model's tokenizer on this task set: every ask and every solution, right and broken."""
    return [text for p in PROBLEMS for text in (p.ask, fenced(p.solution), fenced(p.broken))]
