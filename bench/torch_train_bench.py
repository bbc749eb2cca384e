"""Training tokens/s of the tiny model in PyTorch: the baseline rackstep's engine is compared with.

    /usr/bin/python3 bench/torch_train_bench.py --threads 1 [--batch 8 --seq 256 --steps 8 --json]

The same model as bench/train_bench.cpp (models/zoo/tiny-moe.json), written once in
tests/reference/marin_ref.py and run here in float32 with the routed (sorted, per-expert
GEMM) MoE an efficient PyTorch implementation uses, the same batch shape (random bytes,
a document boundary every 100 tokens), and a whole training step: forward, backward,
MuonH / AdamH / Adam update (batched Newton-Schulz over expert stacks) and the
quantile-balancing bias for the next step. Wall time per step, best and median over
--steps timed steps after --warmup, and tokens per process CPU second. Use Debian's /usr/bin/python3 (python3-torch).
scripts/bench_train_vs_torch.sh runs this next to the C++ benchmark and prints the ratio.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))

import torch  # noqa: E402

import marin_ref  # noqa: E402


def init_params(cfg, specs, init_std_scale, seed):
    """Normal(0, init_std_scale / sqrt(d)) matrices, unit gains, identity SConv kernels
    (exec/model.h, CpuModel::init_params; the values differ, the distribution not)."""
    g = torch.Generator().manual_seed(seed)
    std = init_std_scale / math.sqrt(cfg.d)
    params = {}
    for name, shape, _ in specs:
        if name.endswith(".gain"):
            t = torch.ones(shape)
        elif name.endswith("sconv.kernel"):
            t = torch.zeros(shape)
            t[:, -1] = 1.0
        else:
            t = torch.randn(shape, generator=g) * std
        params[name] = t.requires_grad_(True)
    return params


def make_batch(vocab, B, T):
    """The C++ benchmark's batch: an LCG over bytes, document ids i / 100."""
    s, tokens, targets = 1, [], []
    for _ in range(B * T):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        tokens.append((s >> 33) % vocab)
        targets.append((s >> 13) % vocab)
    shape = (B, T)
    doc = (torch.arange(B * T) // 100).view(shape)
    pos = torch.arange(T).repeat(B, 1)
    return {"tokens": torch.tensor(tokens).view(shape), "targets": torch.tensor(targets).view(shape),
            "doc": doc, "pos": pos}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(REPO, "models", "zoo", "tiny-moe.json"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=0, help="0 = the model's seq_len")
    ap.add_argument("--steps", type=int, default=8, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--moe", choices=["routed", "dense"], default="routed")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    with open(a.model) as f:
        doc = json.load(f)
    cfg = marin_ref.ModelConfig(doc)
    T = a.seq or cfg.seq_len
    specs = marin_ref.param_specs(cfg)
    params = init_params(cfg, specs, doc.get("init_std_scale", 1.0), seed=1)
    batch = make_batch(cfg.vocab, a.batch, T)
    consts = {"norm_eps": cfg.norm_eps, "qk_norm_eps": cfg.norm_eps, "xsa_eps": 1e-6,
              "rope_theta": cfg.rope_theta, "attn_scale": None, "tie_margin": 0.0,
              "moe_impl": a.moe, "keep_router_logits": True}
    model = marin_ref.MarinRef(cfg, consts)
    buffers = {"layers.%d.moe.router.bias" % l: torch.zeros(cfg.experts) for l in range(cfg.layers)}
    hyper = {"beta1": cfg.beta1, "beta2": cfg.beta2, "adam_eps": 1e-8, "adam_weight_decay": 0.0,
             "ns_steps": cfg.ns_steps}
    lr = {marin_ref.MUONH: 1e-3, marin_ref.MUON: 1e-3, marin_ref.ADAMH: 3e-4, marin_ref.ADAM: 3e-4}
    with torch.no_grad():
        state = marin_ref.OptimizerState(specs, params)

    def step():
        for p in params.values():
            p.grad = None
        out = model.forward(params, buffers, batch)
        out["loss"].backward()
        with torch.no_grad():
            new = marin_ref.optimizer_update(specs, params, {n: p.grad for n, p in params.items()},
                                             hyper, state, lr)
            for n, t in new.items():
                params[n].copy_(t)
            for l, logits in enumerate(model.router_logits):
                buffers["layers.%d.moe.router.bias" % l] = marin_ref.qb_bias(logits, cfg.top_k)
        return out["loss"].item()

    for _ in range(a.warmup):
        step()
    times = []
    loss = 0.0
    cpu0 = time.process_time()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    cpu_s = time.process_time() - cpu0  # every thread of the process
    tokens = a.batch * T
    result = {"framework": "pytorch " + torch.__version__, "threads": torch.get_num_threads(),
              "batch": a.batch, "seq": T, "moe": a.moe, "steps": a.steps,
              "best_step_s": min(times), "median_step_s": statistics.median(times),
              "tokens_per_s": tokens / statistics.median(times), "best_tokens_per_s": tokens / min(times),
              "tokens_per_cpu_s": tokens * a.steps / cpu_s,
              "last_loss": loss}
    if a.json:
        print(json.dumps(result))
        return
    print("pytorch %s  threads %d  batch %dx%d  moe %s: %.0f tokens/s (median of %d steps, best %.0f), "
          "loss %.4f" % (torch.__version__, result["threads"], a.batch, T, a.moe, result["tokens_per_s"],
                         a.steps, result["best_tokens_per_s"], loss))


if __name__ == "__main__":
    main()
