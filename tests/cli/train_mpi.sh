#!/usr/bin/env bash
# rackstep train under mpirun (exec/dist.h): data parallel with ZeRO shards and
# expert parallel with the real pooled / ragged transports, against the same
# run in one process.
#   - 1 vs 4 processes: same loss curve within fp32 reduction-order tolerance
#     (DP; DP+EP with capacity so large nothing drops; ragged EP 2 x DP 2)
#   - the gradients' reduce-scatter overlapping the backward (--grad-bucket-mb):
#     bitwise the run with one reduce-scatter after it
#   - checkpoints: resume under the same rank count is bitwise, a 4-process
#     checkpoint resumes in 1 and 2 processes
#   - with drops: --verify-dispatch checks every layer's kept assignments
#     against sim/dispatch inside the run (and aborts on a difference); the
#     logged counts are that measurement, non-zero, and step 1 (identical
#     routing) equals the one-process run of the dispatch library on the same
#     4 virtual GPUs
#   - bad rank counts: one clear line, non-zero exit
#   - gpt-oss's routed experts (biases, clamped SwiGLU) under EP 2 x DP 2
# Skips (exit 77, CTest SKIP_RETURN_CODE) only when mpirun is not installed.
set -u
bin=${1:?usage: train_mpi.sh path/to/rackstep}
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (install openmpi-bin to run the multi-process tests)"
  exit 77
fi
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mpi() {
  local n=$1
  shift
  mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -np "$n" "$@"
}

mkdir -p "$tmp/text"
cp /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "$tmp/text/" 2>/dev/null || true
cp README.md models/*.h "$tmp/text/" 2>/dev/null || true
"$bin" data build --from "$tmp/text" --out "$tmp/data" --split blank-lines --eval-fraction 0.2 --quiet --json >/dev/null
check "data build exits 0" "[ $? -eq 0 ]"

common="--model models/zoo/tiny-moe.json --data $tmp/data --batch 4 --seq 64 --threads 1 --steps 6 --json"
nodrop="--sender-cf 16 --receiver-cf 16"

"$bin" train $common >"$tmp/one.json"
check "1 process exits 0" "[ $? -eq 0 ]"
mpi 4 "$bin" train $common --out "$tmp/dp" --checkpoint-every 3 >"$tmp/dp.json"
check "4 processes DP exit 0" "[ $? -eq 0 ]"
mpi 4 "$bin" train $common --grad-bucket-mb 0.015 >"$tmp/dp_overlap.json"
check "4 processes DP, reduce-scatter overlapping the backward, exit 0" "[ $? -eq 0 ]"
mpi 4 "$bin" train $common --dispatch pooled --ep 4 $nodrop >"$tmp/ep.json"
check "4 processes EP 4 pooled exit 0" "[ $? -eq 0 ]"
mpi 4 "$bin" train $common --dispatch ragged --ep 2 $nodrop >"$tmp/ragged.json"
check "4 processes EP 2 ragged exit 0" "[ $? -eq 0 ]"

/usr/bin/python3 - "$tmp/one.json" "$tmp/dp.json" "$tmp/ep.json" "$tmp/ragged.json" <<'PY' || fail=1
import json, sys
one = json.load(open(sys.argv[1]))
for path in sys.argv[2:]:
    run = json.load(open(path))
    assert run["processes"] == 4 and run["batch"] == one["batch"], (run["processes"], run["batch"])
    a, b = one["steps"], run["steps"]
    assert len(a) == len(b) == 6, (len(a), len(b))
    diff = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
    gdiff = max(abs(x["grad_norm"][g] - y["grad_norm"][g]) / max(1e-12, abs(x["grad_norm"][g]))
                for x, y in zip(a, b) for g in ("muonh", "adamh", "adam"))
    print(f"{path.split('/')[-1]}: max |loss diff| vs 1 process {diff:.2e}, max rel grad-norm diff {gdiff:.2e}, "
          f"losses {a[0]['loss']:.4f} -> {b[-1]['loss']:.4f}")
    assert diff < 2e-4, diff      # fp32 reduction order only
    assert gdiff < 1e-3, gdiff
    assert a[-1]["loss"] < a[0]["loss"] - 0.05, "the run must learn for the comparison to mean anything"
    assert all(s["drops"]["sender"] + s["drops"]["receiver"] == 0 for s in b), "no drops at capacity 16"
    assert all(s["drops"]["assignments"] == a[0]["drops"]["assignments"] for s in b)
PY

# The reduce-scatter begun in ~16 KiB ranges during the backward against one after
# it (tiny-moe's arena is far below the default 25 MiB): Open MPI's non-blocking
# reduce-scatter reduces every element over the same tree whatever the range, so bitwise.
/usr/bin/python3 - "$tmp/dp.json" "$tmp/dp_overlap.json" <<'PY' || fail=1
import json, sys
a, b = (json.load(open(p))["steps"] for p in sys.argv[1:])
assert len(a) == len(b) == 6, (len(a), len(b))
assert all(x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] for x, y in zip(a, b)), \
    [(x["loss"], y["loss"]) for x, y in zip(a, b)]
print("4 processes: --grad-bucket-mb 0.015 bitwise equal to one reduce-scatter after the backward")
PY

# Resume: bitwise under the same rank count; other rank counts load the same file.
mpi 4 "$bin" train $common --out "$tmp/dp2" --stop-after 3 >/dev/null
check "interrupted 4-process run exits 0" "[ $? -eq 0 ]"
mpi 4 "$bin" train $common --out "$tmp/dp2" --resume >"$tmp/dp2.json"
check "4-process resume exits 0" "[ $? -eq 0 ]"
cp -r "$tmp/dp2" "$tmp/dp1" && rm -f "$tmp/dp1"/ckpt-00000006.rsck
"$bin" train $common --out "$tmp/dp1" --resume >"$tmp/dp1.json"
check "1-process resume of a 4-process checkpoint exits 0" "[ $? -eq 0 ]"
cp -r "$tmp/dp1" "$tmp/dp3" && rm -f "$tmp/dp3"/ckpt-00000006.rsck
mpi 2 "$bin" train $common --out "$tmp/dp3" --resume >"$tmp/dp3.json"
check "2-process resume of a 4-process checkpoint exits 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp/dp.json" "$tmp/dp2.json" "$tmp/dp1.json" "$tmp/dp3.json" <<'PY' || fail=1
import json, sys
full, same, one, two = (json.load(open(p))["steps"] for p in sys.argv[1:])
assert [s["step"] for s in same] == [4, 5, 6], same
assert [s["loss"] for s in same] == [s["loss"] for s in full[3:]], "same rank count resumes bitwise"
for other in (one, two):
    assert [s["step"] for s in other] == [4, 5, 6]
    d = max(abs(x["loss"] - y["loss"]) for x, y in zip(full[3:], other))
    assert d < 2e-4, d
print("resume: 4 -> 4 bitwise; 4 -> 1 and 4 -> 2 within fp32 tolerance")
PY

# Drops: the real transports at capacity factors that drop, checked in the run
# against sim/dispatch (--verify-dispatch), and step 1 against the one-process
# dispatch library on the same 4 virtual GPUs.
for t in pooled ragged; do
  drop="--dispatch $t --ep 4 --sender-cf 1.0 --receiver-cf 1.0"
  mpi 4 "$bin" train $common $drop --verify-dispatch >"$tmp/drop-$t.json"
  check "4 processes $t with drops and verification exit 0" "[ $? -eq 0 ]"
  "$bin" train $common $drop >"$tmp/drop-$t-sim.json"
  check "1 process simulated $t exits 0" "[ $? -eq 0 ]"
  /usr/bin/python3 - "$tmp/drop-$t.json" "$tmp/drop-$t-sim.json" "$t" <<'PY' || fail=1
import json, sys
real, sim, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
moe_layers = 4
evals = 1 if real["evals"] else 0
# every MoE layer of every training step (and the final eval forwards) was checked
assert real["verified_dispatch_layers"] >= 6 * moe_layers, real["verified_dispatch_layers"]
dropped = [s["drops"]["sender"] + s["drops"]["receiver"] for s in real["steps"]]
assert all(d > 0 for d in dropped), dropped
if t == "ragged":
    assert all(s["drops"]["sender"] == 0 for s in real["steps"]), "ragged has no sender pools"
r1, s1 = real["steps"][0]["drops"], sim["steps"][0]["drops"]
assert (r1["sender"], r1["receiver"], r1["assignments"]) == (s1["sender"], s1["receiver"], s1["assignments"]), (r1, s1)
print(f"{t}: drop fraction per step {[round(s['drops']['fraction'], 4) for s in real['steps']]}, "
      f"step 1 = one-process sim/dispatch {s1['fraction']:.4f}, {real['verified_dispatch_layers']} layers verified")
PY
done

# Bad rank counts: a clear line and a non-zero exit.
mpi 4 "$bin" train ${common/--batch 4/--batch 6} >"$tmp/bad.out" 2>"$tmp/bad.err"
check "batch not divisible by ranks fails" "[ $? -ne 0 ]"
check "batch error names the split" "grep -q 'split evenly over 4 processes' '$tmp/bad.err'"
mpi 4 "$bin" train $common --dispatch pooled --ep 3 >"$tmp/bad.out" 2>"$tmp/bad.err"
check "--ep not dividing the ranks fails" "[ $? -ne 0 ]"
check "ep error is one clear line" "grep -q -- '--ep: expected a divisor of the 4 processes\|EP size' '$tmp/bad.err'"

# Router losses under data parallelism (aux-loss balancing with a softmax router
# and an applied router z-loss): each rank adds its share of the global batch's,
# so 2 processes follow the one-process curve.
/usr/bin/python3 - models/zoo/tiny-moe.json "$tmp/aux-model.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["moe"].update(balancing="aux_loss", aux_loss_weight=0.01, router="softmax", routing_weight_sum=1.0,
                router_z_loss_applied=True)
json.dump(m, open(sys.argv[2], "w"))
PY
aux="${common/models\/zoo\/tiny-moe.json/$tmp/aux-model.json}"
aux="${aux/--steps 6/--steps 3}"
"$bin" train $aux >"$tmp/aux1.json"
check "1 process with router losses exits 0" "[ $? -eq 0 ]"
mpi 2 "$bin" train $aux >"$tmp/aux2.json"
check "2 processes with router losses exit 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp/aux1.json" "$tmp/aux2.json" <<'PY' || fail=1
import json, sys
one, two = (json.load(open(p))["steps"] for p in sys.argv[1:])
assert len(one) == len(two) == 3
assert all(s["loss"] - s["ce"] - s["z_loss"] > 1e-3 for s in two), "the router losses are in the logged loss"
d = max(abs(x["loss"] - y["loss"]) for x, y in zip(one, two))
assert d < 2e-4, d
print(f"router losses under DP: max |loss diff| 2 vs 1 process {d:.2e}")
PY

# gpt-oss's routed experts (per-expert biases, clamped SwiGLU) under expert
# parallelism: each rank runs its experts' rows of the biases and their
# gradients (exec/dist.cpp), so EP 2 x DP 2 follows the one-process curve.
oss="${common/models\/zoo\/tiny-moe.json/tests/models/tiny-gpt-oss-moe.json}"
oss="${oss/--steps 6/--steps 3}"
"$bin" train $oss >"$tmp/oss1.json"
check "1 process gpt-oss experts exits 0" "[ $? -eq 0 ]"
mpi 4 "$bin" train $oss --dispatch pooled --ep 2 $nodrop >"$tmp/oss4.json"
check "4 processes EP 2 x DP 2 gpt-oss experts exit 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$tmp/oss1.json" "$tmp/oss4.json" <<'PY' || fail=1
import json, sys
one, four = (json.load(open(p))["steps"] for p in sys.argv[1:])
assert len(one) == len(four) == 3
d = max(abs(x["loss"] - y["loss"]) for x, y in zip(one, four))
g = max(abs(x["grad_norm"]["adam"] - y["grad_norm"]["adam"]) / x["grad_norm"]["adam"] for x, y in zip(one, four))
print(f"gpt-oss experts under EP 2 x DP 2: max |loss diff| vs 1 process {d:.2e}, max rel adam grad-norm diff {g:.2e}")
assert d < 2e-4, d
assert g < 1e-3, g
PY

exit $fail
