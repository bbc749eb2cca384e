#!/usr/bin/env bash
# Snapshot of every shipped prediction, for refactors that must not change them:
#   bash scripts/prediction-snapshot.sh [BUILD_DIR] > /tmp/before.txt
#   ... change the code, rebuild ...
#   bash scripts/prediction-snapshot.sh [BUILD_DIR] > /tmp/after.txt && diff /tmp/before.txt /tmp/after.txt
# It prints `rackstep predict --json` for every models/zoo/*.json x every sim/layouts/*.json
# (each layout on the cluster it is written for; a combination the tool rejects
# records its error line), `rackstep timeline --json` for each shipped layout with
# the model it is written for, and `rackstep size --json` on the default scenario.
# Wall-clock fields (the engine's own run time) are removed: they differ run to run.
# BUILD_DIR may be another checkout's build (its source paths print as <repo>).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
RS="$BUILD/rackstep"
[ -x "$RS" ] || { echo "prediction-snapshot: $RS not built (cmake --build $BUILD --target rackstep)" >&2; exit 2; }

# The cluster (and --domains) each shipped layout is written for (its "comment" says so).
cluster_of() {
  case "$(basename "$1" .json)" in
    gb200-pp6) echo "--cluster topologies/zoo/gb200-12-racks.json" ;;
    h100-longctx-pp24) echo "--cluster topologies/zoo/hgx-h100.json --domains 96" ;;
    *) echo "--cluster topologies/zoo/gb200-11-racks.json" ;;
  esac
}
# The model each shipped layout is written for (the timeline runs).
model_of() {
  case "$(basename "$1" .json)" in
    fsdp-360b-rack) echo models/zoo/marin-360b-fsdp.json ;;
    *) echo models/zoo/marin-535b-a23b.json ;;
  esac
}
# Drops the fields that measure the simulator itself, not the step.
strip_wall() { grep -v -E '"(build_s|simulate_s|seconds)"'; }

# Source paths print as <repo>/..., so builds of two checkouts compare.
exec > >(sed -E 's#"/[^"]*/(topologies|tests|models|sim)/#"<repo>/\1/#g')

for layout in sim/layouts/*.json; do
  for model in models/zoo/*.json; do
    echo "=== predict $(basename "$model") x $(basename "$layout")"
    # shellcheck disable=SC2046
    out=$("$RS" predict --model "$model" $(cluster_of "$layout") --layout "$layout" --json 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && ! grep -q '"valid"' <<<"$out"; then
      echo "rejected (exit $rc): $(head -1 <<<"$out")"
    else
      echo "$out"
    fi
  done
done

for layout in sim/layouts/*.json; do
  model=$(model_of "$layout")
  echo "=== timeline $(basename "$model") x $(basename "$layout")"
  # shellcheck disable=SC2046
  out=$("$RS" timeline --model "$model" $(cluster_of "$layout") --layout "$layout" --json 2>&1)
  rc=$?
  [ $rc -ne 0 ] && echo "exit $rc"
  strip_wall <<<"$out"
done

# Explicit ranks, two steps and a checkpoint exercise the rank-level graph.
for layout in sim/layouts/hero-ragged.json sim/layouts/hero-pooled.json; do
  echo "=== timeline marin-535b-a23b.json x $(basename "$layout") --ranks-per-stage 4 --steps 2 --checkpoint-every 2"
  "$RS" timeline --model models/zoo/marin-535b-a23b.json --cluster topologies/zoo/gb200-11-racks.json \
    --layout "$layout" --ranks-per-stage 4 --steps 2 --checkpoint-every 2 --json 2>&1 | strip_wall
done

# The predictor's other readers: the calibration and public validation tables
# (per-op timings included) and a ranked sweep.
echo "=== validate-calibration"
"$RS" validate-calibration --json 2>&1 | strip_wall
echo "=== validate"
"$RS" validate --json 2>&1 | strip_wall
echo "=== sweep marin-535b-a23b.json on gb200-11-racks"
"$RS" sweep --model models/zoo/marin-535b-a23b.json --cluster topologies/zoo/gb200-11-racks.json --threads 1 --json 2>&1 | strip_wall

echo "=== size (default scenario)"
"$RS" size --json 2>&1 | strip_wall
