#!/usr/bin/env bash
# The tracked C++/CUDA sources (third_party/ excepted) are formatted as .clang-format says:
# clang-format --dry-run -Werror over each, so a file that would change fails the check and
# its diff lines are printed. scripts/test.sh runs it once the tree has been formatted (the
# file .clang-format-applied at the repository root marks that); to format a file:
# clang-format -i FILE.
#   usage: scripts/check-format.sh [FILE...]   (default: every tracked source)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
command -v clang-format >/dev/null || { echo "check-format: clang-format is not installed (scripts/install-deps.sh)" >&2; exit 1; }
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h' '*.c' ':!:third_party/**')
fi
if printf '%s\0' "${files[@]}" | xargs -0 -n 50 -P "${MTNLG_BUILD_JOBS:-2}" clang-format --style=file --dry-run -Werror; then
  echo "check-format: ${#files[@]} files formatted as .clang-format says"
else
  echo "check-format: files above differ from .clang-format's layout; run clang-format -i on them" >&2
  exit 1
fi
