# tpuforge/merger: streams the LoRA merge on a CPU node (python -m tpuforge_workloads.merge --config ...); also
# the serving pods' model-fetch init container. torch (CPU) is only needed for `--verify`.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY workloads ./workloads
RUN pip install --no-cache-dir torch==2.13.0 \
 && pip install --no-cache-dir '.[workloads]' && rm -rf /src
ENV JAX_PLATFORMS=cpu
ENTRYPOINT []
CMD ["python", "-m", "tpuforge_workloads.merge", "--config", "/etc/tpuforge/config.json"]
