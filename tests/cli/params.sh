#!/usr/bin/env bash
# rackstep params / validate-config / topology as a user runs them.
set -u
bin=${1:?usage: params.sh path/to/rackstep}
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The done-when check of the foundation issue.
"$bin" params models/zoo/marin-535b-a23b.json --json >"$tmp/p.json"
check "params --json exits 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp/p.json" <<'PY' || fail=1
import json, sys
j = json.load(open(sys.argv[1]))
p, f = j["params"], j["flops_per_token"]["marin"]
assert abs(p["total"] - 535.48e9) <= 0.01e9, p["total"]
assert abs(p["active_marin"] - 22.762e9) <= 0.001e9, p["active_marin"]
assert abs(f["forward"] - 49.91e9) <= 0.01e9, f["forward"]
assert j["recipe"]["steps"] == 390251, j["recipe"]["steps"]
PY
check "params table names the total" "\"$bin\" params models/zoo/marin-535b-a23b.json | grep -q 'TOTAL'"

# Every zoo file validates.
check "validate-config accepts the zoo" "\"$bin\" validate-config models/zoo/*.json topologies/zoo/*.json >/dev/null"

# Bad input: one line on stderr, exit 2.
echo '{"name": "x", "vocab": 10, "d_model": 8, "layers": 2, "attention": {"heads": 2}, "moe": {"experts": 4, "top_k": 5, "expert_width": 8}, "recipe": {"batch_seqs": 1, "steps": 1}}' >"$tmp/bad.json"
"$bin" params "$tmp/bad.json" >/dev/null 2>"$tmp/err"
rc=$?
check "bad model exits 2 (got $rc)" "[ $rc -eq 2 ]"
check "bad model error is one line" "[ \$(wc -l <\"$tmp/err\") -eq 1 ]"
check "bad model error names path and values" "grep -q '/moe/top_k: expected at most experts (4), found 5' \"$tmp/err\""
"$bin" params "$tmp/missing.json" >/dev/null 2>"$tmp/err"
check "missing file exits 2" "[ $? -eq 2 ]"
check "missing file is named" "grep -q 'missing.json: expected a readable JSON file, found no such file' \"$tmp/err\""
"$bin" validate-config "$tmp/bad.json" >/dev/null 2>&1
check "validate-config rejects a bad model" "[ $? -eq 2 ]"
echo '{"name": "r", "gpu": {"name": "g", "peak_flops_per_s": {"bf16": 1e15}}}' >"$tmp/sys.json"
"$bin" topology "$tmp/sys.json" >/dev/null 2>"$tmp/err"
check "unsourced hardware number exits 2" "[ $? -eq 2 ]"
check "unsourced number error" "grep -q 'peak_flops_per_s/bf16: expected {\"value\": number, \"source\": string}, found 1e+15' \"$tmp/err\""
"$bin" params >/dev/null 2>&1
check "missing argument exits 2" "[ $? -eq 2 ]"
"$bin" --help | grep -q params
check "--help lists params" "[ $? -eq 0 ]"
exit $fail
