# tpuforge/checker-verilog: the Verilog checker of functional evaluation (spec.evaluation.code.checker).
# Debian trixie's Icarus Verilog 12 (iverilog + vvp: VerilogEval v2 is written for iverilog 12; 11 cannot
# compile some of its references' casts, which the checker then reports as problems of the task set) and
# Python 3 for the checker runner (python -m tpuforge_workloads.evaluate.check) and the Verilog checker
# (python -m tpuforge_workloads.evaluate.verilog, which reads the compiled design with evaluate.vvp), which
# need the standard library only: only their modules are copied. Each verdict names the simulator's version.
# The runner starts as root with CAP_SETUID and CAP_SETGID only (the pod's securityContext grants exactly
# these, with a read-only root filesystem, no privilege escalation and no service-account token) and runs each
# sample under a fresh uid of its own; the evaluation's NetworkPolicy denies its egress (docs/sandbox.md:
# what each mode guarantees).
FROM debian:trixie-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iverilog python3 \
 && rm -rf /var/lib/apt/lists/*
COPY workloads/tpuforge_workloads/__init__.py /opt/tpuforge/tpuforge_workloads/__init__.py
COPY workloads/tpuforge_workloads/evaluate/__init__.py workloads/tpuforge_workloads/evaluate/check.py \
     workloads/tpuforge_workloads/evaluate/jail.py workloads/tpuforge_workloads/evaluate/verilog.py \
     workloads/tpuforge_workloads/evaluate/vvp.py \
     /opt/tpuforge/tpuforge_workloads/evaluate/
ENV PYTHONPATH=/opt/tpuforge
RUN python3 -m tpuforge_workloads.evaluate.check --help >/dev/null \
 && python3 -c "import tpuforge_workloads.evaluate.verilog" \
 && iverilog -V 2>&1 | awk 'NR==1 { split($4, v, "."); if (v[1] < 12) { print "iverilog " $4 ": 12 or newer needed"; exit 1 } }'
ENTRYPOINT []
CMD ["python3", "-m", "tpuforge_workloads.evaluate.check", "--help"]
