#!/usr/bin/env bash
# One pass on a GPU machine: build, run every test (GPU suites included), then the attention and model
# benchmarks next to PyTorch's. Results go to $OUT (or ./gpu-results). Usage: scripts/gpu_check.sh [quick|full]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi -L
prefix=()
[ -d .deps/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/usr")
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "${prefix[@]}" >"$out/configure.log" 2>&1 || { tail -20 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
echo "== build ok"
ctest --test-dir build-gpu --output-on-failure -j 4 >"$out/ctest.log" 2>&1
tail -15 "$out/ctest.log"
build-gpu/tests/test_gpu >"$out/test_gpu.log" 2>&1
grep -E "ERROR|FAILED|test cases|assertions" "$out/test_gpu.log" | head -40
