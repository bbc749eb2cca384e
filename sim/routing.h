// Routing model: how many of each GPU's assignments go to each expert in a step.
//
// EP drops come from imbalance, and the imbalance a balanced router leaves is
// local: spec/marin-architecture.md ("Routing variance comes mostly from variance
// across documents"). The synthetic generator therefore models documents:
//
//   1. Each GPU holds tokens_per_gpu tokens as windows of min(context, tokens_per_gpu)
//      tokens cut from a stream of packed documents (a renewal process: a window
//      starts inside a length-biased document, then whole documents follow, the
//      last one cut at the window edge). Documents longer than the context are
//      split into different sequences, which land on different GPUs; that is why
//      longer contexts mean fewer documents per GPU and more variance.
//   2. A low-rank topic mixture: K topics, each with a fixed distribution over
//      experts (symmetric Dirichlet with `topic_sharpness` per expert, drawn once
//      from `topic_seed`: it is a property of the trained router, not of a step).
//      Each document fragment mixes topics with weights ~ Dirichlet(concentration/K
//      each). Small concentration = specialised routing (each document sticks to
//      one topic's experts); large = every document routes like the average.
//   3. Top-k without replacement: a token's k experts are distinct, so an
//      expert's inclusion probability k*pi_e is at most 1; topic rows are
//      water-filled to respect that.
//   4. Quantile balancing (QB): the router bias equalises the *global* per-expert
//      load of the step. Modelled by Sinkhorn scaling of the (gpus, experts) rate
//      matrix: rows keep tokens*k, columns become equal.
//   5. Given the rates, a GPU's counts are multinomial(tokens*k, rates) with the
//      spread shrunk to top-k without replacement (a token's k experts are
//      distinct, so an expert's per-token variance is k p (1 - k p), not k p (1 - p)):
//      the per-token noise.
//
// A measured histogram (per-document or per-sequence expert counts, JSON, format
// below) can replace steps 1-3: units are drawn at random to fill each GPU.
//
//   RoutingModel m = ...;                       // e.g. load_drop_calibration()
//   RoutingShape s{.n_experts = 384, .top_k = 8, .gpus = 704,
//                  .tokens_per_gpu = 65536, .context = 4096};
//   RoutingGenerator gen(m, s);
//   std::mt19937_64 rng(1);
//   std::vector<int32_t> counts;                // (gpus, n_experts)
//   gen.sample_counts(rng, counts);
//
// Routing histogram JSON ("rackstep.routing_histogram/1"); the CPU engine dumps it:
//   {
//     "format": "rackstep.routing_histogram/1",
//     "source": "what run, which layer, which steps",
//     "n_experts": 384, "top_k": 8,
//     "unit": "document" | "sequence",
//     "entries": [ {"tokens": 812, "counts": [c_0, ..., c_383]}, ... ]
//   }
// counts[e] = assignments of the unit's tokens to expert e: each in 0..tokens, and
// they sum to tokens * top_k. Unknown keys are errors.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sim/base/dispatch.h"

namespace rackstep::sim {

struct DocLengths {
  enum class Kind { lognormal, exponential, fixed };
  Kind kind = Kind::lognormal;
  double mean_tokens = 1600;  // mean document length
  double sigma = 1.4;         // lognormal shape (log-space standard deviation)

  int64_t sample(std::mt19937_64& rng) const;
  // A document drawn with probability proportional to its length: the one a
  // random token (e.g. a window start) falls into.
  int64_t sample_length_biased(std::mt19937_64& rng) const;
};
DocLengths::Kind parse_doc_length_kind(const std::string& name);
std::string doc_length_kind_name(DocLengths::Kind k);

struct RoutingModel {
  DocLengths doc_lengths;
  int topics = 32;               // K, rank of the topic mixture
  double topic_sharpness = 0.1;  // Dirichlet parameter per expert of each topic's expert distribution
  uint64_t topic_seed = 1;       // which topic->expert map (fixed per trained router)
  double concentration = 1.0;    // per-document Dirichlet total over topics; smaller = more specialised
  // Routing affinity fades along a document: a token's expert rates mix a
  // document-wide topic mixture (weight persistent_share) with a local one drawn
  // afresh every coherence_tokens tokens (weight 1 - persistent_share). Both are
  // Dirichlet(concentration/K). coherence_tokens = 0: document-wide only.
  int64_t coherence_tokens = 0;
  double persistent_share = 1.0;
  // true: QB equalises every step's global expert load exactly (step 4 above).
  // false: QB works from past steps (the Marin trainer's bias comes from the
  // previous step's histogram), so a step's documents move its global load, and
  // the long-run load is `popularity`. This is what gives receiver drops.
  bool balance_each_step = true;
  std::vector<double> popularity;  // (n_experts) long-run share of assignments; empty = uniform
};

struct RoutingHistogram {
  std::string source;
  std::string unit = "document";  // "document" or "sequence"
  int64_t n_experts = 0;
  int top_k = 0;
  std::vector<int64_t> tokens;   // (units)
  std::vector<int32_t> counts;   // (units, n_experts)
};
// Strict reader: every violation is a UserError naming file, JSON path, expected and found.
RoutingHistogram load_routing_histogram(const std::string& path);
void write_routing_histogram(const std::string& path, const RoutingHistogram& h);

struct RoutingShape {
  int64_t n_experts = 384;
  int top_k = 8;
  int64_t gpus = 64;  // GPUs in the step (whole EP groups); QB balances over all of them
  int64_t tokens_per_gpu = 65536;
  int64_t context = 4096;
  int64_t window_tokens() const { return context < tokens_per_gpu ? context : tokens_per_gpu; }
};

class RoutingGenerator {
 public:
  RoutingGenerator(const RoutingModel& model, const RoutingShape& shape);
  RoutingGenerator(const RoutingHistogram& hist, const RoutingShape& shape);

  // Expected assignments per (GPU, expert) given this step's documents, after QB:
  // rates is (gpus, n_experts), each row sums to tokens_per_gpu * top_k.
  void sample_rates(std::mt19937_64& rng, std::vector<double>& rates) const;
  // Assignment counts per (GPU, expert): (gpus, n_experts), rows sum to tokens*k.
  void sample_counts(std::mt19937_64& rng, std::vector<int32_t>& counts) const;

  const RoutingShape& shape() const { return shape_; }
  bool synthetic() const { return hist_.counts.empty(); }
  const RoutingModel& model() const { return model_; }
  // (topics, n_experts) topic rows after water-filling and balancing; rows sum to 1.
  const std::vector<double>& topic_experts() const { return topic_experts_; }
  // E[sum over a GPU's document fragments of fragment_tokens^2]: the second moment the
  // analytic estimate needs (from 20,000 simulated windows of the length process).
  double fragment_square_sum() const { return fragment_square_sum_; }
  // The same for the local pieces (fragments cut every coherence_tokens).
  double piece_square_sum() const { return piece_square_sum_; }

 private:
  void add_synthetic_rates(std::mt19937_64& rng, double* row) const;
  void add_histogram_rates(std::mt19937_64& rng, double* row) const;
  template <typename Visit>
  void for_each_fragment(std::mt19937_64& rng, Visit&& visit) const;

  RoutingShape shape_;
  RoutingModel model_;
  RoutingHistogram hist_;
  std::vector<double> topic_experts_;  // (topics, n_experts)
  std::vector<double> unit_cumulative_tokens_;  // histogram: for length-biased unit draws
  double fragment_square_sum_ = 0;
  double piece_square_sum_ = 0;
};

// Water-fills p so that sum(p) = total and every p_i <= 1 (top-k inclusion
// probabilities); p must be non-negative with a positive sum, total <= p.size().
void water_fill(std::vector<double>& p, double total);
// Sinkhorn balancing of a (rows, cols) non-negative matrix: rows keep their sums,
// columns all end up equal (quantile balancing of the global expert load).
void balance_columns(std::vector<double>& m, int64_t rows, int64_t cols, int iterations = 8);

}  // namespace rackstep::sim
