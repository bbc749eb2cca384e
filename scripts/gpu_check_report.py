#!/usr/bin/env python3
# The JSON report of scripts/gpu-check.sh from what its steps left in the work folder OUT: steps.tsv
# (name, exit code or "budget"/"skipped", seconds), each step's NAME.log, the JSON a json_step wrote
# (NAME.json), test_cuda.xml / parity.xml (Catch2's junit), the profiled run's op_measurements.json.
# A missing file is "not run"; a file of an unexpected shape is noted under "report_errors" and the
# rest is still written. Prints the report and writes OUT/gpu-check.json.
#
#   python3 scripts/gpu_check_report.py OUT HAVE_GPU(0|1) TOTAL_S      (tests/cli/gpu_check.sh)
import datetime, json, os, subprocess, sys, xml.etree.ElementTree as ET
out, have_gpu, total_s = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
def sh(cmd):
    try: return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as e: return str(e)
def junit(path):
    try:
        root = ET.parse(path).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        r = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        r["failed_cases"] = [c.get("name") for c in suite.iter("testcase")
                             if c.find("failure") is not None or c.find("error") is not None]
        return r
    except Exception as e:
        return {"parse_error": str(e)}
def cases(path, word):
    # The test cases of a junit file whose name holds `word`: passed / failed / skipped, seconds.
    if not os.path.exists(path): return {"not_run": "no " + os.path.basename(path) + " (skipped without a device, or not built)"}
    try:
        root = ET.parse(path).getroot()
        r = []
        for c in root.iter("testcase"):
            if word not in (c.get("name") or ""): continue
            failed = c.find("failure") is not None or c.find("error") is not None
            r.append({"name": c.get("name"), "status": "failed" if failed else
                      ("skipped" if c.find("skipped") is not None else "passed"), "s": float(c.get("time", 0))})
        return r
    except Exception as e:
        return {"parse_error": str(e)}
def losses(path):
    try: return [s["loss"] for s in json.load(open(path))["steps"]]
    except Exception as e: return None
def log_tail(name, lines=15):
    # The end of a step's log (its stderr; a build's compiler errors): only 8 files come back from
    # the device, so a failed step's reason travels in the report itself.
    try:
        with open(os.path.join(out, name + ".log"), errors="replace") as f:
            return [l.rstrip("\n")[-400:] for l in f.readlines()[-lines:]]
    except Exception as e:
        return [str(e)]
steps = {}
for line in open(os.path.join(out, "steps.tsv")):
    name, rc, secs = line.rstrip("\n").split("\t")
    steps[name] = {"exit_code": int(rc) if rc.lstrip("-").isdigit() else rc, "seconds": int(secs)}
    if rc not in ("0", "77", "budget", "skipped"): steps[name]["log_tail"] = log_tail(name)
report = {
    "format": "rackstep.gpu_check/2",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "machine": sh("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader") or "no GPU",
    "git": sh("git rev-parse --short HEAD 2>/dev/null || echo unknown"),
    "total_s": total_s,
    "steps": steps,
    "test_cuda": junit(os.path.join(out, "test_cuda.xml")),
    # CMake's line on the cuDNN attention (enabled, or why not).
    "cudnn_attention": next((l.strip("- \n") for l in open(os.path.join(out, "configure.log"), errors="replace")
                             if "cuDNN attention" in l), None) if os.path.exists(os.path.join(out, "configure.log")) else None,
}
report["resident"] = cases(os.path.join(out, "test_cuda.xml"), "resident")
report["bf16"] = cases(os.path.join(out, "test_cuda.xml"), "bf16")
report["cudnn"] = cases(os.path.join(out, "test_cuda.xml"), "cuDNN")
if os.path.exists(os.path.join(out, "parity.xml")):
    report["parity"] = junit(os.path.join(out, "parity.xml"))
report_errors = {}
def part(name, fn):
    # One section of the report: a file of an unexpected shape (a null where a number was expected,
    # a missing key) is noted under "report_errors" and the rest of the report is still written.
    try:
        v = fn()
        if v is not None: report[name] = v
    except Exception as e:
        report_errors[name] = "%s: %s" % (type(e).__name__, e)
def rel_diffs(ref, got):
    # Per-step |got - ref| / |ref| of two loss curves of one length, else None.
    if not ref or not got or len(ref) != len(got): return None
    return [abs(g - r) / abs(r) for r, g in zip(ref, got)]
def run_json(name):
    try: return json.load(open(os.path.join(out, name + ".json")))
    except Exception: return None
cpu, gpu = losses(os.path.join(out, "tiny_cpu.json")), losses(os.path.join(out, "tiny_cuda.json"))
def curve(ref_name, ref, got_name, got):
    rel = rel_diffs(ref, got)
    if rel is None: return None
    return {ref_name: ref, got_name: got, "max_rel_diff": max(rel), "last_rel_diff": rel[-1]}
part("tiny_moe_loss", lambda: curve("cpu", cpu, "cuda", gpu))
part("tiny_gpt_gelu_loss", lambda: curve("cpu", losses(os.path.join(out, "gelu_cpu.json")),
                                         "cuda", losses(os.path.join(out, "gelu_cuda.json"))))
def nccl_dp():
    dp = losses(os.path.join(out, "tiny_cuda_dp.json"))
    if not gpu or not dp or len(dp) > len(gpu): return None
    rel = rel_diffs(gpu[:len(dp)], dp)
    return {"cuda": gpu[:len(dp)], "cuda_nccl_dp": dp, "max_rel_diff": max(rel), "bitwise": dp == gpu[:len(dp)]}
part("tiny_moe_nccl_dp_loss", nccl_dp)
def collectives_lane():
    # Slices per name on the trace's "collectives" thread: the NCCL stream's reduce-scatter ranges and all-gathers.
    path = os.path.join(out, "tiny_cuda_dp", "trace.json")
    if not os.path.exists(path): return None
    t = json.load(open(path))
    events = t["traceEvents"] if isinstance(t, dict) else t
    lanes = {e["tid"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name" and e["args"]["name"] == "collectives"}
    n = {}
    for e in events:
        if e.get("ph") == "X" and e.get("tid") in lanes: n[e["name"]] = n.get(e["name"], 0) + 1
    return n
part("tiny_cuda_dp_collectives_lane", collectives_lane)
def nccl_ep():
    ep_cpu, ep_gpu, ep_ragged = run_json("tiny_cpu_ep"), run_json("tiny_cuda_ep"), run_json("tiny_cuda_ep_ragged")
    ep_serial = run_json("tiny_cuda_ep_serial")  # --ep-overlap off
    if not ep_cpu or not ep_gpu or not ep_cpu.get("steps") or len(ep_cpu["steps"]) != len(ep_gpu.get("steps", [])):
        return None
    drops = lambda j: [[s["drops"][k] for k in ("assignments", "sender", "receiver")] for s in j["steps"]]
    c, g = [s["loss"] for s in ep_cpu["steps"]], [s["loss"] for s in ep_gpu["steps"]]
    return {"cpu_simulated": c, "cuda_nccl_ep": g, "max_rel_diff": max(rel_diffs(c, g)),
            "drops_cpu": drops(ep_cpu), "drops_cuda": drops(ep_gpu), "drops_equal": drops(ep_cpu) == drops(ep_gpu),
            "verified_dispatch_layers": ep_gpu.get("verified_dispatch_layers"),
            "ragged_verified_dispatch_layers": (ep_ragged or {}).get("verified_dispatch_layers"),
            "overlap_off_bitwise": None if not ep_serial else [s["loss"] for s in ep_serial.get("steps", [])] == g}
part("tiny_moe_nccl_ep_loss", nccl_ep)
def bf16_curve():
    b16 = losses(os.path.join(out, "tiny_cuda_bf16.json"))
    rel = rel_diffs(gpu, b16)
    return None if rel is None else {"cuda_fp32": gpu, "cuda_bf16": b16, "max_rel_diff": max(rel)}
part("tiny_moe_bf16_loss", bf16_curve)
def last_step():
    j = run_json("tiny_cuda")
    if not j or not j.get("steps"): return None
    # mfu here is against the CPU's sgemm rate (exec/train.cpp): the medium step below has the GPU's.
    return {k: j["steps"][-1].get(k) for k in ("step", "loss", "tokens_per_s")}
part("tiny_moe_cuda_last_step", last_step)
def profile_summary(run_dir):
    # The run's op_measurements.json in brief: device, clock, memory, per-step times, seconds per op class
    # (medians of the profiled steps, forward + backward) and the slowest ops.
    try: om = json.load(open(os.path.join(run_dir, "op_measurements.json")))
    except Exception as e: return {"not_run": str(e)}
    keep = ("device", "dtype", "op_clock", "steps", "peak_device_bytes", "device_used_at_peak_bytes",
            "device_total_bytes", "peak_rss_bytes", "step_device_s", "step_wall_s")
    r = {k: om[k] for k in keep if k in om}
    by_class = {}
    for o in om.get("ops", []):
        by_class[o["class"]] = by_class.get(o["class"], 0.0) + o["seconds"]
    r["seconds_by_class"] = dict(sorted(by_class.items(), key=lambda kv: -kv[1]))
    r["ops_seconds"] = sum(by_class.values())
    top = sorted(om.get("ops", []), key=lambda o: -o["seconds"])[:8]
    r["slowest_ops"] = [[o["op"], o["phase"], o["seconds"]] for o in top]
    f = run_json("tiny_cuda_calibrate")
    if f: r["calibrate_from_run"] = {k: f.get(k) for k in ("backend", "fit_relative_rms", "efficiencies")}
    return r
part("tiny_moe_cuda_profile", lambda: profile_summary(os.path.join(out, "tiny_cuda")))
report["profile_test"] = cases(os.path.join(out, "test_cuda.xml"), "profile")
def step_json(name):
    j = run_json(name)
    if isinstance(j, dict) and isinstance(j.get("ops"), list): j["ops"] = j["ops"][:12]  # the largest op kinds
    return j
part("medium_moe_step", lambda: step_json("medium_cuda"))
part("medium_moe_step_bf16", lambda: step_json("medium_cuda_bf16"))
part("timing", lambda: run_json("timing"))
# The targets against what this run measured (None: not measured in this run).
def at(d, *path):
    for p in path:
        try: d = d[p]
        except Exception: return None
    return d
def number(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None
def numbers(xs):
    return [x for x in map(number, xs) if x is not None]
def target(value, goal, higher=True):
    value = number(value)
    if value is None: return {"measured": None, "goal": goal, "met": None}
    return {"measured": value, "goal": goal, "met": value >= goal if higher else value <= goal}
def targets():
    t = report.get("timing") if isinstance(report.get("timing"), dict) else {}
    gemm_ratios = numbers(at(g, "ratio") for g in (t.get("gemm") or [])[1:])  # row 0 is the 8192³ ceiling
    mem = numbers(at(m, "vs_copy") for m in (t.get("memory") or []))
    experts = numbers([at(t, "experts_bf16", "ratio"), at(t, "experts_bf16", "one_call_ratio")])
    return {
        "dense_gemm_vs_cublas_min": target(min(gemm_ratios, default=None), 0.85),
        "grouped_experts_vs_dense_bf16": target(max(experts, default=None), 0.70),
        # The bf16 mode's attention: cuDNN's where it ran (attention_cudnn), else the own kernel's; both below.
        "attention_fwd_vs_bf16_ceiling": target(number(at(t, "attention_cudnn", "vs_measured_bf16_ceiling"))
                                                or at(t, "attention", "vs_measured_bf16_ceiling"), 0.50),
        "attention_fwd_own_vs_bf16_ceiling": target(at(t, "attention", "vs_measured_bf16_ceiling"), 0.50),
        "attention_fwd_cudnn_vs_bf16_ceiling": target(at(t, "attention_cudnn", "vs_measured_bf16_ceiling"), 0.50),
        "memory_bound_vs_copy_min": target(min(mem, default=None), 0.70),
        "tiny_moe_loss_max_rel_diff": target(at(report, "tiny_moe_loss", "max_rel_diff"), 1e-4, higher=False),
        "tiny_gpt_gelu_loss_max_rel_diff": target(at(report, "tiny_gpt_gelu_loss", "max_rel_diff"), 1e-4,
                                                  higher=False),
        "medium_moe_mfu_bf16": target(at(report, "medium_moe_step_bf16", "mfu_bf16"), 0.40),
        # bf16 mode within bf16 tolerance of fp32 over the tiny run (the loss, per step).
        "tiny_moe_bf16_vs_fp32_max_rel_diff": target(at(report, "tiny_moe_bf16_loss", "max_rel_diff"), 2e-2,
                                                     higher=False),
        # Residency: no parameter / gradient arena crosses the bus in a timed step.
        "medium_arena_copy_bytes_per_step": target(at(report, "medium_moe_step", "arena_copy_bytes_per_step"), 0,
                                                   higher=False),
    }
part("targets", targets)
if report_errors: report["report_errors"] = report_errors
if not have_gpu: report["note"] = "no GPU here: the GPU steps report skipped (exit 77) or did not run"
json.dump(report, open(os.path.join(out, "gpu-check.json"), "w"), indent=2)
print(json.dumps(report, indent=2))
