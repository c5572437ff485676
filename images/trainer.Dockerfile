# tpuforge/trainer: JAX LoRA SFT on TPU (python -m tpuforge_workloads.train --config ...).
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY workloads ./workloads
# The `tpu` extra brings libtpu; the rest of the stack is pinned by the `workloads` extra.
RUN pip install --no-cache-dir '.[workloads,tpu]' && rm -rf /src
ENV TMPDIR=/dev/shm
# The unprivileged user every tpuforge pod runs as (tpuforge.manifests.common.POD_UID). Its home is /tmp:
# pods mount a scratch volume there, the root filesystem being read-only.
RUN groupadd --gid 65532 tpuforge \
 && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin tpuforge
USER 65532:65532
ENTRYPOINT []
CMD ["python", "-m", "tpuforge_workloads.train", "--config", "/etc/tpuforge/config.json"]
