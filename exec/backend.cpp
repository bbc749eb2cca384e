// The backend registry (exec/backend.h).
#include "exec/backend.h"

#include <map>
#include <mutex>

#include "exec/cpu/backend.h"
#include "models/check.h"

namespace rackstep::exec {

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_backend(const std::string& name, BackendFactory make) {
  RS_CHECK(name != "cpu", "the CPU backend is built in");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(make);
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names = {"cpu"};
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& [name, make] : r.factories)
    if (make()) names.push_back(name);
  return names;
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  BackendFactory make;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    if (auto it = r.factories.find(name); it != r.factories.end()) make = it->second;
  }
  std::unique_ptr<Backend> b = make ? make() : nullptr;
  if (b) return b;
  std::string names;
  for (const std::string& n : available_backends()) names += (names.empty() ? "" : ", ") + n;
  throw UserError("backend: expected one available here (" + names + "), found '" + name + "'");
}

}  // namespace rackstep::exec
