"""Code that runs inside tpuforge pods: training, merge, serving glue."""
