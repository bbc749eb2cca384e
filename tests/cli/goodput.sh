#!/usr/bin/env bash
# `rackstep goodput`: text and JSON output, determinism, and one-line errors with exit status 2.
# Usage: bash tests/cli/goodput.sh path/to/rackstep
set -u
bin=${1:?usage: goodput.sh path/to/rackstep}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

args=(--step-time-s 17.15 --tokens-per-step 46137344 --tokens 18e12 --gpus 704 --params 535.48e9 --runs 200)

out=$("$bin" goodput "${args[@]}" --deadline-days 95) || fail "text run exited $?"
for want in "p10 / p50 / p90" "P(finish by 95.0 days)" "goodput fraction" "Young" "wall-clock days"; do
  grep -qF -- "$want" <<<"$out" || fail "text output lacks '$want'"
done

"$bin" goodput "${args[@]}" --deadline-days 95 --json >"$tmp/a.json" || fail "json run failed"
"$bin" goodput "${args[@]}" --deadline-days 95 --json >"$tmp/b.json" || fail "json rerun failed"
cmp -s "$tmp/a.json" "$tmp/b.json" || fail "same seed, different output"
python3 - "$tmp/a.json" <<'PY' || fail "json content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["steps"] == 390140, j["steps"]
assert j["p10_days"] <= j["p50_days"] <= j["p90_days"]
assert sum(b["runs"] for b in j["histogram"]) == 200
assert 0 <= j["p_finish_by_deadline"] <= 1
assert j["config"]["gpu_failure"]["mtbf_gpu_days"] == 2770
PY

# An override file: no hangs makes the run shorter.
echo '{"hang": {"mean_steps_between": 0}}' >"$tmp/nohang.json"
"$bin" goodput "${args[@]}" --config "$tmp/nohang.json" --json >"$tmp/c.json" || fail "config run failed"
python3 - "$tmp/a.json" "$tmp/c.json" <<'PY' || fail "removing hangs did not shorten the run"
import json, sys
a, c = (json.load(open(p)) for p in sys.argv[1:])
assert c["mean_days"] < a["mean_days"] and c["interruptions_per_run"]["hang"] == 0
PY

# Errors: one line, exit status 2.
expect_error() {
  local want=$1; shift
  err=$("$bin" goodput "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] || fail "expected exit 2 for '$*', got $rc"
  [ "$(wc -l <<<"$err")" -eq 1 ] || fail "expected one error line for '$*': $err"
  grep -qF -- "$want" <<<"$err" || fail "error for '$*' lacks '$want': $err"
}
expect_error "--step-time-s" --step-time-s 0 --tokens-per-step 1 --tokens 10 --gpus 1 --params 1e9
expect_error "--gpus" --step-time-s 1 --tokens-per-step 1 --tokens 10 --gpus 0 --params 1e9
expect_error "--params" --step-time-s 1 --tokens-per-step 1 --tokens 10 --gpus 1 --params 0
echo '{"hang": {"steps": 5}}' >"$tmp/bad.json"
expect_error "bad.json" "${args[@]}" --config "$tmp/bad.json"
expect_error "missing.json" "${args[@]}" --config "$tmp/missing.json"
echo "goodput.sh: ok"
