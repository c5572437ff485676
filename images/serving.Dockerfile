# tpuforge/serving: the vLLM-TPU server of ServingDeployments, exactly as vLLM publishes it. Built so that a
# cluster that pulls only from its own registry finds it there under the same registry and tag as the other
# tpuforge images; nothing is added (the pods run as 65532, and nothing in vLLM looks that user up).
# VLLM_TPU_IMAGE has no default here: `make images` passes tpuforge.api.constants.DEFAULT_VLLM_IMAGE, the one
# place the vLLM-TPU release is named, so this image and the evaluator's base never drift apart.
ARG VLLM_TPU_IMAGE
FROM ${VLLM_TPU_IMAGE}
ARG VLLM_TPU_IMAGE
LABEL dev.tpuforge.vllm-tpu-image=${VLLM_TPU_IMAGE}
