#!/usr/bin/env bash
# Fails when a C++/CUDA source is not clang-formatted with the repository's .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "clang-format not found: format check skipped"
  exit 0
fi
bad=()
while IFS= read -r f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [ ${#bad[@]} -gt 0 ]; then
  echo "not clang-formatted (run clang-format -i on them): ${bad[*]}"
  exit 1
fi
echo "format ok"
