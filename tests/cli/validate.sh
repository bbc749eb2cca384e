#!/usr/bin/env bash
# rackstep validate: the public validation set (tests/validation/*.json).
# Checks that the goal line's figures are computed from the rows (not that the
# goal is met): the JSON goal equals the median / max / verdict count recomputed
# here from the verified validation rows, the text prints the same figures, and
# changing one measurement changes them. Also: every row says whether its source
# was checked, a run that did not fit is in the set, a GPU without GEMM
# calibration is a warning on the rows, each row carries its whole prediction (breakdown),
# and a bad row is a one-line error, exit 2.
#   bash tests/cli/validate.sh path/to/rackstep     (from the repository root)
set -u
bin=${1:?usage: validate.sh path/to/rackstep}
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Recomputes the goal from the rows of a `validate --json` document and compares.
cat >"$tmp/goal.py" <<'EOF'
import json, statistics, sys
d = json.load(open(sys.argv[1]))
rows = [r for r in d["runs"] if r["role"] == "validation" and r["verified"]]
errs = sorted(abs(r["step_error"]) for r in rows if r["predicted"] and "step_error" in r)
right = sum(1 for r in rows if r["predicted"] and r["verdict_right"])
g = d["goal"]
assert g["runs"] == len(rows), (g["runs"], len(rows))
assert g["with_step_time"] == len(errs), (g["with_step_time"], len(errs))
assert abs(g["median_abs_step_error"] - statistics.median(errs)) < 1e-12, g
assert abs(g["max_abs_step_error"] - max(errs)) < 1e-12, g
assert g["verdicts_right"] == right, (g["verdicts_right"], right)
met = statistics.median(errs) <= 0.08 and max(errs) <= 0.20 and right == len(rows)
assert g["met"] == met and d["goal_met"] == met, g
for role in ("fitted", "validation"):
    s = d["summary"][role]
    assert s["runs"] == s["verified"]["runs"] + s["unverified"]["runs"], s
print(f'{100 * g["median_abs_step_error"]:.1f} {100 * g["max_abs_step_error"]:.1f} {g["verdicts_right"]}/{g["runs"]}')
EOF

"$bin" validate --json >"$tmp/v.json"; rc=$?
check "validate --json exits 0" "[ $rc -eq 0 ]"
check "every row is predicted and says whether its source was checked" "python3 -c 'import json; d=json.load(open(\"$tmp/v.json\")); assert all(r[\"predicted\"] and isinstance(r[\"verified\"], bool) and len(r[\"verification\"]) > 20 for r in d[\"runs\"])'"
check "verified and unverified validation rows are both reported" "python3 -c 'import json; s=json.load(open(\"$tmp/v.json\"))[\"summary\"][\"validation\"]; assert s[\"verified\"][\"runs\"] > 0 and s[\"runs\"] >= s[\"verified\"][\"runs\"]'"
check "a published run that did not fit is a validation row with a right verdict" "python3 -c 'import json; d=json.load(open(\"$tmp/v.json\")); r=[r for r in d[\"runs\"] if not r[\"measured_ran\"]]; assert r and all(x[\"role\"] == \"validation\" and not x[\"fits\"] and x[\"verdict_right\"] for x in r)'"
check "each predicted row carries its prediction, whose step time and breakdown add up" "python3 -c 'import json; d=json.load(open(\"$tmp/v.json\")); rs=[r for r in d[\"runs\"] if r[\"predicted\"]]; assert rs and all(abs(r[\"prediction\"][\"step_time_s\"] - r[\"step_time_s\"]) < 1e-9 * r[\"step_time_s\"] and sum(r[\"prediction\"][\"breakdown_s\"].values()) > 0 for r in rs)'"
figs=$(python3 "$tmp/goal.py" "$tmp/v.json"); rc=$?
check "the JSON goal is the median / max / verdicts of the verified validation rows" "[ $rc -eq 0 ]"

out=$("$bin" validate); rc=$?
check "validate exits 0" "[ $rc -eq 0 ]"
check "the table names both groups" "grep -q '^fitted rows' <<<\"\$out\" && grep -q '^validation rows' <<<\"\$out\""
read -r med max verdicts <<<"$figs"
check "the text goal line prints the computed figures ($med% / $max% / $verdicts)" "grep -q \"^goal on the verified validation rows.*median |step error| $med%, max $max%, verdicts right $verdicts\" <<<\"\$out\""

# Every verified validation measurement doubled: the goal figures follow the data.
python3 - "$tmp" <<'EOF'
import json, glob, os, shutil, sys
tmp = sys.argv[1]
os.makedirs(f"{tmp}/set")
done = False
for f in sorted(glob.glob("tests/validation/*.json")):
    d = json.load(open(f))
    for r in d["runs"]:
        if r["role"] == "validation" and r["verified"]["status"] == "verified" and r["measured"].get("step_time_s"):
            r["measured"]["step_time_s"] *= 2.0
            done = True
    json.dump(d, open(f"{tmp}/set/" + os.path.basename(f), "w"))
assert done
EOF
"$bin" validate --json --dir "$tmp/set" >"$tmp/v2.json"; rc=$?
check "validate --dir on an edited set exits 0" "[ $rc -eq 0 ]"
figs2=$(python3 "$tmp/goal.py" "$tmp/v2.json"); rc=$?
check "the edited set's goal is recomputed from its rows" "[ $rc -eq 0 ]"
check "doubled measurements move the goal's median error to about 50% and the goal is not met" "python3 -c 'import json; g=json.load(open(\"$tmp/v2.json\"))[\"goal\"]; g0=json.load(open(\"$tmp/v.json\"))[\"goal\"]; assert g[\"median_abs_step_error\"] > 0.3 and g[\"median_abs_step_error\"] != g0[\"median_abs_step_error\"] and not g[\"met\"]'"

# A GPU without GEMM calibration: a warning on its rows, never a silent default.
python3 -c "
import json; d = json.load(open('sim/calibration.json'))
del d['gemm']['peak_efficiency']['A100-SXM4-80GB']
json.dump(d, open('$tmp/cal.json', 'w'))"
"$bin" validate --json --calibration "$tmp/cal.json" >"$tmp/v3.json"; rc=$?
check "validate with an A100-less calibration exits 0" "[ $rc -eq 0 ]"
check "every A100 row without a stack GEMM entry carries the no-calibration warning" "python3 -c '
import json; d=json.load(open(\"$tmp/v3.json\"))
rows=[r for r in d[\"runs\"] if r[\"stack\"] == \"megatron-lm-2022\"]
assert rows and all(any(\"no GEMM calibration for GPU\" in n and \"A100\" in n for n in r[\"notes\"]) for r in rows)'"

# A GPU without a sustained-load share (H200: none measured) says its GEMMs run at the burst
# rate; a GPU with one (H100) does not.
check "H200 rows carry the burst-rate warning, H100 rows do not" "python3 -c '
import json; d=json.load(open(\"$tmp/v.json\"))
h200=[r for r in d[\"runs\"] if \"h200\" in r[\"id\"]]
h100=[r for r in d[\"runs\"] if \"h100\" in r[\"id\"]]
has=lambda r: any(\"no sustained-load share for GPU\" in n and \"H200\" in n for n in r[\"notes\"])
assert h200 and h100 and all(has(r) for r in h200) and not any(any(\"no sustained-load share\" in n for n in r[\"notes\"]) for r in h100)'"

# A row with a bad verification status is a one-line error naming file and path.
python3 - "$tmp" <<'EOF'
import json, os, sys
tmp = sys.argv[1]
os.makedirs(f"{tmp}/bad")
d = json.load(open("tests/validation/alpaca-2023.json"))
d["runs"][0]["verified"]["status"] = "probably"
json.dump(d, open(f"{tmp}/bad/alpaca-2023.json", "w"))
EOF
"$bin" validate --dir "$tmp/bad" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "a bad verification status exits 2" "[ $rc -eq 2 ]"
check "the error is one line naming the file and the status" "[ \$(wc -l <\"$tmp/err\") -eq 1 ] && grep -q 'alpaca-2023.json' \"$tmp/err\" && grep -q 'status' \"$tmp/err\""

exit $fail
