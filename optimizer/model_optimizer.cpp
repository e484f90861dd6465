#include "optimizer/model_optimizer.hpp"

#include "core/error.hpp"

namespace mtnlg::optimizer {

namespace {
std::vector<ParamSegment> shifted(std::vector<ParamSegment> segs, int64_t by) {
  for (auto& s : segs) s.offset -= by;
  return segs;
}
}  // namespace

parallel::ProcessGroups ModelAdamW::expert_groups(const parallel::ProcessGroups& g) {
  parallel::ProcessGroups e;
  e.topo = g.topo;
  e.rank = g.rank;
  e.coord = g.coord;
  e.world = g.world;
  e.dp = g.edp;
  e.dp_cp = g.edp;
  e.mp = g.emp;
  e.device = g.device;
  return e;
}

ModelAdamW::ModelAdamW(const AdamWConfig& cfg, std::vector<ParamSegment> dense, std::vector<ParamSegment> experts,
                       int64_t expert_offset, int64_t numel, const parallel::ProcessGroups& groups, bool zero1,
                       int64_t bucket_size, Device dev)
    : expert_offset_(expert_offset),
      numel_(numel),
      dense_(cfg, std::move(dense), expert_offset, groups, zero1, bucket_size, dev) {
  if (expert_offset_ == numel_) return;
  MTNLG_CHECK(groups.edp && groups.emp, "optimizer: the model has routed experts but no expert groups");
  experts_.emplace(cfg, shifted(std::move(experts), expert_offset_), numel_ - expert_offset_, expert_groups(groups),
                   zero1, bucket_size, dev);
}

void ModelAdamW::grad_norm_sq(const Tensor& grads, Tensor& acc) {
  dense_.grad_norm_sq(grads.flat(0, expert_offset_), acc);
  if (!experts_) return;
  Tensor more = Tensor::empty({1}, DType::f64, acc.device());
  experts_->grad_norm_sq(grads.flat(expert_offset_, numel_ - expert_offset_), more);
  // The two regions' sums added on the host (f64 is a host dtype for CUDA's elementwise
  // ops; the step reads the norm there next anyway).
  Tensor sum = acc.to(Device::cpu);
  sum.data<double>()[0] += more.to(Device::cpu).data<double>()[0];
  acc.copy_from(sum);
}

StepResult ModelAdamW::apply(Tensor& params, Tensor& grads, double lr, Tensor* weights, double loss_scale,
                             double grad_norm_scaled, bool skip) {
  auto region = [](Tensor& t, int64_t b, int64_t n) { return t.flat(b, n); };
  const int64_t d = expert_offset_, e = numel_ - expert_offset_;
  Tensor p = region(params, 0, d), g = region(grads, 0, d);
  Tensor w = weights && weights->defined() ? region(*weights, 0, d) : Tensor();
  StepResult res = dense_.apply(p, g, lr, w.defined() ? &w : nullptr, loss_scale, grad_norm_scaled, skip);
  if (!experts_) return res;
  Tensor pe = region(params, d, e), ge = region(grads, d, e);
  Tensor we = weights && weights->defined() ? region(*weights, d, e) : Tensor();
  experts_->apply(pe, ge, lr, we.defined() ? &we : nullptr, loss_scale, grad_norm_scaled, skip);
  return res;
}

void ModelAdamW::set_steps_taken(int64_t s) {
  dense_.set_steps_taken(s);
  if (experts_) experts_->set_steps_taken(s);
}

int64_t ModelAdamW::state_bytes() const { return dense_.state_bytes() + (experts_ ? experts_->state_bytes() : 0); }

}  // namespace mtnlg::optimizer
