#!/usr/bin/env bash
# Installs what is missing, builds, prepares the built-in corpus (Debian's fortunes) and trains the tiny
# model: on the GPU when there is one, else on the CPU (a few minutes). Extra arguments go to `train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
have_nvcc() { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }
if have_nvcc && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  build_dir=build cuda=ON
else
  # No GPU (or no CUDA toolkit): skip the CUDA kernels, which would only slow the first run down.
  build_dir=build-cpu cuda=OFF
fi
BUILD_DIR=$build_dir scripts/build.sh -DWITH_CUDA=$cuda --target train prepare_data
# --overwrite: running the quickstart again replaces the previous quickstart run.
"$build_dir/apps/train" --preset tiny --out runs/tiny --overwrite "$@"
