"""The parts of the operator-at-scale benchmark, `benchmarks/operator_scale.py` (which runs them; see its docstring):
workload.py the FineTuneJobs it creates and the baseline's writes, processes.py the processes it starts beside
the sandbox (the operator, py-spy, the CPU load), observe.py what it watches and counts, phases.py the phases in
order and their results."""
