#!/usr/bin/env bash
# Configures and builds the project (CUDA included when nvcc is found) into $BUILD_DIR (default: build).
# CMake -D options are passed to the configure step, `--target NAME ...` to the build step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
configure_args=() build_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target)
      shift
      build_args+=(--target)
      while [ $# -gt 0 ] && [[ "$1" != -* ]]; do build_args+=("$1"); shift; done ;;
    *) configure_args+=("$1"); shift ;;
  esac
done
generator=()
if command -v ninja >/dev/null && [ ! -f "$build_dir/CMakeCache.txt" ]; then generator=(-G Ninja); fi
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${configure_args[@]}" >/dev/null
cmake --build "$build_dir" -j "$(nproc)" "${build_args[@]}"
