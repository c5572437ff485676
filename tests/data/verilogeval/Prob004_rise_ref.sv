module RefModule (
  input clk,
  input reset,
  input in,
  output reg pulse
);

  reg last;

  always @(posedge clk) begin
    if (reset) begin
      last <= 1'b0;
      pulse <= 1'b0;
    end else begin
      last <= in;
      pulse <= in & ~last;
    end
  end

endmodule
