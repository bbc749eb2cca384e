#!/usr/bin/env bash
# Training tokens/s of the tiny model: rackstep's CPU engine against the same model in
# PyTorch, in the same run, same batch (8 x 256), same thread count (issue 7, "Speed").
#
#   scripts/bench_train_vs_torch.sh [BUILD_DIR] [THREADS...]     # default: build 1 2
#   ROUNDS=3 scripts/bench_train_vs_torch.sh build-perf 1 2
#
# Per thread count, ROUNDS alternating runs of each (rackstep's bench/train_bench, then
# bench/torch_train_bench.py), so background load hits both alike. Both run with
# OMP_WAIT_POLICY=passive: spinning OpenMP threads collapse on a shared machine (PyTorch
# at 2 threads ran ~10x slower without it here). The table shows each side's best and
# median wall-clock tokens/s over the rounds, tokens per process CPU second (all
# threads; steadier when other jobs share the cores), their ratios, and rackstep's GEMM
# share of step time and GEMM GFLOP/s against the measured sgemm peak.
# Needs Debian's /usr/bin/python3 with python3-torch (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
threads=("$@")
[ ${#threads[@]} -eq 0 ] && threads=(1 2)
rounds=${ROUNDS:-3}
bench="$build/bench/train_bench"
py=/usr/bin/python3
[ -x "$bench" ] || { echo "bench_train_vs_torch: $bench not built (cmake --build $build --target train_bench)" >&2; exit 2; }
"$py" -c "import torch" 2>/dev/null || { echo "bench_train_vs_torch: $py has no torch (scripts/setup.sh installs python3-torch)" >&2; exit 2; }

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for t in "${threads[@]}"; do
  for r in $(seq "$rounds"); do
    echo "threads $t round $r/$rounds ..." >&2
    OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t OMP_WAIT_POLICY=passive \
      "$bench" --benchmark_filter='BM_TrainStep/8/256' --benchmark_min_time=2 --benchmark_format=json 2>/dev/null |
      "$py" -c 'import json,sys; b=json.load(sys.stdin)["benchmarks"][0]; b["side"]="rackstep"; print(json.dumps(b))' >>"$results"
    OMP_NUM_THREADS=$t OMP_WAIT_POLICY=passive "$py" bench/torch_train_bench.py --threads "$t" --batch 8 --seq 256 --steps 6 --json |
      "$py" -c 'import json,sys; b=json.load(sys.stdin); b["side"]="pytorch"; print(json.dumps(b))' >>"$results"
  done
done

"$py" - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("%-7s %-9s %13s %13s %13s   %s" % ("threads", "side", "best tok/s", "median tok/s", "tok/CPU-s", "detail"))
for t in sorted({int(r["threads"]) for r in rows}):
    rs = [r for r in rows if r["side"] == "rackstep" and int(r["threads"]) == t]
    pt = [r for r in rows if r["side"] == "pytorch" and int(r["threads"]) == t]
    rk = [r["tokens_per_s"] for r in rs]
    tk = [r["tokens_per_s"] for r in pt]
    rc = statistics.median([r["tokens_per_cpu_s"] for r in rs])
    tc = statistics.median([r["tokens_per_cpu_s"] for r in pt])
    last = rs[-1]
    print("%-7d %-9s %13.0f %13.0f %13.0f   GEMM share %.0f%%, GEMM %.1f GFLOP/s = %.0f%% of the %.1f GFLOP/s sgemm peak"
          % (t, "rackstep", max(rk), statistics.median(rk), rc, 100 * last["gemm_share"], last["gemm_gflop_s"],
             100 * last["gemm_vs_peak"], last["sgemm_peak_gflop_s"]))
    print("%-7d %-9s %13.0f %13.0f %13.0f   %s, moe %s" % (t, "pytorch", max(tk), statistics.median(tk), tc,
                                                        pt[-1]["framework"], pt[-1]["moe"]))
    print("%-7d %-9s %12.2fx %12.2fx %12.2fx   target >= 1.5x" % (t, "ratio", max(rk) / max(tk),
                                                           statistics.median(rk) / statistics.median(tk), rc / tc))
EOF
