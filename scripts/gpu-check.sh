#!/usr/bin/env bash
# The GPU check, in one call on the GPU machine (issue 11). Builds what it
# needs for the device at hand, then runs, each step under its own time limit
# and none able to stop the others:
#   1. test_cuda: every CUDA kernel against the CPU kernel (fp32 ≤ 1e-4 relative, bf16 within bf16 rounding),
#      the resident optimizer ([resident]: three steps on the device vs the CPU's, no arena copy per step)
#      and the bf16 mode ([bf16]: the cast bit for bit, GEMMs of rounded operands, tiny-moe vs fp32);
#   2. the backend parity harness on the CUDA backend (test_parity_cuda: tests/exec_parity.cpp, when it exists);
#   3. `rackstep train --backend cuda` on tiny-moe against the CPU backend's loss curve
#      (same seed, data and steps; the per-step relative difference of the loss; the GPU run is
#      resident: parameters, gradients and optimizer on the device), and `--precision bf16`
#      against that fp32 GPU curve, 3 steps of data parallel on NCCL (--dp-collectives backend, one rank)
#      against its first 3, 3 steps of expert parallel on NCCL (--ep 1 in one process: exec/cuda/experts.h
#      with itself as the only peer; pooled and ragged, --verify-dispatch) against the CPU backend's
#      simulated dispatch (the same drops), pooled with --ep-overlap off against itself overlapped (bitwise);
#      the same CPU/GPU comparison on tiny-gpt-gelu (GPT-2's block:
#      learned positions, GeLU MLP, MLP and attention biases, LayerNorm; a few seconds each);
#   4. a training step (forward, backward, resident optimizer) of the medium zoo MoE
#      (marin-ladder-d768, 1.6 B total) on the GPU, per step and per op kind, fp32 then bf16
#      (bench/cuda/model_step.cpp; arena bytes copied per step: 0 when resident);
#   5. the kernel timings (bench/cuda/kernels_timing.cpp) against the ceilings measured there;
#   6. `rackstep calibrate --backend cuda` when calibrate takes --backend.
# The tiny-moe GPU run of step 3 is profiled (per-op CUDA-event times, peak device memory: its
# op_measurements.json in brief as "tiny_moe_cuda_profile", refitted by `calibrate --from-run`), and
# test_cuda's [profile] case checks the per-op times against the step's event time ("profile_test").
# It prints one JSON report, also written to $OUT/gpu-check.json (with up to 7 logs beside it, the
# failed steps' first), every time: a failed configure or build writes it too, each failed step
# carries its log's tail ("log_tail"), and a result file of an unexpected shape is noted
# ("report_errors") rather than losing the rest.
# Budget: under 8 minutes on one H200 (the build is most of it).
#
#   here:    bash scripts/gpu-vendor.sh                       # header-only deps into .vendor/
#   device:  run(command="bash scripts/gpu-check.sh", carry=[".vendor"], timeout_s=600)
#   here:    cp <files_at>/gpu-check.json bench/results/gpu-check-$(date +%Y%m%d)-h200.json; git add; commit
#   dry run without a GPU (here): GPU_CHECK_DRY=1 bash scripts/gpu-check.sh   # builds, every GPU step reports skipped
#   GPU_CHECK_DRY=cpu: as 1, but the tiny-moe comparison runs --backend cpu twice (exercises the report)
set -uo pipefail
cd "$(dirname "$0")/.."
# Work files go to a scratch folder; $OUT (the device tool returns at most 8 files from it)
# gets the report and the logs worth reading, at the end.
out=${GPU_CHECK_WORK:-/tmp/rackstep-gpu-check}
mkdir -p "$out"
# A report holds this run's results only: an earlier run's files and run folders (a warm machine's,
# a rerun's) would otherwise be read as this one's where a step fails before writing its own.
rm -f "$out"/*.json "$out"/*.xml "$out"/*.log
rm -rf "$out"/tiny_* "$out"/gelu_* "$out"/calibrate "$out"/corpus "$out"/data
build=${GPU_CHECK_BUILD:-build-gpu}
# The device's own architecture (nvidia-smi's compute_cap, "9.0" -> 90), else sm_90 (H100, H200).
arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')}
[[ "$arch" =~ ^[0-9]+$ ]] || arch=90
jobs=$(nproc)
t0=$(date +%s)
# NCCL says nothing of why an init or a transfer failed unless asked: its warnings into the steps' logs.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
log() { echo "gpu-check: $*" >&2; }
steps_file="$out/steps.tsv"
: >"$steps_file"
# step NAME LIMIT_S LOGFILE CMD...: runs CMD under a time limit (stdout and stderr to LOGFILE),
# records name, exit code, seconds. json_step writes stdout to NAME.json and stderr to NAME.log.
# The whole check stays inside GPU_CHECK_BUDGET_S (default 540 s, under the device tool's 600 s per
# command): each step's limit is cut to what is left (40 s kept for the report), and a step with
# under 10 s left is recorded as "budget" and skipped.
budget=${GPU_CHECK_BUDGET_S:-540}
step() {
  local name=$1 limit=$2 logfile=$3
  shift 3
  local s left
  s=$(date +%s)
  left=$((budget - 40 - (s - t0)))
  if [ "$left" -lt 10 ]; then
    printf '%s\tbudget\t0\n' "$name" >>"$steps_file"
    log "$name: skipped (the ${budget}s budget is spent)"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "$name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$logfile" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - s))" >>"$steps_file"
  [ "$rc" -eq 0 ] || { log "$name: exit $rc"; tail -5 "$logfile" >&2; }
  return "$rc"
}

# A failed configure or build ends the check: its log's tail on stderr, and the report (the steps
# so far, each failed one's log tail) with the logs in $OUT as at the end (write_report, below).
fail_early() {
  tail -40 "$out/$1" >&2
  write_report
  [ -n "${OUT:-}" ] && [ "$OUT" != "$out" ] && cp "$out/$1" "$OUT/"  # also when its step exited 0 (no CUDA)
  exit 1
}
json_step() {
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" "$out/$name.log" bash -c '"$@" >"'"$out/$name.json"'"' _ "$@"
}

# The JSON report from whatever the steps left in $out (scripts/gpu_check_report.py: a missing or
# broken file is noted, never fatal), printed and written to $out/gpu-check.json; then to $OUT with
# the logs of the failed steps first (the device tool returns at most 8 files) and the usual ones after.
write_report() {
  python3 scripts/gpu_check_report.py "$out" "${have_gpu:-0}" "$(($(date +%s) - t0))"
  [ -n "${OUT:-}" ] && [ "$OUT" != "$out" ] || return 0
  mkdir -p "$OUT"
  [ -s "$out/gpu-check.json" ] && cp "$out/gpu-check.json" "$OUT/"
  local f sent=0
  local failed=() usual=(test_cuda parity tiny_cuda medium_cuda timing build_rest tiny_cuda_bf16)
  mapfile -t failed < <(awk -F'\t' '$2 != "0" && $2 != "77" && $2 != "budget" && $2 != "skipped" {print $1}' \
    "$steps_file")
  for f in $(printf '%s\n' "${failed[@]}" "${usual[@]}" | awk '!seen[$0]++'); do
    [ "$sent" -lt 7 ] && [ -s "$out/$f.log" ] && cp "$out/$f.log" "$OUT/" && sent=$((sent + 1))
  done
  return 0
}

# NCCL: the toolkit's copy, else the one PyTorch's wheels carry (the GPU image has no Debian packages):
# the first include/nccl.h under the `nvidia` namespace package (nvidia/nccl/ in the cu12 wheels; searched
# rather than named, so another wheel layout is found too), with a libnccl.so* in the lib/ beside it.
nccl_args=()
if [ ! -e /usr/local/cuda/include/nccl.h ]; then
  nccl_dir=$(python3 -c '
import glob, os, nvidia
for root in list(nvidia.__path__):
    for h in sorted(glob.glob(os.path.join(root, "**", "include", "nccl.h"), recursive=True)):
        d = os.path.dirname(os.path.dirname(h))
        if glob.glob(os.path.join(d, "lib", "libnccl.so*")): print(d); raise SystemExit
' 2>/dev/null || true)
  if [ -n "$nccl_dir" ]; then
    nccl_lib=$(ls "$nccl_dir"/lib/libnccl.so* 2>/dev/null | head -1)
    nccl_args=(-DRACKSTEP_NCCL="$nccl_lib" -DRACKSTEP_NCCL_INCLUDE="$nccl_dir/include")
    log "NCCL from $nccl_dir"
  else
    log "no NCCL found (toolkit or PyTorch's wheel): the NCCL steps will refuse"
  fi
fi

# cuDNN (the bf16 mode's attention): the toolkit's copy, else the nvidia-cudnn wheel PyTorch carries
# (its lib/ also on the loader's path: libcudnn.so.9 opens its sub-libraries by name at run time).
# The cudnn-frontend headers travel in .vendor/cudnn_frontend (scripts/gpu-vendor.sh).
cudnn_args=()
if [ ! -e /usr/local/cuda/include/cudnn.h ]; then
  cudnn_dir=$(python3 -c 'import nvidia.cudnn as n, os; print(os.path.dirname(n.__file__) if n.__file__ else list(n.__path__)[0])' \
    2>/dev/null || true)
  if [ -n "$cudnn_dir" ] && [ -e "$cudnn_dir/include/cudnn.h" ]; then
    cudnn_args=(-DRACKSTEP_CUDNN_ROOT="$cudnn_dir")
    export LD_LIBRARY_PATH="$cudnn_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi

step configure 120 "$out/configure.log" \
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DRACKSTEP_VENDOR_DIR="$PWD/.vendor" "${nccl_args[@]}" "${cudnn_args[@]}" || fail_early configure.log
grep -q "CUDA backend enabled" "$out/configure.log" || { log "CUDA backend not enabled"; fail_early configure.log; }
# test_cuda first, then the rest: one that fails to build costs only its own step. Only a build
# that leaves no CUDA backend library (nothing on the GPU can run) ends the check.
step build 300 "$out/build.log" cmake --build "$build" -j "$jobs" --target test_cuda ||
  [ -e "$build/librackstep_cuda.a" ] || fail_early build.log
targets=(rackstep cuda_kernels_timing cuda_model_step)
grep -q "test_parity_cuda" "$build/build.ninja" 2>/dev/null && targets+=(test_parity_cuda)
step build_rest 240 "$out/build_rest.log" cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- -k 0

dry=${GPU_CHECK_DRY:-0}
have_gpu=0
nvidia-smi -L >/dev/null 2>&1 && have_gpu=1
[ "$dry" != 0 ] && have_gpu=0
rs="$build/rackstep"

# 1. Kernel parity.
step test_cuda 150 "$out/test_cuda.log" "$build/tests/test_cuda" --reporter junit --out "$out/test_cuda.xml"

# 2. The backend parity harness on the CUDA backend.
if [ -x "$build/tests/test_parity_cuda" ]; then
  step parity 120 "$out/parity.log" "$build/tests/test_parity_cuda" "[parity-devices]" --reporter junit \
    --out "$out/parity.xml"
fi

# 3. tiny-moe on the GPU against the CPU backend: a corpus from the repository's own text.
corpus="$out/corpus"
rm -rf "$corpus" "$out/data"
mkdir -p "$corpus"
find README.md models exec sim -name '*.md' -o -name '*.h' -o -name '*.cpp' 2>/dev/null | sort | head -400 |
  while read -r f; do cp --parents "$f" "$corpus/" 2>/dev/null; done
[ -x "$rs" ] && step data 60 "$out/data.log" "$rs" data build --from "$corpus" --out "$out/data" --split blank-lines \
  --eval-fraction 0.1 --quiet --json
tiny="--model models/zoo/tiny-moe.json --data $out/data --batch 2 --seq 128 --steps ${TINY_STEPS:-10} --seed 7"
backend_flag="--backend cuda"
[ "$dry" = cpu ] && backend_flag="--backend cpu"
if [ -x "$rs" ] && { [ "$have_gpu" = 1 ] || [ "$dry" = cpu ]; }; then
  json_step tiny_cpu 150 "$rs" train $tiny --threads "$jobs" --out "$out/tiny_cpu" --json
  # Profiled (exec/profiler.h: per-op CUDA-event times, the allocator's peak device memory; no per-op sync,
  # so the losses are the unprofiled run's), then refitted from its profile as `rackstep calibrate` takes a run.
  json_step tiny_cuda 120 "$rs" train $tiny $backend_flag --threads "$jobs" --out "$out/tiny_cuda" --json \
    --profile --profile-steps 4
  json_step tiny_cuda_calibrate 60 "$rs" calibrate --from-run "$out/tiny_cuda" --out "$out/tiny_cuda_cal" --json
  # The bf16 mode (the cpu backend refuses it: a dry run records the refusal).
  json_step tiny_cuda_bf16 120 "$rs" train $tiny $backend_flag --precision bf16 --threads "$jobs" \
    --out "$out/tiny_cuda_bf16" --json
  # Data parallel through NCCL (--dp-collectives backend) on a one-rank communicator: reduce-scatter
  # into the shard, the device optimizer on it, all-gather; 3 steps must equal tiny_cuda's first 3.
  # The reduce-scatter goes in ~16 KiB ranges during the backward (--grad-bucket-mb), profiled: the
  # trace's "collectives" lane holds every range and the all-gather (tiny_cuda_dp_collectives_lane).
  json_step tiny_cuda_dp 60 "$rs" train $tiny $backend_flag --dp-collectives backend --stop-after 3 \
    --grad-bucket-mb 0.015 --profile --profile-steps 3 --threads "$jobs" --out "$out/tiny_cuda_dp" --json
  # Expert parallel through NCCL (exec/cuda/experts.h) on a one-rank group: one process with --ep 1 on the
  # GPU takes the device transport, with itself as the only peer (the grouped ncclSend/ncclRecv per
  # wave, the ragged count exchange, the host-side plan of exec/ep_plan.h); capacities that bind and
  # --verify-dispatch (every layer against sim::dispatch). 3 steps against the CPU backend's simulated
  # dispatch of one GPU: the same drops per step, the losses to the GPU's rounding. (A dry run on the
  # cpu backend records the refusal of --verify-dispatch: the cpu backend has no transport of its own.)
  ep="--ep 1 --sender-cf 0.8 --receiver-cf 0.8 --waves 2 --stop-after 3 --threads $jobs"
  json_step tiny_cpu_ep 60 "$rs" train $tiny --backend cpu --dispatch pooled $ep --out "$out/tiny_cpu_ep" --json
  json_step tiny_cuda_ep 60 "$rs" train $tiny $backend_flag --dispatch pooled $ep --verify-dispatch \
    --out "$out/tiny_cuda_ep" --json
  json_step tiny_cuda_ep_ragged 60 "$rs" train $tiny $backend_flag --dispatch ragged $ep --verify-dispatch \
    --out "$out/tiny_cuda_ep_ragged" --json
  # The waves' exchange not overlapping their experts (--ep-overlap off): the same calls one after the
  # other, so the losses must equal tiny_cuda_ep's bit for bit (tiny_moe_nccl_ep_loss.overlap_off_bitwise);
  # tiny_cuda_ep's flags but that one, so nothing else can tell the two runs apart.
  json_step tiny_cuda_ep_serial 60 "$rs" train $tiny $backend_flag --dispatch pooled $ep --verify-dispatch \
    --ep-overlap off --out "$out/tiny_cuda_ep_serial" --json
  gelu="--model models/zoo/tiny-gpt-gelu.json --data $out/data --batch 2 --seq 128 --steps ${TINY_STEPS:-10} --seed 7"
  json_step gelu_cpu 90 "$rs" train $gelu --threads "$jobs" --out "$out/gelu_cpu" --json
  json_step gelu_cuda 90 "$rs" train $gelu $backend_flag --threads "$jobs" --out "$out/gelu_cuda" --json
else
  printf 'tiny_cuda\tskipped\t0\n' >>"$steps_file"
fi
# 4. The medium MoE, forward + backward at a short sequence.
if [ "$have_gpu" = 1 ] && [ -x "$build/bench/cuda_model_step" ]; then
  json_step medium_cuda 150 "$build/bench/cuda_model_step" --model models/zoo/marin-ladder-d768.json \
    --batch 2 --seq 1024 --steps 3
  json_step medium_cuda_bf16 120 "$build/bench/cuda_model_step" --model models/zoo/marin-ladder-d768.json \
    --batch 2 --seq 1024 --steps 2 --precision bf16
fi

# 5. Kernel timings.
if [ "$have_gpu" = 1 ] && [ -x "$build/bench/cuda_kernels_timing" ]; then
  json_step timing 120 "$build/bench/cuda_kernels_timing" --repeats 20
fi

# 6. Calibration on the GPU, when calibrate has a CUDA path.
if [ "$have_gpu" = 1 ] && [ -x "$rs" ] && "$rs" calibrate --help 2>/dev/null | grep -q -- "--backend"; then
  json_step calibrate 120 "$rs" calibrate --backend cuda --budget-s 60 --out "$out/calibrate" --json
fi

write_report
