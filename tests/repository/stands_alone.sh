#!/usr/bin/env bash
# The repository stands alone: no tracked file names a folder beside the project root (the
# developers' input folder is not in a user's clone), and the data the tests and reports read
# lives inside the repository.
# Usage: bash tests/repository/stands_alone.sh SOURCE_DIR
set -euo pipefail
cd "$1"

status=0
# Built from pieces so that this script does not match itself.
outside='\.\./'"shared"
inside="shared"'/(reference|calibration|compat)'
# ... and a path joined from pieces, as os.path.join(ROOT, <parent>, <that folder>) would.
joined='"\.\.", *"'"shared"'"'
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  matches=$(git grep -n -E "$outside|$inside|$joined" -- . || true)
else
  matches=$(grep -rn -E "$outside|$inside|$joined" --exclude-dir=build --exclude-dir='build-*' . || true)
fi
if [[ -n "$matches" ]]; then
  echo "files that name a folder outside the repository:" >&2
  echo "$matches" >&2
  status=1
fi

for needed in validation/published.csv validation/kernels.csv validation/gpu_published.csv \
              validation/recipes_public.json docs/reference/hardware.md \
              docs/reference/maxtext.md docs/reference/numerics.md docs/design.md; do
  if [[ ! -s "$needed" ]]; then
    echo "missing or empty: $needed" >&2
    status=1
  fi
done

if ((status == 0)); then
  echo "stands alone: no outside path named, validation data and references present"
fi
exit "$status"
