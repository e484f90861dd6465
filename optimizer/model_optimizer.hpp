// AdamW over a whole model's flat buffers, in their two regions (model/params.hpp,
// ParamStore::expert_offset): the attention grid's parameters, whose gradients are reduced
// and ZeRO-1 sharded over dp x cp and whose squared norm is summed over mp, and an MoE
// model's routed experts, which are reduced and sharded over their own replicas (the
// expert-data-parallel group) and summed over the expert model-parallel group
// (parallel::ExpertGrid). One DistributedAdamW each; one gradient norm, one clip and one
// skip decision for both, so a step is the step of a one-region model.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "optimizer/distributed_adamw.hpp"

namespace mtnlg::optimizer {

class ModelAdamW {
 public:
  // `dense`: segments in [0, expert_offset); `experts`: segments in [expert_offset,
  // numel) in the buffer's offsets (none for a dense model, and then expert_offset ==
  // numel). The experts' optimizer talks over groups.edp / groups.emp.
  ModelAdamW(const AdamWConfig& cfg, std::vector<ParamSegment> dense, std::vector<ParamSegment> experts,
             int64_t expert_offset, int64_t numel, const parallel::ProcessGroups& groups, bool zero1,
             int64_t bucket_size, Device dev = Device::cpu);

  // DistributedAdamW::grad_norm_sq of the whole model (both regions summed). Collective.
  void grad_norm_sq(const Tensor& grads, Tensor& acc);
  // DistributedAdamW::apply on each region with the whole model's norm.
  StepResult apply(Tensor& params, Tensor& grads, double lr, Tensor* weights, double loss_scale,
                   double grad_norm_scaled, bool skip);

  DistributedAdamW& dense() { return dense_; }
  DistributedAdamW* experts() { return experts_ ? &*experts_ : nullptr; }
  int64_t expert_offset() const { return expert_offset_; }
  int64_t numel() const { return numel_; }
  int64_t steps_taken() const { return dense_.steps_taken(); }
  void set_steps_taken(int64_t s);
  bool zero1() const { return dense_.zero1(); }
  int64_t bucket_size() const { return dense_.bucket_size(); }
  int64_t state_bytes() const;

  // The groups the experts' region talks over, as DistributedAdamW and DataParallelGrads
  // take them: edp in place of dp (and dp x cp), emp in place of mp, nothing else.
  static parallel::ProcessGroups expert_groups(const parallel::ProcessGroups& g);

 private:
  int64_t expert_offset_, numel_;
  DistributedAdamW dense_;
  std::optional<DistributedAdamW> experts_;
};

}  // namespace mtnlg::optimizer
