// The token embedding's price (sim/cost.cpp embedding_lookup_time, issue 13): a lookup reads the
// micro-batch's rows, not the table (F.embedding / Megatron-Core's VocabParallelEmbedding
// forward), and its backward zero-fills a table-sized gradient shard before the sorted segment
// sums write the looked-up rows (PyTorch EmbeddingBackwardKernel.cu embedding_backward_cuda_kernel).
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "sim/stack.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

}  // namespace

TEST_CASE("The embedding's forward reads the looked-up rows; its backward zero-fills the table's gradient shard",
          "[embedding]") {
  const topologies::SystemSpec sys = topologies::load_system(src("topologies/zoo/grand-teton-h100.json"));
  const Calibration cal = stack_calibration(load_stack(stack_path("megatron-lm")));
  const OpTable t =
      build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const OpEntry& emb = find_op(t, models::OpKind::kEmbedding);
  REQUIRE(emb.param_elems == 128256.0 * 4096.0);  // Llama 3's 128,256 × 4,096 table
  OpEntry big = emb;  // the same lookup into a table twice the size
  big.param_elems *= 2.0;

  for (const double tp : {1.0, 8.0}) {
    INFO("tp " << tp);
    PriceContext ctx = device_price_context(sys.gpu, cal);
    ctx.tokens = 8192;
    ctx.seq = 8192;
    ctx.tp = tp;
    const OpTime small_t = price_op(emb, ctx), big_t = price_op(big, ctx);
    // Every TP rank looks up all 8,192 tokens: the ids (8 B) and 4,096 bf16 elements read and
    // written per token, the out-of-shard rows (7/8 at TP 8) zeroed after; no table pass.
    const double masked = (tp - 1.0) / tp;
    const double fwd_bytes = 8192.0 * (8.0 + 4096.0 * 2.0 * (2.0 + masked));
    const double launches = (tp > 1.0 ? 2.0 : 1.0) * cal.launch_overhead_s;
    CHECK(small_t.fwd_s == Approx(fwd_bytes / (ctx.hbm_bw_bytes_per_s * cal.mem_eff_lookup) + launches).epsilon(1e-9));
    CHECK(big_t.fwd_s == Approx(small_t.fwd_s).epsilon(1e-12));
    // The backward grows with the table only by the zero fill of the extra gradient shard (bf16).
    const double fill_s = emb.param_elems / tp * 2.0 / (ctx.hbm_bw_bytes_per_s * cal.mem_eff_lookup);
    CHECK(big_t.bwd_s - small_t.bwd_s == Approx(fill_s).epsilon(1e-9));
    CHECK(small_t.bwd_s > fill_s);
  }
}
