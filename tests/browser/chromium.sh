# Sourced by the browser tests: finds Debian's chromium (exit 1 with the install hint when it is
# missing) and sets browser_flags for a headless run with its own profile under $out (one per
# test: two Chromiums sharing a profile directory refuse to start when ctest runs them at once).
# Needs: out (the output directory) and test_name (for messages).
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z "$browser" ]]; then
  echo "$test_name: no chromium; install it with: bash scripts/setup.sh --with-browser" >&2
  exit 1
fi
browser_flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
               --user-data-dir="$out/profile-$test_name" --enable-logging=stderr --v=0)
