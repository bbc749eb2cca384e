#!/usr/bin/env bash
# `rackstep size --emit-run DIR` (issue 12, item 5): the winner of a tiny CPU
# scenario becomes a directory whose launch script runs it with
# `rackstep train --layout`, then refits (`calibrate --from-run`) and compares;
# an inline candidate is written from the scenario's own JSON.
# Usage: bash tests/cli/calibrate_emit.sh path/to/rackstep
set -u
bin=$(realpath "${1:?usage: calibrate_emit.sh path/to/rackstep}")
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive

/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
base = {"name": "cpu-tiny", "cluster": {"file": "topologies/zoo/cpu-host.json"},
        "start_date": "2026-12-01", "deadline": "2026-12-08", "token_budget": 1e7, "tokens_per_step": 256,
        "rank_by": "fastest", "goodput_runs": 20}
json.dump(dict(base, candidates=[{"model": "models/zoo/tiny-moe.json"}]), open(tmp + "/zoo.json", "w"))
m = json.load(open("models/zoo/tiny-moe.json"))
m["layers"] = 2
json.dump(dict(base, candidates=[{"name": "tiny-2l", "inline": m}]), open(tmp + "/inline.json", "w"))
PY

"$bin" size --scenario "$tmp/zoo.json" --emit-run "$tmp/emit" --quiet >/dev/null 2>"$tmp/size.err"
check "size --emit-run exits 0" "[ $? -eq 0 ]"
for f in model.json layout.json cluster.json calibration.json prediction.json launch-slurm.sbatch; do
  check "size --emit-run writes $f" "[ -s $tmp/emit/$f ]"
done
check "the mpirun script is executable" "[ -x $tmp/emit/launch-mpirun.sh ]"
check "the launch scripts run train --layout" \
  "grep -q 'train .*--layout \"\$DIR/layout.json\"' $tmp/emit/launch-mpirun.sh && grep -q 'srun .*train .*--layout' $tmp/emit/launch-slurm.sbatch"
check "the emitted files load in predict" \
  "'$bin' predict --model $tmp/emit/model.json --cluster $tmp/emit/cluster.json --calibration $tmp/emit/calibration.json --layout $tmp/emit/layout.json >/dev/null"

# The launch script runs as written: train, refit from the profile, compare.
mkdir -p "$tmp/text"
cp README.md models/*.h "$tmp/text/"
"$bin" data build --from "$tmp/text" --out "$tmp/data" --split blank-lines --eval-fraction 0.2 --quiet --json >/dev/null
DATA="$tmp/data" STEPS=2 RACKSTEP="$bin" bash "$tmp/emit/launch-mpirun.sh" >"$tmp/launch.out" 2>&1
check "launch-mpirun.sh exits 0" "[ $? -eq 0 ] || { tail -5 $tmp/launch.out; false; }"
check "the run was profiled" "[ -s $tmp/emit/run/op_measurements.json ]"
check "the run refitted a calibration" "[ -s $tmp/emit/run/calibration/calibration.json ]"
check "the run was compared" "[ -s $tmp/emit/run/compare.json ]"

"$bin" size --scenario "$tmp/inline.json" --emit-run "$tmp/emit2" --quiet >/dev/null 2>&1
check "size --emit-run of an inline winner exits 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp" <<'PY' || fail=1
import json, sys
tmp = sys.argv[1]
m = json.load(open(tmp + "/emit2/model.json"))
assert m["name"] == "tiny-2l" and m["layers"] == 2, (m["name"], m["layers"])
p = json.load(open(tmp + "/emit2/prediction.json"))
assert p["valid"] and p["step_time_s"] > 0 and "inline" in p["sources"]["model"], p["sources"]
l = json.load(open(tmp + "/emit/layout.json"))
assert l["tokens_per_step"] == 256, l
PY

exit $fail
