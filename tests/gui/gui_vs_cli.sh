#!/usr/bin/env bash
# The viewer's figures against the command line's for the same files: what
# `rackstep-gui --json FILE` says each tab shows must equal what `rackstep
# timeline / size / drops` print.
#   bash tests/gui/gui_vs_cli.sh path/to/rackstep path/to/rackstep-gui   (from the repository root)
# Exit 77 (skipped) without python3, which reads the JSON.
set -u
RS=${1:?usage: gui_vs_cli.sh path/to/rackstep path/to/rackstep-gui}
GUI=${2:?usage: gui_vs_cli.sh path/to/rackstep path/to/rackstep-gui}
command -v python3 >/dev/null || { echo "gui_vs_cli.sh: python3 not found, skipped"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# 1. Exposed communication per GPU (a 6-stage pipeline, the hero): by kind, as `rackstep
#    timeline --json` prints it, compute / bubble per GPU, and the critical path
#    (its slices, its time by category).
check_timeline() {
  local name=$1 cluster=$2 layout=$3
  "$RS" timeline --model models/zoo/marin-535b-a23b.json --cluster "$cluster" --layout "$layout" \
    -o "$TMP/$name.json" --json >"$TMP/cli_$name.json" 2>"$TMP/err" || { fail "rackstep timeline $name: $(cat "$TMP/err")"; return; }
  "$GUI" --json "$TMP/$name.json" >"$TMP/gui_$name.json" 2>"$TMP/err" || { fail "rackstep-gui --json $name: $(cat "$TMP/err")"; return; }
  python3 - "$TMP/cli_$name.json" "$TMP/gui_$name.json" <<'EOF' || fail "$name: timeline figures differ (above)"
import json, sys
cli, gui = (json.load(open(p)) for p in sys.argv[1:3])
tol = 1e-6 * cli["makespan_s"] + 1e-9
bad = []
for key in ("compute_busy_s", "bubble_s"):
    if abs(cli[key] - gui[key]) > tol: bad.append(f"{key}: cli {cli[key]} gui {gui[key]}")
for kind, v in cli["exposed_s_by_kind"].items():
    g = gui["exposed_s_by_kind"].get(kind, 0.0)
    if abs(v - g) > tol: bad.append(f"exposed {kind}: cli {v} gui {g}")
for cat, v in cli["critical_path_s_by_category"].items():
    g = gui["critical_path_s_by_category"].get(cat, 0.0)
    if abs(v - g) > tol: bad.append(f"critical path {cat}: cli {v} gui {g}")
if gui["critical_slices"] != cli["critical_path_tasks"]:
    bad.append(f"critical slices: cli {cli['critical_path_tasks']} gui {gui['critical_slices']}")
total = sum(cli["exposed_s_by_kind"].values())
shown = gui["exposed_communication_s"] + gui["exposed_host_s"]
if abs(total - shown) > tol * 10: bad.append(f"exposed total: cli {total} gui {shown}")
for b in bad: print("  " + b)
sys.exit(1 if bad else 0)
EOF
}
check_timeline pp6 topologies/zoo/gb200-12-racks.json sim/layouts/gb200-pp6.json
check_timeline hero topologies/zoo/gb200-11-racks.json sim/layouts/hero-ragged.json

# 2. Device memory per candidate: host memory (host_optimizer) is not added;
#    the bar total is the CLI's peak_memory_bytes, and over-the-HBM-line agrees.
"$RS" size --quiet --runs 10 --json >"$TMP/size.json" 2>"$TMP/err" || fail "rackstep size: $(cat "$TMP/err")"
"$GUI" --json "$TMP/size.json" >"$TMP/gui_size.json" 2>"$TMP/err" || fail "rackstep-gui --json size: $(cat "$TMP/err")"
python3 - "$TMP/size.json" "$TMP/gui_size.json" <<'EOF' || fail "sizing figures differ (above)"
import json, sys
cli, gui = (json.load(open(p)) for p in sys.argv[1:3])
GiB = 1024.0 ** 3
bad, checked = [], 0
by_name = {c["name"]: c for c in gui["candidates"]}
for c in cli["candidates"]:
    if "peak_memory_bytes" not in c: continue
    g = by_name[c["name"]]
    checked += 1
    if abs(g["device_memory_gib"] - c["peak_memory_bytes"] / GiB) > 1e-6 * c["peak_memory_bytes"] / GiB:
        bad.append(f"{c['name']}: device memory cli {c['peak_memory_bytes'] / GiB} GiB gui {g['device_memory_gib']}")
    host = sum(v for k, v in c["memory_bytes"].items() if k.startswith("host")) / GiB
    if abs(g["host_memory_gib"] - host) > 1e-6 * max(host, 1):
        bad.append(f"{c['name']}: host memory cli {host} gui {g['host_memory_gib']}")
    if g.get("over_hbm") != (c["peak_memory_bytes"] > c["hbm_bytes"]):
        bad.append(f"{c['name']}: over the HBM line: cli {c['peak_memory_bytes'] > c['hbm_bytes']} gui {g.get('over_hbm')}")
if checked == 0: bad.append("no runnable candidate to check")
if gui["columns"][:2] != ["candidate", "verdict"]: bad.append(f"columns start {gui['columns'][:2]}")
for b in bad: print("  " + b)
sys.exit(1 if bad else 0)
EOF

# 3. Drop percentages: the table shows what `rackstep drops` prints ("%.3f"),
#    including a receiver fraction of about 1e-56 (printed as 8.779e-55 before).
"$RS" drops --method analytic --receiver-cf 3 --json >"$TMP/drops.json" 2>"$TMP/err" || fail "rackstep drops --json: $(cat "$TMP/err")"
"$RS" drops --method analytic --receiver-cf 3 >"$TMP/drops.txt" 2>"$TMP/err" || fail "rackstep drops: $(cat "$TMP/err")"
"$GUI" --json "$TMP/drops.json" >"$TMP/gui_drops.json" 2>"$TMP/err" || fail "rackstep-gui --json drops: $(cat "$TMP/err")"
python3 - "$TMP/drops.txt" "$TMP/gui_drops.json" <<'EOF' || fail "drop figures differ (above)"
import json, sys
text = open(sys.argv[1]).read().splitlines()
gui = json.load(open(sys.argv[2]))
cli = {}
for line in text:
    parts = line.split()
    if len(parts) == 3 and parts[0] in ("sender", "receiver", "padding", "total"): cli[parts[0]] = parts[1]
cols, row = gui["columns"], gui["rows"][0]
bad = []
for kind in ("sender", "receiver", "padding", "total"):
    if kind not in cli: bad.append(f"no {kind} line in the CLI table"); continue
    g = row[cols.index(kind + " %")]
    if g != cli[kind]: bad.append(f"{kind} %: cli {cli[kind]} gui {g}")
for b in bad: print("  " + b)
sys.exit(1 if bad else 0)
EOF

if [ "$fails" -ne 0 ]; then
  echo "gui_vs_cli.sh: $fails failure(s)"
  exit 1
fi
echo "gui_vs_cli.sh: all passed"
