#!/usr/bin/env bash
# The main job on a fresh machine: install, build, and size the built-in scenario.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/rackstep size "$@"
