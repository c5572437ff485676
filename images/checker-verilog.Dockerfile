# tpuforge/checker-verilog: the Verilog checker of functional evaluation (spec.evaluation.code.checker).
# Debian's Icarus Verilog (iverilog + vvp) and Python 3 for the checker runner (python -m
# tpuforge_workloads.evaluate.check) and the Verilog checker (python -m tpuforge_workloads.evaluate.verilog),
# which need the standard library only: only their modules are copied.
# The runner starts as root with CAP_SETUID and CAP_SETGID only (the pod's securityContext grants exactly
# these, with a read-only root filesystem, no privilege escalation and no service-account token) and runs each
# sample under a fresh uid of its own; the evaluation's NetworkPolicy denies its egress (docs/sandbox.md:
# what each mode guarantees).
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iverilog python3 \
 && rm -rf /var/lib/apt/lists/*
COPY workloads/tpuforge_workloads/__init__.py /opt/tpuforge/tpuforge_workloads/__init__.py
COPY workloads/tpuforge_workloads/evaluate/__init__.py workloads/tpuforge_workloads/evaluate/check.py \
     workloads/tpuforge_workloads/evaluate/jail.py workloads/tpuforge_workloads/evaluate/verilog.py \
     /opt/tpuforge/tpuforge_workloads/evaluate/
ENV PYTHONPATH=/opt/tpuforge
RUN python3 -m tpuforge_workloads.evaluate.check --help >/dev/null \
 && python3 -c "import tpuforge_workloads.evaluate.verilog" && iverilog -V >/dev/null
ENTRYPOINT []
CMD ["python3", "-m", "tpuforge_workloads.evaluate.check", "--help"]
