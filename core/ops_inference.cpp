// Dispatch and shape checks for core/ops_inference.hpp.
#include "core/ops_inference.hpp"

#include <initializer_list>

#include "core/cpu/ops_inference_cpu.hpp"

namespace mtnlg::ops {

void attention_cached_forward(Tensor& out, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int64_t heads,
                              int64_t past) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &k_cache, &v_cache, &qkv}) {
    if (t->device() != Device::cpu)
      throw_runtime("attention_cached_forward: this build has no CUDA implementation of the op");
    if (t->dtype() != qkv.dtype()) throw_runtime("attention_cached_forward: mixed dtypes");
  }
  MTNLG_CHECK(qkv.ndim() == 3, "qkv must be [B,T,3C], got {}", shape_str(qkv.shape()));
  MTNLG_CHECK(k_cache.ndim() == 4 && v_cache.shape() == k_cache.shape(), "cache must be [B,H,cap,D], got {}",
              shape_str(k_cache.shape()));
  const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (3 * heads);
  MTNLG_CHECK(qkv.dim(2) == 3 * heads * D, "qkv width {} not 3*heads*D", qkv.dim(2));
  MTNLG_CHECK(k_cache.dim(0) == B && k_cache.dim(1) == heads && k_cache.dim(3) == D, "cache shape {} vs qkv {}",
              shape_str(k_cache.shape()), shape_str(qkv.shape()));
  const int64_t cap = k_cache.dim(2);
  MTNLG_CHECK(past >= 0 && past + T <= cap, "past {} + new {} exceeds the cache capacity {}", past, T, cap);
  MTNLG_CHECK(out.numel() == B * T * heads * D, "out numel {}", out.numel());
  if (qkv.dtype() == DType::f64)
    cpu::attention_cached_forward<double>(out.data<double>(), k_cache.data<double>(), v_cache.data<double>(),
                                          qkv.data<double>(), B, T, heads, D, cap, past);
  else if (qkv.dtype() == DType::f32)
    cpu::attention_cached_forward<float>(out.data<float>(), k_cache.data<float>(), v_cache.data<float>(),
                                         qkv.data<float>(), B, T, heads, D, cap, past);
  else
    throw_runtime("attention_cached_forward: dtype {} not supported", to_string(qkv.dtype()));
}

}  // namespace mtnlg::ops
