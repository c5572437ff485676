`timescale 1 ps/1 ps

module tb;
  reg clk = 0;
  always #5 clk = ~clk;

  reg [7:0] d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  reg [1:0] sel = 0;
  wire [7:0] y_ref, y_dut;
  integer samples = 0, mismatches = 0;

  RefModule ref_inst (.d0(d0), .d1(d1), .d2(d2), .d3(d3), .sel(sel), .y(y_ref));
  TopModule top_inst (.d0(d0), .d1(d1), .d2(d2), .d3(d3), .sel(sel), .y(y_dut));

  initial begin
    repeat (100) @(negedge clk) begin
      {d0, d1} = $random;
      {d2, d3} = $random;
      sel = $random;
    end
    @(negedge clk);
    $display("Mismatches: %0d in %0d samples", mismatches, samples);
    $finish;
  end

  always @(posedge clk) begin
    samples = samples + 1;
    if (y_dut !== y_ref) mismatches = mismatches + 1;
  end
endmodule
