#!/usr/bin/env bash
# scripts/gpu-check.sh's report without a GPU: the device run is one try, so a failed step must
# still leave a report that says why. (1) A configure that fails writes the report (the failed
# step, its log's tail) into $OUT; (2) scripts/gpu_check_report.py on a work folder whose files
# carry nulls (a loss, a GEMM ratio) and a crashed step still writes every other section.
set -u
: "${1:?usage: gpu_check.sh path/to/rackstep}"  # the CLI tests' argument; the script builds its own
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# (1) cmake that fails at configure: the check ends early, with its report.
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "CMake Error: no CUDA compiler (stub)" >&2\nexit 1\n' >"$tmp/bin/cmake"
chmod +x "$tmp/bin/cmake"
PATH="$tmp/bin:$PATH" GPU_CHECK_WORK="$tmp/work" GPU_CHECK_BUILD="$tmp/build" OUT="$tmp/out" \
  bash scripts/gpu-check.sh >"$tmp/early.txt" 2>&1
check "a failed configure exits 1" "[ $? -eq 1 ]"
check "a failed configure still writes the report into \$OUT" "[ -s \"$tmp/out/gpu-check.json\" ]"
/usr/bin/python3 - "$tmp/out/gpu-check.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
c = r["steps"]["configure"]
assert c["exit_code"] == 1, c
assert any("no CUDA compiler (stub)" in l for l in c["log_tail"]), c
assert "build" not in r["steps"], r["steps"]
PY
check "the failed step's log travels with the report" "[ -s \"$tmp/out/configure.log\" ]"

# (2) The report from a work folder of odd files.
w="$tmp/fake"
mkdir -p "$w"
printf 'configure\t0\t3\nbuild\t0\t90\ntiny_cpu\t0\t4\ntiny_cuda\t0\t5\ntiny_cuda_bf16\t0\t6\ntiny_cuda_ep\t134\t2\n' \
  >"$w/steps.tsv"
printf 'medium_cuda\tbudget\t0\n' >>"$w/steps.tsv"
printf 'step 1\nrackstep: NCCL call failed at exec/cuda/experts.cpp:185: ncclGroupEnd(): unhandled cuda error\n' \
  >"$w/tiny_cuda_ep.log"
echo '{"steps": [{"loss": 5.0}, {"loss": 4.0}]}' >"$w/tiny_cpu.json"
echo '{"steps": [{"loss": 5.0}, {"loss": 4.001}]}' >"$w/tiny_cuda.json"
echo '{"steps": [{"loss": 5.0}, {"loss": null}]}' >"$w/tiny_cuda_bf16.json"
echo '{"gemm": [{"ratio": 1.0}, {"ratio": null}, {"ratio": 0.9}], "memory": [{"vs_copy": null}]}' >"$w/timing.json"
/usr/bin/python3 scripts/gpu_check_report.py "$w" 1 100 >"$tmp/report.txt" 2>"$tmp/report.err"
check "the report of odd files exits 0" "[ $? -eq 0 ]"
/usr/bin/python3 - "$w/gpu-check.json" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
s = r["steps"]
assert s["tiny_cuda_ep"]["exit_code"] == 134, s
assert any("ncclGroupEnd" in l for l in s["tiny_cuda_ep"]["log_tail"]), s["tiny_cuda_ep"]
assert "log_tail" not in s["tiny_cuda"] and s["medium_cuda"]["exit_code"] == "budget", s
assert abs(r["tiny_moe_loss"]["max_rel_diff"] - 0.001 / 4.0) < 1e-12, r["tiny_moe_loss"]
assert "tiny_moe_bf16_loss" in r["report_errors"] and "tiny_moe_bf16_loss" not in r, r.get("report_errors")
t = r["targets"]
assert t["dense_gemm_vs_cublas_min"]["measured"] == 0.9, t["dense_gemm_vs_cublas_min"]
assert t["memory_bound_vs_copy_min"]["measured"] is None, t["memory_bound_vs_copy_min"]
assert t["tiny_moe_loss_max_rel_diff"]["met"] is False, t["tiny_moe_loss_max_rel_diff"]
PY
exit $fail
