#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (single-rank and mpirun suites; GPU tests are
# skipped when no CUDA device exists).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j 2
