#include "exec/resources.h"

#include <unistd.h>

#include <cstdio>

#include "sim/base/check.h"

namespace rackstep::exec {

double training_memory_lower_bound_bytes(const models::LayerGraph& g, int64_t batch, int64_t seq) {
  const double params = models::count_params(g).total;
  const double logits = 2.0 * static_cast<double>(batch) * static_cast<double>(seq) * static_cast<double>(g.model.vocab);
  return 4.0 * (4.0 * params + logits);
}

void check_training_memory(const models::LayerGraph& g, int64_t batch, int64_t seq, const std::string& model_path) {
  const double need = training_memory_lower_bound_bytes(g, batch, seq);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_bytes = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return;  // unknown: nothing to compare against
  const double have = static_cast<double>(pages) * static_cast<double>(page_bytes);
  if (need <= have) return;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "a model that fits this machine's %.1f GiB (training needs at least %.1f GiB: 16 bytes per "
                "parameter plus the logits of %lld x %lld tokens)",
                have / (1u << 30), need / (1u << 30), static_cast<long long>(batch), static_cast<long long>(seq));
  throw UserError(model_path, "", buf, std::to_string(models::count_params(g).total / 1e9) + "B parameters");
}

}  // namespace rackstep::exec
