#!/usr/bin/env bash
# `rackstep calibrate` and `rackstep compare` (issue 12): a calibration with a
# tiny budget on the tiny model writes files `predict` loads, every fitted
# value carries a source, --backend cuda fails with one line (exit 2), a tiny
# profiled run refits (--from-run) and compares into a two-sided Chrome trace.
# Usage: bash tests/cli/calibrate.sh path/to/rackstep
set -u
bin=$(realpath "${1:?usage: calibrate.sh path/to/rackstep}")
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive

"$bin" calibrate --backend cuda --out "$tmp/cuda" --budget-s 5 --quiet >/dev/null 2>"$tmp/cuda.err"
rc=$?
if [ $rc -eq 0 ]; then  # a GPU: GEMMs and bandwidth measured on it, profiles not yet
  check "--backend cuda measures on the GPU" "grep -q '\"backend\": \"cuda\"' $tmp/cuda/measurements.json"
else
  check "--backend cuda without a GPU exits 2" "[ $rc -eq 2 ]"
  check "--backend cuda says why in one line" \
    "grep -qE 'CUDA backend plugin|CUDA device' $tmp/cuda.err && [ \$(wc -l < $tmp/cuda.err) -eq 1 ]"
fi

"$bin" calibrate --backend cpu --out "$tmp/cal" --threads 1 --budget-s 2 --no-collectives --json \
  >"$tmp/cal.json" 2>"$tmp/cal.err"
check "calibrate exits 0" "[ $? -eq 0 ]"
check "calibrate shows progress on stderr" "grep -q 'calibrate: \[' $tmp/cal.err"
check "predict loads the fitted files" \
  "'$bin' predict --model models/zoo/tiny-moe.json --cluster $tmp/cal/topology.json --calibration $tmp/cal/calibration.json --layout sim/layouts/hero-ragged.json >/dev/null 2>&1; [ \$? -le 2 ]"
cat >"$tmp/layout.json" <<'J'
{"name": "one", "data": 1, "fsdp": 1, "ep": 1, "micro_batch_seqs": 2, "tokens_per_step": 128, "seq_len": 64,
 "recompute": "none", "optimizer_state": "device", "master_dtype": "fp32"}
J
"$bin" predict --model models/zoo/tiny-moe.json --cluster "$tmp/cal/topology.json" \
  --calibration "$tmp/cal/calibration.json" --layout "$tmp/layout.json" --json >"$tmp/pred.json"
check "predict on the fitted files exits 0" "[ $? -eq 0 ]"

mkdir -p "$tmp/text"
cp README.md models/*.h "$tmp/text/"
"$bin" data build --from "$tmp/text" --out "$tmp/data" --split blank-lines --eval-fraction 0.2 --quiet --json >/dev/null
"$bin" train --model models/zoo/tiny-moe.json --data "$tmp/data" --batch 2 --seq 64 --steps 3 --threads 1 \
  --profile --out "$tmp/run" --json >/dev/null
check "profiled train exits 0" "[ $? -eq 0 ]"
"$bin" calibrate --from-run "$tmp/run" --out "$tmp/cal2" --topology "$tmp/cal/topology.json" \
  --calibration "$tmp/cal/calibration.json" --json >"$tmp/cal2.json" 2>/dev/null
check "calibrate --from-run exits 0" "[ $? -eq 0 ]"
# A GPU run's profile (exec/profiler.h: the device fields a CUDA run adds) fits onto its GPU's zoo
# topology (topologies/cuda_devices.json); a GPU without one is refused with one line, exit 2.
gpu_run() {
  rm -rf "$tmp/$1" && cp -r "$tmp/run" "$tmp/$1"
  /usr/bin/python3 - "$tmp/$1/op_measurements.json" "$2" <<'PY'
import json, sys
p, device = sys.argv[1], sys.argv[2]
d = json.load(open(p))
d.update({"device": device, "op_clock": "cuda_events", "step_device_s": d["step_wall_s"],
          "peak_device_bytes": 3.0e8, "device_used_at_peak_bytes": 9.0e8, "device_total_bytes": 1.5e11})
json.dump(d, open(p, "w"))
PY
}
gpu_run gpurun "NVIDIA H200"
"$bin" calibrate --from-run "$tmp/gpurun" --out "$tmp/calgpu" --json >/dev/null 2>"$tmp/calgpu.err"
check "calibrate --from-run of a GPU run exits 0" "[ $? -eq 0 ]"
check "a GPU run fits onto its GPU's topology" \
  "grep -q '\"NVIDIA H200 (calibrated)\"' $tmp/calgpu/topology.json && grep -q '\"rss_bytes\": 900000000' $tmp/calgpu/measurements.json"
gpu_run gpuother "NVIDIA GeForce RTX 4090"
"$bin" calibrate --from-run "$tmp/gpuother" --out "$tmp/calother" --json >/dev/null 2>"$tmp/calother.err"
check "a GPU without a zoo topology exits 2" "[ $? -eq 2 ]"
check "... in one line naming /device" "grep -q '/device' $tmp/calother.err && [ \$(wc -l < $tmp/calother.err) -eq 1 ]"
"$bin" compare --predicted "$tmp/cal" --measured "$tmp/run" -o "$tmp/compare.json" --json >"$tmp/table.json"
check "compare exits 0" "[ $? -eq 0 ]"
"$bin" compare --predicted "$tmp/cal" --measured "$tmp/nothing" >/dev/null 2>"$tmp/noerr"
check "compare of a missing run exits 2" "[ $? -eq 2 ]"

"$bin" sweep --model models/zoo/tiny-moe.json --cluster "$tmp/cal/topology.json" --calibration "$tmp/cal/calibration.json" \
  --top 1 --emit-run "$tmp/emit" >/dev/null 2>&1
check "sweep --emit-run exits 0" "[ $? -eq 0 ]"
check "emit-run writes the launch scripts" "[ -x $tmp/emit/launch-mpirun.sh ] && grep -q srun $tmp/emit/launch-slurm.sbatch"
check "emit-run layout loads in predict" \
  "'$bin' predict --model $tmp/emit/model.json --cluster $tmp/emit/cluster.json --calibration $tmp/emit/calibration.json --layout $tmp/emit/layout.json >/dev/null"

/usr/bin/python3 - "$tmp" <<'PY' || fail=1
import json, sys, os
tmp = sys.argv[1]
cal = json.load(open(os.path.join(tmp, "cal", "calibration.json")))
topo = json.load(open(os.path.join(tmp, "cal", "topology.json")))
fit = json.load(open(os.path.join(tmp, "cal.json")))
meas = json.load(open(os.path.join(tmp, "cal", "measurements.json")))
assert meas["format"] == "rackstep.calibration_measurements/1"
assert len(meas["profiles"]) >= 1 and len(meas["gemm"]) >= 1, "measured at least one profile and GEMM"
# Every fitted value says where it came from.
assert cal["attention"]["fwd_efficiency"]["source"].startswith("[F]"), cal["attention"]["fwd_efficiency"]
assert cal["launch_overhead_s"]["source"].startswith("[F]")
assert topo["gpu"]["hbm_bw_bytes_per_s"]["source"].startswith("[M]")
assert topo["gpu"]["peak_flops_per_s"]["bf16"]["source"].startswith("[F]")
# The fitted peak is the measured GEMM rate / 0.9 (not the placeholder).
assert abs(fit["peak_flops_per_s"] * 0.9 - fit["best_gemm_flops_per_s"]) < 1e-6 * fit["peak_flops_per_s"]
assert 0 < fit["efficiencies"]["gemm"] <= 1
pred = json.load(open(os.path.join(tmp, "pred.json")))
assert pred["valid"] and pred["step_time_s"] > 0
run = json.load(open(os.path.join(tmp, "run", "op_measurements.json")))
assert run["peak_rss_bytes"] > 1e6, "the profile records the process's peak resident set"
t = json.load(open(os.path.join(tmp, "compare.json")))
ev = t["traceEvents"]
names = [e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"]
assert all(n.startswith("predicted: ") or n.startswith("measured: ") for n in names), names
x = [e for e in ev if e.get("ph") == "X"]
pred_x = [e for e in x if e["pid"] < 1000000]
meas_x = [e for e in x if e["pid"] >= 1000000]
assert pred_x and meas_x
for side in (pred_x, meas_x):
    assert min(e["ts"] for e in side) == 0, "both timelines start at 0"
for e in x:
    assert e["cat"] in ("forward", "backward", "recompute", "optimizer", "comm", "host"), e
    assert "op" in e["args"] and "op_class" in e["args"], e
# The engine's slice names are the simulator's: same set of (name, op) on both sides.
ps = {(e["name"], e["args"]["op"]) for e in pred_x}
ms = {(e["name"], e["args"]["op"]) for e in meas_x}
assert ms <= ps, sorted(ms - ps)[:5]
assert t["otherData"]["rackstep_compare"]["measured"].endswith("run")
table = json.load(open(os.path.join(tmp, "table.json")))
assert table["step"]["measured_median_s"] > 0 and table["step"]["predicted_s"] > 0
assert {r["op_class"] for r in table["by_class"]} >= {"gemm", "attention"}
assert table["step"]["measured_deloaded_median_s"] > 0
refit = json.load(open(os.path.join(tmp, "cal2.json")))
assert refit["profiles"] == 1 and 0 < refit["efficiencies"]["gemm"] <= 1
PY

exit $fail
