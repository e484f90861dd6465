// Token embedding (vocab-parallel: rows outside [vocab_start, vocab_start + rows) give
// zeros) and learned positions: checks once, one CUDA dispatch line
// (core/cuda/embedding.cu), the CPU implementation. Backward ops accumulate (+=) into
// wide (f32) gradients in row order, so every thread count gives the same bits.
#include "core/ops.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

template <typename T>
void embedding_forward(T* out, const int32_t* tok, const T* table, int64_t N, int64_t C, int64_t vstart,
                       int64_t vlocal) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    int64_t id = static_cast<int64_t>(tok[i]) - vstart;
    T* o = out + i * C;
    if (id >= 0 && id < vlocal) {
      const T* r = table + id * C;
      for (int64_t c = 0; c < C; ++c) o[c] = r[c];
    } else {
      for (int64_t c = 0; c < C; ++c) o[c] = 0;
    }
  }
}

template <typename T>
void embedding_backward(T* dtable, const int32_t* tok, const T* dout, int64_t N, int64_t C, int64_t vstart,
                        int64_t vlocal) {
  // Rows are scattered by token id; split the work by column blocks so no two threads
  // touch the same element and the summation order is the row order for any thread count.
  constexpr int64_t kCols = 64;
  int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < blocks; ++bk) {
    int64_t c0 = bk * kCols, c1 = std::min(C, c0 + kCols);
    for (int64_t i = 0; i < N; ++i) {
      int64_t id = static_cast<int64_t>(tok[i]) - vstart;
      if (id < 0 || id >= vlocal) continue;
      T* r = dtable + id * C;
      const T* g = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) r[c] += g[c];
    }
  }
}

template <typename T>
void position_forward(T* x, const T* pos, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * C;
    const T* pr = pos + ((row_start + r) % seq_len) * C;
    for (int64_t c = 0; c < C; ++c) xr[c] += pr[c];
  }
}

template <typename T>
void position_backward(T* dpos, const T* dx, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len) {
  // Column blocks per thread; rows summed in order (thread-count independent).
  constexpr int64_t kCols = 64;
  int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < blocks; ++bk) {
    int64_t c0 = bk * kCols, c1 = std::min(C, c0 + kCols);
    for (int64_t r = 0; r < rows; ++r) {
      T* pr = dpos + ((row_start + r) % seq_len) * C;
      const T* g = dx + r * C;
      for (int64_t c = c0; c < c1; ++c) pr[c] += g[c];
    }
  }
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table, int64_t vocab_start) {
  const bool cuda = same_device("embedding_forward", {&out, &tokens, &table});
  const DType dt = act_dtype("embedding_forward", {{"out", &out}, {"table", &table}});
  expect_i32("embedding_forward", "tokens", tokens);
  expect_ndim("embedding_forward", "table", table, 2);
  int64_t C = table.dim(1), N = tokens.numel();
  expect_numel("embedding_forward", "out", out, N * C);
  MTNLG_CUDA_DISPATCH(cuda, embedding_forward(out, tokens, table, vocab_start));
  if (is_low(dt)) {  // a row copy: exact in any dtype
    const auto* tab = table.kernel_data<uint16_t>();
    auto* o = out.kernel_data<uint16_t>();
    const int32_t* tok = tokens.kernel_data<int32_t>();
    const int64_t V = table.dim(0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t id = static_cast<int64_t>(tok[i]) - vocab_start;
      for (int64_t c = 0; c < C; ++c) o[i * C + c] = (id >= 0 && id < V) ? tab[id * C + c] : uint16_t{0};
    }
    return;
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::embedding_forward<T>(out.kernel_data<T>(), tokens.kernel_data<int32_t>(), table.kernel_data<T>(), N, C,
                              vocab_start, table.dim(0));
  });
}

Tensor embedding_grad_order(const int32_t* tokens, int64_t n) {
  std::vector<int32_t> rows(static_cast<size_t>(n));
  std::iota(rows.begin(), rows.end(), 0);
  std::stable_sort(rows.begin(), rows.end(), [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  std::vector<int32_t> starts;
  for (int64_t i = 0; i < n; ++i)
    if (i == 0 || tokens[rows[static_cast<size_t>(i)]] != tokens[rows[static_cast<size_t>(i - 1)]])
      starts.push_back(static_cast<int32_t>(i));
  const int64_t runs = static_cast<int64_t>(starts.size());
  starts.resize(static_cast<size_t>(n + 1), static_cast<int32_t>(n));  // starts[runs..n] = n
  Tensor out = Tensor::empty({2 * n + 2}, DType::i32, Device::cpu);
  int32_t* o = out.data<int32_t>();
  o[0] = static_cast<int32_t>(runs);
  std::copy(starts.begin(), starts.end(), o + 1);
  std::copy(rows.begin(), rows.end(), o + n + 2);
  return out;
}

void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout, int64_t vocab_start,
                        const EmbeddingGradOrder* order) {
  const bool cuda = same_device("embedding_backward", {&dtable, &tokens, &dout});
  const DType dt = act_dtype("embedding_backward", {{"dout", &dout}}, {{"dtable", &dtable}});
  expect_i32("embedding_backward", "tokens", tokens);
  expect_ndim("embedding_backward", "dtable", dtable, 2);
  int64_t C = dtable.dim(1), N = tokens.numel();
  expect_numel("embedding_backward", "dout", dout, N * C);
  if (order) expect_numel("embedding_backward", "order.rows", order->rows, N);
  MTNLG_CUDA_DISPATCH(cuda, embedding_backward(dtable, tokens, dout, vocab_start, order));
  if (is_low(dt)) {
    Widened wd;
    return embedding_backward(dtable, tokens, wd.in(dout), vocab_start);
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::embedding_backward<T>(dtable.kernel_data<T>(), tokens.kernel_data<int32_t>(), dout.kernel_data<T>(), N, C,
                               vocab_start, dtable.dim(0));
  });
}

namespace {
// The checks of a position op, once for both: `table` [positions, C] (the table or its
// gradient) against `x` [rows, C] for a sequence of seq_len positions. Returns rows.
int64_t position_rows(const char* op, const char* table_name, const Tensor& table, const char* x_name, const Tensor& x,
                      int64_t seq_len) {
  expect_ndim(op, table_name, table, 2);
  const int64_t C = table.dim(1), rows = C ? x.numel() / C : 0;
  expect_numel(op, x_name, x, rows * C);
  expect_positions(op, seq_len, table.dim(0));
  return rows;
}
}  // namespace

void position_forward(Tensor& x, const Tensor& pos, int64_t row_start, int64_t seq_len) {
  const bool cuda = same_device("position_forward", {&x, &pos});
  const DType dt = act_dtype("position_forward", {{"x", &x}, {"pos", &pos}});
  const int64_t rows = position_rows("position_forward", "pos", pos, "x", x, seq_len), C = pos.dim(1);
  MTNLG_CUDA_DISPATCH(cuda, position_forward(x, pos, row_start, seq_len));
  if (is_low(dt)) {
    Widened wd;
    position_forward(wd.out(x, true), wd.in(pos), row_start, seq_len);
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::position_forward<V>(x.kernel_data<V>(), pos.kernel_data<V>(), rows, C, row_start, seq_len);
  });
}

void position_backward(Tensor& dpos, const Tensor& dx, int64_t row_start, int64_t seq_len) {
  const bool cuda = same_device("position_backward", {&dpos, &dx});
  const DType dt = act_dtype("position_backward", {{"dx", &dx}}, {{"dpos", &dpos}});
  const int64_t rows = position_rows("position_backward", "dpos", dpos, "dx", dx, seq_len), C = dpos.dim(1);
  MTNLG_CUDA_DISPATCH(cuda, position_backward(dpos, dx, row_start, seq_len));
  if (is_low(dt)) {
    Widened wd;
    return position_backward(dpos, wd.in(dx), row_start, seq_len);
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::position_backward<V>(dpos.kernel_data<V>(), dx.kernel_data<V>(), rows, C, row_start, seq_len);
  });
}

}  // namespace mtnlg::ops
