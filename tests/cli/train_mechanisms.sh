#!/usr/bin/env bash
# rackstep train on the zoo models of the mechanisms beyond the Marin block:
# tiny-gpt-gelu (learned positions, biases, GeLU, dense, tied) and
# tiny-alibi-sink-moe (ALiBi, attention sinks, biases, ReLU² shared expert, MoE),
# and tests/models/tiny-gpt-oss-moe (gpt-oss's block: the routed experts' biases
# and clamped SwiGLU beside sinks, attention biases, softmax router, aux loss).
# A few steps each: every loss finite and the last below the first; a sequence
# longer than the position table is one line naming the JSON path, exit 2.
set -u
bin=${1:?usage: train_mechanisms.sh path/to/rackstep}
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/text"
cp /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "$tmp/text/" 2>/dev/null || true
cp README.md models/*.h "$tmp/text/" 2>/dev/null || true
"$bin" data build --from "$tmp/text" --out "$tmp/data" --split blank-lines --quiet --json >/dev/null
check "data build exits 0" "[ $? -eq 0 ]"

for path in models/zoo/tiny-gpt-gelu.json models/zoo/tiny-alibi-sink-moe.json tests/models/tiny-gpt-oss-moe.json; do
  m=$(basename "$path" .json)
  OMP_WAIT_POLICY=passive "$bin" train --model "$path" --data "$tmp/data" --batch 4 --seq 128 --threads 1 \
    --steps 8 --seed 3 --out "$tmp/$m" --json >"$tmp/$m.json"
  check "$m: train exits 0" "[ $? -eq 0 ]"
  /usr/bin/python3 - "$tmp/$m.json" "$m" <<'PY' || fail=1
import json, math, sys
steps = json.load(open(sys.argv[1]))["steps"]
loss = [s["loss"] for s in steps]
assert len(loss) == 8 and all(math.isfinite(x) for x in loss), loss
assert loss[-1] < loss[0] - 0.5, (sys.argv[2], loss)
print("%s: loss %.4f -> %.4f in %d steps" % (sys.argv[2], loss[0], loss[-1], len(loss)))
PY
done

"$bin" train --model models/zoo/tiny-gpt-gelu.json --data "$tmp/data" --batch 1 --seq 512 --steps 1 \
  --out "$tmp/long" 2>"$tmp/err.txt" >/dev/null
check "a sequence past the position table exits 2" "[ $? -eq 2 ]"
check "and says where" "grep -q 'models/zoo/tiny-gpt-gelu.json: /position_embedding/max_positions: expected at least the run.s sequence length (512), found 256' $tmp/err.txt"
check "in one line" "[ \$(wc -l <$tmp/err.txt) -eq 1 ]"
exit $fail
