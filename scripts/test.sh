#!/usr/bin/env bash
# Install, build and run every test (Catch2 units, command-line checks, the
# PyTorch reference comparison). CI runs exactly this through .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure -j "$jobs"
