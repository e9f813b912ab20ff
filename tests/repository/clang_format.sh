#!/usr/bin/env bash
# Every C++ source and header of the repository is formatted as .clang-format says: clang-format
# would change nothing. With --self-test, checks that a file it would reformat is caught.
# Usage: bash tests/repository/clang_format.sh SOURCE_DIR [--self-test]
set -euo pipefail
cd "$1"
if ! command -v clang-format >/dev/null 2>&1; then
  echo "clang-format is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi

if [[ "${2:-}" == "--self-test" ]]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  cp .clang-format "$scratch/"
  printf 'int  f( int x ){return x;}\n' > "$scratch/badly_formatted.cpp"
  if clang-format --dry-run --Werror "$scratch/badly_formatted.cpp" 2>/dev/null; then
    echo "clang-format passed a file it should reformat" >&2
    exit 1
  fi
  echo "a badly formatted file is caught"
  exit 0
fi

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.cpp' '*.h')
else
  mapfile -t files < <(find . \( -path ./build -o -path './build-*' \) -prune -o \
                         \( -name '*.cpp' -o -name '*.h' \) -print | sort)
fi
if ! clang-format --dry-run --Werror "${files[@]}"; then
  echo "these files are not clang-formatted: run clang-format -i on them" >&2
  exit 1
fi
echo "${#files[@]} C++ files are clang-formatted"
