`timescale 1 ps/1 ps

module tb;
  reg clk = 0;
  always #5 clk = ~clk;

  reg a = 0, b = 0, c = 0;
  wire y_ref, y_dut;
  integer samples = 0, mismatches = 0, i;

  RefModule ref_inst (.a(a), .b(b), .c(c), .y(y_ref));
  TopModule top_inst (.a(a), .b(b), .c(c), .y(y_dut));

  // Inputs change on the falling edge; outputs are compared on the rising one.
  initial begin
    for (i = 0; i < 8; i = i + 1) @(negedge clk) {a, b, c} = i;
    repeat (40) @(negedge clk) {a, b, c} = $random;
    @(negedge clk);
    $display("Mismatches: %0d in %0d samples", mismatches, samples);
    $finish;
  end

  always @(posedge clk) begin
    samples = samples + 1;
    if (y_dut !== y_ref) mismatches = mismatches + 1;
  end
endmodule
