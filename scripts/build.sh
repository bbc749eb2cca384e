#!/usr/bin/env bash
# Configures and builds rackstep into build/ (Release). Used by run.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
bash scripts/cudnn-frontend.sh  # the cuDNN attention's headers into .vendor/ (without network: the own kernel)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
