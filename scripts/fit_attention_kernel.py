#!/usr/bin/env python3
"""Refit an attention kernel's curve on one GPU from a validation file's fitted rows.

  python3 scripts/fit_attention_kernel.py RACKSTEP VALIDATION_JSON CLUSTER_JSON KERNEL GPU HEAD_DIM [--split]

e.g. build/rackstep tests/validation/llm-foundry-mpt.json topologies/zoo/hgx-h100.json
     flash_attention_triton H100-SXM 128 --split

The rows of role "fitted" on CLUSTER_JSON are grouped by their model's sequence length.
A row without activation checkpointing runs the kernel's forward and backward once each,
so its step time depends on the forward + backward rate alone: at each sequence those
rows fix sim/calibration.json's fwd_bwd_efficiency point, the value at which they average
zero step-time error (bisection on `rackstep validate --calibration`). With --split, the
checkpointed rows (forward run twice) at those sequences then fix fwd_over_bwd_rate the
same way; checkpointed rows at other sequences fix those points given the rate. Prints
the values and each fitted row's error; sim/calibration.json is not written.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if len(sys.argv) not in (7, 8) or sys.argv[7:] not in ([], ["--split"]):
    sys.exit("usage: fit_attention_kernel.py RACKSTEP VALIDATION_JSON CLUSTER_JSON KERNEL GPU HEAD_DIM [--split]")
RS, VALIDATION, CLUSTER, KERNEL, GPU, HEAD_DIM = sys.argv[1:7]
SPLIT = sys.argv[7:] == ["--split"]
BASE = json.load(open(os.path.join(ROOT, "sim/calibration.json")))
CURVE = BASE["attention_kernels"][KERNEL]["per_gpu"][GPU]

work = tempfile.mkdtemp()  # the validation file alone: `rackstep validate --dir` reads every file there
shutil.copy(os.path.join(ROOT, VALIDATION), work)
CAL_PATH = work + ".calibration.json"
rows = {}
for r in json.load(open(os.path.join(ROOT, VALIDATION)))["runs"]:
    if r["role"] == "fitted" and r["cluster"] == CLUSTER:
        seq = json.load(open(os.path.join(ROOT, r["model"])))["seq_len"]
        rows[r["id"]] = (seq, r["layout"]["recompute"] != "none")
if not rows:
    sys.exit(f"fit_attention_kernel: {VALIDATION} has no fitted row on {CLUSTER}")


def errors(points, rate):
    """Each fitted row's step-time error with the curve's points and rate replaced."""
    cal = json.loads(json.dumps(BASE))
    curve = cal["attention_kernels"][KERNEL]["per_gpu"][GPU]
    for seq, value in points.items():
        curve["fwd_bwd_efficiency"][HEAD_DIM][str(seq)] = {"value": value, "source": "fit"}
    curve["fwd_over_bwd_rate"]["value"] = rate
    json.dump(cal, open(CAL_PATH, "w"))
    out = subprocess.run([RS, "validate", "--dir", work, "--calibration", CAL_PATH, "--json"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"fit_attention_kernel: rackstep validate failed: {out.stderr.strip()}")
    runs = {r["id"]: r for r in json.loads(out.stdout)["runs"]}
    missing = [i for i in rows if runs[i].get("step_error") is None]
    if missing:
        sys.exit(f"fit_attention_kernel: no prediction for {missing[0]}: {runs[missing[0]].get('error')}")
    return {i: runs[i]["step_error"] for i in rows}


def solve(mean_error, lo, hi):
    """Bisection for the value where the rows' mean error crosses zero (a faster kernel: a lower error)."""
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_error(mid) > 0 else (lo, mid)
    return 0.5 * (lo + hi)


def mean(ids, points, rate):
    e = errors(points, rate)
    return sum(e[i] for i in ids) / len(ids)


def bracket(points, seq):
    """Around the point's value (or the next shorter one's): sim/calibration.cpp rejects a curve
    whose last point is 2x its previous one or more (no finite rate to rise toward)."""
    ref = points[seq] if seq in points else points[max(s for s in points if s < seq)]
    return 0.5 * ref, 1.99 * ref


points = {int(s): p["value"] for s, p in CURVE["fwd_bwd_efficiency"][HEAD_DIM].items()}
rate = CURVE["fwd_over_bwd_rate"]["value"]
plain = sorted({s for s, ckpt in rows.values() if not ckpt})
for seq in plain:
    ids = [i for i, (s, ckpt) in rows.items() if s == seq and not ckpt]
    points[seq] = solve(lambda e: mean(ids, {**points, seq: e}, rate), *bracket(points, seq))
if SPLIT:
    ids = [i for i, (s, ckpt) in rows.items() if ckpt and s in plain]
    if ids:
        rate = solve(lambda x: mean(ids, points, x), 0.25, 4.0)
    for seq in sorted({s for s, ckpt in rows.values() if ckpt and s not in plain}):
        ids = [i for i, (s, ckpt) in rows.items() if s == seq and ckpt]
        points[seq] = solve(lambda e: mean(ids, {**points, seq: e}, rate), *bracket(points, seq))
final = errors(points, rate)
shutil.rmtree(work)
os.remove(CAL_PATH)
print(json.dumps({"fwd_over_bwd_rate": round(rate, 4),
                  "fwd_bwd_efficiency": {str(s): round(v, 4) for s, v in sorted(points.items())},
                  "fitted_row_errors": {i: round(e, 4) for i, e in final.items()}}, indent=2))
