#!/usr/bin/env bash
# `rackstep data build/inspect`: the default Debian corpus builds, the summary
# is sane, and corrupt / truncated shards and bad arguments exit 2 with one line.
# Usage: bash tests/cli/data.sh path/to/rackstep
set -euo pipefail
bin=$(realpath "${1:?usage: data.sh path/to/rackstep}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "data.sh: FAIL: $*" >&2; exit 1; }

# Expect exit status 2 and a single-line message containing $2.
expect_error() {
  local what=$1 needle=$2
  shift 2
  set +e
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "$what: exit $rc, expected 2 ($(cat "$tmp/err"))"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "$what: expected one error line, got: $(cat "$tmp/err")"
  grep -q -- "$needle" "$tmp/err" || fail "$what: error lacks '$needle': $(cat "$tmp/err")"
}

# 1. The default corpus (text shipped with Debian's base-files and python3).
"$bin" data build --default --out "$tmp/py" --json >"$tmp/summary.json" 2>"$tmp/progress"
grep -q "tokenised train" "$tmp/progress" || fail "no progress lines on stderr"
python3 - "$tmp/summary.json" <<'EOF' || fail "default corpus summary out of range"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["tokenizer"] == "byte" and s["vocab_size"] == 256, s
assert s["tokens"]["train"] > 4_000_000, s["tokens"]
assert s["documents"]["train"] > 300 and s["documents"]["eval"] > 0, s["documents"]
assert s["shards"]["train"] >= 1 and s["shards"]["eval"] >= 1, s["shards"]
# Byte-level text: well below 8 bits, well above 2.
assert 3.0 < s["unigram_entropy_bits_per_token"] < 6.5, s["unigram_entropy_bits_per_token"]
assert abs(s["unigram_entropy_nats_per_token"] - s["unigram_entropy_bits_per_token"] * 0.6931471805599453) < 1e-9
EOF
"$bin" data inspect "$tmp/py" | grep -q "all shards valid" || fail "inspect of a fresh dataset"
"$bin" data inspect "$tmp/py" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["valid"]' \
  || fail "inspect --json"

# 2. A small BPE dataset from explicit files, documents per paragraph.
mkdir -p "$tmp/src"
for i in 1 2 3 4 5 6; do
  printf 'paragraph one of file %s, with words and more words\n\nparagraph two of file %s\n' "$i" "$i" >"$tmp/src/f$i.txt"
done
"$bin" data build --from "$tmp/src" --out "$tmp/bpe" --tokenizer bpe --vocab 300 --split blank-lines \
  --eval-fraction 0.3 --json --quiet >"$tmp/bpe.json"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["tokenizer"]=="bpe" and 256<s["vocab_size"]<=300 and s["documents"]["train"]+s["documents"]["eval"]==12, s' \
  "$tmp/bpe.json" || fail "bpe build summary"

# 3. Damaged shards: one flipped byte, a truncated file.
shard=$(ls "$tmp/py"/train-*.bin | head -1)
cp "$shard" "$tmp/keep.bin"
printf '\x55' | dd of="$shard" bs=1 seek=1000 conv=notrunc status=none
expect_error "flipped byte" "corrupt" "$bin" data inspect "$tmp/py"
cp "$tmp/keep.bin" "$shard"
head -c 5000 "$tmp/keep.bin" >"$shard"
expect_error "truncated shard" "truncated" "$bin" data inspect "$tmp/py"
cp "$tmp/keep.bin" "$shard"
"$bin" data inspect "$tmp/py" >/dev/null || fail "restored shard no longer valid"

# 4. Bad arguments.
expect_error "missing source" "nothing there" "$bin" data build --from "$tmp/nope" --out "$tmp/x"
expect_error "no source at all" "--default" "$bin" data build --out "$tmp/x"
mkdir -p "$tmp/unrelated" && echo keep >"$tmp/unrelated/file"
expect_error "unrelated out dir" "dataset.json" "$bin" data build --from "$tmp/src" --out "$tmp/unrelated"
[ "$(cat "$tmp/unrelated/file")" = keep ] || fail "unrelated directory was touched"
expect_error "bad eval fraction" "eval-fraction" "$bin" data build --from "$tmp/src" --out "$tmp/y" --eval-fraction 1.5
expect_error "no dataset" "dataset.json" "$bin" data inspect "$tmp/src"
echo "data.sh: ok"
