#!/usr/bin/env bash
# `rackstep drops`: output formats, sweeps, histograms, and bad input (one line, exit 2).
#   bash tests/cli/drops.sh path/to/rackstep     (from the repository root)
set -u
RS=${1:?usage: drops.sh path/to/rackstep}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# Expects exit status 2 and exactly one line on stderr mentioning $2.
expect_user_error() {
  local what=$1 needle=$2
  shift 2
  "$RS" drops "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq 2 ] || fail "$what: exit $rc, expected 2"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$what: expected one line on stderr, got: $(cat "$TMP/err")"
  grep -qi -- "$needle" "$TMP/err" || fail "$what: stderr lacks '$needle': $(cat "$TMP/err")"
}

FAST="--samples 2"

# Plain run: a table with every kind and a total.
"$RS" drops $FAST >"$TMP/out" 2>"$TMP/err" || fail "default run exited $?: $(cat "$TMP/err")"
for kind in sender receiver padding total; do
  grep -q "^$kind " "$TMP/out" || fail "default run: no '$kind' row"
done

# JSON: parses, total = sender + receiver + padding, a CI is reported.
"$RS" drops $FAST --json >"$TMP/j" || fail "--json exited $?"
python3 - "$TMP/j" <<'EOF' || fail "--json content"
import json, sys
j = json.load(open(sys.argv[1]))
p = j["points"][0]
assert j["scenario"]["transport"] == "pooled", j["scenario"]
assert 0 < p["total"] < 0.2, p
assert abs(p["total"] - (p["sender"] + p["receiver"] + p["padding"])) < 1e-12, p
assert p["total_ci95"] >= 0, p
EOF

# A context sweep as CSV: one row per value, drops grow with context.
"$RS" drops $FAST --sweep context=4096,16384,65536 --csv >"$TMP/c" || fail "--sweep --csv exited $?"
python3 - "$TMP/c" <<'EOF' || fail "context sweep CSV"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["context"] for r in rows] == ["4096", "16384", "65536"], rows
t = [float(r["total"]) for r in rows]
assert t[0] < t[1] < t[2], t
EOF

# A capacity-factor sweep: drops fall as cf rises; ragged never exceeds pooled.
"$RS" drops --method analytic --sweep cf=1.0,1.1,1.3 --json >"$TMP/cf" || fail "cf sweep exited $?"
"$RS" drops $FAST --sweep transport=pooled,ragged --json >"$TMP/tr" || fail "transport sweep exited $?"
python3 - "$TMP/cf" "$TMP/tr" <<'EOF' || fail "cf / transport sweeps"
import json, sys
t = [p["total"] for p in json.load(open(sys.argv[1]))["points"]]
assert t[0] > t[1] > t[2], t
pooled, ragged = [p["total"] for p in json.load(open(sys.argv[2]))["points"]]
assert ragged <= pooled, (ragged, pooled)
EOF

# A measured histogram replaces the synthetic model.
python3 - "$TMP/hist.json" <<'EOF'
import json, random, sys
random.seed(1)
entries = []
for _ in range(50):
    tokens = random.randint(20, 400)
    counts = [0] * 16
    for _ in range(tokens):
        for e in random.sample(range(16), 2):
            counts[e] += 1
    entries.append({"tokens": tokens, "counts": counts})
json.dump({"format": "rackstep.routing_histogram/1", "source": "test", "n_experts": 16, "top_k": 2,
           "unit": "document", "entries": entries}, open(sys.argv[1], "w"))
EOF
"$RS" drops $FAST --experts 16 --top-k 2 --ep 4 --tokens-per-gpu 2048 --context 512 --histogram "$TMP/hist.json" \
  >"$TMP/out" 2>"$TMP/err" || fail "--histogram run exited $?: $(cat "$TMP/err")"
grep -q "routing: histogram" "$TMP/out" || fail "--histogram: routing line missing"

# Calibration round trip: fit, write, read back.
"$RS" drops --method analytic --target-drop 0.02 --write-calibration "$TMP/cal.json" --json >"$TMP/fit" ||
  fail "--target-drop --write-calibration exited $?"
"$RS" drops --method analytic --calibration "$TMP/cal.json" --json >"$TMP/refit" || fail "--calibration exited $?"
python3 - "$TMP/refit" "$TMP/cal.json" <<'EOF' || fail "calibration round trip"
import json, sys
p = json.load(open(sys.argv[1]))["points"][0]
assert abs(p["total"] - 0.02) < 3e-4, p
cal = json.load(open(sys.argv[2]))
assert cal["source"] and cal["fit"]["target_drop"] == 0.02, cal
EOF

# --model and --layout fill experts, k, context, EP size, GPUs, transport, capacity
# factors and tokens per dispatch (micro-batch x seq / cp); explicit flags win.
MODEL=models/zoo/marin-535b-a23b.json
LAYOUT=sim/layouts/hero-pooled.json
if [ -f "$MODEL" ] && [ -f "$LAYOUT" ]; then
  "$RS" drops --model "$MODEL" --layout "$LAYOUT" --method analytic --json >"$TMP/ml" 2>"$TMP/err" ||
    fail "--model --layout exited $?: $(cat "$TMP/err")"
  "$RS" drops --model "$MODEL" --layout "$LAYOUT" --transport ragged --ep 32 --method analytic --json >"$TMP/ml2" ||
    fail "--model --layout with overrides exited $?"
  python3 - "$TMP/ml" "$TMP/ml2" <<'EOF' || fail "--model/--layout scenario"
import json, sys
s = json.load(open(sys.argv[1]))["scenario"]
want = {"experts": 384, "top_k": 8, "ep": 64, "gpus": 704, "tokens_per_gpu": 65536, "context": 4096,
        "transport": "pooled", "sender_cf": 1.1, "receiver_cf": 1.15, "waves": 3}
assert all(s[k] == v for k, v in want.items()), s
o = json.load(open(sys.argv[2]))["scenario"]
assert o["transport"] == "ragged" and o["ep"] == 32 and o["experts"] == 384, o
EOF
else
  echo "SKIP: $MODEL or $LAYOUT missing; --model/--layout not exercised"
fi

# A folded layout (sim/layout.h: EP 32 x ETP 1 over TP 2 x data 16): the EP ranks are the
# stage's 32 GPUs, each dispatching its sequence-parallel half of a 4096-token micro-batch.
cat >"$TMP/folded.json" <<'JSON'
{"data": 16, "tp": 2, "pp": 8, "ep": 32, "etp": 1, "micro_batch_seqs": 1}
JSON
"$RS" drops --model models/zoo/marin-535b-a23b.json --layout "$TMP/folded.json" --method analytic --json >"$TMP/fold" ||
  fail "folded --layout exited $?"
python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))['scenario']
assert s['ep'] == 32 and s['gpus'] == 32 and s['tokens_per_gpu'] == 2048, s
" "$TMP/fold" || fail "folded layout scenario"

# Bad input: one clear line, exit 2.
expect_user_error "receiver cf 0" "capacity factor" --receiver-cf 0
expect_user_error "sender cf < 0" "capacity factor" --sender-cf -1
expect_user_error "k > experts" "top-k" --experts 8 --top-k 9 --ep 8
expect_user_error "EP does not divide experts" "EP size" --ep 5
expect_user_error "bad transport" "transport" --transport carrier-pigeon
expect_user_error "bad sweep" "sweep" --sweep colour=red
expect_user_error "unreachable target" "target drop" --method analytic --target-drop 0.95
echo '{"format": "rackstep.routing_histogram/1", "n_experts": 16, "top_k": 2, "entries": [{"tokens": 3, "counts": [1]}]}' >"$TMP/bad.json"
expect_user_error "malformed histogram" "counts" --experts 16 --top-k 2 --ep 4 --histogram "$TMP/bad.json"
echo '{"format": "rackstep.routing_histogram/1", "n_experts": 16, ' >"$TMP/trunc.json"
expect_user_error "truncated histogram" "trunc.json" --experts 16 --top-k 2 --ep 4 --histogram "$TMP/trunc.json"
expect_user_error "missing histogram" "nope.json" --histogram "$TMP/nope.json"
expect_user_error "missing model" "nomodel.json" --model "$TMP/nomodel.json"
expect_user_error "both formats" "at most one" --json --csv

# Sizes that would allocate or loop without end are refused before any work.
expect_user_error "huge waves" "at most 64" --waves 1000000000
expect_user_error "huge samples" "at most" --samples 1000000000
expect_user_error "huge GPU count" "at most" --gpus 1000000000
expect_user_error "huge tokens per GPU" "at most" --tokens-per-gpu 1000000000000
expect_user_error "context 1" "at most 4096 sequences" --context 1
expect_user_error "NaN concentration" "finite" --concentration nan
expect_user_error "infinite cf" "finite" --receiver-cf inf
if [ -f "$LAYOUT" ]; then
  python3 - "$LAYOUT" "$TMP/huge-layout.json" <<'EOF'
import json, sys
l = json.load(open(sys.argv[1]))
l["data"] = 1000000000
json.dump(l, open(sys.argv[2], "w"))
EOF
  expect_user_error "layout with a huge data axis" "huge-layout.json: /data" --layout "$TMP/huge-layout.json"
fi

# --write-calibration names what it was fitted to: the target's source, never a
# hard-coded claim about the hero.
"$RS" drops --method analytic --target-drop 0.02 --write-calibration "$TMP/cal2.json" >/dev/null || fail "fit without source"
"$RS" drops --method analytic --target-drop 0.02 --target-source "a test target" --write-calibration "$TMP/cal3.json" \
  >/dev/null || fail "fit with --target-source"
python3 - "$TMP/cal2.json" "$TMP/cal3.json" <<'EOF' || fail "calibration provenance"
import json, sys
a, b = (json.load(open(f))["source"] for f in sys.argv[1:])
assert "2.67" not in a and "Marin" not in a and "0.02" in a and "command line" in a, a
assert "a test target" in b, b
EOF

# Routing traces: replay is exact and fit writes per-layer models with their provenance.
python3 - "$TMP/t.rsrt" <<'EOF'
import random, struct, sys
random.seed(2)
E, k, seq, n = 8, 2, 128, 32768
toks, ex, sc = [], [], []
for i in range(n):
    doc = i // 1000
    toks.append(struct.pack("<4I", 0, i // seq, i % seq, doc))
    pref = doc % E
    first = pref if random.random() < 0.4 else random.randrange(E)
    second = (first + 1 + random.randrange(E - 1)) % E
    ex += [first, second]
    sc += [0.6, 0.4]
src = b"cli test"
payload = src + struct.pack("<I", 1) + b"".join(toks) + struct.pack(f"<{len(ex)}H", *ex) + struct.pack(f"<{len(sc)}f", *sc)
h = 1469598103934665603
for byte in payload:
    h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
header = b"RSROUTE\0" + struct.pack("<6IQQI", 1, E, k, 1, seq, 1, n, h, len(src)) + bytes(12)
open(sys.argv[1], "wb").write(header + payload)
EOF
R="--ep 4 --tokens-per-gpu 1024 --context 512 --transport ragged --receiver-cf 1.05"
"$RS" drops --replay "$TMP/t.rsrt" $R --json >"$TMP/rep" 2>"$TMP/err" || fail "--replay exited $?: $(cat "$TMP/err")"
"$RS" drops --fit "$TMP/t.rsrt" --write-calibration "$TMP/tfit.json" $R --samples 4 --json >"$TMP/fitj" 2>"$TMP/err" ||
  fail "--fit exited $?: $(cat "$TMP/err")"
"$RS" drops --calibration "$TMP/tfit.json" $R --samples 8 --json >"$TMP/pred" 2>"$TMP/err" ||
  fail "--calibration (fitted) exited $?: $(cat "$TMP/err")"
python3 - "$TMP/rep" "$TMP/tfit.json" "$TMP/pred" <<'EOF' || fail "replay / fit content"
import json, sys
rep = json.load(open(sys.argv[1]))
assert rep["method"] == "replay" and rep["scenario"]["experts"] == 8, rep
r = rep["points"][0]
assert r["receiver"] > 0 and r["sender"] == 0, r
cal = json.load(open(sys.argv[2]))
assert cal["fit"]["method"] == "trace_statistics" and cal["fit"]["traces"], cal["fit"]
assert "t.rsrt" in cal["source"] and "No drop rate was fitted" in cal["source"], cal["source"]
assert len(cal["layer_models"]) == 1 and len(cal["layer_models"][0]["popularity"]) == 8, cal
assert cal["statistics"]["documents"] >= 20, cal["statistics"]
p = json.load(open(sys.argv[3]))["points"][0]
assert p["receiver"] > 0, p
EOF
printf 'RSROUTE\0garbage' >"$TMP/bad.rsrt"
expect_user_error "damaged trace" "bad.rsrt" --replay "$TMP/bad.rsrt"

# The trainer writes a trace a replay reads: one short step, then the evaluation.
if "$RS" data build --from README.md sim/drops.h sim/routing.h --split blank-lines --eval-fraction 0.5 \
    --out "$TMP/data" >/dev/null 2>"$TMP/err"; then
  "$RS" train --model models/zoo/tiny-moe.json --data "$TMP/data" --steps 1 --batch 2 --seq 64 --eval-batches 4 \
    --routing-trace-eval "$TMP/eval.rsrt" --routing-trace "$TMP/train.rsrt" --threads 1 >/dev/null 2>"$TMP/err" ||
    fail "train --routing-trace exited $?: $(cat "$TMP/err")"
  "$RS" drops --replay "$TMP/eval.rsrt" --ep 2 --tokens-per-gpu 128 --context 64 --transport ragged --json \
    >"$TMP/r2" 2>"$TMP/err" || fail "--replay of a trained trace exited $?: $(cat "$TMP/err")"
  "$RS" drops --replay "$TMP/train.rsrt" --ep 2 --tokens-per-gpu 64 --context 64 --json >/dev/null 2>"$TMP/err" ||
    fail "--replay of a training-step trace exited $?: $(cat "$TMP/err")"
  python3 - "$TMP/eval.rsrt" "$TMP/r2" <<'EOF' || fail "trained trace content"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"RSROUTE\0", b[:8]
version, E, k, layers, seq, split, tokens = struct.unpack("<6IQ", b[8:40])
assert (version, E, k, seq, split) == (1, 8, 2, 64, 1), (version, E, k, seq, split)
assert layers >= 1 and tokens == 4 * 2 * 64, (layers, tokens)
assert json.load(open(sys.argv[2]))["points"][0]["total"] >= 0
EOF
else
  fail "data build for the trace test exited: $(cat "$TMP/err")"
fi

if [ "$fails" -ne 0 ]; then
  echo "drops.sh: $fails failure(s)"
  exit 1
fi
echo "drops.sh: all passed"
