# tpuforge/evaluator: the evaluation's scoring step (python -m tpuforge_workloads.evaluate.score --config ...):
# vLLM-TPU answers held-out questions with the base and with base + the new adapter. It is the serving image
# (api.constants.DEFAULT_VLLM_IMAGE, passed by `make images` as VLLM_TPU_IMAGE, which has no default here:
# the evaluation runs the same vLLM release as serving, one with runtime LoRA loading on TPU) with tpuforge on
# top and only what the score program needs beside vLLM: pydantic (vLLM has it), google-cloud-storage and
# tensorboardX (the scores as TensorBoard scalars beside the training run's).
# No JAX: the loss step runs in the trainer image.
ARG VLLM_TPU_IMAGE
FROM ${VLLM_TPU_IMAGE}
ARG VLLM_TPU_IMAGE
LABEL dev.tpuforge.vllm-tpu-image=${VLLM_TPU_IMAGE}
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY workloads ./workloads
# --no-deps keeps vLLM's own pins (pydantic, numpy, torch) untouched; pyyaml is tpuforge's other dependency.
RUN pip install --no-cache-dir --no-deps . \
 && pip install --no-cache-dir 'google-cloud-storage==3.17.1' 'pyyaml>=6' 'tensorboardX==2.6.5' \
 && python -c "import tpuforge_workloads.evaluate.score" \
 && rm -rf /src
# The unprivileged user every tpuforge pod runs as (tpuforge.manifests.common.POD_UID). Its home is /tmp:
# pods mount a scratch volume there, the root filesystem being read-only.
RUN groupadd --gid 65532 tpuforge \
 && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin tpuforge
USER 65532:65532
ENTRYPOINT []
CMD ["python", "-m", "tpuforge_workloads.evaluate.score", "--config", "/etc/tpuforge/config.json"]
