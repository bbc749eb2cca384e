#!/usr/bin/env bash
# rackstep-gui on the command line: --screenshot renders each kind of file to a
# PNG without a display; bad files and flags give one line and exit 2.
#   bash tests/gui/gui_cli.sh path/to/rackstep-gui path/to/png_stats   (from the repository root)
set -u
GUI=${1:?usage: gui_cli.sh path/to/rackstep-gui path/to/png_stats}
STATS=${2:?usage: gui_cli.sh path/to/rackstep-gui path/to/png_stats}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# A small hand-written trace: two GPUs, compute and comm streams, one exposed
# reduce-scatter on the critical path.
cat >"$TMP/trace.json" <<'EOF'
{"traceEvents":[
{"ph":"M","name":"process_name","pid":0,"args":{"name":"gpu0"}},
{"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"compute"}},
{"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"comm"}},
{"ph":"M","name":"process_name","pid":1,"args":{"name":"gpu1"}},
{"ph":"M","name":"thread_name","pid":1,"tid":0,"args":{"name":"compute"}},
{"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"comm"}},
{"ph":"X","pid":0,"tid":0,"ts":0,"dur":100,"name":"L0.fwd","cat":"forward"},
{"ph":"X","pid":0,"tid":0,"ts":100,"dur":100,"name":"L1.fwd","cat":"forward","args":{"critical":true}},
{"ph":"X","pid":0,"tid":1,"ts":200,"dur":100,"name":"reduce_scatter","cat":"fsdp","args":{"critical":true,"bytes":1e9}},
{"ph":"X","pid":0,"tid":0,"ts":300,"dur":200,"name":"L1.bwd","cat":"backward","args":{"critical":true}},
{"ph":"X","pid":1,"tid":0,"ts":10,"dur":190,"name":"fwd","cat":"forward"},
{"ph":"X","pid":1,"tid":1,"ts":50,"dur":100,"name":"allgather","cat":"fsdp"},
{"ph":"X","pid":1,"tid":0,"ts":310,"dur":200,"name":"bwd","cat":"backward"}
]}
EOF

# Expects exit 0, a PNG of the given size that is not blank.
expect_png() {
  local what=$1 png=$2 w=$3 h=$4
  shift 4
  "$GUI" --screenshot "$png" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq 0 ] || { fail "$what: exit $rc: $(cat "$TMP/err")"; return; }
  [ -s "$TMP/err" ] && fail "$what: unexpected stderr: $(cat "$TMP/err")"
  read -r pw ph sd colors rest < <("$STATS" "$png" b00020 d62728) || { fail "$what: no PNG at $png"; return; }
  [ "$pw" -eq "$w" ] && [ "$ph" -eq "$h" ] || fail "$what: size ${pw}x${ph}, expected ${w}x${h}"
  awk -v s="$sd" 'BEGIN { exit !(s > 8) }' || fail "$what: blank-looking image (gray stddev $sd)"
  [ "$colors" -gt 20 ] || fail "$what: only $colors colours"
  echo "$rest" >"$TMP/probes"
}

expect_png "trace" "$TMP/trace.png" 1400 900 "$TMP/trace.json"
read -r critical exposed <"$TMP/probes"
[ "${critical:-0}" -gt 100 ] || fail "trace: critical-path outlines missing ($critical pixels)"
[ "${exposed:-0}" -gt 100 ] || fail "trace: exposed communication missing ($exposed pixels)"
expect_png "trace --size" "$TMP/small.png" 800 500 --size 800x500 "$TMP/trace.json"
# The same trace gzipped, and as a compare against itself (predicted vs measured tab).
gzip -c "$TMP/trace.json" >"$TMP/trace.json.gz"
expect_png "trace --rows" "$TMP/rows.png" 1400 900 --rows compute "$TMP/trace.json"
expect_png "trace .json.gz" "$TMP/gz.png" 1400 900 "$TMP/trace.json.gz"
expect_png "compare" "$TMP/compare.png" 1400 900 --compare "$TMP/trace.json" "$TMP/trace.json.gz"
# A PyTorch-profiler-like trace: string pids/tids, nested slices, an instant, a counter.
cat >"$TMP/torch.json" <<'EOF2'
{"traceEvents":[
{"ph":"X","pid":"host","tid":"python 1","ts":100,"dur":1000,"name":"ProfilerStep#1","cat":"user_annotation"},
{"ph":"X","pid":"host","tid":"python 1","ts":150,"dur":600,"name":"aten::linear","cat":"cpu_op"},
{"ph":"X","pid":"host","tid":"python 1","ts":200,"dur":100,"name":"aten::mm","cat":"cpu_op"},
{"ph":"i","pid":"host","tid":"python 1","ts":900,"name":"mark","s":"t"},
{"ph":"C","pid":"host","ts":100,"name":"memory","args":{"allocated":10}},
{"ph":"C","pid":"host","ts":600,"name":"memory","args":{"allocated":30}}]}
EOF2
expect_png "torch trace" "$TMP/torch.png" 1400 900 "$TMP/torch.json"
"$GUI" --json "$TMP/torch.json" >"$TMP/torch_fig.json" 2>"$TMP/err" || fail "--json torch: $(cat "$TMP/err")"
grep -q '"counters": 1' "$TMP/torch_fig.json" || fail "torch trace: counter track missing: $(cat "$TMP/torch_fig.json")"
grep -q '"instants": 1' "$TMP/torch_fig.json" || fail "torch trace: instant missing"

# A sizing result (fields rackstep size may write; unknown ones ignored) and a drops sweep.
cat >"$TMP/sizing.json" <<'EOF'
{"scenario": {"deadline_days": 80}, "winner": "535B-A23B", "future_field": {"x": 1},
 "candidates": [
  {"name": "535B-A23B", "mfu": 0.42, "step_time_s": 7.1, "days": 71.5, "p_finish": 0.93, "forecast_loss": 1.912,
   "memory": {"weights_bytes": 3.2e10, "optimizer_bytes": 6.4e10, "activations_bytes": 5.3e10, "capacity_bytes": 2.0e11}},
  {"name": "360B FSDP", "mfu": 0.47, "step_time_s": 9.8, "days": 92, "p_finish": 0.2, "forecast_loss": 1.951,
   "memory": {"weights_bytes": 4.5e10, "optimizer_bytes": 9e10, "activations_bytes": 4e10}}]}
EOF
expect_png "sizing" "$TMP/sizing.png" 1400 900 "$TMP/sizing.json"
cat >"$TMP/drops.json" <<'EOF'
{"scenario": {"ep": 64, "transport": "pooled"}, "sweep": "context",
 "points": [{"context": "4096", "total": 0.0267, "sender": 0.01, "receiver": 0.0167, "padding": 0},
            {"context": "16384", "total": 0.041, "sender": 0.02, "receiver": 0.021, "padding": 0},
            {"context": "65536", "total": 0.079, "sender": 0.04, "receiver": 0.039, "padding": 0}]}
EOF
expect_png "drops" "$TMP/drops.png" 1400 900 "$TMP/drops.json"

# Bad input: one clear line on stderr, exit 2, no PNG left behind.
expect_user_error() {
  local what=$1 needle=$2
  shift 2
  "$GUI" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq 2 ] || fail "$what: exit $rc, expected 2"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$what: expected one line on stderr, got: $(cat "$TMP/err")"
  grep -q -- "$needle" "$TMP/err" || fail "$what: stderr lacks '$needle': $(cat "$TMP/err")"
}
echo '{"traceEvents":[{"ph":"X","pid":0,"tid":0,"ts":"soon","dur":5}]}' >"$TMP/bad.json"
expect_user_error "malformed trace" "bad.json: /traceEvents/0/ts: expected a number" --screenshot "$TMP/bad.png" "$TMP/bad.json"
[ -e "$TMP/bad.png" ] && fail "malformed trace: a PNG was written"
printf '{"traceEvents":[{"ph":"X",' >"$TMP/trunc.json"
expect_user_error "truncated JSON" "trunc.json: expected valid JSON" --screenshot "$TMP/t.png" "$TMP/trunc.json"
echo '{"hello": 1}' >"$TMP/other.json"
expect_user_error "unknown kind" "expected a Chrome trace" --screenshot "$TMP/o.png" "$TMP/other.json"
expect_user_error "missing file" "nope.json" --screenshot "$TMP/n.png" "$TMP/nope.json"
expect_user_error "no file" "expected a FILE" --screenshot "$TMP/n.png"
expect_user_error "bad size" "--size" --screenshot "$TMP/n.png" --size big "$TMP/trace.json"
expect_user_error "unknown flag" "--frobnicate" --frobnicate
expect_user_error "unwritable PNG" "/nonexistent-dir/x.png" --screenshot /nonexistent-dir/x.png "$TMP/trace.json"

if [ "$fails" -ne 0 ]; then
  echo "gui_cli.sh: $fails failure(s)"
  exit 1
fi
echo "gui_cli.sh: all passed"
