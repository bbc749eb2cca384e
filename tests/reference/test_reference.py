"""The C++ engine against the PyTorch reference, tensor by tensor (issue 7, Correctness).

    /usr/bin/python3 tests/reference/test_reference.py build/rackstep [--keep DIR] [--dump DIR]

Runs one training step of models/zoo/tiny-moe.json with `rackstep train --reference-dump`,
recomputes it in float64 PyTorch from the same weights and batch (tests/reference/marin_ref.py),
and compares logits, loss, every parameter gradient, and every parameter after one update of
each optimizer kind (MuonH, AdamH, Adam), by normalised error
    err = max|engine - reference| / max|reference|
(for the updates, also of the update itself: after - before, whose tolerance is
max(1e-4, 4 x its fp32 rounding floor)). Exits 1 on any error above the tolerance (1e-4; fp32
engine vs float64 reference), 0 when everything matches. Prints
"SKIP: ..." and exits 77 (CTest: skipped) when python3-torch / numpy are missing or the binary
has no `train --reference-dump` at all.
--dump DIR compares an existing dump instead of running the binary (debugging).
--variant shapes runs the one-step comparison instead on tiny-moe changed to every
shape the tiny model leaves out (VARIANTS below: MLA with a query latent, tied
embeddings, LayerNorm, a leading dense layer, a softmax router with auxiliary-loss
balancing and an applied router z-loss): its own ctest entry. --variant gpt-gelu and
--variant alibi-sinks run the zoo models of the mechanisms beyond the Marin block instead
(MODEL_VARIANTS: learned positions, biases, GeLU, dense; ALiBi, sinks, ReLU², MoE), and
--variant mla-mech puts them on the Marin block (MLA with biases and sinks); --variant
gpt-oss runs tests/models/tiny-gpt-oss-moe (the routed experts' biases and clamped SwiGLU).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

# CTest reads this exit status as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt).
SKIP = 77

try:
    import numpy as np  # noqa: E402
    import torch  # noqa: E402
except ImportError as e:
    print("SKIP: the PyTorch reference needs python3-torch and python3-numpy (%s); nothing compared" % e)
    sys.exit(SKIP)

import marin_ref  # noqa: E402
from dump import read_dump  # noqa: E402

MODEL = os.path.join(REPO, "models", "zoo", "tiny-moe.json")
# Changes to tiny-moe for --variant NAME (one JSON merge per top-level key).
VARIANTS = {
    "tied": {"tied_embeddings": True},
    "shapes": {
        "tied_embeddings": True,
        "attention": {"kind": "mla", "mla": {"kv_latent": 32, "q_latent": 48, "rope_dim": 16},
                      "kv_heads": 4, "local": {"kv_heads": 4}, "global": {"kv_heads": 4}},
        "norm": {"kind": "layernorm"},
        "moe": {"dense_layers": 1, "dense_width": 96, "router": "softmax", "balancing": "aux_loss",
                "aux_loss_weight": 0.05, "router_z_loss_applied": True, "router_z_loss_weight": 0.01},
    },
    # The new mechanisms on the Marin block: MLA with Q/K/V and output biases and sinks
    # (attention on the zero-padded v), learned positions, a GeLU dense layer and GeLU
    # shared experts with biases.
    "mla-mech": {
        "position_embedding": {"kind": "learned"},
        "attention": {"kind": "mla", "mla": {"kv_latent": 32, "q_latent": 48, "rope_dim": 16},
                      "kv_heads": 4, "local": {"kv_heads": 4}, "global": {"kv_heads": 4},
                      "qkv_bias": True, "o_bias": True, "sinks": True},
        "mlp": {"activation": "gelu", "bias": True},
        "moe": {"dense_layers": 1, "dense_width": 96},
    },
}
# Whole zoo models for --variant NAME (the one-step comparison on that file).
MODEL_VARIANTS = {
    "gpt-gelu": "tiny-gpt-gelu.json",          # learned positions, Q/K/V/O and MLP biases, GeLU, dense, tied
    "alibi-sinks": "tiny-alibi-sink-moe.json",  # ALiBi, attention sinks, biases, ReLU² shared expert, MoE
    "gpt-oss": "../../tests/models/tiny-gpt-oss-moe.json",  # the experts' biases and clamped SwiGLU, sinks
}


def merged(doc, change):
    """doc with change merged in, dicts recursively."""
    out = dict(doc)
    for k, v in change.items():
        out[k] = merged(doc[k], v) if isinstance(v, dict) and isinstance(doc.get(k), dict) else v
    return out
TOLERANCE = 1e-4
# Text the corpus is built from: files of this repository (always present, real prose and code).
CORPUS_FILES = ["README.md", "models/model.h", "models/layer_graph.h", "exec/kernels.h", "exec/optim.h"]


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def has_reference_dump(rackstep):
    r = run([rackstep, "train", "--help"])
    return r.returncode == 0 and "--reference-dump" in r.stdout


def make_dump(rackstep, work):
    """Builds a small multi-document corpus and runs one reference step; returns the dump dir
    (the corpus is in work/data)."""
    data = os.path.join(work, "data")
    files = [os.path.join(REPO, f) for f in CORPUS_FILES if os.path.exists(os.path.join(REPO, f))]
    r = run([rackstep, "data", "build", "--from", *files, "--out", data, "--split", "blank-lines",
             "--quiet"])
    if r.returncode != 0:
        sys.exit("FAIL: rackstep data build failed:\n" + r.stdout)
    out = os.path.join(work, "dump")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    cmd = [rackstep, "train", "--model", MODEL, "--data", data, "--out", os.path.join(work, "run"),
           "--reference-dump", out]
    print("$ " + " ".join(cmd), flush=True)
    r = run(cmd, env=env, cwd=REPO)
    if r.returncode != 0:
        sys.exit("FAIL: rackstep train --reference-dump exited %d:\n%s" % (r.returncode, r.stdout))
    return out


def f64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def consts_from_meta(cfg, meta):
    """Constants the spec leaves to the implementation, as the engine used them."""
    def get(key, default):
        return meta[key] if key in meta else default
    return {
        "norm_eps": get("norm_eps", cfg.norm_eps),
        "qk_norm_eps": get("qk_norm_eps", get("norm_eps", cfg.norm_eps)),
        "xsa_eps": get("xsa_eps", 1e-6),
        "rope_theta": get("rope_theta", cfg.rope_theta),
        "attn_scale": get("attn_scale", None),
        "rot_dims_local": get("rot_dims_local", None),
        "rot_dims_global": get("rot_dims_global", None),
        # fp32 logits carry ~1e-6 relative error; a choice that flips within this
        # gap of biased scores is a near-tie, not a bug.
        "tie_margin": 1e-4,
    }


def hyper_from_meta(cfg, meta):
    lr = meta["lr"]
    return {
        "lr": {marin_ref.MUONH: lr["muonh"], marin_ref.MUON: lr.get("muon", lr["muonh"]),
               marin_ref.ADAMH: lr["adamh"], marin_ref.ADAM: lr["adam"]},
        "beta1": meta.get("beta1", cfg.beta1),
        "beta2": meta.get("beta2", cfg.beta2),
        "adam_eps": meta.get("adam_eps", 1e-8),
        "adam_weight_decay": meta.get("adam_weight_decay", 0.0),
        "ns_steps": meta.get("ns_steps", cfg.ns_steps),
    }


def norm_err(engine, ref, floor=0.0):
    """max|engine - ref| / max(max|ref|, floor)."""
    engine = np.asarray(engine, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if engine.shape != ref.shape:
        return float("inf")
    scale = max(np.max(np.abs(ref)) if ref.size else 0.0, floor)
    diff = np.max(np.abs(engine - ref)) if ref.size else 0.0
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return float(diff / scale)


class Table:
    def __init__(self):
        self.rows = []  # (kind, name, err, tolerance, note)

    def add(self, kind, name, err, tol=TOLERANCE, note=""):
        self.rows.append((kind, name, err, tol, note))

    def failures(self):
        return [r for r in self.rows if not (r[2] <= r[3])]

    def print(self):
        print("%-8s %-42s %12s %10s  %s" % ("what", "tensor", "max rel err", "tolerance", ""))
        for kind, name, err, tol, note in self.rows:
            flag = "ok" if err <= tol else "MISMATCH"
            print("%-8s %-42s %12.3e %10.0e  %s %s" % (kind, name, err, tol, flag, note))
        by_kind = {}
        for kind, _, err, _, _ in self.rows:
            by_kind[kind] = max(by_kind.get(kind, 0.0), err)
        print("max by kind: " + ", ".join("%s %.3e" % kv for kv in by_kind.items()))


def check_names(cfg, dump, table):
    """The dump's parameters are exactly the layer graph's, with the same shapes."""
    specs = marin_ref.param_specs(cfg)
    want = {n: tuple(s) for n, s, _ in specs}
    have = {n: tuple(a.shape) for n, a in dump.with_prefix("param.").items()}
    problems = []
    for n in want:
        if n not in have:
            problems.append("missing param." + n)
        elif have[n] != want[n]:
            problems.append("param.%s shape %s, reference %s" % (n, have[n], want[n]))
    problems += ["unexpected param." + n for n in have if n not in want]
    for p in problems:
        print("  " + p)
    table.add("names", "param names and shapes", 0.0 if not problems else float("inf"),
              note="%d tensors" % len(want))
    return specs, not problems


def compare(dump):
    meta = dump.meta
    cfg = marin_ref.ModelConfig.from_json(MODEL)
    table = Table()
    specs, names_ok = check_names(cfg, dump, table)
    if not names_ok:
        return table
    consts = consts_from_meta(cfg, meta)
    params = {n: f64(dump["param." + n]).requires_grad_(True) for n, _, _ in specs}
    buffers = {n: f64(a) for n, a in dump.with_prefix("buffer.").items()}
    routes = {n: torch.from_numpy(a.astype(np.int64)) for n, a in dump.with_prefix("route.").items()}
    batch = {k: torch.from_numpy(dump["batch." + k].astype(np.int64)) for k in ("tokens", "targets", "doc", "pos")}

    model = marin_ref.MarinRef(cfg, consts)
    out = model.forward(params, buffers, batch, routes)
    out["loss"].backward()
    rr = model.routing_report
    if rr["mismatches"]:
        print("routing differs beyond an fp32 near-tie at %d token-layers; first: %s" % (
            rr["mismatches"], rr["first_mismatch"]))
    table.add("route", "expert choice", float(rr["mismatches"]) / max(1, rr["tokens"]), tol=0.0,
              note="%d tokens x layers, %d differ, %d fp32 near-ties (engine's choice used)%s" % (
                  rr["tokens"], rr["mismatches"], rr["near_ties"], "" if routes else " (no route.* in dump)"))

    table.add("forward", "logits", norm_err(dump["logits"], out["logits"].detach().numpy()))
    for name in ("loss", "ce", "z_loss"):
        if name in dump:
            table.add("forward", name, norm_err(dump[name], out[name].detach().numpy()),
                      note="engine %.8f ref %.8f" % (float(dump[name]), out[name].item()))
    # A gradient that is zero by symmetry (the key bias without sinks: softmax does not
    # change when every score of a row shifts by q.b) is, in the engine, a sum over the
    # batch's N tokens that cancels: its fp32 rounding can reach N 2^-24 times the terms'
    # scale (Higham, the recursive summation bound). Such tensors are measured against
    # that floor, with the largest gradient as the scale.
    ref_grads = {n: (np.zeros(params[n].shape) if params[n].grad is None else params[n].grad.numpy())
                 for n, _, _ in specs}  # None: the loss does not depend on it (a selection-only bias)
    tokens = batch["tokens"].numel()
    floor = tokens * 2.0 ** -24 * max(float(np.max(np.abs(g))) for g in ref_grads.values())
    for n, _, group in specs:
        if "grad." + n not in dump:
            table.add("grad", n, float("inf"), note="missing from dump")
            continue
        small = float(np.max(np.abs(ref_grads[n]))) < floor
        table.add("grad", n, norm_err(dump["grad." + n], ref_grads[n], floor),
                  note="reference ~0 (max %.1e): against N 2^-24 x the largest gradient, %.1e" % (
                      float(np.max(np.abs(ref_grads[n]))), floor) if small else "")

    # One update of each optimizer kind, from the engine's own gradients, so this
    # checks the optimizer alone (the gradients were checked above).
    hyper = hyper_from_meta(cfg, meta)
    before = {n: f64(dump["param." + n]) for n, _, _ in specs}
    grads = {n: f64(dump["grad." + n]) for n, _, _ in specs if "grad." + n in dump}
    after_ref = marin_ref.optimizer_step(cfg, [s for s in specs if s[0] in grads], before, grads, hyper)
    for n, _, group in specs:
        if "after." + n not in dump or n not in after_ref:
            table.add("step", n, float("inf"), note="missing from dump")
            continue
        engine_after = dump["after." + n].astype(np.float64)
        ref_after = after_ref[n].numpy()
        table.add("step:" + group, n, norm_err(engine_after, ref_after))
        ref_delta = ref_after - before[n].numpy()
        floor = fp32_floor(ref_after, ref_delta)
        table.add("delta:" + group, n, norm_err(engine_after - before[n].numpy(), ref_delta),
                  tol=max(TOLERANCE, DELTA_FLOOR_FACTOR * floor), note="update itself; fp32 floor %.1e" % floor)
    return table


# ---------------------------------------------------------------------------
# Several consecutive steps (tests/reference/dump_steps.cpp): momentum carried across
# updates, a non-zero quantile-balancing bias, simulated EP drops.

STEPS = 3
# Per-expert capacity at 1.25x the balanced load on 2 virtual EP ranks: drops a few
# percent of the assignments of the tiny model (the keep mask is the engine's).
STEPS_DISPATCH = ["--dispatch", "capacity", "--ep", "2", "--receiver-cf", "1.25"]
# A bias computed by the reference from the engine's own router logits must equal the
# engine's: same histogram, same walk, fp32 rounding of the result only.
QB_TOLERANCE = 1e-6


def steps_binary(rackstep):
    return os.path.join(os.path.dirname(os.path.abspath(rackstep)), "tests", "reference_dump_steps")


def make_steps_dump(binary, work):
    out = os.path.join(work, "steps")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    cmd = [binary, "--model", MODEL, "--data", os.path.join(work, "data"), "--out", out,
           "--steps", str(STEPS), *STEPS_DISPATCH]
    print("$ " + " ".join(cmd), flush=True)
    r = run(cmd, env=env, cwd=REPO)
    if r.returncode != 0:
        sys.exit("FAIL: %s exited %d:\n%s" % (binary, r.returncode, r.stdout))
    print(r.stdout, end="")
    return out


def qb_bias(logits, k, bins, lo, hi, fp32):
    """exec/kernels.h qb_histogram + qb_bias_from_histogram, written again: per expert, the
    (1 - k/E)-quantile of its logits from a histogram of `bins` bins over [lo, hi] (edge
    bins take the outliers), linearly interpolated inside the bin; bias = -quantile.
    fp32: the logits are the engine's float32 values (x - lo is then a float32 difference,
    as in C++)."""
    N, E = logits.shape
    per_unit = bins / (float(hi) - float(lo))
    if fp32:
        pos = (logits.astype(np.float32) - np.float32(lo)).astype(np.float64) * per_unit
    else:
        pos = (logits.astype(np.float64) - float(lo)) * per_unit
    b = np.clip(np.floor(pos), 0, bins - 1).astype(np.int64)
    width = (float(hi) - float(lo)) / bins
    level = 1.0 - k / E
    bias = np.zeros(E)
    for e in range(E):
        counts = np.bincount(b[:, e], minlength=bins)
        target = level * counts.sum()
        below, j = 0.0, 0
        while j < bins - 1 and below + counts[j] < target:
            below += counts[j]
            j += 1
        frac = (target - below) / counts[j] if counts[j] > 0 else 0.0
        bias[e] = -(lo + (j + min(max(frac, 0.0), 1.0)) * width)
    return bias.astype(np.float32)


def compare_steps(steps_dir):
    """Step s: forward and gradients at the engine's parameters, bias and keep mask (each
    step on its own); the optimizer as one chain over all steps (the reference's own
    moments and parameters from step 0 on, fed the engine's gradients), so momentum,
    second moments, the bias correction and the LR schedule are checked across steps;
    the QB bias for step s + 1 from step s's router logits."""
    cfg = marin_ref.ModelConfig.from_json(MODEL)
    specs = marin_ref.param_specs(cfg)
    table = Table()
    dirs = sorted(d for d in os.listdir(steps_dir) if d.startswith("step"))
    dumps = [read_dump(os.path.join(steps_dir, d)) for d in dirs]
    if len(dumps) != STEPS:
        table.add("steps", "step dumps", float("inf"), note="%d found, %d expected" % (len(dumps), STEPS))
        return table
    chain = {n: f64(dumps[0]["param." + n]) for n, _, _ in specs}
    state = marin_ref.OptimizerState(specs, chain)
    for s, dump in enumerate(dumps):
        meta = dump.meta
        tag = "s%d:" % s
        consts = consts_from_meta(cfg, meta)
        consts["keep_router_logits"] = True
        params = {n: f64(dump["param." + n]).requires_grad_(True) for n, _, _ in specs}
        buffers = {n: f64(a) for n, a in dump.with_prefix("buffer.").items()}
        routes = {n: torch.from_numpy(a.astype(np.int64)) for n, a in dump.with_prefix("route.").items()}
        batch = {k: torch.from_numpy(dump["batch." + k].astype(np.int64))
                 for k in ("tokens", "targets", "doc", "pos")}
        bias_max = max([float(np.max(np.abs(b))) for b in dump.with_prefix("buffer.").values()] or [0.0])
        keeps = [a for n, a in dump.with_prefix("route.").items() if n.endswith(".keep")]
        dropped = int(sum(int((a == 0).sum()) for a in keeps))
        table.add(tag + "setup", "QB bias in use, drops", 0.0 if (s == 0 or bias_max > 0) and keeps and dropped else
                  float("inf"), note="max|bias| %.3g, %d of %d assignments dropped (engine's keep mask)" % (
                      bias_max, dropped, sum(a.size for a in keeps)))

        model = marin_ref.MarinRef(cfg, consts)
        out = model.forward(params, buffers, batch, routes)
        out["loss"].backward()
        rr = model.routing_report
        table.add(tag + "route", "expert choice", float(rr["mismatches"]) / max(1, rr["tokens"]), tol=0.0,
                  note="%d differ, %d fp32 near-ties" % (rr["mismatches"], rr["near_ties"]))
        table.add(tag + "fwd", "logits", norm_err(dump["logits"], out["logits"].detach().numpy()))
        for name in ("loss", "ce", "z_loss"):
            table.add(tag + "fwd", name, norm_err(dump[name], out[name].detach().numpy()),
                      note="engine %.8f ref %.8f" % (float(dump[name]), out[name].item()))
        worst = ("", 0.0)
        for l, logits in enumerate(model.router_logits):
            name = "layers.%d.moe.logits" % l
            err = norm_err(dump["router." + name], logits.numpy())
            table.add(tag + "fwd", "router " + name, err)
        for n, _, _ in specs:
            err = norm_err(dump["grad." + n], params[n].grad.numpy())
            worst = max(worst, (n, err), key=lambda x: x[1])
            table.add(tag + "grad", n, err)

        # Quantile balancing: the bias the engine will use next step.
        k, bins, lo, hi = cfg.top_k, int(meta["qb_bins"]), float(meta["qb_lo"]), float(meta["qb_hi"])
        for l, logits in enumerate(model.router_logits):
            p = "layers.%d.moe." % l
            engine_next = dump["next." + p + "router.bias"].astype(np.float64)
            from_engine = qb_bias(dump["router." + p + "logits"], k, bins, lo, hi, fp32=True)
            table.add(tag + "qb", p + "router.bias (engine logits)", norm_err(engine_next, from_engine),
                      tol=QB_TOLERANCE)
            # From the reference's own float64 logits: a logit within fp32 rounding of a
            # bin edge may change bins, moving the quantile by a fraction of a bin.
            own = qb_bias(logits.numpy(), k, bins, lo, hi, fp32=False)
            table.add(tag + "qb", p + "router.bias (ref logits)", norm_err(engine_next, own),
                      tol=(hi - lo) / bins / max(1e-30, float(np.max(np.abs(own)))),
                      note="tolerance one bin width")

        # The optimizer chain.
        hyper = hyper_from_meta(cfg, meta)
        grads = {n: f64(dump["grad." + n]) for n, _, _ in specs}
        before = {n: t.clone() for n, t in chain.items()}
        chain = marin_ref.optimizer_update(specs, chain, grads, hyper, state, hyper["lr"])
        for n, _, group in specs:
            engine_after = dump["after." + n].astype(np.float64)
            ref_after = chain[n].numpy()
            table.add(tag + "step:" + group, n, norm_err(engine_after, ref_after))
            ref_delta = ref_after - before[n].numpy()
            floor = fp32_floor(ref_after, ref_delta)
            table.add(tag + "delta:" + group, n,
                      norm_err(engine_after - dump["param." + n].astype(np.float64), ref_delta),
                      tol=max(TOLERANCE, DELTA_FLOOR_FACTOR * floor), note="fp32 floor %.1e" % floor)
        if s + 1 < len(dumps):
            nxt = dumps[s + 1]
            same = all(np.array_equal(dump["after." + n], nxt["param." + n]) for n, _, _ in specs)
            same = same and all(np.array_equal(dump["next." + n], nxt["buffer." + n])
                                for n in [x[len("next."):] for x in dump.names() if x.startswith("next.")])
            table.add(tag + "carry", "after/next == step %d param/buffer" % (s + 1), 0.0 if same else float("inf"))
    momentum = max(float(state.m[n].abs().max()) for n, _, g in specs if g == marin_ref.MUONH)
    table.add("steps", "momentum carried", 0.0 if momentum > 0 else float("inf"),
              note="max|MuonH momentum| after %d steps %.3g" % (len(dumps), momentum))
    return table


# The update after - before is ~lr times smaller than the weights (lr ~ 2e-4 at
# the first warmup step), so the engine cannot hold it more exactly than the
# fp32 rounding of the weights allows: floor = 2^-24 max|W| / max|update|. The
# weights are rounded twice (the step, then the hyperball rescale), so the
# update may err by a few floors; a wrong LR, sign or normalisation errs by ~1.
DELTA_FLOOR_FACTOR = 4.0


def fp32_floor(after, delta):
    scale = np.max(np.abs(delta))
    return float(2.0 ** -24 * np.max(np.abs(after)) / scale) if scale > 0 else 0.0


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit("usage: test_reference.py <rackstep binary> [--keep DIR] [--dump DIR] [--steps-dump DIR]")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    rackstep = args[0]
    global MODEL
    variant = args[args.index("--variant") + 1] if "--variant" in args else None
    if variant is not None and variant not in VARIANTS and variant not in MODEL_VARIANTS:
        sys.exit("usage: --variant one of %s" % ", ".join(list(VARIANTS) + list(MODEL_VARIANTS)))
    keep = args[args.index("--keep") + 1] if "--keep" in args else None
    given = args[args.index("--dump") + 1] if "--dump" in args else None
    given_steps = args[args.index("--steps-dump") + 1] if "--steps-dump" in args else None
    work = None
    if given or given_steps:
        dump_dir, steps_dir = given, given_steps
    else:
        if not has_reference_dump(rackstep):
            print("SKIP: %s has no `train --reference-dump` (the training command is not built yet); "
                  "nothing compared" % rackstep)
            return SKIP
        binary = steps_binary(rackstep)
        if not os.path.exists(binary):
            sys.exit("FAIL: %s not found (build the target reference_dump_steps)" % binary)
        work = keep or tempfile.mkdtemp(prefix="rackstep_ref_")
        os.makedirs(work, exist_ok=True)
        if variant in MODEL_VARIANTS:
            MODEL = os.path.join(REPO, "models", "zoo", MODEL_VARIANTS[variant])
            print("variant %s: %s" % (variant, MODEL))
        elif variant:
            doc = merged(json.load(open(MODEL)), VARIANTS[variant])
            doc["name"] += "-" + variant
            MODEL = os.path.join(work, "tiny-moe-%s.json" % variant)
            json.dump(doc, open(MODEL, "w"), indent=1)
            print("variant %s: %s" % (variant, json.dumps(VARIANTS[variant])))
        dump_dir = make_dump(rackstep, work)
        steps_dir = None if variant else make_steps_dump(binary, work)
    tables = []
    try:
        if dump_dir:
            print("== one step from the initial weights (rackstep train --reference-dump)")
            tables.append(compare(read_dump(dump_dir)))
            tables[-1].print()
        if steps_dir:
            print("== %d consecutive steps, QB bias, drops (reference_dump_steps %s)" % (STEPS, " ".join(STEPS_DISPATCH)))
            tables.append(compare_steps(steps_dir))
            tables[-1].print()
    finally:
        if work and not keep:
            shutil.rmtree(work, ignore_errors=True)
    rows = sum(len(t.rows) for t in tables)
    bad = sum(len(t.failures()) for t in tables)
    if bad:
        print("FAIL: %d of %d comparisons above tolerance" % (bad, rows))
        return 1
    print("PASS: %d comparisons within tolerance" % rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
