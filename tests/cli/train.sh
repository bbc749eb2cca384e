#!/usr/bin/env bash
# rackstep train as a user runs it: a small corpus from `rackstep data build`,
# a few steps of the tiny model, checkpoint + resume, profile, reference dump,
# and bad inputs (one line on stderr, non-zero exit, nothing overwritten).
set -u
bin=${1:?usage: train.sh path/to/rackstep}
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=models/zoo/tiny-moe.json

# A small real-text corpus: the licences Debian ships (plus the repo's own docs as a fallback).
mkdir -p "$tmp/text"
cp /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "$tmp/text/" 2>/dev/null || true
cp README.md models/*.h "$tmp/text/" 2>/dev/null || true
"$bin" data build --from "$tmp/text" --out "$tmp/data" --split blank-lines --eval-fraction 0.2 --quiet --json >"$tmp/build.json"
check "data build exits 0" "[ $? -eq 0 ]"

common="--model $model --data $tmp/data --batch 2 --seq 64 --threads 1"
"$bin" train $common --steps 4 --out "$tmp/run" --checkpoint-every 2 --eval-every 2 --json >"$tmp/train.json"
check "train exits 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp/train.json" "$tmp/run" <<'PY' || fail=1
import json, math, os, sys
j = json.load(open(sys.argv[1]))
steps = j["steps"]
assert len(steps) == 4, len(steps)
for s in steps:
    assert math.isfinite(s["loss"]) and s["tokens_per_s"] > 0 and s["mfu"] > 0, s
    assert set(s["grad_norm"]) >= {"muonh", "adamh", "adam"}, s
assert j["evals"] and math.isfinite(j["evals"][-1]["eval_loss"]), j["evals"]
assert os.path.exists(os.path.join(sys.argv[2], "ckpt-00000002.rsck"))
assert os.path.exists(os.path.join(sys.argv[2], "ckpt-00000004.rsck"))
lines = [json.loads(l) for l in open(os.path.join(sys.argv[2], "log.jsonl"))]
assert sum("loss" in l for l in lines) == 4, lines
PY

# Resume: stop after 2 of 4 steps, resume, and the last loss is bitwise the uninterrupted one.
"$bin" train $common --steps 4 --out "$tmp/run2" --stop-after 2 --json >/dev/null
check "interrupted run exits 0" "[ $? -eq 0 ]"
"$bin" train $common --steps 4 --out "$tmp/run2" --resume --json >"$tmp/resumed.json"
check "resumed run exits 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp/train.json" "$tmp/resumed.json" <<'PY' || fail=1
import json, sys
a = json.load(open(sys.argv[1]))["steps"]
b = json.load(open(sys.argv[2]))["steps"]
assert [s["step"] for s in b] == [3, 4], b
assert a[3]["loss"] == b[1]["loss"], (a[3]["loss"], b[1]["loss"])
PY

# Profile: trace, measurements, routing histograms.
"$bin" train $common --steps 2 --out "$tmp/prof" --profile >/dev/null
check "profiled run exits 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp/prof" <<'PY' || fail=1
import json, os, sys
d = sys.argv[1]
t = json.load(open(os.path.join(d, "trace.json")))
events = t["traceEvents"] if isinstance(t, dict) else t
names = {e.get("name") for e in events}
assert "layers.0.attn.core.fwd" in names and "lm_head.bwd" in names, sorted(names)[:20]
m = json.load(open(os.path.join(d, "op_measurements.json")))
assert m["format"] == "rackstep.op_measurements/1" and m["ops"], m.keys()
assert any(o["op"] == "layers.0.moe.experts" and o["flops"] > 0 and o["seconds"] > 0 for o in m["ops"])
h = json.load(open(os.path.join(d, "routing-layer0-document.json")))
assert h["format"] == "rackstep.routing_histogram/1" and h["entries"], h.keys()
for e in h["entries"]:
    assert sum(e["counts"]) == e["tokens"] * h["top_k"]
PY

# Reference dump.
"$bin" train $common --reference-dump "$tmp/ref" >/dev/null
check "reference dump exits 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp/ref" <<'PY' || fail=1
import json, os, sys
m = json.load(open(os.path.join(sys.argv[1], "manifest.json")))
names = {t["name"] for t in m["tensors"]}
for n in ["batch.tokens", "batch.pos", "logits", "loss", "param.lm_head.w", "grad.lm_head.w", "after.lm_head.w",
          "buffer.layers.0.moe.router.bias", "route.layers.0.moe.expert"]:
    assert n in names, n
assert "lr" in m["meta"] and "xsa_eps" in m["meta"]
PY

# One layout: --layout takes the file `predict` reads. An EP group of 4 in one
# process (virtual GPUs) with the pooled transport gives bitwise the losses of
# the same settings given as flags; experts and top-k come from the model.
cat >"$tmp/ep4.json" <<'JSON'
{"name": "cpu-ep4", "data": 4, "ep": 4, "micro_batch_seqs": 2, "recompute": "full",
 "ep_transport": "pooled", "sender_cf": 1.0, "receiver_cf": 1.0, "waves": 2}
JSON
lay="--model $model --data $tmp/data --seq 64 --threads 1 --steps 3 --json"
"$bin" train $lay --layout "$tmp/ep4.json" >"$tmp/layout.json"
check "train --layout exits 0" "[ $? -eq 0 ]"
"$bin" train $lay --batch 8 --dispatch pooled --ep 4 --sender-cf 1.0 --receiver-cf 1.0 --waves 2 >"$tmp/flags.json"
check "train --dispatch exits 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp/layout.json" "$tmp/flags.json" <<'PY' || fail=1
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["batch"] == 8, a["batch"]  # data 4 x micro_batch_seqs 2 = the recipe's batch
assert [s["loss"] for s in a["steps"]] == [s["loss"] for s in b["steps"]], (a["steps"], b["steps"])
assert sum(s["drops"]["fraction"] for s in a["steps"]) > 0, a["steps"]
d = a["dispatch"]
assert d["ep"] == 4 and d["transport"] == "pooled" and d["waves"] == 2 and d["experts"] == 8 and d["top_k"] == 2, d
assert a["layout_not_applied"] == ["/recompute: full"], a["layout_not_applied"]
PY

# Bad input: exit 2, one line, nothing overwritten.
bad() {  # name, expected-substring, args...
  local name=$1 want=$2; shift 2
  "$bin" train "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  check "$name exits 2 (got $rc)" "[ $rc -eq 2 ]"
  check "$name error is one line" "[ \$(wc -l <\"$tmp/err\") -eq 1 ]"
  check "$name error says '$want'" "grep -q -- \"$want\" \"$tmp/err\""
}
bad "missing data" "dataset.json" --model $model --data "$tmp/nope" --steps 1
sed 's/"kind": "gqa"/"kind": "mla", "mla": {"kv_latent": 32, "rope_dim": 16}/' $model >"$tmp/mla.json"
"$bin" train --model "$tmp/mla.json" --data "$tmp/data" --batch 2 --seq 64 --threads 1 --steps 2 --json >"$tmp/mla-run.json"
check "an MLA model trains" "[ $? -eq 0 ]"
/usr/bin/python3 -c "import json, math, sys; s = json.load(open(sys.argv[1]))['steps']; assert len(s) == 2 and all(math.isfinite(x['loss']) for x in s), s" "$tmp/mla-run.json" || fail=1
cp "$tmp/run/ckpt-00000004.rsck" "$tmp/ckpt.bak"
printf 'garbage' | dd of="$tmp/run/ckpt-00000004.rsck" bs=1 seek=100 conv=notrunc 2>/dev/null
cp "$tmp/run/ckpt-00000004.rsck" "$tmp/ckpt.corrupt"
bad "corrupt checkpoint" "ckpt-00000004.rsck" $common --steps 4 --out "$tmp/run" --resume
check "corrupt checkpoint left alone" "cmp -s \"$tmp/run/ckpt-00000004.rsck\" \"$tmp/ckpt.corrupt\""
bad "fresh run into a used directory" "resume from it" $common --steps 4 --out "$tmp/run"
sed 's/"layers": 4/"layers": 2/' $model >"$tmp/other.json"
bad "another model's checkpoint" "run.json" --model "$tmp/other.json" --data "$tmp/data" --batch 2 --seq 64 --steps 4 --out "$tmp/run2" --resume
bad "hero layout in one process" "/data" $common --steps 1 --layout sim/layouts/hero-pooled.json
sed 's/"data": 4/"data": 4, "tp": 2/' "$tmp/ep4.json" >"$tmp/tp2.json"
bad "tensor-parallel layout" "/tp" $common --steps 1 --layout "$tmp/tp2.json"
# MoE parallel folding (sim/layout.h): experts split over etp 2 is expert tensor parallelism, which train has not.
sed 's/"ep": 4/"ep": 2, "etp": 2/' "$tmp/ep4.json" >"$tmp/etp2.json"
bad "folded expert layout" "/etp" $common --steps 1 --layout "$tmp/etp2.json"
bad "layout and flags" "--layout" $common --steps 1 --layout "$tmp/ep4.json" --dispatch pooled --ep 4
bad "bf16 on the cpu backend" "--precision" $common --steps 1 --precision bf16
printf 'RSTOKSH\0' >"$tmp/data/train-00000.bin"
bad "corrupt shard" "train-00000.bin" $common --steps 1

exit $fail
