#!/usr/bin/env bash
# `rackstep timeline`: a Chrome trace that parses, a summary beside the analytic
# step time, JSON output, and one-line errors with exit status 2.
# Usage: bash tests/cli/timeline.sh path/to/rackstep
set -u
bin=${1:?usage: timeline.sh path/to/rackstep}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
hero=(--model models/zoo/marin-535b-a23b.json --cluster topologies/zoo/gb200-11-racks.json
      --layout sim/layouts/hero-ragged.json)

out=$("$bin" timeline "${hero[@]}" --steps 2 -o "$tmp/trace.json") || fail "timeline exited $?"
for want in "step time: DES" "analytic" "exposed per GPU" "critical path" "trace written"; do
  grep -qF -- "$want" <<<"$out" || fail "output lacks '$want'"
done
python3 - "$tmp/trace.json" <<'PY' || fail "trace content"
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
names = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
assert names and "(x704)" in names[0], names
slices = [e for e in ev if e["ph"] == "X"]
assert len(slices) > 100 and all(e["dur"] >= 0 for e in slices)
assert {"forward", "backward", "ep_dispatch", "gc_stall"} <= {e["cat"] for e in slices}
PY

"$bin" timeline "${hero[@]}" --json >"$tmp/s.json" || fail "json run failed"
python3 - "$tmp/s.json" <<'PY' || fail "json summary"
import json, sys
j = json.load(open(sys.argv[1]))
assert abs(j["des_vs_predicted"]) < 0.05, j["des_vs_predicted"]
assert j["exposed_s_by_kind"]["ep_dispatch"] > 0
PY

# A schedule the DES does not build: one line, exit 2.
sed 's/"interleaved_1f1b"/"dualpipev"/' sim/layouts/h100-longctx-pp24.json >"$tmp/dpv.json"
err=$("$bin" timeline --model models/zoo/marin-535b-a23b.json --cluster topologies/zoo/hgx-h100.json \
      --domains 96 --layout "$tmp/dpv.json" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] || fail "expected exit 2 for dualpipev, got $rc"
[ "$(wc -l <<<"$err")" -eq 1 ] || fail "expected one error line: $err"
grep -qF "not simulated yet" <<<"$err" || fail "error lacks the reason: $err"
echo "timeline.sh: ok"
