// Mixture of experts, the CPU reference (docs/specs/moe.md): the router's gating in its
// own dtype, top-k routing (softmax, pre-softmax, sigmoid with the expert bias choosing
// only, the scaling factor, group-limited routing), the load-balancing scores and loss,
// the z-loss, capacity, the permutation of tokens by expert and its inverse, the routing
// weight on each expert row, the experts as a grouped GEMM, the expert-bias update and the
// shared expert's sigmoid gate. f32 or f64 tensors; every reduction runs in double in a
// fixed order (row, slot, expert), so a result never depends on the thread count. CUDA
// tensors go to core/cuda/moe.cu (after the shape checks here, which both devices share;
// the CUDA entry checks its own dtypes); the dispatch plan and the capacity are made here,
// on the host, for both devices: their sizes decide the launches that follow.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "core/moe_ops.hpp"
#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/moe_cuda.hpp"
#endif
#include "core/ops.hpp"
#include "core/ops/common.hpp"

namespace mtnlg::ops {

using namespace detail;

namespace {

// Shape and dtype checks shared by every entry. The dtype checks are the CPU kernels'
// (f32 or f64, one dtype per call); CUDA tensors' dtypes are checked by core/cuda/moe.cu
// (the router's side f32, the rows f32, bf16 or f16).
void float_dtype(const char* op, const char* name, const Tensor& t) {
  if (t.device() == Device::cuda) return;
  if (t.dtype() != DType::f32 && t.dtype() != DType::f64)
    throw_runtime("{}: {} must be f32 or f64, got {}", op, name, to_string(t.dtype()));
}
// The rows' tensors (tokens, expert activations, the shared expert's gate): f32 or f64, or
// bf16/f16 storage (f32 arithmetic on widened copies, one rounding per stored value).
void data_dtype(const char* op, const char* name, const Tensor& t) {
  if (t.device() == Device::cuda) return;
  if (t.dtype() != DType::f32 && t.dtype() != DType::f64 && !is_low(t.dtype()))
    throw_runtime("{}: {} must be f32, f64, bf16 or f16, got {}", op, name, to_string(t.dtype()));
}
// A routing weight tensor beside rows of `act`'s dtype: the same dtype when that is wide,
// f32 (the router's) for bf16/f16 rows.
void weight_dtype(const char* op, const char* name, const Tensor& t, const Tensor& act) {
  if (t.device() == Device::cuda) return;
  const DType want = is_low(act.dtype()) ? DType::f32 : act.dtype();
  if (t.dtype() != want)
    throw_runtime("{}: {} is {}, expected {} (the routing weights are wide: f32 beside bf16/f16 rows)", op, name,
                  to_string(t.dtype()), to_string(want));
}
void same_dtype(const char* op, const char* name, const Tensor& t, DType dt) {
  if (t.device() == Device::cuda) return;
  if (t.dtype() != dt)
    throw_runtime("{}: {} is {}, expected {} (the dtype of the logits/activations)", op, name, to_string(t.dtype()),
                  to_string(dt));
}
// Rows and width of a [rows, width] tensor.
void rows_cols(const char* op, const char* name, const Tensor& t, int64_t& rows, int64_t& cols) {
  MTNLG_CHECK(t.ndim() >= 1, "{}: {} needs a last dimension", op, name);
  cols = t.dim(-1);
  rows = cols ? t.numel() / cols : 0;
}

// Element i of a f32/f64 tensor as double, and a store.
double at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f64 ? t.kernel_data<double>()[i] : static_cast<double>(t.kernel_data<float>()[i]);
}
void put(Tensor& t, int64_t i, double v) {
  if (t.dtype() == DType::f64)
    t.kernel_data<double>()[i] = v;
  else
    t.kernel_data<float>()[i] = static_cast<float>(v);
}
const int32_t* i32(const Tensor& t) { return t.kernel_data<int32_t>(); }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The softmax of a row of n values into out (double), max-subtracted.
void softmax_row(const double* v, int64_t n, double* out) {
  double m = -INFINITY, s = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, v[i]);
  for (int64_t i = 0; i < n; ++i) s += (out[i] = std::exp(v[i] - m));
  for (int64_t i = 0; i < n; ++i) out[i] /= s;
}

// The k largest of v[0..n) among allowed ones (mask null: all), descending, ties to the
// lower index: k passes of a strict-greater scan.
void topk_indices(const double* v, int64_t n, int64_t k, const bool* allowed, int32_t* out) {
  std::vector<bool> taken(static_cast<size_t>(n), false);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      if (taken[static_cast<size_t>(e)] || (allowed && !allowed[e])) continue;
      if (best < 0 || v[e] > v[best]) best = e;
    }
    MTNLG_CHECK(best >= 0, "topk_indices: fewer than k candidates");
    taken[static_cast<size_t>(best)] = true;
    out[j] = static_cast<int32_t>(best);
  }
}

// Group-limited selection: the groups' scores (sum of each group's top k / group_topk),
// the group_topk best groups allowed, then the top-k of their experts.
void group_topk_indices(const double* sel, int64_t E, const RouterParams& p, int32_t* out) {
  const int64_t G = p.num_groups, per = E / G, take = p.topk / p.group_topk;
  std::vector<double> gscore(static_cast<size_t>(G));
  std::vector<int32_t> top(static_cast<size_t>(std::max(take, p.group_topk)));
  for (int64_t g = 0; g < G; ++g) {
    topk_indices(sel + g * per, per, take, nullptr, top.data());
    double s = 0;
    for (int64_t j = 0; j < take; ++j) s += sel[g * per + top[static_cast<size_t>(j)]];
    gscore[static_cast<size_t>(g)] = s;
  }
  topk_indices(gscore.data(), G, p.group_topk, nullptr, top.data());
  std::unique_ptr<bool[]> allowed(new bool[static_cast<size_t>(E)]());
  for (int64_t j = 0; j < p.group_topk; ++j)
    for (int64_t e = 0; e < per; ++e) allowed[static_cast<size_t>(top[static_cast<size_t>(j)] * per + e)] = true;
  topk_indices(sel, E, p.topk, allowed.get(), out);
}

// One row's routing: the selection scores (or the given ones, `forced`), the choice, the weights.
void route_row(const double* l, int64_t E, const double* bias, const RouterParams& p, int32_t* idx, double* w,
               const double* forced = nullptr) {
  const int64_t k = p.topk;
  std::vector<double> sel(static_cast<size_t>(E)), s(static_cast<size_t>(E));
  if (p.score == RouterScore::sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(l[e]), sel[e] = s[e] + (bias ? bias[e] : 0.0);
  } else if (p.pre_softmax) {
    softmax_row(l, E, s.data());
    sel = s;
  } else {
    std::copy(l, l + E, sel.begin());
  }
  if (forced) std::copy(forced, forced + E, sel.begin());
  if (p.group_topk > 0)
    group_topk_indices(sel.data(), E, p, idx);
  else
    topk_indices(sel.data(), E, k, nullptr, idx);
  if (p.score == RouterScore::softmax && !p.pre_softmax) {
    std::vector<double> chosen(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) chosen[j] = l[idx[j]];
    softmax_row(chosen.data(), k, w);
  } else {
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += (w[j] = s[idx[j]]);
    if (p.score == RouterScore::sigmoid && k > 1)
      for (int64_t j = 0; j < k; ++j) w[j] /= sum + 1e-20;
  }
  if (p.scaling_factor != 0)
    for (int64_t j = 0; j < k; ++j) w[j] *= p.scaling_factor;
}

// One row's backward: g [k] (the weights' gradient), dl [E] written.
void route_row_backward(const double* l, int64_t E, const int32_t* idx, const double* dw, const RouterParams& p,
                        double* dl) {
  const int64_t k = p.topk;
  const double sf = p.scaling_factor != 0 ? p.scaling_factor : 1.0;
  std::vector<double> g(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) g[j] = dw[j] * sf;
  std::fill(dl, dl + E, 0.0);
  if (p.score == RouterScore::softmax && !p.pre_softmax) {
    std::vector<double> chosen(static_cast<size_t>(k)), q(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) chosen[j] = l[idx[j]];
    softmax_row(chosen.data(), k, q.data());
    double dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += q[j] * g[j];
    for (int64_t j = 0; j < k; ++j) dl[idx[j]] = q[j] * (g[j] - dot);
  } else if (p.score == RouterScore::softmax) {
    std::vector<double> s(static_cast<size_t>(E)), G(static_cast<size_t>(E), 0.0);
    softmax_row(l, E, s.data());
    double dot = 0;
    for (int64_t j = 0; j < k; ++j) G[idx[j]] = g[j], dot += s[idx[j]] * g[j];
    for (int64_t e = 0; e < E; ++e) dl[e] = s[e] * (G[e] - dot);
  } else {
    std::vector<double> v(static_cast<size_t>(k)), dv(static_cast<size_t>(k));
    double sum = 0, gv = 0;
    for (int64_t j = 0; j < k; ++j) sum += (v[j] = sigmoid(l[idx[j]]));
    if (k > 1) {
      const double S = sum + 1e-20;
      for (int64_t j = 0; j < k; ++j) gv += g[j] * v[j];
      for (int64_t j = 0; j < k; ++j) dv[j] = g[j] / S - gv / (S * S);
    } else {
      dv[0] = g[0];
    }
    for (int64_t j = 0; j < k; ++j) dl[idx[j]] = dv[j] * v[j] * (1 - v[j]);
  }
}

void check_router_params(const char* op, const RouterParams& p, int64_t E, const Tensor* bias) {
  if (p.topk < 1 || p.topk > E) throw_runtime("{}: topk {} must be in [1, {}]", op, p.topk, E);
  if (bias && bias->defined() && p.score != RouterScore::sigmoid)
    throw_runtime("{}: an expert bias needs the sigmoid score", op);
  if (p.group_topk > 0 && (p.num_groups < 1 || E % p.num_groups != 0 || p.group_topk > p.num_groups ||
                           p.topk < p.group_topk || p.topk > p.group_topk * (E / p.num_groups)))
    throw_runtime("{}: group-limited routing with {} groups, group_topk {}, topk {} does not fit {} experts", op,
                  p.num_groups, p.group_topk, p.topk, E);
}

// A row of a f32/f64 tensor as doubles.
void load_row(const Tensor& t, int64_t row, int64_t n, double* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = at(t, row * n + i);
}

}  // namespace

// ---- the router's gating ----------------------------------------------------------------

namespace {
// t in dtype dt: itself, or a converted copy.
Tensor in_dtype(const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t;
  Tensor c = Tensor::empty(t.shape(), dt, t.device());
  convert(c, t);
  return c;
}
}  // namespace

void moe_router_logits_forward(Tensor& logits, const Tensor& x, const Tensor& w) {
  const char* op = "moe_router_logits_forward";
  const bool cuda = same_device(op, {&logits, &x, &w});  // composed on either device, but f64 on CUDA
  float_dtype(op, "logits", logits);
  MTNLG_CUDA_DISPATCH(cuda && logits.dtype() == DType::f64, moe_router_logits_forward(logits, x, w));
  matmul_forward(logits, in_dtype(x, logits.dtype()), in_dtype(w, logits.dtype()), nullptr);
}

void moe_router_logits_backward(Tensor& dx, Tensor& dw, const Tensor& dlogits, const Tensor& x, const Tensor& w) {
  const char* op = "moe_router_logits_backward";
  const bool cuda = same_device(op, {&dx, &dw, &dlogits, &x, &w});
  float_dtype(op, "dlogits", dlogits);
  MTNLG_CUDA_DISPATCH(cuda && dlogits.dtype() == DType::f64, moe_router_logits_backward(dx, dw, dlogits, x, w));
  const DType rd = dlogits.dtype();
  // dx is written and dw accumulates: in the router's dtype, then converted back.
  Tensor dx_r = dx.dtype() == rd ? dx : Tensor::empty(dx.shape(), rd, dx.device());
  Tensor dw_r = in_dtype(dw, rd);
  matmul_backward(&dx_r, &dw_r, nullptr, dlogits, in_dtype(x, rd), in_dtype(w, rd));
  if (dx.dtype() != rd) convert(dx, dx_r);
  if (dw.dtype() != rd) convert(dw, dw_r);
}

// ---- top-k routing ------------------------------------------------------------------------

void moe_topk_forward(Tensor& probs, Tensor& idx, const Tensor& logits, const Tensor* expert_bias,
                      const RouterParams& p, const Tensor* selection) {
  const char* op = "moe_topk_forward";
  const bool cuda = same_device(op, {&probs, &idx, &logits, expert_bias, selection});
  float_dtype(op, "logits", logits);
  same_dtype(op, "probs", probs, logits.dtype());
  expect_i32(op, "idx", idx);
  int64_t N, E;
  rows_cols(op, "logits", logits, N, E);
  check_router_params(op, p, E, expert_bias);
  const int64_t k = p.topk;
  expect_numel(op, "probs", probs, N * k);
  expect_numel(op, "idx", idx, N * k);
  const bool has_bias = expert_bias && expert_bias->defined();
  if (has_bias) expect_numel(op, "expert_bias", *expert_bias, E);
  if (selection) {
    same_dtype(op, "selection", *selection, logits.dtype());
    expect_numel(op, "selection", *selection, N * E);
  }
  MTNLG_CUDA_DISPATCH(cuda, moe_topk_forward(probs, idx, logits, expert_bias, p, selection));
  std::vector<double> bias(static_cast<size_t>(has_bias ? E : 0));
  if (has_bias) load_row(*expert_bias, 0, E, bias.data());
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> l(static_cast<size_t>(E)), w(static_cast<size_t>(k)), f(selection ? E : 0);
    load_row(logits, n, E, l.data());
    if (selection) load_row(*selection, n, E, f.data());
    route_row(l.data(), E, has_bias ? bias.data() : nullptr, p, idx.kernel_data<int32_t>() + n * k, w.data(),
              selection ? f.data() : nullptr);
    for (int64_t j = 0; j < k; ++j) put(probs, n * k + j, w[j]);
  }
}

void moe_sinkhorn(Tensor& out, const Tensor& logits, double tol, int64_t max_iter) {
  const char* op = "moe_sinkhorn";
  const bool cuda = same_device(op, {&out, &logits});
  float_dtype(op, "logits", logits);
  same_dtype(op, "out", out, logits.dtype());
  int64_t N, E;
  rows_cols(op, "logits", logits, N, E);
  expect_numel(op, "out", out, N * E);
  if (!(tol > 0) || max_iter < 1) throw_runtime("{}: tol {} and max_iter {} must be positive", op, tol, max_iter);
  if (N == 0) return;
  MTNLG_CUDA_DISPATCH(cuda, moe_sinkhorn(out, logits, tol, max_iter));
  std::vector<double> c(static_cast<size_t>(N * E)), d0(static_cast<size_t>(N), 1.0), d1(static_cast<size_t>(E), 1.0);
  for (int64_t i = 0; i < N * E; ++i) c[i] = std::exp(at(logits, i));
  const double eps = 1e-8;
  for (int64_t it = 0; it < max_iter; ++it) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += d1[e] * c[n * E + e];
      d0[n] = 1.0 / static_cast<double>(N) / (s + eps);
    }
    double err = 0;
    for (int64_t e = 0; e < E; ++e) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) s += d0[n] * c[n * E + e];
      const double v = 1.0 / static_cast<double>(E) / (s + eps);
      err += std::fabs(d1[e] - v);
      d1[e] = v;
    }
    if (err / static_cast<double>(E) <= tol) break;
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) put(out, n * E + e, d1[e] * c[n * E + e] * d0[n]);
}

void moe_topk_backward(Tensor& dlogits, const Tensor& dprobs, const Tensor& logits, const Tensor& idx,
                       const RouterParams& p) {
  const char* op = "moe_topk_backward";
  const bool cuda = same_device(op, {&dlogits, &dprobs, &logits, &idx});
  float_dtype(op, "logits", logits);
  same_dtype(op, "dlogits", dlogits, logits.dtype());
  same_dtype(op, "dprobs", dprobs, logits.dtype());
  expect_i32(op, "idx", idx);
  int64_t N, E;
  rows_cols(op, "logits", logits, N, E);
  check_router_params(op, p, E, nullptr);
  const int64_t k = p.topk;
  expect_numel(op, "dlogits", dlogits, N * E);
  expect_numel(op, "dprobs", dprobs, N * k);
  expect_numel(op, "idx", idx, N * k);
  MTNLG_CUDA_DISPATCH(cuda, moe_topk_backward(dlogits, dprobs, logits, idx, p));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> l(static_cast<size_t>(E)), g(static_cast<size_t>(k)), dl(static_cast<size_t>(E));
    load_row(logits, n, E, l.data());
    load_row(dprobs, n, k, g.data());
    route_row_backward(l.data(), E, i32(idx) + n * k, g.data(), p, dl.data());
    for (int64_t e = 0; e < E; ++e) put(dlogits, n * E + e, dl[e]);
  }
}

// ---- the load-balancing loss and the z-loss -----------------------------------------------

namespace {
// The aux-loss scores of one row: softmax, or sigmoid normalised by its sum + 1e-20.
void aux_scores_row(const double* l, int64_t E, RouterScore score, double* s) {
  if (score == RouterScore::softmax) return softmax_row(l, E, s);
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (s[e] = sigmoid(l[e]));
  for (int64_t e = 0; e < E; ++e) s[e] /= sum + 1e-20;
}

void check_groups(const char* op, int64_t N, int64_t groups) {
  if (groups < 1 || N % groups != 0) throw_runtime("{}: {} rows do not split into {} equal groups", op, N, groups);
}
}  // namespace

void moe_aux_scores_forward(Tensor& scores, Tensor& counts, const Tensor& logits, RouterScore score, int64_t topk,
                            int64_t groups) {
  const char* op = "moe_aux_scores_forward";
  const bool cuda = same_device(op, {&scores, &counts, &logits});
  float_dtype(op, "logits", logits);
  same_dtype(op, "scores", scores, logits.dtype());
  float_dtype(op, "counts", counts);
  int64_t N, E;
  rows_cols(op, "logits", logits, N, E);
  check_groups(op, N, groups);
  if (topk < 1 || topk > E) throw_runtime("{}: topk {} must be in [1, {}]", op, topk, E);
  expect_numel(op, "scores", scores, N * E);
  expect_numel(op, "counts", counts, groups * E);
  MTNLG_CUDA_DISPATCH(cuda, moe_aux_scores_forward(scores, counts, logits, score, topk, groups));
  std::vector<int32_t> chosen(static_cast<size_t>(N * topk));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> l(static_cast<size_t>(E)), s(static_cast<size_t>(E));
    load_row(logits, n, E, l.data());
    aux_scores_row(l.data(), E, score, s.data());
    topk_indices(s.data(), E, topk, nullptr, chosen.data() + n * topk);
    for (int64_t e = 0; e < E; ++e) put(scores, n * E + e, s[e]);
  }
  std::vector<double> c(static_cast<size_t>(groups * E), 0.0);
  const int64_t per = N / groups;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < topk; ++j) c[(n / per) * E + chosen[n * topk + j]] += 1;
  for (int64_t i = 0; i < groups * E; ++i) put(counts, i, c[i]);
}

void moe_aux_scores_backward(Tensor& dlogits, const Tensor& dscores, const Tensor& logits, RouterScore score) {
  const char* op = "moe_aux_scores_backward";
  const bool cuda = same_device(op, {&dlogits, &dscores, &logits});
  float_dtype(op, "logits", logits);
  same_dtype(op, "dlogits", dlogits, logits.dtype());
  same_dtype(op, "dscores", dscores, logits.dtype());
  int64_t N, E;
  rows_cols(op, "logits", logits, N, E);
  expect_numel(op, "dlogits", dlogits, N * E);
  expect_numel(op, "dscores", dscores, N * E);
  MTNLG_CUDA_DISPATCH(cuda, moe_aux_scores_backward(dlogits, dscores, logits, score));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> l(static_cast<size_t>(E)), d(static_cast<size_t>(E)), s(static_cast<size_t>(E));
    load_row(logits, n, E, l.data());
    load_row(dscores, n, E, d.data());
    double dot = 0;
    if (score == RouterScore::softmax) {
      softmax_row(l.data(), E, s.data());
      for (int64_t e = 0; e < E; ++e) dot += s[e] * d[e];
      for (int64_t e = 0; e < E; ++e) put(dlogits, n * E + e, at(dlogits, n * E + e) + s[e] * (d[e] - dot));
      continue;
    }
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (s[e] = sigmoid(l[e]));
    const double S = sum + 1e-20;
    for (int64_t e = 0; e < E; ++e) dot += d[e] * s[e];
    for (int64_t e = 0; e < E; ++e) {
      const double ds = d[e] / S - dot / (S * S);
      put(dlogits, n * E + e, at(dlogits, n * E + e) + ds * s[e] * (1 - s[e]));
    }
  }
}

namespace {
// An optional f64 [1] beside tensors on `dev` (an accumulator or a scale read when the op runs).
void check_scalar(const char* op, const char* name, const Tensor* t, Device dev) {
  if (!t) return;
  if (!t->defined() || t->dtype() != DType::f64 || t->numel() != 1 || t->device() != dev)
    throw_runtime("{}: {} must be one f64 on the {} device", op, name, dev == Device::cuda ? "cuda" : "cpu");
}

// True when the tensors are on CUDA.
bool check_aux(const char* op, const Tensor& scores, const Tensor& counts, int64_t groups, double total_tokens,
               int64_t topk, int64_t& N, int64_t& E) {
  const bool cuda = same_device(op, {&scores, &counts});
  float_dtype(op, "scores", scores);
  float_dtype(op, "counts", counts);
  rows_cols(op, "scores", scores, N, E);
  check_groups(op, N, groups);
  expect_numel(op, "counts", counts, groups * E);
  if (!(total_tokens > 0) || topk < 1) throw_runtime("{}: total_tokens and topk must be positive", op);
  return cuda;
}
}  // namespace

double moe_aux_loss_forward(const Tensor& scores, const Tensor& counts, int64_t groups, double total_tokens,
                            int64_t topk, double coeff, Tensor* acc) {
  int64_t N, E;
  const char* op = "moe_aux_loss_forward";
  const bool cuda = check_aux(op, scores, counts, groups, total_tokens, topk, N, E);
  check_scalar(op, "acc", acc, scores.device());
  MTNLG_CUDA_DISPATCH(cuda, moe_aux_loss_forward(scores, counts, groups, total_tokens, topk, coeff, acc));
  if (acc) {
    acc->kernel_data<double>()[0] += moe_aux_loss_forward(scores, counts, groups, total_tokens, topk, coeff);
    return 0.0;
  }
  const int64_t per = N / groups;
  double loss = 0;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<double> P(static_cast<size_t>(E), 0.0);
    for (int64_t n = g * per; n < (g + 1) * per; ++n)
      for (int64_t e = 0; e < E; ++e) P[e] += at(scores, n * E + e);
    for (int64_t e = 0; e < E; ++e) loss += P[e] * at(counts, g * E + e);
  }
  return loss * coeff * static_cast<double>(E) / (static_cast<double>(topk) * total_tokens * total_tokens) /
         static_cast<double>(groups);
}

void moe_aux_loss_backward(Tensor& dscores, const Tensor& counts, int64_t groups, double total_tokens, int64_t topk,
                           double coeff, double dloss, const Tensor* dloss_scale) {
  int64_t N, E;
  const char* op = "moe_aux_loss_backward";
  const bool cuda = check_aux(op, dscores, counts, groups, total_tokens, topk, N, E);
  check_scalar(op, "dloss_scale", dloss_scale, dscores.device());
  MTNLG_CUDA_DISPATCH(cuda,
                      moe_aux_loss_backward(dscores, counts, groups, total_tokens, topk, coeff, dloss, dloss_scale));
  if (dloss_scale) dloss *= dloss_scale->kernel_data<double>()[0];
  const double f = dloss * coeff * static_cast<double>(E) / (static_cast<double>(topk) * total_tokens * total_tokens) /
                   static_cast<double>(groups);
  const int64_t per = N / groups;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) put(dscores, n * E + e, f * at(counts, (n / per) * E + e));
}

namespace {
// logsumexp of each row, in double.
std::vector<double> row_lse(const Tensor& logits, int64_t N, int64_t E) {
  std::vector<double> lse(static_cast<size_t>(N));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    double m = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, at(logits, n * E + e));
    for (int64_t e = 0; e < E; ++e) s += std::exp(at(logits, n * E + e) - m);
    lse[n] = m + std::log(s);
  }
  return lse;
}
}  // namespace

double moe_z_loss_forward(const Tensor& logits, double coeff, Tensor* acc) {
  const char* op = "moe_z_loss_forward";
  const bool cuda = same_device(op, {&logits});
  float_dtype(op, "logits", logits);
  check_scalar(op, "acc", acc, logits.device());
  int64_t N, E;
  rows_cols(op, "logits", logits, N, E);
  if (N == 0) return 0;
  MTNLG_CUDA_DISPATCH(cuda, moe_z_loss_forward(logits, coeff, acc));
  double s = 0;
  for (double v : row_lse(logits, N, E)) s += v * v;
  const double z = coeff * s / static_cast<double>(N);
  if (!acc) return z;
  acc->kernel_data<double>()[0] += z;
  return 0.0;
}

void moe_z_loss_backward(Tensor& dlogits, const Tensor& logits, double coeff, double dloss, const Tensor* dloss_scale) {
  const char* op = "moe_z_loss_backward";
  const bool cuda = same_device(op, {&dlogits, &logits});
  float_dtype(op, "logits", logits);
  same_dtype(op, "dlogits", dlogits, logits.dtype());
  check_scalar(op, "dloss_scale", dloss_scale, logits.device());
  int64_t N, E;
  rows_cols(op, "logits", logits, N, E);
  expect_numel(op, "dlogits", dlogits, N * E);
  MTNLG_CUDA_DISPATCH(cuda, moe_z_loss_backward(dlogits, logits, coeff, dloss, dloss_scale));
  if (dloss_scale) dloss *= dloss_scale->kernel_data<double>()[0];
  const std::vector<double> lse = row_lse(logits, N, E);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const double f = dloss * coeff * 2 * lse[n] / static_cast<double>(N);
    for (int64_t e = 0; e < E; ++e)
      put(dlogits, n * E + e, at(dlogits, n * E + e) + f * std::exp(at(logits, n * E + e) - lse[n]));
  }
}

// ---- capacity ----------------------------------------------------------------------------

int64_t moe_capacity(int64_t tokens, int64_t num_experts, int64_t topk, double factor) {
  if (tokens < 0 || num_experts < 1 || topk < 1 || !(factor > 0))
    throw_runtime("moe_capacity: tokens {}, experts {}, topk {}, factor {} out of range", tokens, num_experts, topk,
                  factor);
  return static_cast<int64_t>(
      std::ceil(static_cast<double>(tokens * topk) / static_cast<double>(num_experts) * factor));
}

int64_t moe_apply_capacity(Tensor& keep, const Tensor& probs, const Tensor& idx, int64_t num_experts, int64_t capacity,
                           DropPolicy policy) {
  const char* op = "moe_apply_capacity";
  if (same_device(op, {&keep, &probs, &idx})) {  // on the host: a sort per expert
    Tensor kh = Tensor::empty(keep.shape(), DType::i32);
    const int64_t dropped =
        moe_apply_capacity(kh, probs.to(Device::cpu), idx.to(Device::cpu), num_experts, capacity, policy);
    keep.copy_from(kh);
    return dropped;
  }
  expect_i32(op, "keep", keep);
  expect_i32(op, "idx", idx);
  float_dtype(op, "probs", probs);
  const int64_t slots = idx.numel();
  expect_numel(op, "keep", keep, slots);
  expect_numel(op, "probs", probs, slots);
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(num_experts));
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t e = i32(idx)[s];
    if (e < 0 || e >= num_experts) throw_runtime("{}: idx[{}] = {} is not an expert in [0, {})", op, s, e, num_experts);
    by_expert[static_cast<size_t>(e)].push_back(s);  // slots in token order
  }
  int32_t* k = keep.kernel_data<int32_t>();
  std::fill(k, k + slots, 1);
  int64_t dropped = 0;
  for (auto& list : by_expert) {
    if (static_cast<int64_t>(list.size()) <= capacity) continue;
    if (policy == DropPolicy::probs)  // highest weight first, ties to the earlier token
      std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) { return at(probs, a) > at(probs, b); });
    for (size_t i = static_cast<size_t>(capacity); i < list.size(); ++i) k[list[i]] = 0, ++dropped;
  }
  return dropped;
}

// ---- the permutation by expert -------------------------------------------------------------

MoeDispatch moe_dispatch_plan(const Tensor& idx, const Tensor* keep, int64_t num_experts, int64_t pad_to) {
  const char* op = "moe_dispatch_plan";
  if (same_device(op, {&idx, keep})) {  // the choices come to the host (one synchronisation), the plan goes back
    const Tensor kh = keep && keep->defined() ? keep->to(Device::cpu) : Tensor();
    return moe_dispatch_plan(idx.to(Device::cpu), kh.defined() ? &kh : nullptr, num_experts, pad_to).on(idx.device());
  }
  expect_i32(op, "idx", idx);
  MoeDispatch d;
  rows_cols(op, "idx", idx, d.num_tokens, d.topk);
  d.num_experts = num_experts;
  const int64_t slots = idx.numel();
  const bool has_keep = keep && keep->defined();
  if (has_keep) expect_numel(op, "keep", *keep, slots);
  auto kept = [&](int64_t s) { return !has_keep || i32(*keep)[s] != 0; };
  d.tokens.assign(static_cast<size_t>(num_experts), 0);
  for (int64_t s = 0; s < slots; ++s) {
    const int32_t e = i32(idx)[s];
    if (e < 0 || e >= num_experts) throw_runtime("{}: idx[{}] = {} is not an expert in [0, {})", op, s, e, num_experts);
    if (kept(s)) ++d.tokens[static_cast<size_t>(e)];
  }
  d.counts = d.tokens;
  for (auto& c : d.counts) {
    if (pad_to > 0 && c > pad_to) throw_runtime("{}: an expert has {} rows, above pad_to {}", op, c, pad_to);
    if (pad_to > 0) c = pad_to;
  }
  d.rows = std::accumulate(d.counts.begin(), d.counts.end(), int64_t{0});
  d.row_src = Tensor::empty({d.rows}, DType::i32);
  d.row_slot = Tensor::empty({d.rows}, DType::i32);
  d.slot_row = Tensor::empty({slots}, DType::i32);
  int32_t *src = d.row_src.data<int32_t>(), *rs = d.row_slot.data<int32_t>(), *sr = d.slot_row.data<int32_t>();
  std::fill(src, src + d.rows, -1);
  std::fill(rs, rs + d.rows, -1);
  std::vector<int64_t> next(static_cast<size_t>(num_experts));
  for (int64_t e = 0; e < num_experts; ++e) next[e] = d.offset(e);
  for (int64_t s = 0; s < slots; ++s) {
    sr[s] = -1;
    if (!kept(s)) continue;
    const int64_t r = next[static_cast<size_t>(i32(idx)[s])]++;
    src[r] = static_cast<int32_t>(s / d.topk);
    rs[r] = static_cast<int32_t>(s);
    sr[s] = static_cast<int32_t>(r);
  }
  return d;
}

MoeDispatch moe_padded_dispatch_plan(Tensor& kept, const Tensor& probs, const Tensor& idx, int64_t num_experts,
                                     int64_t capacity, DropPolicy policy) {
  const char* op = "moe_padded_dispatch_plan";
  const bool cuda = same_device(op, {&kept, &probs, &idx});
  expect_i32(op, "kept", kept);
  expect_i32(op, "idx", idx);
  expect_numel(op, "kept", kept, num_experts);
  expect_numel(op, "probs", probs, idx.numel());
  if (capacity < 1) throw_runtime("{}: capacity {} (a padded plan needs at least one row per expert)", op, capacity);
  MTNLG_CUDA_DISPATCH(cuda, moe_padded_dispatch_plan(kept, probs, idx, num_experts, capacity, policy));
  Tensor keep = Tensor::empty(idx.shape(), DType::i32, idx.device());
  moe_apply_capacity(keep, probs, idx, num_experts, capacity, policy);
  MoeDispatch d = moe_dispatch_plan(idx, &keep, num_experts, capacity);
  for (int64_t e = 0; e < num_experts; ++e) kept.kernel_data<int32_t>()[e] = static_cast<int32_t>(d.tokens[e]);
  d.tokens.clear();
  return d;
}

void moe_record_routing(Tensor& record, const Tensor& kept, int64_t slots) {
  const char* op = "moe_record_routing";
  const bool cuda = same_device(op, {&record, &kept});
  expect_i32(op, "kept", kept);
  const int64_t E = kept.numel();
  if (record.dtype() != DType::f64 || record.numel() != E + 4)
    throw_runtime("{}: record must be f64 [{}] (E + 4), got {} [{}]", op, E + 4, to_string(record.dtype()),
                  record.numel());
  MTNLG_CUDA_DISPATCH(cuda, moe_record_routing(record, kept, slots));
  double* r = record.kernel_data<double>();
  const int32_t* k = kept.kernel_data<int32_t>();
  int64_t sum = 0;
  for (int64_t e = 0; e < E; ++e) {
    r[e] += k[e];
    sum += k[e];
  }
  r[E] += static_cast<double>(slots - sum);
  r[E + 3] += 1.0;
}

namespace {
void check_plan_rows(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t& H) {
  data_dtype(op, name, t);
  int64_t n;
  rows_cols(op, name, t, n, H);
  if (n != rows) throw_runtime("{}: {} has {} rows, expected {}", op, name, n, rows);
}
}  // namespace

void moe_permute(Tensor& out, const Tensor& x, const MoeDispatch& d) {
  const char* op = "moe_permute";
  const bool cuda = same_device(op, {&out, &x});
  int64_t H, Ho;
  check_plan_rows(op, "x", x, d.num_tokens, H);
  check_plan_rows(op, "out", out, d.rows, Ho);
  same_dtype(op, "out", out, x.dtype());
  if (H != Ho) throw_runtime("{}: out width {} != x width {}", op, Ho, H);
  MTNLG_CUDA_DISPATCH(cuda, moe_permute(out, x, d));
  if (is_low(x.dtype())) {
    Widened wd;
    moe_permute(wd.out(out), wd.in(x), d);
    return wd.store();
  }
  const int32_t* src = i32(d.row_src);
  by_dtype(x.dtype(), [&](auto z) {  // typed pointers: at/put per element cost a dtype test and a call
    using T = decltype(z);
    const T* in = x.kernel_data<T>();
    T* o = out.kernel_data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < d.rows; ++r)
      for (int64_t c = 0; c < H; ++c) o[r * H + c] = src[r] < 0 ? T(0) : in[src[r] * H + c];
  });
}

void moe_unpermute(Tensor& y, const Tensor& rows, const MoeDispatch& d) {
  const char* op = "moe_unpermute";
  const bool cuda = same_device(op, {&y, &rows});
  int64_t H, Hr;
  check_plan_rows(op, "y", y, d.num_tokens, H);
  check_plan_rows(op, "rows", rows, d.rows, Hr);
  same_dtype(op, "y", y, rows.dtype());
  if (H != Hr) throw_runtime("{}: y width {} != rows width {}", op, H, Hr);
  MTNLG_CUDA_DISPATCH(cuda, moe_unpermute(y, rows, d));
  if (is_low(y.dtype())) {
    Widened wd;
    moe_unpermute(wd.out(y), wd.in(rows), d);
    return wd.store();
  }
  const int32_t* sr = i32(d.slot_row);
  by_dtype(y.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* in = rows.kernel_data<T>();
    T* out = y.kernel_data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < d.num_tokens; ++n)
      for (int64_t c = 0; c < H; ++c) {
        double s = 0;  // in double, slot order: the sum of section 6
        for (int64_t j = 0; j < d.topk; ++j)
          if (const int32_t r = sr[n * d.topk + j]; r >= 0) s += static_cast<double>(in[r * H + c]);
        out[n * H + c] = static_cast<T>(s);
      }
  });
}

void moe_weight_rows_forward(Tensor& out, const Tensor& act, const Tensor& probs, const MoeDispatch& d) {
  const char* op = "moe_weight_rows_forward";
  const bool cuda = same_device(op, {&out, &act, &probs});
  int64_t F, Fo;
  check_plan_rows(op, "act", act, d.rows, F);
  check_plan_rows(op, "out", out, d.rows, Fo);
  same_dtype(op, "out", out, act.dtype());
  weight_dtype(op, "probs", probs, act);
  expect_numel(op, "probs", probs, d.num_tokens * d.topk);
  if (F != Fo) throw_runtime("{}: out width {} != act width {}", op, Fo, F);
  MTNLG_CUDA_DISPATCH(cuda, moe_weight_rows_forward(out, act, probs, d));
  if (is_low(act.dtype())) {
    Widened wd;
    moe_weight_rows_forward(wd.out(out), wd.in(act), probs, d);
    return wd.store();
  }
  const int32_t* rs = i32(d.row_slot);
  by_dtype(act.dtype(), [&](auto z) {
    using T = decltype(z);
    const T *a = act.kernel_data<T>(), *p = probs.kernel_data<T>();
    T* o = out.kernel_data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < d.rows; ++r) {
      const double w = rs[r] < 0 ? 0.0 : static_cast<double>(p[rs[r]]);
      for (int64_t c = 0; c < F; ++c) o[r * F + c] = static_cast<T>(static_cast<double>(a[r * F + c]) * w);
    }
  });
}

void moe_weight_rows_backward(Tensor& dact, Tensor& dprobs, const Tensor& dout, const Tensor& act, const Tensor& probs,
                              const MoeDispatch& d) {
  const char* op = "moe_weight_rows_backward";
  const bool cuda = same_device(op, {&dact, &dprobs, &dout, &act, &probs});
  int64_t F, Fd, Fo;
  check_plan_rows(op, "act", act, d.rows, F);
  check_plan_rows(op, "dact", dact, d.rows, Fd);
  check_plan_rows(op, "dout", dout, d.rows, Fo);
  for (const auto& [name, t] : {Named{"dact", &dact}, Named{"dout", &dout}}) same_dtype(op, name, *t, act.dtype());
  for (const auto& [name, t] : {Named{"probs", &probs}, Named{"dprobs", &dprobs}}) weight_dtype(op, name, *t, act);
  expect_numel(op, "probs", probs, d.num_tokens * d.topk);
  expect_numel(op, "dprobs", dprobs, d.num_tokens * d.topk);
  if (F != Fd || F != Fo) throw_runtime("{}: widths differ (act {}, dact {}, dout {})", op, F, Fd, Fo);
  MTNLG_CUDA_DISPATCH(cuda, moe_weight_rows_backward(dact, dprobs, dout, act, probs, d));
  if (is_low(act.dtype())) {
    Widened wd;
    moe_weight_rows_backward(wd.out(dact), dprobs, wd.in(dout), wd.in(act), probs, d);
    return wd.store();
  }
  const int32_t *rs = i32(d.row_slot), *sr = i32(d.slot_row);
  by_dtype(act.dtype(), [&](auto z) {
    using T = decltype(z);
    const T *a = act.kernel_data<T>(), *p = probs.kernel_data<T>(), *g = dout.kernel_data<T>();
    T *da = dact.kernel_data<T>(), *dp = dprobs.kernel_data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < d.rows; ++r) {
      const double w = rs[r] < 0 ? 0.0 : static_cast<double>(p[rs[r]]);
      for (int64_t c = 0; c < F; ++c) da[r * F + c] = static_cast<T>(static_cast<double>(g[r * F + c]) * w);
    }
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < d.num_tokens * d.topk; ++s) {
      double sum = 0;
      if (const int32_t r = sr[s]; r >= 0)
        for (int64_t c = 0; c < F; ++c) sum += static_cast<double>(g[r * F + c]) * static_cast<double>(a[r * F + c]);
      dp[s] = static_cast<T>(sum);
    }
  });
}

// ---- the experts as one grouped GEMM -------------------------------------------------------

namespace {
// E, OC, C of w [E, OC, C] against inp's rows and the counts.
void grouped_shape(const char* op, const Tensor& inp, const Tensor& w, const std::vector<int64_t>& counts, int64_t& E,
                   int64_t& OC, int64_t& C) {
  expect_ndim(op, "w", w, 3);
  E = w.dim(0), OC = w.dim(1), C = w.dim(2);
  if (static_cast<int64_t>(counts.size()) != E) throw_runtime("{}: {} counts for {} experts", op, counts.size(), E);
  int64_t rows = 0;
  for (int64_t n : counts) {
    if (n < 0) throw_runtime("{}: a negative row count", op);
    rows += n;
  }
  MTNLG_CHECK(inp.ndim() >= 1, "{}: inp needs a last dimension", op);
  if (inp.dim(-1) != C || inp.numel() != rows * C)
    throw_runtime("{}: inp holds {} elements, expected sum(counts) {} x C {}", op, inp.numel(), rows, C);
}
Tensor rows_of(const Tensor& t, int64_t start, int64_t n, int64_t width) {
  return t.flat(start * width, n * width).view({n, width});
}
}  // namespace

void grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias,
                            const std::vector<int64_t>& counts) {
  const char* op = "grouped_matmul_forward";
  const bool cuda = same_device(op, {&out, &inp, &w, bias});
  int64_t E, OC, C;
  grouped_shape(op, inp, w, counts, E, OC, C);
  const int64_t rows = inp.numel() / std::max<int64_t>(C, 1);
  expect_numel(op, "out", out, rows * OC);
  const bool has_bias = bias && bias->defined();
  if (has_bias) expect_numel(op, "bias", *bias, E * OC);
  MTNLG_CUDA_DISPATCH(cuda, grouped_matmul_forward(out, inp, w, bias, counts));
  int64_t off = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[static_cast<size_t>(e)];
    if (n > 0) {
      Tensor o = rows_of(out, off, n, OC), b = has_bias ? bias->flat(e * OC, OC) : Tensor();
      matmul_forward(o, rows_of(inp, off, n, C), w.flat(e * OC * C, OC * C).view({OC, C}), has_bias ? &b : nullptr);
    }
    off += n;
  }
}

void grouped_matmul_backward(Tensor* dinp, Tensor* dw, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                             const Tensor& w, const std::vector<int64_t>& counts) {
  const char* op = "grouped_matmul_backward";
  const bool cuda = same_device(op, {dinp, dw, dbias, &dout, &inp, &w});
  int64_t E, OC, C;
  grouped_shape(op, inp, w, counts, E, OC, C);
  const int64_t rows = inp.numel() / std::max<int64_t>(C, 1);
  expect_numel(op, "dout", dout, rows * OC);
  if (dinp && dinp->defined()) expect_numel(op, "dinp", *dinp, rows * C);
  if (dw && dw->defined()) expect_numel(op, "dw", *dw, E * OC * C);
  if (dbias && dbias->defined()) expect_numel(op, "dbias", *dbias, E * OC);
  MTNLG_CUDA_DISPATCH(cuda, grouped_matmul_backward(dinp, dw, dbias, dout, inp, w, counts));
  int64_t off = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[static_cast<size_t>(e)];
    if (n > 0) {
      Tensor di = dinp && dinp->defined() ? rows_of(*dinp, off, n, C) : Tensor();
      Tensor dwe = dw && dw->defined() ? dw->flat(e * OC * C, OC * C).view({OC, C}) : Tensor();
      Tensor db = dbias && dbias->defined() ? dbias->flat(e * OC, OC) : Tensor();
      matmul_backward(di.defined() ? &di : nullptr, dwe.defined() ? &dwe : nullptr, db.defined() ? &db : nullptr,
                      rows_of(dout, off, n, OC), rows_of(inp, off, n, C), w.flat(e * OC * C, OC * C).view({OC, C}));
    }
    off += n;
  }
}

// ---- the expert-bias update and the shared expert's gate -----------------------------------

void moe_expert_bias_update(Tensor& bias, const Tensor& counts, double rate) {
  const char* op = "moe_expert_bias_update";
  const bool cuda = same_device(op, {&bias, &counts});
  float_dtype(op, "bias", bias);
  float_dtype(op, "counts", counts);
  const int64_t E = bias.numel();
  expect_numel(op, "counts", counts, E);
  if (E == 0) return;
  MTNLG_CUDA_DISPATCH(cuda, moe_expert_bias_update(bias, counts, rate));
  double mean = 0;
  for (int64_t e = 0; e < E; ++e) mean += at(counts, e);
  mean /= static_cast<double>(E);
  for (int64_t e = 0; e < E; ++e) {
    const double off = mean - at(counts, e);
    const double sign = off > 0 ? 1.0 : off < 0 ? -1.0 : 0.0;
    put(bias, e, at(bias, e) + rate * sign);
  }
}

void sigmoid_gate_forward(Tensor& out, const Tensor& x, const Tensor& gate) {
  const char* op = "sigmoid_gate_forward";
  const bool cuda = same_device(op, {&out, &x, &gate});
  data_dtype(op, "x", x);
  same_dtype(op, "out", out, x.dtype());
  same_dtype(op, "gate", gate, x.dtype());
  int64_t N, C;
  rows_cols(op, "x", x, N, C);
  expect_numel(op, "out", out, N * C);
  expect_numel(op, "gate", gate, N);
  MTNLG_CUDA_DISPATCH(cuda, sigmoid_gate_forward(out, x, gate));
  if (is_low(x.dtype())) {
    Widened wd;
    sigmoid_gate_forward(wd.out(out), wd.in(x), wd.in(gate));
    return wd.store();
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const double s = sigmoid(at(gate, n));
    for (int64_t c = 0; c < C; ++c) put(out, n * C + c, at(x, n * C + c) * s);
  }
}

void sigmoid_gate_backward(Tensor& dx, Tensor& dgate, const Tensor& dout, const Tensor& x, const Tensor& gate) {
  const char* op = "sigmoid_gate_backward";
  const bool cuda = same_device(op, {&dx, &dgate, &dout, &x, &gate});
  data_dtype(op, "x", x);
  for (const auto& [name, t] : {Named{"dx", &dx}, Named{"dgate", &dgate}, Named{"dout", &dout}, Named{"gate", &gate}})
    same_dtype(op, name, *t, x.dtype());
  int64_t N, C;
  rows_cols(op, "x", x, N, C);
  expect_numel(op, "dx", dx, N * C);
  expect_numel(op, "dout", dout, N * C);
  expect_numel(op, "gate", gate, N);
  expect_numel(op, "dgate", dgate, N);
  MTNLG_CUDA_DISPATCH(cuda, sigmoid_gate_backward(dx, dgate, dout, x, gate));
  if (is_low(x.dtype())) {
    Widened wd;
    sigmoid_gate_backward(wd.out(dx), wd.out(dgate), wd.in(dout), wd.in(x), wd.in(gate));
    return wd.store();
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const double s = sigmoid(at(gate, n));
    double g = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double d = at(dout, n * C + c);
      g += d * at(x, n * C + c);
      put(dx, n * C + c, d * s);
    }
    put(dgate, n, g * s * (1 - s));
  }
}

void moe_jitter(Tensor& out, const Tensor& x, double eps, uint64_t key, uint64_t base_index, const DeviceKey& dkey) {
  const char* op = "moe_jitter";
  const bool cuda = same_device(op, {&out, &x});
  data_dtype(op, "x", x);
  same_dtype(op, "out", out, x.dtype());
  expect_numel(op, "out", out, x.numel());
  if (!(eps >= 0 && eps < 1)) throw_runtime("{}: eps {} must be in [0, 1)", op, eps);
  MTNLG_CUDA_DISPATCH(cuda, moe_jitter(out, x, eps, key, base_index, dkey));
  if (is_low(x.dtype())) {
    Widened wd;
    moe_jitter(wd.out(out), wd.in(x), eps, key, base_index, dkey);
    return wd.store();
  }
  const float e = static_cast<float>(eps);
  by_dtype(x.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* in = x.kernel_data<T>();
    T* o = out.kernel_data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float u = philox_uniform(key, 1, base_index + static_cast<uint64_t>(i));
      o[i] = in[i] * static_cast<T>(1.0f - e + 2.0f * e * u);  // the factor in fp32, as CUDA's
    }
  });
}

}  // namespace mtnlg::ops
