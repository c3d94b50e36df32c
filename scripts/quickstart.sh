#!/usr/bin/env bash
# Installs what is missing, builds train and prepare_data into build/, prepares the built-in corpus (Debian's
# fortunes) and trains the tiny model: on the GPU when there is one, else on the CPU (a few minutes). Extra
# arguments go to `train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
have_nvcc() { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }
cuda=()
if have_nvcc && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  cuda=(-DWITH_CUDA=ON)
elif [ ! -f build/CMakeCache.txt ]; then
  # No GPU (or no CUDA toolkit) and no build yet: skip the CUDA kernels, which would only slow the first
  # build down. A build/ configured before keeps its setting (`scripts/build.sh -DWITH_CUDA=ON` adds them).
  cuda=(-DWITH_CUDA=OFF)
fi
BUILD_DIR=build scripts/build.sh "${cuda[@]}" --target train prepare_data
# --overwrite: running the quickstart again replaces the previous quickstart run.
build/apps/train --preset tiny --out runs/tiny --overwrite "$@"
