#!/usr/bin/env bash
# Library code names quantities, not flags (issue 10 item 6): a `size` user whose
# scenario makes the goodput model refuse is told about the step time, the
# token budget or the checkpoint interval, never about `rackstep goodput`'s
# --step-time-s, which they did not pass; `rackstep goodput` still names its flag.
# Likewise `rackstep train --layout` names the layout's ep, `train --ep` the flag.
set -u
bin=${1:?usage: library_errors.sh path/to/rackstep}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect NAME STATUS MUST MUST_NOT CMD...: exit STATUS, one line on stderr holding MUST and not MUST_NOT.
expect() {
  local name=$1 want=$2 must=$3 must_not=$4
  shift 4
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local err
  err=$(cat "$tmp/err")
  if [ "$rc" -ne "$want" ]; then echo "FAIL: $name: exit $rc, expected $want ($err)"; fail=1; return; fi
  local bad=0
  if [ "$(wc -l <"$tmp/err")" -ne 1 ]; then echo "FAIL: $name: expected one line on stderr, found: $err"; bad=1; fi
  if ! grep -qF -- "$must" "$tmp/err"; then echo "FAIL: $name: expected '$must' in: $err"; bad=1; fi
  if [ -n "$must_not" ] && grep -qF -- "$must_not" "$tmp/err"; then
    echo "FAIL: $name: '$must_not' is a flag this command does not have: $err"; bad=1
  fi
  if [ $bad -eq 0 ]; then echo "ok: $name: $err"; else fail=1; fi
}

# A scenario (the default one's files, run from the repository root) whose
# goodput settings the Monte Carlo cannot finish: a GPU failure every ~0.1 s.
/usr/bin/python3 - "$tmp" <<'PY' || fail=1
import json, sys
s = json.load(open("sim/scenarios/marin-july-2026.json"))
s["candidates"] = s["candidates"][:1]
s["goodput"]["gpu_failure"] = {"mtbf_gpu_days": 1e-3, "source": "test: interruptions too frequent to simulate"}
json.dump(s, open(sys.argv[1] + "/flaky.json", "w"))
# A token budget of more than 1e12 steps.
s = json.load(open("sim/scenarios/marin-july-2026.json"))
s["candidates"] = s["candidates"][:1]
s["token_budget"] = 1e22
json.dump(s, open(sys.argv[1] + "/huge.json", "w"))
PY
expect "size: interruptions too frequent" 2 "interruptions" "--" "$bin" size --scenario "$tmp/flaky.json" --quiet --runs 10
expect "size: token budget of too many steps" 2 "goodput: tokens: expected at most 1e12 steps' worth" "--" \
  "$bin" size --scenario "$tmp/huge.json" --quiet --runs 10

# The same refusal from `rackstep goodput` names the flag its user typed.
gp=(--tokens-per-step 1 --tokens 1e13 --gpus 8 --params 1e9 --runs 10)
expect "goodput: --tokens" 2 "goodput: --tokens: expected at most 1e12 steps' worth" "" "$bin" goodput --step-time-s 1 "${gp[@]}"

# `rackstep train --layout`: the EP size comes from the layout file, so a batch
# of 63 tokens (one sequence of 63) that EP 2 cannot split names ep, not the
# --ep this user did not pass. The same error from --ep names the flag.
# (Refused before any data is read.)
cat >"$tmp/odd-ep.json" <<'JSON'
{"name": "odd-tokens-ep2", "data": 2, "ep": 2, "seq_len": 63, "ep_transport": "pooled"}
JSON
train=(train --model models/zoo/tiny-moe.json --data "$tmp/no-data" --threads 1)
expect "train --layout: ep from the file" 2 "dispatch: ep: expected a divisor of the batch's 63 tokens, found 2" "--ep" \
  "$bin" "${train[@]}" --batch 1 --layout "$tmp/odd-ep.json"
expect "train --ep: the flag" 2 "dispatch: --ep: expected a divisor of the batch's 63 tokens, found 2" "" \
  "$bin" "${train[@]}" --seq 63 --batch 1 --dispatch pooled --ep 2
expect "train --steps 0: the flag" 2 "--steps" "" "$bin" "${train[@]}" --steps 0

exit $fail
