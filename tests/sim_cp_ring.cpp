// Ring context parallelism's passes beside the attention kernels (issue 13): Transformer
// Engine's AttnFuncWithCPAndKVP2P (transformer_engine/pytorch/attention.py, v1.11) copies and
// accumulates each ring step's operands and results through HBM, which a stack running it
// (attention.cp_ring_te_passes, megatron-bridge-2025) prices on the attention op.
#include <catch2/catch.hpp>

#include "sim/calibration.h"
#include "sim/cost.h"
#include "sim/stack.h"
#include "tests/sim_llama8b.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;

TEST_CASE("TE's ring attention passes over two ranks, counted from its code", "[cp_ring]") {
  const double q = 1000.0, kv = 500.0;
  // Rank 0: forward K,V cat (4 KV), zeroed out (2 Q), step 1 copies q's second half (2 Q),
  // corrects the whole output at step 0 (6 Q) and its second half at step 1 (3 Q);
  // rank 1 copies KV's first half instead (2 KV) and corrects the whole output twice.
  const double fwd_r0 = 4 * kv + 2 * q + 2 * q + 6 * q + 3 * q;
  const double fwd_r1 = 4 * kv + 2 * q + 2 * kv + 6 * q + 6 * q;
  // Backward, rank 0: KV into the ring buffer (4 KV); step 0 (queries' second half, KV whole):
  // q, out, dout halves (6 Q), dQ half copied (2 Q), dK dV cat (4 KV), dKV copied (4 KV);
  // step 1 (diagonal): dQ half copied + half added (5 Q), cat (4 KV), dKV half added + half
  // copied (5 KV). Rank 1: step 0 (KV's first half): KV half (2 KV), dQ copied (4 Q), cat of
  // the half (2 KV), dKV half copied (2 KV); step 1: dQ added (6 Q), cat (4 KV), dKV added (6 KV).
  const double bwd_r0 = 4 * kv + 6 * q + 2 * q + 4 * kv + 4 * kv + 5 * q + 4 * kv + 5 * kv;
  const double bwd_r1 = 4 * kv + 2 * kv + 4 * q + 2 * kv + 2 * kv + 6 * q + 4 * kv + 6 * kv;
  const CpRingPasses p = cp_ring_attention_passes(q, kv, 2);
  CHECK(p.fwd_bytes == Approx((fwd_r0 + fwd_r1) / 2));
  CHECK(p.bwd_bytes == Approx((bwd_r0 + bwd_r1) / 2));
  CHECK(p.fwd_kernels > 0);
  CHECK(p.bwd_kernels > 0);
  const CpRingPasses none = cp_ring_attention_passes(q, kv, 1);
  CHECK(none.fwd_bytes == 0);
  CHECK(none.bwd_bytes == 0);
  CHECK(none.bwd_kernels == 0);
  // A longer ring runs more steps, each with its copies and accumulations.
  const CpRingPasses four = cp_ring_attention_passes(q, kv, 4);
  CHECK(four.fwd_bytes > p.fwd_bytes);
  CHECK(four.bwd_bytes > p.bwd_bytes);
}

TEST_CASE("a stack running TE's ring attention prices its passes on the attention op", "[cp_ring]") {
  const Llama8b m("topologies/zoo/hgx-h100.json");
  const OpEntry& attn = find_op(m.t, models::OpKind::kAttention);
  const Calibration te = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  REQUIRE(te.attention_cp_ring_te_passes);
  PriceContext one = m.ctx(te, 4096);  // a CP rank's 4,096 tokens of a sequence of 8,192
  PriceContext ring = one;
  ring.cp_ring = 2;
  const OpTime a = price_op(attn, one), b = price_op(attn, ring);
  // Llama 3 8B: 32 query heads and 8 KV heads of 128 on one GPU (TP 1).
  const double q = 4096.0 * 32 * 128, kv = 4096.0 * 8 * 256;
  const CpRingPasses p = cp_ring_attention_passes(q, kv, 2);
  const double bw = one.hbm_bw_bytes_per_s * te.mem_eff_elementwise;
  CHECK(b.fwd_s - a.fwd_s == Approx(p.fwd_bytes / bw + p.fwd_kernels * te.launch_overhead_s));
  CHECK(b.bwd_s - a.bwd_s == Approx(p.bwd_bytes / bw + p.bwd_kernels * te.launch_overhead_s));
  CHECK(b.fwd_flops == a.fwd_flops);  // the kernels' FLOPs do not change

  // A stack without TE's ring (Marin's base calibration) prices the kernels alone.
  const Calibration base = load_calibration();
  REQUIRE_FALSE(base.attention_cp_ring_te_passes);
  PriceContext plain = m.ctx(base, 4096);
  const OpTime c = price_op(attn, plain);
  plain.cp_ring = 2;
  CHECK(price_op(attn, plain).bwd_s == c.bwd_s);
}
