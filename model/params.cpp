#include "model/params.hpp"

#include <algorithm>
#include <cmath>

#include "core/mem_account.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"

namespace mtnlg::model {

uint64_t name_key(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the name, then mixed with the seed
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return mix_key(seed, h, 0x1417);
}

double normal_draw(uint64_t key, uint64_t index) {
  Philox4x32 r = philox4x32(key, 0, index);
  // 32-bit uniforms in (0, 1] and [0, 1).
  double u1 = (static_cast<double>(r.c[0]) + 1.0) / 4294967296.0;
  double u2 = static_cast<double>(r.c[1]) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void ParamStore::add(ParamInfo p) {
  p.numel = shape_numel(p.shape);
  p.offset = total_;
  total_ += p.numel;
  infos_.push_back(std::move(p));
}

void ParamStore::finalize(DType master, DType compute, Device dev) {
  std::stable_partition(infos_.begin(), infos_.end(), [](const ParamInfo& p) { return !p.expert; });
  int64_t offset = 0;
  bool seen_expert = false;
  for (auto& p : infos_) {
    if (p.expert && !seen_expert) expert_offset_ = offset;
    seen_expert = seen_expert || p.expert;
    p.offset = offset;
    offset += p.numel;
  }
  if (!seen_expert) expert_offset_ = total_;
  auto zeros = [&](DType dt) {
    Tensor t = Tensor::empty({total_}, dt, dev);
    ops::fill(t, 0.0);
    return t;
  };
  // Memory roles as the planner counts them: the master copy is the weights when the model
  // computes in it, else part of the optimizer state (with Adam's moments).
  {
    mem::RoleScope role(compute == master ? mem::Role::weights : mem::Role::optimizer);
    params_ = zeros(master);
  }
  {
    mem::RoleScope role(mem::Role::grads);
    grads_ = zeros(master);
  }
  mem::RoleScope role(mem::Role::weights);
  weights_ = compute == master ? params_ : zeros(compute);
}

void ParamStore::place(Device dev) {
  if (!params_.defined() || params_.device() == dev) return;
  const bool alias = !has_compute_copy();
  params_ = params_.to(dev);
  grads_ = grads_.to(dev);
  weights_ = alias ? params_ : weights_.to(dev);
}

void ParamStore::sync_weights() {
  MTNLG_CHECK(params_.defined(), "ParamStore::sync_weights before finalize");
  if (has_compute_copy()) ops::convert(weights_, params_);
}

Tensor ParamStore::weight(const std::string& name) const {
  auto& p = info(name);
  return weights_.flat(p.offset, p.numel).view(p.shape);
}

const ParamInfo& ParamStore::info(const std::string& name) const {
  for (auto& p : infos_)
    if (p.name == name) return p;
  throw_runtime("no parameter named {}", name);
}

bool ParamStore::has(const std::string& name) const {
  for (auto& p : infos_)
    if (p.name == name) return true;
  return false;
}

Tensor ParamStore::param(const std::string& name) const {
  auto& p = info(name);
  return params_.flat(p.offset, p.numel).view(p.shape);
}

Tensor ParamStore::grad(const std::string& name) const {
  auto& p = info(name);
  return grads_.flat(p.offset, p.numel).view(p.shape);
}

void ParamStore::zero_grads() { ops::fill(grads_, 0.0); }

int64_t ParamStore::global_index(const ParamInfo& p, int64_t local) {
  if (p.split_dim < 0) return local;
  // Decompose the local index in the local shape, shift the split dim, recompose globally.
  int64_t nd = static_cast<int64_t>(p.shape.size());
  int64_t idx = local, global = 0, stride = 1;
  MTNLG_CHECK(nd <= 8, "parameter {} has {} dimensions", p.name, nd);
  int64_t coord[8];  // no allocation: this runs once per element at initialisation
  for (int64_t d = nd - 1; d >= 0; --d) {
    coord[d] = idx % p.shape[d];
    idx /= p.shape[d];
  }
  coord[p.split_dim] =
      split_global_coord(coord[p.split_dim], p.shape[p.split_dim], p.split_rank, p.split_count, p.split_parts);
  for (int64_t d = nd - 1; d >= 0; --d) {
    global += coord[d] * stride;
    stride *= p.global_shape[d];
  }
  return global;
}

void ParamStore::initialize(uint64_t seed, double std, int64_t num_layers_total) {
  MTNLG_CHECK(params_.defined(), "ParamStore::initialize before finalize");
  // Drawn in host memory, then placed (no copy when the store is on the CPU).
  Tensor host = params_.device() == Device::cpu ? params_ : Tensor::empty({total_}, params_.dtype(), Device::cpu);
  for (auto& p : infos_) {
    Tensor t = host.flat(p.offset, p.numel);
    switch (p.init) {
      case InitKind::zeros: ops::fill(t, 0.0); break;
      case InitKind::ones: ops::fill(t, 1.0); break;
      case InitKind::normal:
      case InitKind::normal_scaled_output: {
        double s = p.init == InitKind::normal ? std : std / std::sqrt(2.0 * static_cast<double>(num_layers_total));
        uint64_t key = name_key(seed, p.name);
        bool f64 = t.dtype() == DType::f64;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < p.numel; ++i) {
          double v = s * normal_draw(key, static_cast<uint64_t>(global_index(p, i)));
          if (f64)
            t.data<double>()[i] = v;
          else
            t.data<float>()[i] = static_cast<float>(v);
        }
        break;
      }
    }
  }
  params_.copy_from(host);
  sync_weights();
}

}  // namespace mtnlg::model
