module RefModule (
  input clk,
  input reset,
  input en,
  output reg [3:0] q
);

  always @(posedge clk) begin
    if (reset) q <= 4'd15;
    else if (en) q <= q - 4'd1;
  end

endmodule
