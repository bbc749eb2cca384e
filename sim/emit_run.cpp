#include "sim/emit_run.h"

#include <filesystem>
#include <sstream>

#include "models/check.h"
#include "models/json_io.h"
#include "models/model.h"
#include "sim/calibration.h"

namespace rackstep::sim {

namespace fs = std::filesystem;

namespace {

// The `rackstep train` flags that run this layout with the CPU engine: one
// process per data rank, the global batch in sequences, EP over processes.
std::string train_flags(const Layout& l, const models::ModelConfig& m) {
  const int64_t seq = l.seq(m);
  const int64_t tokens = l.tokens_per_step > 0 ? l.tokens_per_step : m.recipe.batch_seqs * seq;
  std::ostringstream o;
  o << "--model \"$DIR/model.json\" --data \"$DATA\" --batch " << tokens / seq << " --seq " << seq
    << " --threads \"$THREADS\" --profile --out \"$RUN\"";
  if (l.ep > 1) o << " --dispatch " << transport_name(l.ep_transport) << " --ep " << l.ep;
  return o.str();
}

std::string feedback() {
  return "\"$RACKSTEP\" calibrate --from-run \"$RUN\" --out \"$RUN/calibration\" --topology \"$DIR/cluster.json\" "
         "--calibration \"$DIR/calibration.json\"\n"
         "\"$RACKSTEP\" compare --measured \"$RUN\" --cluster \"$DIR/cluster.json\" --calibration "
         "\"$DIR/calibration.json\" -o \"$RUN/compare.json\"\n";
}

}  // namespace

void emit_run(const std::string& dir, const EmitRunInputs& in, const Layout& layout, const Prediction& prediction) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir, "", "a directory for the run", ec.message());
  const models::ModelConfig m = models::load_model(in.model);
  const std::string cal = in.calibration.empty() ? default_calibration_path() : in.calibration;
  write_json_file_atomic((fs::path(dir) / "model.json").string(), load_json_file(in.model));
  write_json_file_atomic((fs::path(dir) / "cluster.json").string(), load_json_file(in.cluster));
  write_json_file_atomic((fs::path(dir) / "calibration.json").string(), load_json_file(cal));
  write_json_file_atomic((fs::path(dir) / "layout.json").string(), layout_to_json(layout));
  nlohmann::json p = prediction_to_json(prediction);
  p["sources"] = {{"model", in.model}, {"cluster", in.cluster}, {"calibration", cal}};
  write_json_file_atomic((fs::path(dir) / "prediction.json").string(), p);

  const int64_t procs = layout.gpus();
  const std::string flags = train_flags(layout, m);
  const std::string head =
      "#!/usr/bin/env bash\n"
      "# Runs layout.json of model.json (" + describe(layout) + ") with `rackstep train`, one process per rank,\n"
      "# then refits from its profile and compares with prediction.json. Written by `rackstep sweep --emit-run`.\n"
      "set -euo pipefail\n"
      "DIR=$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\n"
      ": \"${DATA:?set DATA to a dataset from rackstep data build}\"\n"
      "THREADS=${THREADS:-1}\nRUN=${RUN:-$DIR/run}\nRACKSTEP=${RACKSTEP:-rackstep}\n"
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

}  // namespace rackstep::sim
