`timescale 1 ps/1 ps

module tb;
  reg clk = 0;
  always #5 clk = ~clk;

  reg reset = 1, en = 0;
  wire [3:0] q_ref, q_dut;
  integer samples = 0, mismatches = 0;

  RefModule ref_inst (.clk(clk), .reset(reset), .en(en), .q(q_ref));
  TopModule top_inst (.clk(clk), .reset(reset), .en(en), .q(q_dut));

  // Inputs change on the falling edge; the registers, updated on the rising edge, are compared on the
  // falling one, once reset has set them.
  initial begin
    @(negedge clk);
    @(negedge clk) begin reset = 0; en = 1; end
    repeat (20) @(negedge clk);
    repeat (80) @(negedge clk) begin
      en = $random;
      reset = ($random & 15) == 0;
    end
    @(negedge clk);
    $display("Mismatches: %0d in %0d samples", mismatches, samples);
    $finish;
  end

  always @(negedge clk) begin
    if ($time > 10) begin
      samples = samples + 1;
      if (q_dut !== q_ref) mismatches = mismatches + 1;
    end
  end
endmodule
