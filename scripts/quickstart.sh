#!/usr/bin/env bash
# Quickstart 1: set up, build, and run the main job on the embedded default config.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/sim/tpusim topology v5p-128
echo
./build/sim/tpusim config model_name=llama3.1-8b compile_topology=v5p-128 | tail -n 1
