#include "exec/train_layout.h"

#include "sim/base/check.h"

namespace rackstep::exec {

sim::DispatchConfig with_model_experts(sim::DispatchConfig config, const models::LayerGraph& g) {
  const auto& m = g.model;
  if (m.moe.experts == 0) {
    throw UserError(m.source_file, "/moe/experts", "routed experts for an EP dispatch", "0 (a dense model)");
  }
  config.n_experts = m.moe.experts;
  config.top_k = static_cast<int>(m.moe.top_k);
  return config;
}

TrainLayout train_layout(const sim::Layout& l, const std::string& file, const models::LayerGraph& g,
                         int processes, int64_t batch_override) {
  const auto str = [](int64_t v) { return std::to_string(v); };
  const auto must_be_one = [&](const char* path, int64_t v, const char* why) {
    if (v != 1) throw UserError(file, path, std::string("1 (") + why + ")", str(v));
  };
  must_be_one("/tp", l.tp, "rackstep train has no tensor parallelism");
  must_be_one("/cp", l.cp, "rackstep train has no context parallelism");
  must_be_one("/pp", l.pp, "rackstep train has no pipeline parallelism");
  must_be_one("/pp_virtual", l.pp_virtual, "rackstep train has no pipeline parallelism");
  // A folded expert mesh (sim/layout.h) needs expert tensor parallelism; with tp = 1 that is etp > 1.
  must_be_one("/etp", l.expert_tp(), "rackstep train has no expert tensor parallelism: its EP groups are data ranks");
  if (l.master_dtype != sim::MasterDtype::kFp32) {
    throw UserError(file, "/master_dtype", "\"fp32\" (the CPU engine trains in fp32)", "\"bf16\"");
  }
  if (processes > 1 && l.data != processes) {
    throw UserError(file, "/data", str(processes) + " (the processes of this MPI job)", str(l.data));
  }
  if (processes == 1 && l.data != 1 && l.data != l.ep) {
    throw UserError(file, "/data",
                    "1, or ep (one process splits its batch over the EP group's virtual GPUs), or mpirun -np " +
                        str(l.data),
                    str(l.data));
  }
  if (l.ep < 1 || l.data % l.ep != 0) {
    throw UserError(file, "/ep", "a divisor of data (" + str(l.data) + ")", str(l.ep));
  }

  TrainLayout t;
  t.seq = l.seq(g.model);
  t.batch_seqs = batch_override > 0 ? batch_override : sim::batch_seqs(l, g);
  if (t.batch_seqs < 1) throw UserError(file, "/tokens_per_step", "at least one sequence per step", "0");
  if (batch_override == 0 && l.micro_batch_seqs > 0 && l.data * l.micro_batch_seqs != t.batch_seqs) {
    throw UserError(file, "/micro_batch_seqs",
                    "data x micro_batch_seqs = the batch of " + str(t.batch_seqs) +
                        " sequences (rackstep train has no gradient accumulation; or give the run a batch of its own)",
                    str(l.micro_batch_seqs));
  }
  if (l.ep > 1) {
    sim::DispatchConfig c;
    c.transport = l.ep_transport;
    c.sender_cf = l.sender_cf;
    c.receiver_cf = l.receiver_cf;
    c.waves = static_cast<int>(l.waves);
    c.ragged_chunks = static_cast<int>(l.ragged_chunks);
    t.dispatch.enabled = true;
    t.dispatch.ep = l.ep;
    t.dispatch.config = with_model_experts(c, g);
    sim::validate(t.dispatch.config, l.ep);
  }

  // Memory placement: the same numbers either way.
  if (l.fsdp != 1) t.placement_only.push_back("/fsdp: " + str(l.fsdp));
  if (l.recompute != models::Recompute::kNone) {
    t.placement_only.push_back(std::string("/recompute: ") +
                               (l.recompute == models::Recompute::kFull ? "full" : "selective"));
  }
  if (l.offload_residual) t.placement_only.push_back("/offload_residual: true");
  if (l.optimizer_state == sim::StatePlacement::kHost) t.placement_only.push_back("/optimizer_state: host");
  if (l.replicate_embedding) t.placement_only.push_back("/replicate_embedding: true");
  if (l.coordinated_gc) t.placement_only.push_back("/coordinated_gc: true");
  return t;
}

}  // namespace rackstep::exec
