#!/usr/bin/env bash
# Every environment variable the project's code reads is documented in launch/README.md's "Environment
# variables" section (as `NAME`).
#
# Names read: every all-capitals string literal with an underscore ("TT_NCCL_TIMEOUT_S") in a source file
# that calls getenv, every name passed to getenv directly (getenv("TERM")), and every "TT_..." literal in
# any source file (a helper may receive the name from another file). Sources: *.cpp, *.cu, *.h, *.cuh
# under the library and app folders; tests/ is left out.
# Usage: tests/env_documented.sh [REPO_ROOT]
set -euo pipefail
root=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
cd "$root"

# Third-party names read only to detect the launcher (Open MPI, PMI, PMIx, MVAPICH, Cray PALS, Slurm): not
# ours to document.
not_ours='^(OMPI|PMI|PMIX|MV2|PALS|SLURM)_'
source_dirs=(apps base core dist kernels nn optim)

sources=$(find "${source_dirs[@]}" -type f \( -name '*.cpp' -o -name '*.cu' -o -name '*.h' -o -name '*.cuh' \))
readers=$(grep -l -E '\bgetenv\b' $sources || true)
names=$( {
  [ -z "$readers" ] || grep -ohE '"[A-Z][A-Z0-9]*_[A-Z0-9_]+"' $readers
  [ -z "$readers" ] || grep -ohE 'getenv\("[A-Z][A-Z0-9_]*"\)' $readers | grep -oE '"[A-Z0-9_]+"'
  grep -ohE '"TT_[A-Z0-9_]+"' $sources || true
} | tr -d '"' | sort -u | grep -vE "$not_ours" || true)

# The section from its heading to the next level-2 heading.
section=$(awk '/^## Environment variables/ { on = 1; next } /^## / { on = 0 } on' launch/README.md)
[ -n "$section" ] || { echo "launch/README.md has no '## Environment variables' section"; exit 1; }

missing=()
for name in $names; do
  grep -qF "\`$name\`" <<<"$section" || missing+=("$name")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "read by the code but not in launch/README.md's environment table: ${missing[*]}"
  for name in "${missing[@]}"; do grep -n -E "\"$name\"" $sources | sed 's/^/  /'; done
  exit 1
fi
echo "environment variables documented: $(echo $names | wc -w) checked ($(echo $names))"
