# tpuforge/merger: streams the LoRA merge on a CPU node (python -m tpuforge_workloads.merge --config ...); also
# the serving pods' model-fetch init container. torch (CPU) is only needed for `--verify`.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY workloads ./workloads
RUN pip install --no-cache-dir torch==2.13.0 \
 && pip install --no-cache-dir '.[workloads,merge]' && rm -rf /src
ENV JAX_PLATFORMS=cpu
# The unprivileged user every tpuforge pod runs as (tpuforge.manifests.common.POD_UID). Its home is /tmp:
# pods mount a scratch volume there, the root filesystem being read-only.
RUN groupadd --gid 65532 tpuforge \
 && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin tpuforge
USER 65532:65532
ENTRYPOINT []
CMD ["python", "-m", "tpuforge_workloads.merge", "--config", "/etc/tpuforge/config.json"]
