# tpuforge/checker-verilog: the Verilog checker of functional evaluation (spec.evaluation.code.checker).
# Debian's Icarus Verilog (iverilog + vvp) and Python 3 for the checker runner (python -m
# tpuforge_workloads.evaluate.check), which needs the standard library only: only its modules are copied.
# The pod makes the root filesystem read-only, runs it as 65532 with no service-account token, and the
# evaluation's NetworkPolicy denies its egress (docs/sandbox.md: what the sandbox enforces instead).
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends iverilog python3 \
 && rm -rf /var/lib/apt/lists/*
COPY workloads/tpuforge_workloads/__init__.py /opt/tpuforge/tpuforge_workloads/__init__.py
COPY workloads/tpuforge_workloads/evaluate/__init__.py workloads/tpuforge_workloads/evaluate/check.py \
     workloads/tpuforge_workloads/evaluate/jail.py /opt/tpuforge/tpuforge_workloads/evaluate/
ENV PYTHONPATH=/opt/tpuforge
RUN python3 -m tpuforge_workloads.evaluate.check --help >/dev/null && iverilog -V >/dev/null
RUN groupadd --gid 65532 tpuforge \
 && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin tpuforge
USER 65532:65532
ENTRYPOINT []
CMD ["python3", "-m", "tpuforge_workloads.evaluate.check", "--help"]
