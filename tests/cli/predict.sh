#!/usr/bin/env bash
# rackstep predict / sweep / validate-calibration: tables, JSON, and one-line
# errors with exit status 2 for bad input.
#   bash tests/cli/predict.sh path/to/rackstep     (from the repository root)
set -u
bin=${1:?usage: predict.sh path/to/rackstep}
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }

M=models/zoo/marin-535b-a23b.json
C=topologies/zoo/gb200-11-racks.json
L=sim/layouts/hero-ragged.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$("$bin" predict --model $M --cluster $C --layout $L); rc=$?
check "predict exits 0" "[ $rc -eq 0 ]"
check "predict prints the step time" "grep -q 'step time' <<<\"\$out\""
check "predict prints MFU" "grep -q 'MFU (Marin)' <<<\"\$out\""
check "predict prints memory" "grep -q 'device total' <<<\"\$out\""

"$bin" predict --model $M --cluster $C --layout $L --json >"$tmp/p.json"; rc=$?
check "predict --json exits 0" "[ $rc -eq 0 ]"
check "predict --json is JSON with a step time" "python3 -c 'import json,sys; d=json.load(open(\"$tmp/p.json\")); assert d[\"valid\"] and d[\"step_time_s\"] > 0; assert abs(sum(d[\"breakdown_s\"].values()) - d[\"step_time_s\"]) < 1e-6 * d[\"step_time_s\"]'"

# An invalid layout: explained, exit 2.
python3 - "$L" "$tmp/bad.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["ep"] = 5; d["data"] = 700
json.dump(d, open(sys.argv[2], "w"))
PY
out=$("$bin" predict --model $M --cluster $C --layout "$tmp/bad.json" 2>&1); rc=$?
check "invalid layout exits 2" "[ $rc -eq 2 ]"
check "invalid layout names the GPU product" "grep -q 'gpu_product' <<<\"\$out\""
check "invalid layout names the EP divisibility" "grep -q 'does not divide 384 experts' <<<\"\$out\""

# Unknown files: one line, exit 2.
out=$("$bin" predict --model models/zoo/nope.json --cluster $C --layout $L 2>&1); rc=$?
check "unknown model exits 2" "[ $rc -eq 2 ]"
check "unknown model is one line" "[ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ]"
out=$("$bin" predict --model $M --cluster topologies/zoo/nope.json --layout $L 2>&1); rc=$?
check "unknown cluster exits 2" "[ $rc -eq 2 ]"
check "unknown cluster is one line" "[ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ]"
echo '{"data": 704, "warp_drive": true}' >"$tmp/unknown_key.json"
out=$("$bin" predict --model $M --cluster $C --layout "$tmp/unknown_key.json" 2>&1); rc=$?
check "unknown layout key exits 2" "[ $rc -eq 2 ]"
check "unknown layout key is named" "grep -q 'warp_drive' <<<\"\$out\""

# CUDA graphs: a scope list that breaks Megatron-Core's rules is one line naming /cuda_graphs, exit 2.
echo '{"data": 704, "recompute": "none", "cuda_graphs": ["moe_preprocess"]}' >"$tmp/graphs_bad.json"
out=$("$bin" predict --model $M --cluster $C --layout "$tmp/graphs_bad.json" 2>&1); rc=$?
check "cuda_graphs without moe_router exits 2" "[ $rc -eq 2 ]"
check "cuda_graphs error is one line naming the field" "[ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ] && grep -q '/cuda_graphs' <<<\"\$out\""

# Training stacks: a stack that cannot run the layout says what, and prices with its own overheads.
out=$("$bin" predict --model $M --cluster $C --layout $L --stack marin-july-2026); rc=$?
check "predict --stack exits 0" "[ $rc -eq 0 ]"
check "the July stack has no ragged transport yet" "grep -q 'stack_support (marin-july-2026 does not run the ragged EP transport)' <<<\"\$out\""
"$bin" predict --model $M --cluster $C --layout $L --stack megatron-lm --json >"$tmp/meg.json"
check "megatron-lm charges no JAX GC pause" "python3 -c 'import json; d=json.load(open(\"$tmp/meg.json\")); p=json.load(open(\"$tmp/p.json\")); assert d[\"stack\"] == \"megatron-lm\"; assert d[\"breakdown_s\"][\"host_stall\"] == 0 < p[\"breakdown_s\"][\"host_stall\"]'"
out=$("$bin" predict --model $M --cluster $C --layout $L --stack nope 2>&1); rc=$?
check "unknown stack exits 2" "[ $rc -eq 2 ]"
check "unknown stack is one line" "[ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ]"

# ZeRO-1 (Megatron's distributed optimizer) is expressible and priced without per-layer gathers.
python3 - "$L" "$tmp/zero1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["zero_stage"] = 1
json.dump(d, open(sys.argv[2], "w"))
PY
"$bin" predict --model $M --cluster $C --layout "$tmp/zero1.json" --json >"$tmp/z1.json"
check "zero_stage 1 has no per-layer FSDP traffic" "python3 -c 'import json; d=json.load(open(\"$tmp/z1.json\")); assert d[\"layout\"][\"zero_stage\"] == 1 and d[\"breakdown_s\"][\"fsdp_comm\"] == 0'"

# The public validation set: both tables, each run predicted.
"$bin" validate --json >"$tmp/v.json"; rc=$?
check "validate --json exits 0" "[ $rc -eq 0 ]"
check "validate has fitted and validation rows, all predicted" "python3 -c 'import json; d=json.load(open(\"$tmp/v.json\")); s=d[\"summary\"]; assert s[\"fitted\"][\"runs\"] > 0 and s[\"validation\"][\"runs\"] > 0; assert all(r[\"predicted\"] for r in d[\"runs\"])'"
out=$("$bin" validate); rc=$?
check "validate table names both groups" "grep -q '^fitted rows' <<<\"\$out\" && grep -q '^validation rows' <<<\"\$out\""

# Sweep: a small cluster (one rack) keeps the test short.
out=$("$bin" sweep --model models/zoo/marin-ladder-d768.json --cluster topologies/zoo/gb200-nvl72.json --top 3 --explain); rc=$?
check "sweep exits 0" "[ $rc -eq 0 ]"
check "sweep shows the fastest" "grep -q 'fastest' <<<\"\$out\""
check "sweep shows the Pareto front" "grep -q 'Pareto' <<<\"\$out\""
check "sweep --explain counts reasons" "grep -q 'rejected, by reason' <<<\"\$out\""
# Zero valid layouts: the 535B cannot fit on one 8-GPU node; the sweep says so and why.
out=$("$bin" sweep --model $M --cluster topologies/zoo/hgx-h100.json 2>&1); rc=$?
check "empty sweep exits 2" "[ $rc -eq 2 ]"
check "empty sweep says so" "grep -q 'no valid layout' <<<\"\$out\""

out=$("$bin" validate-calibration); rc=$?
check "validate-calibration exits 0" "[ $rc -eq 0 ]"
check "validate-calibration shows the hero step" "grep -q 'hero step time' <<<\"\$out\""

exit $fail
