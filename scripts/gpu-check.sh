#!/usr/bin/env bash
# The GPU check, in one call on the GPU machine (issue 11): builds the CUDA
# backend for the device at hand, runs the GPU tests (CUDA kernels against the
# CPU kernels) and the kernel timings, and prints one JSON report (also written
# to $OUT/gpu-check.json when $OUT is set). Budget: well under 8 minutes on one H200.
#
#   here:    bash scripts/gpu-vendor.sh          # header-only deps into .vendor/
#   device:  bash scripts/gpu-check.sh           # carry .vendor
#   here:    copy the report to bench/results/gpu-check-DATE-MACHINE.json and commit it
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/rackstep-gpu-check}
mkdir -p "$out"
build=build-gpu
arch=${CUDA_ARCH:-90}
t0=$(date +%s)

log() { echo "gpu-check: $*" >&2; }
log "configure (CUDA architecture $arch)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DRACKSTEP_VENDOR_DIR="$PWD/.vendor" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
grep -q "CUDA backend enabled" "$out/configure.log" || { log "CUDA backend not enabled"; tail -30 "$out/configure.log"; exit 1; }
log "build"
cmake --build "$build" -j "$(nproc)" --target test_cuda cuda_kernels_timing >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
t_build=$(date +%s)

log "GPU tests"
set +e
"$build/tests/test_cuda" --reporter junit --out "$out/test_cuda.xml" >"$out/test_cuda.log" 2>&1
tests_rc=$?
"$build/tests/test_cuda" >>"$out/test_cuda.log" 2>&1
log "kernel timings"
"$build/bench/cuda_kernels_timing" --repeats 20 >"$out/timing.json" 2>"$out/timing.log"
timing_rc=$?
set -e
t_end=$(date +%s)

python3 - "$out" "$tests_rc" "$timing_rc" "$((t_build - t0))" "$((t_end - t_build))" <<'PY'
import json, subprocess, sys, datetime, xml.etree.ElementTree as ET
out, tests_rc, timing_rc, build_s, run_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def sh(cmd):
    try: return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e: return str(e)
report = {
    "format": "rackstep.gpu_check/1",
    "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
    "machine": sh("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader"),
    "git": sh("git rev-parse --short HEAD 2>/dev/null || echo unknown"),
    "build_s": build_s, "run_s": run_s,
    "tests": {"exit_code": tests_rc},
    "not_yet_run": ["training on the GPU: the CUDA backend has kernels but no model driver yet (issue 11)"],
}
try:
    root = ET.parse(out + "/test_cuda.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    report["tests"].update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
    report["tests"]["cases"] = [{"name": c.get("name"), "ok": c.find("failure") is None and c.find("error") is None}
                                for c in suite.iter("testcase")]
except Exception as e:
    report["tests"]["parse_error"] = str(e)
try:
    report["timing"] = json.load(open(out + "/timing.json"))
except Exception as e:
    report["timing"] = {"exit_code": timing_rc, "error": str(e)}
json.dump(report, open(out + "/gpu-check.json", "w"), indent=2)
print(json.dumps(report, indent=2))
PY
