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

# Links: without contention the step is no slower; a checkpoint step saves.
python3 - "$bin" <<'PY' || fail "contention / checkpoint"
import json, subprocess, sys
hero = ["--model", "models/zoo/marin-535b-a23b.json", "--cluster", "topologies/zoo/gb200-11-racks.json",
        "--layout", "sim/layouts/hero-ragged.json", "--no-gc", "--json"]
run = lambda *extra: json.loads(subprocess.run([sys.argv[1], "timeline", *hero, *extra], check=True,
                                               capture_output=True, text=True).stdout)
shared, own = run(), run("--no-contention")
assert shared["makespan_s"] >= own["makespan_s"] * (1 - 1e-9), (shared["makespan_s"], own["makespan_s"])
thin = run("--fabric-oversubscription", "32")
assert thin["makespan_s"] > shared["makespan_s"] * 1.05, (thin["makespan_s"], shared["makespan_s"])
saved = run("--steps", "2", "--checkpoint-every", "2")
two = run("--steps", "2")
assert saved["makespan_s"] > two["makespan_s"] + 1.0, (saved["makespan_s"], two["makespan_s"])
PY

# Every pipeline schedule runs on the PP example.
for s in 1f1b zero_bubble dualpipev; do
  sed "s/\"1f1b\"/\"$s\"/" sim/layouts/gb200-pp6.json >"$tmp/pp.json"
  "$bin" timeline --model models/zoo/marin-535b-a23b.json --cluster topologies/zoo/gb200-12-racks.json \
      --layout "$tmp/pp.json" >"$tmp/pp.txt" || fail "schedule $s exited $?"
  grep -qF "6 stages" "$tmp/pp.txt" || fail "schedule $s: no 6-stage run"
done

# A schedule that cannot run with these micro-batches: one line, exit 2.
sed -e 's/"1f1b"/"dualpipev"/' -e 's/"tokens_per_step": 50331648/"tokens_per_step": 16777216/' \
    sim/layouts/gb200-pp6.json >"$tmp/dpv.json"
err=$("$bin" timeline --model models/zoo/marin-535b-a23b.json --cluster topologies/zoo/gb200-12-racks.json \
      --layout "$tmp/dpv.json" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] || fail "expected exit 2 for dualpipev with 8 micro-batches, got $rc"
[ "$(wc -l <<<"$err")" -eq 1 ] || fail "expected one error line: $err"
grep -qF "micro-batches" <<<"$err" || fail "error lacks the reason: $err"
# Bad numbers: one line, exit 2, naming the flag (NaN and inf refused, limits stated).
for bad in "--jitter nan" "--jitter inf" "--straggler-prob nan" "--straggler-prob 2" "--steps 100000" \
           "--steps -3" "--ranks-per-stage -1" "--domains -2" "--straggler-slowdown inf"; do
  err=$("$bin" timeline "${hero[@]}" $bad 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] || fail "expected exit 2 for '$bad', got $rc"
  [ "$(wc -l <<<"$err")" -eq 1 ] || fail "expected one error line for '$bad': $err"
  grep -qF -- "${bad%% *}" <<<"$err" || fail "error for '$bad' does not name the flag: $err"
done
# A graph that would not fit is refused before it is built, with the figure.
err=$("$bin" timeline "${hero[@]}" --ranks-per-stage 704 --max-memory-gb 0.05 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] || fail "expected exit 2 for a graph over the memory limit, got $rc"
grep -qE "estimated [0-9.]+ GB" <<<"$err" || fail "memory refusal lacks the estimate: $err"

# What-if: a slow GPU among 4 explicit ranks, what changed, and a sweep against the factor.
"$bin" timeline "${hero[@]}" --ranks-per-stage 4 --no-gc --slow-gpu 2:1.5 \
    --sweep slow-gpu-factor=1,1.5,2 --json >"$tmp/w.json" || fail "what-if run failed"
python3 - "$tmp/w.json" <<'PY' || fail "what-if summary"
import json, sys
j = json.load(open(sys.argv[1]))
w = j["what_if"]
assert w["change"] > 0.05, w["change"]
assert w["critical_ranks"][0]["name"] == "stage0.rank2", w["critical_ranks"]
assert w["waits"] and w["waits"][0]["waited_for"][0]["for"] == "stage0.rank2", w["waits"][0]
t = [r["step_time_s"] for r in j["sweep"]]
assert t[0] < t[1] < t[2], t
assert abs(t[0] - w["baseline_step_time_s"]) < 1e-9 * t[0], (t[0], w["baseline_step_time_s"])
PY
out=$("$bin" timeline "${hero[@]}" --ranks-per-stage 4 --failed-nic 1 --expert-load 1,1.3) || fail "failed-nic run"
grep -qF "what-if:" <<<"$out" || fail "what-if section missing"
# Expert load from the drop model's routing: the busiest EP rank makes the step longer than balanced.
"$bin" timeline "${hero[@]}" --expert-load routing --json >"$tmp/load.json" || fail "expert-load routing run"
python3 - "$tmp/load.json" <<'PY' || fail "expert-load routing does not slow the step"
import json, sys
w = json.load(open(sys.argv[1]))["what_if"]
assert w["change"] > 0, w
PY

# A pipeline trace: no two slices on one thread overlap (what makes Perfetto move or drop slices).
"$bin" timeline --model models/zoo/marin-535b-a23b.json --cluster topologies/zoo/gb200-12-racks.json \
    --layout sim/layouts/gb200-pp6.json --jitter 0.05 -o "$tmp/pp.json" >/dev/null || fail "pp trace"
python3 - "$tmp/pp.json" <<'PY' || fail "pp trace overlaps"
import json, sys
from collections import defaultdict
rows = defaultdict(list)
for e in json.load(open(sys.argv[1]))["traceEvents"]:
    if e["ph"] == "X":
        b = round(e["ts"] * 1000)
        rows[(e["pid"], e["tid"])].append((b, b + round(e["dur"] * 1000)))
bad = sum(1 for v in rows.values() for a, b in zip(sorted(v), sorted(v)[1:]) if b[0] < a[1])
assert bad == 0, f"{bad} overlapping slices"
PY
# --stack as predict takes it: the stack's calibration (an eager trainer's host issues each kernel:
# a host_issue stream, the device waiting on it after each MoE sync), its name and what of the
# layout it cannot run in the JSON, and a one-line error for an unknown stack.
python3 - "$tmp/q30.json" <<'PY'
import json, sys
for r in json.load(open("tests/validation/megatron-bridge-26.02.json"))["runs"]:
    if r["id"] == "mbridge2602-qwen3-30b-a3b-b200-mxfp8-gbs512-mbs1":
        json.dump(r["layout"], open(sys.argv[1], "w"))
PY
q30=(--model tests/validation/models/qwen3-30b-a3b.json --cluster topologies/zoo/dgx-b200.json --domains 1
     --layout "$tmp/q30.json")
"$bin" timeline "${q30[@]}" --stack megatron-bridge-2025 --json >"$tmp/st.json" || fail "timeline --stack exited $?"
"$bin" timeline "${q30[@]}" --json >"$tmp/nost.json" || fail "timeline without a stack exited $?"
"$bin" predict "${q30[@]}" --stack megatron-bridge-2025 --json >"$tmp/stp.json" || fail "predict --stack exited $?"
python3 - "$tmp/st.json" "$tmp/nost.json" "$tmp/stp.json" <<'PY' || fail "timeline --stack summary"
import json, sys
st, nost, p = (json.load(open(f)) for f in sys.argv[1:])
assert st["stack"] == "megatron-bridge-2025" and st["issues"] == [], st.get("issues")
assert "stack" not in nost and "issues" not in nost
# Same analytic step as predict under the stack; the host's issue shows as exposed time.
assert abs(st["predicted_step_time_s"] / p["step_time_s"] - 1) < 1e-9, (st["predicted_step_time_s"], p["step_time_s"])
assert p["breakdown_s"]["host_issue"] > 0
assert st["exposed_s_by_kind"].get("host_issue", 0) > 0, st["exposed_s_by_kind"]
assert "host_issue" not in nost["exposed_s_by_kind"]
assert abs(st["des_vs_predicted"]) < 0.10, st["des_vs_predicted"]
PY
out=$("$bin" timeline "${hero[@]}" --stack marin-july-2026 --json) || fail "timeline --stack marin-july-2026 exited $?"
python3 -c 'import json, sys; j = json.loads(sys.argv[1]); assert any(i["reason"] == "stack_support" and "ragged" in i["detail"] for i in j["issues"]), j["issues"]' "$out" \
    || fail "the July stack's issue with the ragged hero is not in the JSON"
"$bin" timeline "${hero[@]}" --stack marin-july-2026 | grep -qF "not runnable: stack_support (marin-july-2026 does not run the ragged EP transport)" \
    || fail "the stack's issue is not printed as predict prints it"
err=$("$bin" timeline "${hero[@]}" --stack nope 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] || fail "expected exit 2 for an unknown stack, got $rc"
[ "$(wc -l <<<"$err")" -eq 1 ] || fail "expected one error line for an unknown stack: $err"
perr=$("$bin" predict "${hero[@]}" --stack nope 2>&1 >/dev/null)
[ "$err" = "$perr" ] || fail "timeline and predict word an unknown stack differently: '$err' vs '$perr'"
echo "timeline.sh: ok"
