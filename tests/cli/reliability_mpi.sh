#!/usr/bin/env bash
# Issue 17, failure 4: a stopped (not killed) MPI rank froze the job forever.
# Two ranks train; one is stopped with SIGSTOP; the collective watchdog
# (exec/watchdog.h, --collective-timeout-s 3) must end the job within a minute
# with one line naming the stopped rank (its pid) and the collective.
# Skips (exit 77) when mpirun is not installed or cannot start two ranks.
set -u
bin=${1:?usage: reliability_mpi.sh path/to/rackstep}
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (install openmpi-bin to run the multi-process tests)"
  exit 77
fi
fail=0
tmp=$(mktemp -d)
stopped=""
cleanup() {
  [ -n "$stopped" ] && kill -KILL "$stopped" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

mkdir -p "$tmp/text"
cp /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "$tmp/text/" 2>/dev/null || true
cp README.md models/*.h "$tmp/text/" 2>/dev/null || true
"$bin" data build --from "$tmp/text" --out "$tmp/data" --split blank-lines --eval-fraction 0.2 --quiet >/dev/null || exit 1

mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -np 2 \
  "$bin" train --model models/zoo/tiny-moe.json --data "$tmp/data" --batch 2 --seq 32 --threads 1 --steps 100000 \
  --out "$tmp/run" --collective-timeout-s 3 >"$tmp/out" 2>"$tmp/err" &
job=$!

# Wait for training to run (a step logged), then stop one rank.
for _ in $(seq 1 600); do
  [ -s "$tmp/run/log.jsonl" ] && break
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
if [ ! -s "$tmp/run/log.jsonl" ]; then
  echo "SKIP: the two-rank job did not start: $(tail -c 300 "$tmp/err")"
  kill -KILL $job 2>/dev/null
  exit 77
fi
ranks=$(pgrep -f -- "--out $tmp/run" | sort -n)
stopped=$(echo "$ranks" | tail -n 1)
kill -STOP "$stopped"
start=$(date +%s)

# The job must end by itself (the watchdog aborts it); give it a minute.
for _ in $(seq 1 600); do
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
if kill -0 $job 2>/dev/null; then
  echo "FAIL: the job still runs $(( $(date +%s) - start )) s after a rank was stopped"
  kill -KILL $job 2>/dev/null
  fail=1
fi
wait $job
rc=$?
elapsed=$(( $(date +%s) - start ))
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0 after a rank was stopped"; fail=1; }
grep -q "pid $stopped) stopped" "$tmp/err" || { echo "FAIL: no line naming the stopped rank (pid $stopped): $(tail -c 600 "$tmp/err")"; fail=1; }
grep -q "collective MPI_" "$tmp/err" || { echo "FAIL: no line naming the collective: $(tail -c 600 "$tmp/err")"; fail=1; }
grep -q "collective-timeout-s" "$tmp/err" || { echo "FAIL: the line does not name the setting"; fail=1; }
echo "watchdog: job ended $elapsed s after SIGSTOP; $(grep -m1 'stopped' "$tmp/err")"
exit $fail
