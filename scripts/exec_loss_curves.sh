#!/usr/bin/env bash
# Loss curves of every shape `rackstep train` runs, for a bitwise before/after
# diff of a change to the execute side (exec/): tiny-moe and its variants
# (dense, tied embeddings, LayerNorm, aux-loss balancing with a softmax router,
# an applied router z-loss, MLA), simulated pooled / ragged EP drops, MPI data
# parallelism with and without expert parallelism, stop + resume, a profiled
# run, and the one-step reference dumps (every parameter, gradient and logit).
# Prints one md5 per curve or dump; two builds agree bitwise when the lists do:
#
#   scripts/exec_loss_curves.sh build-before /tmp/before > before.md5
#   scripts/exec_loss_curves.sh build /tmp/after > after.md5
#   diff <(sed 's|/tmp/before/||' before.md5) <(sed 's|/tmp/after/||' after.md5) && echo bitwise-equal
set -eu
B=${1:?usage: exec_loss_curves.sh BUILD_DIR OUT_DIR}
O=${2:?usage: exec_loss_curves.sh BUILD_DIR OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$O/models"
D="$O/data"
[ -d "$D" ] || "$B/rackstep" data build --default --out "$D" --quiet >/dev/null
/usr/bin/python3 - "$root/models/zoo/tiny-moe.json" "$O/models" <<'PY'
import copy, json, sys
base = json.load(open(sys.argv[1]))
def variant(name, change):
    m = copy.deepcopy(base)
    change(m)
    json.dump(m, open(f"{sys.argv[2]}/{name}.json", "w"))
variant("moe", lambda m: None)
def dense(m):
    m["moe"] = {"experts": 0, "dense_width": 96}
variant("dense", dense)
variant("tied", lambda m: m.update(tied_embeddings=True))
variant("layernorm", lambda m: m["norm"].update(kind="layernorm"))
variant("aux", lambda m: m["moe"].update(balancing="aux_loss", aux_loss_weight=0.01, router="softmax",
                                         routing_weight_sum=1.0))
variant("rz", lambda m: m["moe"].update(router_z_loss_applied=True))
def mla(m):
    a = m["attention"]
    a.update(kind="mla", mla={"kv_latent": 32, "q_latent": 48, "rope_dim": 16}, kv_heads=4)
    a["local"]["kv_heads"] = a["global"]["kv_heads"] = 4
variant("mla", mla)
PY
common="--data $D --seed 1 --batch 2 --seq 64 --threads 1"
curve() {  # run name: the logged figures that must not move (no timings)
  /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    s = json.loads(line)
    print(json.dumps([s.get(k) for k in ("step", "loss", "ce", "z_loss", "router_z_loss", "drops", "grad_norm", "eval_loss")]))
' "$O/run-$1/log.jsonl" >"$O/curve-$1.txt"
}
run() {
  local name=$1
  shift
  rm -rf "$O/run-$name"
  "$@" $common --steps 4 --eval-every 4 --eval-batches 1 --out "$O/run-$name" >/dev/null 2>"$O/err-$name" ||
    { echo "FAIL $name" >&2; cat "$O/err-$name" >&2; }
  curve "$name"
}
for m in moe dense tied layernorm aux rz mla; do run "$m" "$B/rackstep" train --model "$O/models/$m.json"; done
run pooled "$B/rackstep" train --model "$O/models/moe.json" --dispatch pooled --ep 2
run ragged "$B/rackstep" train --model "$O/models/moe.json" --dispatch ragged --ep 4
if command -v mpirun >/dev/null 2>&1; then
  mpi="mpirun --allow-run-as-root --oversubscribe -np 2"
  run mpi $mpi "$B/rackstep" train --model "$O/models/moe.json"
  run mpiep $mpi "$B/rackstep" train --model "$O/models/moe.json" --dispatch pooled --ep 2
fi
rm -rf "$O/run-resume"
"$B/rackstep" train --model "$O/models/moe.json" $common --steps 4 --checkpoint-every 2 --stop-after 2 \
  --out "$O/run-resume" >/dev/null 2>&1
"$B/rackstep" train --model "$O/models/moe.json" $common --steps 4 --checkpoint-every 2 --resume \
  --out "$O/run-resume" >/dev/null 2>&1 || echo "FAIL resume" >&2
curve resume
rm -rf "$O/run-prof"
"$B/rackstep" train --model "$O/models/moe.json" $common --steps 2 --profile --out "$O/run-prof" >/dev/null 2>&1 ||
  echo "FAIL profile" >&2
/usr/bin/python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["ops"]))' \
  "$O/run-prof/op_measurements.json" >"$O/curve-prof.txt"
for m in moe mla tied dense layernorm aux rz; do
  rm -rf "$O/dump-$m"
  "$B/rackstep" train --model "$O/models/$m.json" $common --reference-dump "$O/dump-$m" >/dev/null 2>&1 ||
    echo "FAIL dump $m" >&2
done
md5sum "$O"/curve-*.txt "$O"/dump-*/tensors.bin
