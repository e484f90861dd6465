// Reductions for the step statistics (sum of squares for the gradient norm, the
// non-finite check): the checks, the one CUDA dispatch line (core/cuda/reduce.cu) and
// the CPU implementation, summed in fixed chunks so the result does not depend on the
// thread count.
#include "core/ops.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/common.hpp"

namespace mtnlg::ops {

using namespace detail;

double sum_squares(const Tensor& x) {
  MTNLG_CUDA_DISPATCH(same_device("sum_squares", {&x}), sum_squares(x));
  const DType dt = act_dtype("sum_squares", {{"x", &x}});
  if (is_low(dt)) {
    Widened w;
    return sum_squares(w.in(x));
  }
  double total = 0;
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    const T* p = x.kernel_data<T>();
    int64_t n = x.numel();
    // Fixed-size chunks summed in order: the result does not depend on the thread count.
    constexpr int64_t kChunk = 1 << 16;
    int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> part(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0;
      int64_t e = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < e; ++i) s += static_cast<double>(p[i]) * p[i];
      part[c] = s;
    }
    for (double s : part) total += s;
  });
  return total;
}

bool all_finite(const Tensor& x) { return std::isfinite(sum_squares(x)); }

void sum_squares_accumulate(Tensor& acc, const Tensor& x) {
  const bool cuda = same_device("sum_squares_accumulate", {&acc, &x});
  expect_acc("sum_squares_accumulate", acc, 1);
  MTNLG_CUDA_DISPATCH(cuda, sum_squares_accumulate(acc, x));
  acc.kernel_data<double>()[0] += sum_squares(x);
}

}  // namespace mtnlg::ops
