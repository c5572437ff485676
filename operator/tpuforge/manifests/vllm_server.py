"""The vLLM server process of a ServingDeployment's pods: `vllm serve`'s arguments (LoRA flags included), its
environment, its port and its probes."""

from __future__ import annotations

import math

from tpuforge.api.constants import MULTIMODAL_MAX_NUM_BATCHED_TOKENS
from tpuforge.api.serving import ServingDeploymentSpec
from tpuforge.manifests.common import Obj
from tpuforge.manifests.serving_inputs import ServingInputs, served_model_name

VLLM_PORT = 8000
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
XLA_CACHE_MOUNT = "/xla-cache"
# vLLM-TPU compiles for 8-10 minutes on a cold cache; its own v6e-8 benchmark allows an hour. The engine
# timeout and the startup probe share this budget so that neither gives up before the other.
STARTUP_BUDGET_SECONDS = 3600
STARTUP_PROBE_PERIOD_SECONDS = 10
# vLLM's loader for weights in object storage (the Run:ai model streamer): it reads a gs:// directory's
# safetensors straight into memory, several ranges at once, and pulls the small files (config, tokenizer) first.
STREAM_LOAD_FORMAT = "runai_streamer"
# The ranks vLLM's --max-lora-rank accepts (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# --max-lora-rank when an adapter's rank is not known ahead (a URI adapter): covers the usual LoRA ranks.
DEFAULT_URI_LORA_RANK = 64


def lora_enabled(spec: ServingDeploymentSpec) -> bool:
    """vLLM serves LoRA adapters when the spec lists some, or names a maxLoraRank (which keeps the flags, and
    so the pods, the same when the first adapter is added later)."""
    return bool(spec.adapters) or spec.vllm.lora.max_lora_rank is not None


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts for --max-lora-rank that holds `rank`."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}")


def max_lora_rank(inp: ServingInputs) -> int:
    """spec.vllm.lora.maxLoraRank, else the largest referenced job's rank, and 64 for URI adapters (whose
    rank nothing records ahead), rounded up to a rank vLLM accepts."""
    explicit = inp.spec.vllm.lora.max_lora_rank
    if explicit is not None:
        return vllm_lora_rank(explicit)
    ranks = [inp.adapter_job_rank] if inp.adapter_job_rank else []
    if any(a.uri is not None for a in inp.spec.adapters) or not ranks:
        ranks.append(DEFAULT_URI_LORA_RANK)
    return vllm_lora_rank(max(ranks))


def lora_args(inp: ServingInputs) -> list[str]:
    if not lora_enabled(inp.spec):
        return []
    lora = inp.spec.vllm.lora
    args = ["--enable-lora", "--max-loras", str(lora.max_loras), "--max-lora-rank", str(max_lora_rank(inp))]
    if lora.max_cpu_loras is not None:
        args += ["--max-cpu-loras", str(lora.max_cpu_loras)]
    return args


def vllm_args(inp: ServingInputs) -> list[str]:
    """`vllm serve` arguments after the subcommand: the model first (its gs:// URI when streamed, else the path
    the init container copied it to), extra args last (so they win)."""
    v = inp.spec.vllm
    stream = inp.spec.model_storage.medium == "Stream"
    args = [
        inp.model_uri if stream else v.model_path,
        *(["--load-format", STREAM_LOAD_FORMAT] if stream else []),
        "--served-model-name",
        served_model_name(inp.name, inp.spec),
        "--tensor-parallel-size",
        str(v.tensor_parallel_size),
        "--max-model-len",
        str(v.max_model_len),
        "--kv-cache-dtype",
        v.kv_cache_dtype,
    ]
    if v.max_num_seqs is not None:
        args += ["--max-num-seqs", str(v.max_num_seqs)]
    batched = v.max_num_batched_tokens
    if inp.model.multimodal:
        # vLLM-TPU requires it for multimodal models (Gemma 4's vision tower); each item is then batched whole.
        args.append("--disable_chunked_mm_input")
        batched = batched or MULTIMODAL_MAX_NUM_BATCHED_TOKENS
    if batched is not None:
        args += ["--max-num-batched-tokens", str(batched)]
    args += lora_args(inp)
    args += ["--host", "0.0.0.0", "--port", str(VLLM_PORT)]
    return args + list(v.extra_args)


def _http_get(path: str) -> Obj:
    return {"path": path, "port": VLLM_PORT}


def probes() -> dict[str, Obj]:
    """Startup allows the whole compile budget; after that readiness gates traffic and liveness restarts a
    wedged server."""
    return {
        "startupProbe": {
            "httpGet": _http_get(HEALTH_PATH),
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": math.ceil(STARTUP_BUDGET_SECONDS / STARTUP_PROBE_PERIOD_SECONDS),
        },
        "readinessProbe": {
            "httpGet": _http_get(HEALTH_PATH),
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": _http_get(HEALTH_PATH),
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 5,
        },
    }


def vllm_env(lora: bool = False) -> list[Obj]:
    env = [
        {"name": "VLLM_XLA_CACHE_PATH", "value": XLA_CACHE_MOUNT},
        {"name": "VLLM_ENGINE_READY_TIMEOUT_S", "value": str(STARTUP_BUDGET_SECONDS)},
        # The model is a local directory or a gs:// one: nothing should reach out to the Hugging Face Hub.
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        # vLLM otherwise reports usage statistics to its authors (and writes them under HOME).
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
    ]
    if lora:
        # The operator loads and unloads adapters through /v1/load_lora_adapter while the server runs.
        env.append({"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"})
    return env
