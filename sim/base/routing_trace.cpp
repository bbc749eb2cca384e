#include "sim/base/routing_trace.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::sim {

namespace {

uint64_t fnv1a64(const char* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

template <typename T>
void put(std::string& out, T value) {
  char buf[sizeof(T)];
  std::memcpy(buf, &value, sizeof(T));
  out.append(buf, sizeof(T));
}

template <typename T>
T get(const std::string& in, size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}

}  // namespace

void write_routing_trace(const std::string& path, const RoutingTrace& t) {
  RS_CHECK(t.n_experts >= 1 && t.n_experts <= 65535, "expert ids are stored as u16");
  RS_CHECK(t.top_k >= 1 && t.top_k <= t.n_experts, "top-k picks distinct experts");
  RS_CHECK(t.layers() >= 1, "a trace records at least one MoE layer");
  RS_CHECK(static_cast<int64_t>(t.experts.size()) == t.layers() && static_cast<int64_t>(t.scores.size()) == t.layers(),
           "one expert and one score array per layer");
  const size_t n = t.tokens.size(), per_layer = n * static_cast<size_t>(t.top_k);
  for (int64_t l = 0; l < t.layers(); ++l)
    RS_CHECK(t.experts[l].size() == per_layer && t.scores[l].size() == per_layer, "(tokens, top_k) per layer");

  std::string payload;
  payload.reserve(t.source.size() + 4 * t.layer_index.size() + 16 * n + t.layer_index.size() * per_layer * 6);
  payload += t.source;
  for (int32_t l : t.layer_index) put<uint32_t>(payload, static_cast<uint32_t>(l));
  for (const TraceToken& tok : t.tokens) {
    put<uint32_t>(payload, tok.step);
    put<uint32_t>(payload, tok.sequence);
    put<uint32_t>(payload, tok.position);
    put<uint32_t>(payload, tok.document);
  }
  for (int64_t l = 0; l < t.layers(); ++l) {
    payload.append(reinterpret_cast<const char*>(t.experts[l].data()), per_layer * sizeof(uint16_t));
    payload.append(reinterpret_cast<const char*>(t.scores[l].data()), per_layer * sizeof(float));
  }

  std::string file(kRoutingTraceMagic, sizeof kRoutingTraceMagic);
  put<uint32_t>(file, kRoutingTraceVersion);
  put<uint32_t>(file, static_cast<uint32_t>(t.n_experts));
  put<uint32_t>(file, static_cast<uint32_t>(t.top_k));
  put<uint32_t>(file, static_cast<uint32_t>(t.layers()));
  put<uint32_t>(file, static_cast<uint32_t>(t.seq_len));
  put<uint32_t>(file, t.eval ? 1u : 0u);
  put<uint64_t>(file, static_cast<uint64_t>(n));
  put<uint64_t>(file, fnv1a64(payload.data(), payload.size()));
  put<uint32_t>(file, static_cast<uint32_t>(t.source.size()));
  file.append(12, '\0');
  RS_CHECK(file.size() == kRoutingTraceHeaderBytes, "header layout");
  file += payload;
  write_text_file_atomic(path, file);
}

RoutingTrace read_routing_trace(const std::string& path) {
  auto fail = [&](const std::string& field, const std::string& expected, const std::string& found) {
    throw UserError(path, field, expected, found);
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("", "a readable routing trace (rackstep train --routing-trace)", "no such file");
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  // The whole file is read at once: bound it before allocating.
  if (ec || size > (uint64_t(1) << 36)) fail("", "a routing trace of at most 64 GiB", ec ? ec.message() : std::to_string(size) + " bytes");
  std::string b(static_cast<size_t>(size), '\0');
  in.read(b.data(), static_cast<std::streamsize>(size));
  if (!in) fail("", "a readable routing trace", "a read error");
  if (b.size() < kRoutingTraceHeaderBytes)
    fail("header", "at least 64 bytes", std::to_string(b.size()) + " bytes");
  if (std::memcmp(b.data(), kRoutingTraceMagic, sizeof kRoutingTraceMagic) != 0)
    fail("magic", "\"RSROUTE\" (a rackstep routing trace)", "other bytes");
  const uint32_t version = get<uint32_t>(b, 8);
  if (version != kRoutingTraceVersion) fail("version", std::to_string(kRoutingTraceVersion), std::to_string(version));
  RoutingTrace t;
  t.n_experts = get<uint32_t>(b, 12);
  t.top_k = static_cast<int>(get<uint32_t>(b, 16));
  const uint64_t layers = get<uint32_t>(b, 20);
  t.seq_len = get<uint32_t>(b, 24);
  const uint32_t split = get<uint32_t>(b, 28);
  const uint64_t tokens = get<uint64_t>(b, 32);
  const uint64_t checksum = get<uint64_t>(b, 40);
  const uint64_t source_bytes = get<uint32_t>(b, 48);
  if (t.n_experts < 1 || t.n_experts > 65535) fail("n_experts", "1..65535", std::to_string(t.n_experts));
  if (t.top_k < 1 || t.top_k > t.n_experts)
    fail("top_k", "1..n_experts (" + std::to_string(t.n_experts) + ")", std::to_string(t.top_k));
  if (layers < 1 || layers > 4096) fail("layers", "1..4096", std::to_string(layers));
  if (t.seq_len < 1) fail("seq_len", "at least 1", std::to_string(t.seq_len));
  if (split > 1) fail("split", "0 (training) or 1 (evaluation)", std::to_string(split));
  t.eval = split == 1;
  const uint64_t k = static_cast<uint64_t>(t.top_k);
  // Every token costs at least 16 bytes, so the file size bounds the count
  // before any product can overflow.
  if (tokens > b.size() / 16) fail("tokens", "a count the file size allows", std::to_string(tokens));
  const uint64_t expected = kRoutingTraceHeaderBytes + source_bytes + 4 * layers + 16 * tokens + layers * tokens * k * 6;
  if (b.size() != expected)
    fail("size", std::to_string(expected) + " bytes for " + std::to_string(tokens) + " tokens, " +
                     std::to_string(layers) + " layers, top-" + std::to_string(k),
         std::to_string(b.size()) + " bytes");
  const uint64_t sum = fnv1a64(b.data() + kRoutingTraceHeaderBytes, b.size() - kRoutingTraceHeaderBytes);
  if (sum != checksum) fail("checksum", "the payload's FNV-1a 64", "a mismatch (the file is damaged)");

  size_t at = kRoutingTraceHeaderBytes;
  t.source = b.substr(at, source_bytes);
  at += source_bytes;
  for (uint64_t l = 0; l < layers; ++l, at += 4) t.layer_index.push_back(static_cast<int32_t>(get<uint32_t>(b, at)));
  t.tokens.resize(tokens);
  for (uint64_t i = 0; i < tokens; ++i, at += 16) {
    TraceToken& tok = t.tokens[i];
    tok.step = get<uint32_t>(b, at);
    tok.sequence = get<uint32_t>(b, at + 4);
    tok.position = get<uint32_t>(b, at + 8);
    tok.document = get<uint32_t>(b, at + 12);
    if (tok.position >= t.seq_len)
      fail("tokens/" + std::to_string(i) + "/position", "below seq_len " + std::to_string(t.seq_len),
           std::to_string(tok.position));
    if (i > 0 && tok.sequence < t.tokens[i - 1].sequence)
      fail("tokens/" + std::to_string(i) + "/sequence", "non-decreasing sequence numbers",
           std::to_string(tok.sequence) + " after " + std::to_string(t.tokens[i - 1].sequence));
  }
  const size_t per_layer = static_cast<size_t>(tokens * k);
  t.experts.resize(layers);
  t.scores.resize(layers);
  for (uint64_t l = 0; l < layers; ++l) {
    auto& e = t.experts[l];
    auto& s = t.scores[l];
    e.resize(per_layer);
    s.resize(per_layer);
    std::memcpy(e.data(), b.data() + at, per_layer * sizeof(uint16_t));
    at += per_layer * sizeof(uint16_t);
    std::memcpy(s.data(), b.data() + at, per_layer * sizeof(float));
    at += per_layer * sizeof(float);
    for (size_t i = 0; i < per_layer; ++i) {
      auto where = [&] { return "layers/" + std::to_string(l) + "/"; };
      if (e[i] >= t.n_experts)
        fail(where() + "experts/" + std::to_string(i), "an expert id below " + std::to_string(t.n_experts), std::to_string(e[i]));
      if (!std::isfinite(s[i])) fail(where() + "scores/" + std::to_string(i), "a finite router score", "NaN or Inf");
      const size_t first = i - i % k;
      for (size_t j = first; j < i; ++j)
        if (e[j] == e[i])
          fail(where() + "experts/" + std::to_string(i), "experts distinct within a token", "expert " + std::to_string(e[i]) + " twice");
    }
  }
  RS_CHECK(at == b.size(), "the size check covers every byte");
  return t;
}

}  // namespace rackstep::sim
