#!/usr/bin/env bash
# Quickstart 1: set up, build, and run the main job (tpusim estimate) on the embedded default
# config (configs/base.yml: MaxText's default model on the v5p-8 slice).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/sim/tpusim estimate
