#!/usr/bin/env bash
# The project on a TPU VM without network (docs/tpu-offline.md).
#
#   scripts/tpu-offline.sh prepare BUNDLE_DIR     on a machine with a package index: the wheels a plain TPU VM
#                                                 lacks (cp311, manylinux) and the repository's files, in one dir
#   scripts/tpu-offline.sh install BUNDLE_DIR     on the TPU VM: the wheels installed into BUNDLE_DIR/site (no
#                                                 network, no dependency resolution); prints the environment
#   scripts/tpu-offline.sh measure BUNDLE_DIR OUT [runner args]
#                                                 on the TPU VM: the named measurements (benchmarks/chip/session.py),
#                                                 each in its own process under a deadline, JSON appended under OUT
#
# The TPU VM keeps its own JAX, jaxlib, libtpu, numpy and scipy: nothing here carries them, and the carried
# packages come after the machine's own site-packages on the path, so its JAX stays the one imported.
# LOCAL_INDEX (e.g. file:///opt/pypi/simple): the VM's own package index, for the large wheels it has
# (pyarrow, tensorstore, pandas, pillow, llvmlite, numba); without it `prepare` carries them too (CARRY_LARGE=1).
set -euo pipefail

PYTHON=${PYTHON:-python3}
PY_VERSION=${PY_VERSION:-3.11}
PLATFORMS=(manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64)
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# What a TPU VM with JAX 0.10.2 and libtpu lacks, at the versions the project runs with (measured 2026-12-06).
WHEELS=(
  absl_py==2.5.1 annotated_types==0.8.0 array_record==0.8.6 attrs==26.1.0 cloudpickle==3.1.3 clu==0.0.12
  etils==1.15.0 filelock==4.3.2 flax==0.12.8 fsspec==2026.9.0 google_metrax==0.2.4 google_tunix==0.1.7
  googleapis_common_protos==1.76.0 grain==0.2.18 huggingface_hub==1.33.0 humanize==4.17.0 jaxtyping==0.3.11
  msgpack==1.2.4 optax==0.2.8 orbax_checkpoint==0.12.8 perfetto==0.59.1 portpicker==1.6.0
  prometheus_client==0.26.0 protobuf==7.36.2 pydantic==2.14.4 pydantic_core==2.50.5 pygments==2.21.0
  python_dateutil==4.0.0 pyyaml==6.0.4 qwix==0.1.8 rich==15.0.0 safetensors==0.7.0 sentencepiece==0.2.3
  simplejson==4.3.0 tensorboardx==2.6.5 threadpoolctl==3.8.0 tokenizers==0.22.2 tqdm==4.70.1 treescope==0.1.10
  typing_extensions==4.16.0 typing_inspection==0.4.5 uvloop==0.23.0 wadler_lindig==0.1.8 wrapt==2.5.2
)
# Large, and on the measured VM's own index: carried only with CARRY_LARGE=1 (numba and llvmlite: the merge CLI's bfloat16 kernels).
LARGE=(pyarrow tensorstore pandas pillow llvmlite numba)

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

download() {  # DEST SPEC...: binary wheels for the VM's Python, never its dependencies
  local dest=$1; shift
  local platform_args=()
  for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
  "$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    "${platform_args[@]}" --dest "$dest" "$@"
}

prepare() {
  local bundle=$1
  mkdir -p "$bundle/wheels"
  download "$bundle/wheels" "${WHEELS[@]}"
  if [[ ${CARRY_LARGE:-0} == 1 ]]; then download "$bundle/wheels" "${LARGE[@]}"; fi
  # The repository's tracked files at HEAD (source roots, benchmarks, scripts): the project runs from source.
  git -C "$ROOT" archive --format=tar HEAD | (mkdir -p "$bundle/repo" && tar -x -C "$bundle/repo")
  printf '%s\n' "${WHEELS[@]}" > "$bundle/wheels.txt"
  echo "bundle in $bundle: $(ls "$bundle/wheels" | wc -l) wheels, $(du -sh "$bundle" | cut -f1); copy it to the TPU VM"
}

env_lines() {  # the environment that runs the project from the bundle, machine site first
  local bundle site
  bundle=$(cd "$1" && pwd)
  site=$("$PYTHON" -c 'import site, sys; print(":".join(site.getsitepackages() + [site.getusersitepackages()]))')
  # What PYTHONPATH already names stays first (a TPU image may keep its JAX there, not in site-packages).
  echo "export PYTHONPATH=\${PYTHONPATH:+\$PYTHONPATH:}$site:$bundle/site:$bundle/repo/operator:$bundle/repo/workloads:$bundle/repo"
  echo "export ALLOW_MULTIPLE_LIBTPU_LOAD=1"
}

install() {
  local bundle=$1
  [[ -d $bundle/wheels ]] || { echo "no $bundle/wheels: run 'prepare' where there is a package index" >&2; exit 2; }
  # --isolated with no config file: a pip.conf naming an unreachable index is not consulted.
  local pip=(env PIP_CONFIG_FILE=/dev/null "$PYTHON" -m pip install --isolated -q --no-deps --no-compile --no-cache-dir)
  "${pip[@]}" --no-index --target "$bundle/site" "$bundle"/wheels/*.whl
  if [[ -n ${LOCAL_INDEX:-} ]]; then
    "${pip[@]}" --only-binary=:all: --index-url "$LOCAL_INDEX" --target "$bundle/site" "${LARGE[@]}"
  fi
  env_lines "$bundle" > "$bundle/env.sh"
  # shellcheck disable=SC1091
  . "$bundle/env.sh"
  "$PYTHON" -c 'import jax, tunix, qwix, grain, tpuforge_workloads.train.trainer as t; print("jax", jax.__version__, "from", jax.__file__); print(jax.devices())'
  echo "installed; run: . $bundle/env.sh"
}

measure() {
  local bundle=$1 out=$2; shift 2
  [[ -f $bundle/env.sh ]] || { echo "run '$0 install $bundle' first" >&2; exit 2; }
  # shellcheck disable=SC1091
  . "$bundle/env.sh"
  mkdir -p "$out"
  cd "$bundle/repo"
  "$PYTHON" -m benchmarks.chip.session --out "$out" "$@" 2>&1 | tee -a "$out/session.log"
}

case ${1:-} in
  prepare) [[ $# -eq 2 ]] || usage; prepare "$2" ;;
  install) [[ $# -eq 2 ]] || usage; install "$2" ;;
  measure) [[ $# -ge 3 ]] || usage; shift; measure "$@" ;;
  *) usage ;;
esac
