`timescale 1 ps/1 ps

module tb;
  reg clk = 0;
  always #5 clk = ~clk;

  reg reset = 1, in = 0;
  wire pulse_ref, pulse_dut;
  integer samples = 0, mismatches = 0;

  RefModule ref_inst (.clk(clk), .reset(reset), .in(in), .pulse(pulse_ref));
  TopModule top_inst (.clk(clk), .reset(reset), .in(in), .pulse(pulse_dut));

  initial begin
    @(negedge clk);
    @(negedge clk) reset = 0;
    repeat (100) @(negedge clk) begin
      in = $random;
      reset = ($random & 31) == 0;
    end
    @(negedge clk);
    $display("Mismatches: %0d in %0d samples", mismatches, samples);
    $finish;
  end

  always @(negedge clk) begin
    if ($time > 10) begin
      samples = samples + 1;
      if (pulse_dut !== pulse_ref) mismatches = mismatches + 1;
    end
  end
endmodule
