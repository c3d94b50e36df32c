#!/usr/bin/env bash
# Every repository path that the documentation and the sources mention exists.
#
# Scanned: README.md, docs/*.md (not docs/results/), every folder's README.md, and the sources (*.cpp, *.h,
# *.cu, *.cuh, *.py, *.sh). Checked:
#   - a path whose first component is a top-level folder of the repository (`docs/attention.md`,
#     `apps/lib/flags.h`, `kernels/cuda/`), from the repository root;
#   - in Markdown, a link target `[text](target)` (not a URL or an anchor), from the file's folder;
#   - a bare Markdown file name (`baselines.md`): next to the file, at the root, in docs/, or a result file
#     of that name under docs/results/.
# Paths people create (`data/mine`, `RUN/metrics.jsonl`, `build/apps/train`, `hf/mine`) start with no
# top-level folder of the repository, so they are not checked. A path with a placeholder (`*`, `{a,b}`,
# `<name>`, `$var`) is skipped.
# Usage: tests/doc_references.sh [REPO_ROOT]
set -euo pipefail
root=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
cd "$root"

files=$(git ls-files --cached --others --exclude-standard 2>/dev/null) ||
  files=$(find . -path './build*' -prune -o -path ./.git -prune -o -type f -print | sed 's|^\./||')
# Top-level folders: those holding a tracked (or new, not ignored) file; build folders are ignored.
top=$(grep / <<<"$files" | cut -d/ -f1 | sort -u | paste -sd'|' -)
docs=$(grep -E '^(README\.md|docs/[^/]+\.md|[^/]+/README\.md)$' <<<"$files" || true)
# This script is left out: it names the exceptions below.
sources=$(grep -E '\.(cpp|h|cu|cuh|py|sh)$' <<<"$files" | grep -vE '^(docs/results/|tests/doc_references\.sh$)' || true)

# Known exceptions, as "FILE: PATH" (none now).
allowed=()

missing=()
# check FILE WHERE_FROM TOKEN: records TOKEN (a path relative to WHERE_FROM) when it does not exist.
check() {
  local file=$1 from=$2 token=$3
  case "$token" in *'*'* | *'{'* | *'}'* | *'<'* | *'>'* | *'$'* | *'~'*) return ;; esac
  token=${token%%#*}
  [ -n "$token" ] || return 0
  [ -e "$from/$token" ] || missing+=("$file: $token")
}

for file in $docs $sources; do
  [ -f "$file" ] || continue
  dir=$(dirname "$file")
  # Repository paths: a top-level folder name and a slash, not inside a longer path or word.
  while IFS= read -r token; do
    token=${token#?}                               # the boundary character matched in front
    token=$(sed -E 's/[.:]+$//' <<<"$token")      # sentence punctuation after the path
    check "$file" . "$token"
  done < <(sed 's/^/ /' "$file" | grep -oE "[^A-Za-z0-9_./\$~-]($top)/[A-Za-z0-9_./*{}<>\$~-]*" || true)
  case "$file" in
    *.md)
      # Markdown link targets, relative to the file's folder.
      while IFS= read -r token; do
        token=${token#](}
        token=${token%)}
        case "$token" in http://* | https://* | mailto:* | '#'*) continue ;; esac
        check "$file" "$dir" "$token"
      done < <(grep -oE '\]\([^) ]+\)' "$file" || true) ;;
  esac
  # Bare Markdown file names.
  while IFS= read -r token; do
    token=${token#?}
    [ -e "$dir/$token" ] || [ -e "$token" ] || [ -e "docs/$token" ] ||
      grep -qE "^docs/results/(.*/)?$token\$" <<<"$files" || missing+=("$file: $token")
  done < <(sed 's/^/ /' "$file" | grep -oE '[^A-Za-z0-9_./$~-][A-Za-z0-9_-]+\.md\b' || true)
done

for entry in "${allowed[@]}"; do
  for i in "${!missing[@]}"; do
    [ "${missing[$i]}" != "$entry" ] || unset 'missing[i]'
  done
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "references to paths that do not exist:"
  printf '  %s\n' "${missing[@]}" | sort -u
  exit 1
fi
echo "references ok: $(wc -w <<<"$docs $sources") files"
