#include "sim/emit_run.h"

#include <filesystem>
#include <sstream>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "models/model.h"
#include "sim/base/source_dir.h"
#include "sim/calibration.h"
#include "sim/stack.h"

namespace rackstep::sim {

namespace fs = std::filesystem;

namespace {

// The `rackstep train` flags that run layout.json with the CPU engine: the
// layout holds the processes (data ranks), EP with its transport and the batch.
std::string train_flags() {
  return "--model \"$DIR/model.json\" --data \"$DATA\" --layout \"$DIR/layout.json\" --steps \"$STEPS\" "
         "--threads \"$THREADS\" --profile --out \"$RUN\"";
}

std::string feedback() {
  return "\"$RACKSTEP\" calibrate --from-run \"$RUN\" --out \"$RUN/calibration\" --topology \"$DIR/cluster.json\" "
         "--calibration \"$DIR/calibration.json\"\n"
         "\"$RACKSTEP\" compare --measured \"$RUN\" --cluster \"$DIR/cluster.json\" --calibration "
         "\"$DIR/calibration.json\" -o \"$RUN/compare.json\"\n";
}

// Where the scenario's cluster file points: a system file, or a cluster file
// naming one next to it. Returns the system JSON with the scenario's domain
// count and healthy GPUs per domain written into it.
nlohmann::json scenario_system(const Scenario& s, std::string* source) {
  const nlohmann::json scen = load_json_file(s.file);
  const std::string rel = scen.at("cluster").at("file").get<std::string>();
  std::string path = fs::path(rel).is_absolute() ? rel : (fs::path(s.file).parent_path() / rel).string();
  if (std::error_code ec; !fs::exists(path, ec)) path = (fs::path(rackstep::source_dir()) / rel).string();
  nlohmann::json doc = load_json_file(path);
  *source = path;
  if (doc.contains("system")) {
    const std::string sys = (fs::path(path).parent_path() / doc["system"].get<std::string>()).string();
    doc = load_json_file(sys);
    *source = path + " (system " + sys + ")";
  }
  doc["domains"] = s.cluster.domains;
  if (doc.contains("domain") && doc["domain"].contains("healthy_gpus") &&
      doc["domain"]["healthy_gpus"].value("value", 0.0) != static_cast<double>(s.cluster.gpus_per_domain)) {
    doc["domain"]["healthy_gpus"] = {{"value", s.cluster.gpus_per_domain},
                                     {"source", "the scenario's healthy_gpus_per_domain (" + s.file + ")"}};
  }
  return doc;
}

}  // namespace

void emit_run(const std::string& dir, const EmitRunInputs& in, const Layout& layout, const Prediction& prediction) {
  const std::string cal = in.calibration.empty() ? default_calibration_path() : in.calibration;
  EmitRunDocs d;
  d.model = load_json_file(in.model);
  d.cluster = load_json_file(in.cluster);
  d.calibration = load_json_file(cal);
  d.sources = {{"model", in.model}, {"cluster", in.cluster}, {"calibration", cal}};
  emit_run_docs(dir, d, layout, prediction);
}

void emit_run_docs(const std::string& dir, const EmitRunDocs& d, const Layout& layout, const Prediction& prediction) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir, "", "a directory for the run", ec.message());
  const models::ModelConfig m = models::parse_model(d.model, d.sources.value("model", "model"));
  write_json_file_atomic((fs::path(dir) / "model.json").string(), d.model);
  write_json_file_atomic((fs::path(dir) / "cluster.json").string(), d.cluster);
  write_json_file_atomic((fs::path(dir) / "calibration.json").string(), d.calibration);
  write_json_file_atomic((fs::path(dir) / "layout.json").string(), layout_to_json(layout));
  nlohmann::json p = prediction_to_json(prediction);
  p["sources"] = d.sources;
  write_json_file_atomic((fs::path(dir) / "prediction.json").string(), p);

  const int64_t procs = layout.gpus();
  const std::string flags = train_flags();
  const std::string head =
      "#!/usr/bin/env bash\n"
      "# Runs layout.json of model.json (" + describe(layout) + ") with `rackstep train --layout`, one process per\n"
      "# rank, then refits from its profile and compares with prediction.json. Written by `" + d.written_by + "`.\n"
      "set -euo pipefail\n"
      "DIR=$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\n"
      ": \"${DATA:?set DATA to a dataset from rackstep data build}\"\n"
      "THREADS=${THREADS:-1}\nSTEPS=${STEPS:-20}\nRUN=${RUN:-$DIR/run}\nRACKSTEP=${RACKSTEP:-rackstep}\n"
      "# MPIRUN_FLAGS: e.g. \"--oversubscribe --allow-run-as-root\"\n";
  std::string mpi = head;
  mpi += procs > 1 ? "mpirun ${MPIRUN_FLAGS:-} -np " + std::to_string(procs) + " -x OMP_NUM_THREADS=$THREADS \"$RACKSTEP\" train " + flags + "\n"
                   : "\"$RACKSTEP\" train " + flags + "\n";
  mpi += feedback();
  write_text_file_atomic((fs::path(dir) / "launch-mpirun.sh").string(), mpi);
  std::string slurm = "#!/usr/bin/env bash\n#SBATCH --job-name=rackstep-" + m.name + "\n#SBATCH --ntasks=" +
                      std::to_string(procs) + "\n#SBATCH --cpus-per-task=${THREADS:-1}\n" + head.substr(head.find('\n') + 1);
  slurm += "srun --ntasks=" + std::to_string(procs) + " \"$RACKSTEP\" train " + flags + "\n" + feedback();
  write_text_file_atomic((fs::path(dir) / "launch-slurm.sbatch").string(), slurm);
  fs::permissions(fs::path(dir) / "launch-mpirun.sh", fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add, ec);
}

EmitRunDocs size_candidate_docs(const Scenario& s, const CandidateResult& c) {
  EmitRunDocs d;
  d.written_by = "rackstep size --emit-run";
  std::string model_src;
  if (c.origin.rfind("zoo file", 0) == 0) {
    d.model = load_json_file(c.model.source_file);
    model_src = c.model.source_file;
  } else if (c.origin == "inline config") {
    const nlohmann::json scen = load_json_file(s.file);
    for (const auto& cand : scen.at("candidates")) {
      if (!cand.contains("inline")) continue;
      if (cand.value("name", cand["inline"].value("name", std::string())) != c.name) continue;
      d.model = cand["inline"];
      model_src = s.file + " (inline candidate " + c.name + ")";
    }
  }
  if (d.model.is_null()) {
    throw UserError(s.file, "/candidates", "a chosen candidate from a model file or an inline config for --emit-run",
                    c.name + " (" + c.origin + ": no model JSON to launch; put its shape in a model file)");
  }
  d.model["name"] = c.name;
  std::string cluster_src;
  d.cluster = scenario_system(s, &cluster_src);
  d.calibration = load_json_file(default_calibration_path());
  std::string cal_src = default_calibration_path();
  if (!s.stack.empty()) {
    const Stack st = load_stack(stack_path(s.stack));
    d.calibration.merge_patch(st.calibration_overrides);
    cal_src += " with the overrides of stack " + st.file;
  }
  d.sources = {{"model", model_src}, {"cluster", cluster_src}, {"calibration", cal_src}, {"scenario", s.file}};
  return d;
}

}  // namespace rackstep::sim
