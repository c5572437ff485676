# tpuforge/trainer: JAX LoRA SFT on TPU (python -m tpuforge_workloads.train --config ...).
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY workloads ./workloads
# jax[tpu] brings libtpu; the rest of the stack is pinned by the `workloads` extra.
RUN pip install --no-cache-dir '.[workloads]' 'jax[tpu]==0.10.2' && rm -rf /src
ENV TMPDIR=/dev/shm
ENTRYPOINT []
CMD ["python", "-m", "tpuforge_workloads.train", "--config", "/etc/tpuforge/config.json"]
