#!/usr/bin/env bash
# Out-of-sample check of `rackstep calibrate` on this machine: calibrate from
# micro-benchmarks, then predict and measure real `rackstep train` runs the fit
# never saw; writes bench/results/validate-local-<date>-<host>.{md,json}.
#   scripts/validate-local.sh [BUILD_DIR=build] [WORK_DIR=/tmp/rackstep-validate-local]
# Environment: RACKSTEP_CAL_BUDGET_S (default 60), RACKSTEP_VALIDATE_STEPS (default 8).
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 scripts/validate_local.py "${1:-build}" "${2:-/tmp/rackstep-validate-local}"
