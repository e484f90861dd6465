// CPU implementation of core/ops_inference.hpp (templated on float/double).
#pragma once
#include <cstdint>

namespace mtnlg::cpu {

template <typename T>
void attention_cached_forward(T* out, T* k_cache, T* v_cache, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D,
                              int64_t capacity, int64_t past);

}  // namespace mtnlg::cpu
