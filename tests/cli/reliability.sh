#!/usr/bin/env bash
# Issue 17's numbered failures on the real binary, one check (or a few) each:
#   1 output paths: a symlink keeps its link, a FIFO's reader gets the data, /dev/full is an error
#   2 resume refuses another dataset (other --data, one shard swapped) unless --allow-data-change
#   3 log.jsonl on a full device stops the run at the first line, naming the file
#   5 crashes: JSON nested 100,000 deep, over-long names, symlink loops, sweep --top 0 / --threads 100000
#   6 unbounded work: layers 1e5, /dev/zero as input, tokens_per_step 4e9, goodput extremes
#   7 bad values: NaN / inf / 0 / negatives on flags, 1e400 in JSON, tiny published totals
#   8 litter: stale ckpt-N.rsck.tmp.PID and run.json.tmp removed; a corrupt newest checkpoint names the
#     newest valid one, and --resume-fallback resumes from it
# Every refusal: exit 2, one line on stderr, no signal, within a time limit.
set -u
bin=${1:?usage: reliability.sh path/to/rackstep}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }

# run NAME EXPECTED_RC GREP_PATTERN CMD...: the exit status and a pattern on stderr (or stdout).
run() {
  local name=$1 want=$2 pattern=$3
  shift 3
  timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: $name: exit $rc, expected $want; stderr: $(head -c 400 "$tmp/err")"
    fail=1
    return
  fi
  if [ -n "$pattern" ] && ! grep -q -- "$pattern" "$tmp/err" "$tmp/out"; then
    echo "FAIL: $name: no \"$pattern\" in: $(head -c 400 "$tmp/err")"
    fail=1
  fi
  if [ "$want" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -ne 1 ]; then
    echo "FAIL: $name: expected one line on stderr, found $(wc -l <"$tmp/err"): $(head -c 400 "$tmp/err")"
    fail=1
  fi
}

model=models/zoo/tiny-moe.json
hero=models/zoo/marin-535b-a23b.json
cluster=topologies/zoo/gb200-11-racks.json

# --- 5: crashes -------------------------------------------------------------------------
python3 -c "print('[' * 100000 + ']' * 100000)" >"$tmp/deep.json"
run "deep JSON: params" 2 "nested at most 64" "$bin" params "$tmp/deep.json"
run "deep JSON: topology" 2 "nested at most 64" "$bin" topology "$tmp/deep.json"
run "deep JSON: validate-config" 2 "nested at most 64" "$bin" validate-config "$tmp/deep.json"
run "deep JSON: sweep" 2 "nested at most 64" "$bin" sweep --model "$tmp/deep.json" --cluster "$cluster"
run "deep JSON: size" 2 "nested at most 64" "$bin" size --scenario "$tmp/deep.json"
long=$tmp/$(printf 'n%.0s' $(seq 1 300)).json
run "over-long file name" 2 "$tmp" "$bin" params "$long"
ln -s loop-b "$tmp/loop-a"
ln -s loop-a "$tmp/loop-b"
run "symlink loop" 2 "loop-a" "$bin" params "$tmp/loop-a"
run "sweep --top 0" 2 "--top" "$bin" sweep --model "$hero" --cluster "$cluster" --top 0
run "sweep --threads 100000" 2 "at most 1024" "$bin" sweep --model "$hero" --cluster "$cluster" --threads 100000

# --- 6: unbounded work ---------------------------------------------------------------------
python3 - "$hero" "$tmp/layers.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["layers"] = 100000
json.dump(m, open(sys.argv[2], "w"))
PY
run "layers 1e5: params" 2 "at most 4096" "$bin" params "$tmp/layers.json"
run "layers 1e5: validate-config" 2 "at most 4096" "$bin" validate-config "$tmp/layers.json"
run "/dev/zero as a model" 2 "at most 64 MiB" "$bin" params /dev/zero
python3 - sim/scenarios/marin-july-2026.json "$tmp/scenario.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); s["tokens_per_step"] = 4000000000
json.dump(s, open(sys.argv[2], "w"))
PY
run "scenario tokens_per_step 4e9" 2 "at most" "$bin" size --scenario "$tmp/scenario.json" --quiet
gp="--tokens-per-step 46137344 --tokens 18e12 --gpus 704 --params 535e9"
run "goodput huge step time" 2 "at most 1000000" "$bin" goodput --step-time-s 1e300 $gp
run "goodput step time that never finishes" 2 "interruptions" "$bin" goodput --step-time-s 900000 $gp
run "goodput tiny step time" 2 "from 1e-06" "$bin" goodput --step-time-s 1e-300 $gp
run "goodput short step time" 0 "" "$bin" goodput --step-time-s 1 $gp --runs 10
check "goodput short step time: no nan/inf" "! grep -qiwE 'nan|inf' $tmp/out"
run "goodput huge checkpoint interval" 2 "at most" "$bin" goodput --step-time-s 17 $gp --checkpoint-interval-s 1e300

# --- 7: bad values ---------------------------------------------------------------------------
run "--min-p-finish nan" 2 "finite" "$bin" size --min-p-finish nan --quiet
run "--checkpoint-interval-s 0" 2 "> 0" "$bin" goodput --step-time-s 17 $gp --checkpoint-interval-s 0
run "goodput --step-time-s nan" 2 "finite" "$bin" goodput --step-time-s nan $gp
run "goodput --step-time-s inf" 2 "finite" "$bin" goodput --step-time-s inf $gp
run "sweep --domains -1" 2 "--domains" "$bin" sweep --model "$hero" --cluster "$cluster" --domains -1
run "params --seq -1" 2 "--seq" "$bin" params "$hero" --seq -1
run "sweep --threads -1" 2 "--threads" "$bin" sweep --model "$hero" --cluster "$cluster" --threads -1
printf '{"name": "x", "layers": 1e400}' >"$tmp/e400.json"
run "1e400 names the file" 2 "e400.json" "$bin" params "$tmp/e400.json"
python3 - "$hero" "$tmp/published.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["published"]["total_params"] = 1e-300
json.dump(m, open(sys.argv[2], "w"))
PY
run "tiny published total" 2 "parameter count >= 1" "$bin" params "$tmp/published.json"

# --- 1: output paths -------------------------------------------------------------------------
# `data build` writes dataset.json, tokenizer.json and shards through the same writers as every output.
mkdir -p "$tmp/text"
cp /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "$tmp/text/" 2>/dev/null || true
cp README.md models/*.h "$tmp/text/" 2>/dev/null || true
run "data build" 0 "" "$bin" data build --from "$tmp/text" --out "$tmp/data" --split blank-lines --eval-fraction 0.2 --quiet
mkdir -p "$tmp/linked"
touch "$tmp/real-dataset.json"
ln -s "$tmp/real-dataset.json" "$tmp/linked/dataset.json"
run "data build through a symlinked dataset.json" 0 "" "$bin" data build --from "$tmp/text" --out "$tmp/linked" --split blank-lines --eval-fraction 0.2 --quiet
check "the symlink stays a symlink" "[ -L $tmp/linked/dataset.json ]"
check "its target got the manifest" "grep -q rackstep-token-shards $tmp/real-dataset.json"
mkdir -p "$tmp/fifo"
mkfifo "$tmp/fifo/dataset.json"
(timeout 60 cat "$tmp/fifo/dataset.json" >"$tmp/fifo-read") &
reader=$!
run "data build into a FIFO" 0 "" "$bin" data build --from "$tmp/text" --out "$tmp/fifo" --split blank-lines --eval-fraction 0.2 --quiet
wait $reader
check "the FIFO's reader got the manifest" "grep -q rackstep-token-shards $tmp/fifo-read"
check "the FIFO stays a FIFO" "[ -p $tmp/fifo/dataset.json ]"
mkdir -p "$tmp/full"
ln -s /dev/full "$tmp/full/dataset.json"
if [ -w /dev/full ]; then
  run "data build into /dev/full" 2 "No space left on device" "$bin" data build --from "$tmp/text" --out "$tmp/full" --split blank-lines --eval-fraction 0.2 --quiet
  check "/dev/full is still a device" "[ -c /dev/full ]"
  run "stdout on /dev/full" 2 "standard output" sh -c "\"$bin\" params $hero --json >/dev/full"
fi

# --- 3: every log line's write checked -------------------------------------------------------
common="--model $model --data $tmp/data --batch 2 --seq 32 --threads 1"
if [ -w /dev/full ]; then
  mkdir -p "$tmp/fullrun"
  ln -s /dev/full "$tmp/fullrun/log.jsonl"
  run "log.jsonl on a full device" 2 "log.jsonl.*No space left on device" "$bin" train $common --steps 3 --out "$tmp/fullrun"
fi

# --- 2 and 8: resume identity, fallback, litter --------------------------------------------------
run "train 4 steps" 0 "" "$bin" train $common --steps 6 --out "$tmp/run" --checkpoint-every 2 --stop-after 4
cp -r "$tmp/data" "$tmp/moved-data"
cp -r "$tmp/run" "$tmp/run-m"
run "resume on the same dataset, moved" 0 "" "$bin" train --model $model --data "$tmp/moved-data" --batch 2 --seq 32 --threads 1 --steps 6 --out "$tmp/run-m" --resume
mkdir -p "$tmp/text2"
cp /usr/share/common-licenses/GPL-2 "$tmp/text2/" 2>/dev/null || cp sim/*.h "$tmp/text2/"
run "another dataset" 0 "" "$bin" data build --from "$tmp/text2" --out "$tmp/data2" --split blank-lines --eval-fraction 0.2 --quiet
cp -r "$tmp/run" "$tmp/run-b"
run "resume on another dataset is refused" 2 "dataset" "$bin" train --model $model --data "$tmp/data2" --batch 2 --seq 32 --threads 1 --steps 6 --out "$tmp/run-b" --resume
# One train shard swapped for a valid shard of the other dataset.
cp -r "$tmp/data" "$tmp/swapped"
cp "$tmp/data2/train-00000.bin" "$tmp/swapped/train-00000.bin"
run "resume with one shard swapped is refused" 2 "digest" "$bin" train --model $model --data "$tmp/swapped" --batch 2 --seq 32 --threads 1 --steps 6 --out "$tmp/run-b" --resume
run "--allow-data-change continues" 0 "" "$bin" train --model $model --data "$tmp/data2" --batch 2 --seq 32 --threads 1 --steps 6 --out "$tmp/run-b" --resume --allow-data-change
check "the data change is logged" "grep -q data_change $tmp/run-b/log.jsonl"
# A corrupt newest checkpoint: refused, naming the newest valid one; --resume-fallback resumes from it.
cp -r "$tmp/run" "$tmp/run-c"
python3 - "$tmp/run-c/ckpt-00000004.rsck" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[200] ^= 0xff; open(p, "wb").write(bytes(b))
PY
run "resume with a corrupt newest checkpoint names the valid one" 2 "ckpt-00000002.rsck (resume from it with --resume-fallback)" "$bin" train $common --steps 6 --out "$tmp/run-c" --resume
# Litter from killed writers is removed at start.
printf 'half' >"$tmp/run-c/ckpt-00000006.rsck.tmp.999999999"
printf '{' >"$tmp/run-c/run.json.tmp"
timeout 60 "$bin" train $common --steps 6 --out "$tmp/run-c" --resume --resume-fallback >"$tmp/out" 2>"$tmp/err"
check "--resume-fallback exits 0" "[ $? -eq 0 ]"
check "--resume-fallback says where it resumed" "grep -q 'newest valid checkpoint, .*ckpt-00000002.rsck' $tmp/err"
check "the corrupt checkpoint is kept aside" "[ -e $tmp/run-c/ckpt-00000004.rsck.corrupt ]"
check "stale checkpoint temp removed" "[ ! -e $tmp/run-c/ckpt-00000006.rsck.tmp.999999999 ]"
check "stale run.json.tmp removed" "[ ! -e $tmp/run-c/run.json.tmp ]"
check "the run finished at step 6" "[ -e $tmp/run-c/ckpt-00000006.rsck ]"

[ $fail -eq 0 ] && echo "reliability: all checks passed"
exit $fail
