// CPU attention over a key/value cache. Same arithmetic order as the training
// attention_forward (scores in T, max-subtracted exp, normalise, weighted sum of V), so
// a prefill with past = 0 matches it to rounding. Threaded over (batch, head, query).
#include "core/cpu/ops_inference_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace mtnlg::cpu {

template <typename T>
void attention_cached_forward(T* out, T* k_cache, T* v_cache, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D,
                              int64_t capacity, int64_t past) {
  const int64_t row = H * 3 * D;
  // 1) append the new keys and values
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      T* kc = k_cache + ((b * H + h) * capacity) * D;
      T* vc = v_cache + ((b * H + h) * capacity) * D;
      for (int64_t i = 0; i < Tn; ++i) {
        const T* src = qkv + (b * Tn + i) * row + h * 3 * D;
        std::copy(src + D, src + 2 * D, kc + (past + i) * D);
        std::copy(src + 2 * D, src + 3 * D, vc + (past + i) * D);
      }
    }
  // 2) attend; each query row is independent
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
#pragma omp parallel
  {
    std::vector<T> s(static_cast<size_t>(past + Tn));
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Tn; ++i) {
          const T* q = qkv + (b * Tn + i) * row + h * 3 * D;
          const T* kc = k_cache + ((b * H + h) * capacity) * D;
          const T* vc = v_cache + ((b * H + h) * capacity) * D;
          const int64_t n = past + i + 1;
          T mx = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < n; ++j) {
            const T* k = kc + j * D;
            T acc = 0;
            for (int64_t d = 0; d < D; ++d) acc += q[d] * k[d];
            acc *= scale;
            s[j] = acc;
            mx = std::max(mx, acc);
          }
          T sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            s[j] = std::exp(s[j] - mx);
            sum += s[j];
          }
          T inv = T(1) / sum;
          T* o = out + (b * Tn + i) * H * D + h * D;
          for (int64_t d = 0; d < D; ++d) o[d] = 0;
          for (int64_t j = 0; j < n; ++j) {
            T pj = s[j] * inv;
            const T* v = vc + j * D;
            for (int64_t d = 0; d < D; ++d) o[d] += pj * v[d];
          }
        }
  }
}

template void attention_cached_forward<float>(float*, float*, float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                              int64_t, int64_t);
template void attention_cached_forward<double>(double*, double*, double*, const double*, int64_t, int64_t, int64_t,
                                               int64_t, int64_t, int64_t);

}  // namespace mtnlg::cpu
