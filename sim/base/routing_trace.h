// Routing traces: every token's routed experts, recorded from a real run, so
// drops can be replayed exactly (sim/routing_replay.h) and the routing model fitted to
// what a trained router does (sim/routing_fit.h).
//
// The CPU engine writes them (`rackstep train --routing-trace F` for training
// steps, `--routing-trace-eval F` for the last evaluation, exec/routing_trace.h);
// `rackstep drops --replay F` and `--fit F` read them.
//
// File format "RSROUTE" version 1, little-endian, written atomically:
//   offset  size  field
//        0     8  magic "RSROUTE\0"
//        8     4  version (1)
//       12     4  n_experts (1..65535)
//       16     4  top_k (1..n_experts)
//       20     4  layers: MoE layers recorded (>= 1)
//       24     4  seq_len: the context the run used
//       28     4  split: 0 = training steps, 1 = evaluation (eval windows are
//                 consecutive in the token stream, so documents are whole)
//       32     8  tokens: token records (the same tokens for every layer)
//       40     8  payload checksum (FNV-1a 64 of every byte after the header)
//       48     4  source_bytes: length of the UTF-8 source text
//       52    12  reserved (0)
//       64        source text[source_bytes]    what run, which model, which steps
//                 layer_index u32[layers]      the model layer of each recorded MoE layer
//                 token records[tokens]        u32 step, u32 sequence, u32 position, u32 document
//                 per layer, in header order:
//                   experts u16[tokens * top_k]  (token, j) chosen expert, distinct per token
//                   scores  f32[tokens * top_k]  (token, j) the router's combine weight
// File size must be exactly 64 + source_bytes + 4*layers + 16*tokens +
// layers*tokens*top_k*6. Token records are in run order: sequence numbers grow
// by one per sequence of the run (rows of each batch), positions run 0..seq_len-1
// inside a sequence, document ids are the data split's (a document cut by the
// window edge keeps its id in the next window).
//
//   RoutingTrace t = read_routing_trace("run/trace-eval.rsrt");
//   const uint16_t* e = t.experts[0].data();   // (tokens, top_k) of the first MoE layer
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rackstep::sim {

struct TraceToken {
  uint32_t step = 0;      // optimizer step the token was routed at
  uint32_t sequence = 0;  // sequence number within the trace
  uint32_t position = 0;  // position inside the sequence
  uint32_t document = 0;  // document id of the data split
};

struct RoutingTrace {
  std::string source;
  int64_t n_experts = 0;
  int top_k = 0;
  int64_t seq_len = 0;
  bool eval = false;
  std::vector<int32_t> layer_index;           // (layers)
  std::vector<TraceToken> tokens;             // (tokens)
  std::vector<std::vector<uint16_t>> experts; // (layers)(tokens, top_k)
  std::vector<std::vector<float>> scores;     // (layers)(tokens, top_k)

  int64_t layers() const { return static_cast<int64_t>(layer_index.size()); }
  int64_t token_count() const { return static_cast<int64_t>(tokens.size()); }
};

constexpr char kRoutingTraceMagic[8] = {'R', 'S', 'R', 'O', 'U', 'T', 'E', '\0'};
constexpr uint32_t kRoutingTraceVersion = 1;
constexpr size_t kRoutingTraceHeaderBytes = 64;

// Atomic (temp file + rename). RS_CHECKs the shapes: the recorder builds them.
void write_routing_trace(const std::string& path, const RoutingTrace& trace);
// Validates magic, version, sizes, checksum, expert ids (in range, distinct per
// token), finite scores and positions; each violation is one UserError naming
// the file, the field, what was expected and what was found.
RoutingTrace read_routing_trace(const std::string& path);

}  // namespace rackstep::sim
