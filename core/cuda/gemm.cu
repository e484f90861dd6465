// The linear layer: matmuls through cuBLASLt, the bias add and its column-sum backward.
// CPU reference: core/ops/gemm.cpp, which calls OpenBLAS with the same three shapes:
//   forward  out[N,OC]  = inp[N,C] @ w[OC,C]^T (+ bias)   beta 0
//   dinp     dinp[N,C]  = dout[N,OC] @ w[OC,C]            beta 0, or 1 to accumulate
//   dw       dw[OC,C]  += dout[N,OC]^T @ inp[N,C]         beta 1, fp32 output
// cuBLASLt is column-major; a row-major [R,K] matrix is a column-major [K,R] one, so
// each shape is computed as its transpose (see the m/n/k comments below).
//
// Precision: CUBLAS_COMPUTE_32F (true fp32 accumulation; TF32 is never enabled, so the
// fp32 path matches the CPU to rounding). bf16/fp16 inputs accumulate in fp32; the
// weight gradient is written in fp32 (fp32 gradient accumulation).
// Gradient contract: dw ACCUMULATES, dinp is WRITTEN unless `accumulate`.
//
// Algorithms: up to 8 heuristic candidates per (shape, types, alignments), tried in order
// (the first that runs is kept in front); when cuBLASLt refuses the problem (any status
// from the heuristic) or none of its candidates runs, the GEMM goes to cublasGemmEx (same
// fp32 compute) instead of failing. The bias epilogue is used when the bias pointer is
// 16-byte aligned and the heuristic offers an algorithm for it; otherwise the GEMM runs
// plain and a kernel adds the bias — for bf16/fp16 outputs to the fp32 product, rounding
// once, as the epilogue and the CPU do.
//
// Epilogues are optional fusions: a refusal of one (heuristic or matmul status) never
// ends a run. The caller runs the plain GEMM and its separate kernels, the refusal is
// warned about once per problem and counted in gemm_fallbacks() (metrics.jsonl).
//
// Attributes are set as cuBLASLt 13 documents them for these types (docs/specs/
// cuda-emulation.md has the table the emulator checks): the bias vector's type is left at
// its default, D's type, which is the only one documented for f32/bf16/fp16 outputs, and
// the GELU aux matrix's type is never set (a non-default aux type is documented for FP8
// outputs only; a bf16 GELU_AUX_BIAS call that set it to bf16 was refused with
// CUBLAS_STATUS_INVALID_VALUE on an H200). So the bias-gradient epilogue DGELU_BGRAD,
// whose bias gradient would have D's type where mtnlg keeps it in fp32, is not used:
// bf16/fp16 take DGELU and the column-sum kernel.
//
// The GELU epilogues serve bf16/fp16 only. fp32 is the precision whose contract is the
// CPU's function to ~1e-5, and the library's GELU derivative is not that: on an H200 the
// fused f32 backward's dpre was 1.0002x the 1e-5 bound where the GEMM and mtnlg's own
// GELU kernel are well inside it (the same shape, the same test); at bf16's 2^-8 rounding
// the difference is invisible.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <string>
#include <cstdio>
#include <map>
#include <tuple>
#include <mutex>
#include <set>
#include <utility>

#include "core/cuda/common.cuh"
#include "core/cuda/cublas_classic.hpp"
#include "core/switches.hpp"

namespace mtnlg::cuda::k {

namespace {

bool g_bias_epilogue = true;
// MTNLG_GELU_EPILOGUE=0 turns the GELU epilogues off for a whole run (the A/B of
// scripts/bench/gpu_bench.sh); set_gemm_gelu_epilogue() for tests.
bool& gelu_epilogue() {  // read at the first use, after main checked the environment
  static bool on = switches::on(Switch::gelu_epilogue);
  return on;
}
std::atomic<int64_t> g_gelu_fused{0};  // GEMMs that ran a GELU epilogue

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: fail("gemm: storage dtype other than f32, bf16, f16");
  }
}

int64_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int64_t al = 256;
  while (al > 1 && (a % static_cast<uintptr_t>(al)) != 0) al /= 2;
  return al;
}

// RAII holders for the descriptor objects of one call.
struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Desc() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Everything cuBLASLt's heuristic answer depends on: the problem, its layouts, the
// epilogue, the pointers' alignments, beta, the device and the batch strides.
struct AlgoKey {
  int64_t ta, tb, m, n, k;
  int64_t a_type, d_type;
  int64_t lda, ldb, ldd;
  int64_t epilogue;
  int64_t align_a, align_b, align_d;  // bytes (alignment())
  int64_t beta_nonzero;
  int64_t device;
  int64_t batch_count, batch_a, batch_b, batch_d;
  int64_t aux_ld, align_aux;

  auto tie() const {
    return std::tie(ta, tb, m, n, k, a_type, d_type, lda, ldb, ldd, epilogue, align_a, align_b, align_d, beta_nonzero,
                    device, batch_count, batch_a, batch_b, batch_d, aux_ld, align_aux);
  }
  bool operator<(const AlgoKey& o) const { return tie() < o.tie(); }
};
std::mutex g_algo_mu;
std::set<std::array<int64_t, 6>> g_warned;  // shapes (type, m, n, k, epilogue, batch) whose refusal was warned about
constexpr int kHeuristics = 8;              // candidates asked for per key
// The heuristic's candidates for a call's key, best first; n = 0 when cuBLASLt has none.
// (A fixed array, not a std::vector: nvcc 13 hits an internal error on the latter here.)
struct Candidates {
  int n = 0;
  cublasLtMatmulAlgo_t algo[kHeuristics];
  cublasStatus_t refusal = CUBLAS_STATUS_SUCCESS;  // when n == 0: why (SUCCESS: every candidate failed to run)
};
std::map<AlgoKey, Candidates> g_algos;
bool g_use_lt = true;     // false: every matmul takes the cublasGemmEx fallback (tests)
int64_t g_fallbacks = 0;  // matmuls not run as asked: an epilogue refused, or cublasGemmEx


// The same product through classic cuBLAS (any alignment or shape cuBLAS takes; fp32
// compute, CUBLAS_DEFAULT_MATH, so never TF32): when cuBLASLt offers no algorithm, or
// none of its candidates runs.
void gemm_ex(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* A, DType adt, int64_t lda,
             const void* B, int64_t ldb, void* D, DType ddt, int64_t ldd, float beta) {
  for (int64_t v : {m, n, k, lda, ldb, ldd})
    if (v > INT32_MAX) fail("a matmul dimension exceeds cuBLAS's 32-bit sizes");
  // The backend's handle: on the backend stream with its own workspace since
  // init_backend (device.hpp), so that a captured fallback allocates nothing.
  const cublasHandle_t h = cublas_classic();
  CUBLAS_CHECK(cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(m),
                            static_cast<int>(n), static_cast<int>(k), &alpha, A, cuda_type(adt), static_cast<int>(lda),
                            B, cuda_type(adt), static_cast<int>(ldb), &beta, D, cuda_type(ddt), static_cast<int>(ldd),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  std::lock_guard<std::mutex> lock(g_algo_mu);
  ++g_fallbacks;
}

// What cuBLASLt does after the product (CUBLASLT_EPILOGUE_*): DEFAULT, BIAS (bias[m] added),
// GELU_AUX_BIAS (bias added, the sum kept in aux, gelu of it stored) or DGELU (D
// multiplied by gelu'(aux)). The bias and the aux matrix have D's type.
struct Epilogue {
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  bool any() const { return epi != CUBLASLT_EPILOGUE_DEFAULT; }
};

// A strided batch of the same product: matrix i of A, B and D starts i * stride elements
// after the first (count 1: a single matrix).
struct Batch {
  int64_t count = 1, a = 0, b = 0, d = 0;
};

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    default: return "no";
  }
}

// A refused problem (the caller holds g_algo_mu): counted with every call, warned about
// once per shape (the cache's keys also tell pointer alignments apart) with what runs instead.
void note_refusal(const Epilogue& ep, DType dt, int64_t m, int64_t n, int64_t k, int64_t batch, cublasStatus_t st) {
  if (ep.any()) ++g_fallbacks;  // a required GEMM is counted by cublasGemmEx, per call
  if (!g_warned.insert({static_cast<int64_t>(dt), m, n, k, static_cast<int64_t>(ep.epi), batch}).second) return;
  char msg[512];
  std::snprintf(msg, sizeof msg,
                "cuBLASLt refused a %s GEMM (m %lld, n %lld, k %lld) with the %s epilogue: %s; running %s instead "
                "(warned once per shape, counted in gemm_fallbacks)",
                to_string(dt).c_str(), static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                epilogue_name(ep.epi),
                st == CUBLAS_STATUS_SUCCESS ? "none of its algorithms ran" : cublasGetStatusString(st),
                ep.any() ? "the GEMM and separate kernels" : "cublasGemmEx");
  warn(msg);
}

// The batch through the fallback, one cublasGemmEx per matrix.
void gemm_ex_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* A, DType adt,
                     int64_t lda, const void* B, int64_t ldb, void* D, DType ddt, int64_t ldd, float beta,
                     const Batch& batch) {
  const int64_t ea = dtype_size(adt), ed = dtype_size(ddt);
  for (int64_t i = 0; i < batch.count; ++i)
    gemm_ex(ta, tb, m, n, k, alpha, static_cast<const char*>(A) + i * batch.a * ea, adt, lda,
            static_cast<const char*>(B) + i * batch.b * ea, ldb, static_cast<char*>(D) + i * batch.d * ed, ddt, ldd,
            beta);
}

// The operation (transposes, epilogue and its pointers) and the three matrix layouts
// (with the batch's strides) of one cuBLASLt call, into `ds`.
void describe_matmul(Desc& ds, bool ta, bool tb, int64_t m, int64_t n, int64_t k, DType adt, int64_t lda, int64_t ldb,
                     DType ddt, int64_t ldd, const Epilogue& ep, const Batch& batch) {
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (ep.any()) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep.epi, sizeof(ep.epi)));
    if (ep.bias)  // its type attribute stays unset: D's type (see the header)
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.bias, sizeof(ep.bias)));
    if (ep.aux) {  // the aux matrix has D's type: its type attribute stays unset (FP8 only)
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux, sizeof(ep.aux)));
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ep.aux_ld, sizeof(ep.aux_ld)));
    }
  }
  const cudaDataType_t at = cuda_type(adt), dtt = cuda_type(ddt);
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.a, at, ta ? k : m, ta ? m : k, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.b, at, tb ? n : k, tb ? k : n, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.d, dtt, m, n, ldd));
  if (batch.count > 1) {
    const int32_t count = static_cast<int32_t>(batch.count);
    const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {{ds.a, batch.a}, {ds.b, batch.b}, {ds.d, batch.d}};
    for (const auto& [layout, stride] : strided) {
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                    sizeof(stride)));
    }
  }
}

// cuBLASLt's candidates for `key` (its problem described by `ds`): asked of the heuristic
// on the key's first use and cached, a refusal as a list with none.
Candidates cached_candidates(Desc& ds, const AlgoKey& key) {
  std::lock_guard<std::mutex> lock(g_algo_mu);
  auto it = g_algos.find(key);
  if (it == g_algos.end()) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&ds.pref));
    const uint64_t ws = static_cast<uint64_t>(cublas_workspace_bytes());
    CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t al_a = static_cast<uint32_t>(key.align_a), al_b = static_cast<uint32_t>(key.align_b),
                   al_d = static_cast<uint32_t>(key.align_d);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, 4));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, 4));
    cublasLtMatmulHeuristicResult_t res[kHeuristics] = {};
    int found = 0;
    // Any status other than success is a refusal of this problem (NOT_SUPPORTED: no
    // kernel; INVALID_VALUE: an attribute it does not take for these types), never an
    // error: the problem is remembered with no candidate and runs another way.
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(cublaslt(), ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, kHeuristics, res, &found);
    Candidates list;
    list.refusal = st;
    if (st == CUBLAS_STATUS_SUCCESS)
      for (int i = 0; i < found && i < kHeuristics; ++i)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) list.algo[list.n++] = res[i].algo;
    if (st == CUBLAS_STATUS_SUCCESS && list.n == 0) list.refusal = CUBLAS_STATUS_NOT_SUPPORTED;
    it = g_algos.emplace(key, list).first;
  }
  return it->second;
}

// Column-major D[m,n] = alpha op(A) op(B) + beta D, then the epilogue, for each matrix of
// `batch`. A is stored [k,m] when ta
// else [m,k]; B is stored [n,k] when tb else [k,n]. cuBLASLt's heuristic is asked for up
// to kHeuristics candidates per (shape, types, alignments, epilogue); they are tried in
// order and the first that runs moves to the front. Returns false, doing nothing, when an
// epilogue was asked for and no candidate takes it (the caller does its work separately);
// without one, no runnable candidate means cublasGemmEx.
bool lt_matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* A, DType adt, int64_t lda, const void* B,
               int64_t ldb, void* D, DType ddt, int64_t ldd, float beta, const Epilogue& ep = Epilogue{},
               float alpha = 1.0f, const Batch& batch = Batch{}) {
  if (!g_use_lt) {
    if (ep.any()) return false;
    gemm_ex_batched(ta, tb, m, n, k, alpha, A, adt, lda, B, ldb, D, ddt, ldd, beta, batch);
    return true;
  }
  Desc ds;
  describe_matmul(ds, ta, tb, m, n, k, adt, lda, ldb, ddt, ldd, ep, batch);

  const AlgoKey key{.ta = ta,
                    .tb = tb,
                    .m = m,
                    .n = n,
                    .k = k,
                    .a_type = static_cast<int64_t>(adt),
                    .d_type = static_cast<int64_t>(ddt),
                    .lda = lda,
                    .ldb = ldb,
                    .ldd = ldd,
                    .epilogue = static_cast<int64_t>(ep.epi),
                    .align_a = alignment(A),
                    .align_b = alignment(B),
                    .align_d = alignment(D),
                    .beta_nonzero = beta != 0.0f,
                    .device = backend_device(),
                    .batch_count = batch.count,
                    .batch_a = batch.a,
                    .batch_b = batch.b,
                    .batch_d = batch.d,
                    .aux_ld = ep.aux_ld,
                    .align_aux = ep.aux ? alignment(ep.aux) : 0};
  const Candidates algos = cached_candidates(ds, key);
  for (int i = 0; i < algos.n; ++i) {
    const cublasStatus_t st =
        cublasLtMatmul(cublaslt(), ds.op, &alpha, A, ds.a, B, ds.b, &beta, D, ds.d, D, ds.d, &algos.algo[i],
                       cublas_workspace(), static_cast<size_t>(cublas_workspace_bytes()), stream());
    if (st == CUBLAS_STATUS_SUCCESS) {
      if (i > 0) {  // remember the one that ran
        std::lock_guard<std::mutex> lock(g_algo_mu);
        Candidates& list = g_algos[key];
        std::rotate(list.algo, list.algo + i, list.algo + i + 1);
      }
      return true;
    }
    if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE && st != CUBLAS_STATUS_ARCH_MISMATCH)
      CUBLAS_CHECK(st);  // a real failure, not "this candidate cannot run here"
  }
  {
    std::lock_guard<std::mutex> lock(g_algo_mu);
    if (algos.n > 0) g_algos[key].n = 0;  // none of the candidates ran: do not try them again for this key
    note_refusal(ep, adt, m, n, k, batch.count, algos.n > 0 ? CUBLAS_STATUS_SUCCESS : algos.refusal);
  }
  if (ep.any()) return false;
  gemm_ex_batched(ta, tb, m, n, k, alpha, A, adt, lda, B, ldb, D, ddt, ldd, beta, batch);
  return true;
}

// Zeros of any storage dtype are all-zero bytes.
void zero(void* x, DType dt, int64_t n) {
  CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(n * dtype_size(dt)), stream()));
}

}  // namespace

void bias_add_forward(void* x, const void* b, DType dt, int64_t N, int64_t C);                    // below
void bias_add_round(void* out, const float* acc, const void* b, DType dt, int64_t N, int64_t C);  // below

void gemm_forward(void* out, const void* inp, const void* w, const void* bias, DType dt, int64_t N, int64_t C,
                  int64_t OC) {
  if (N <= 0 || OC <= 0) return;
  if (C == 0) {  // empty sum: out = bias or 0
    zero(out, dt, N * OC);
    if (bias) bias_add_forward(out, bias, dt, N, OC);
    return;
  }
  // out^T [OC,N] = w [as C x OC col-major]^T @ inp^T [C x N]: m=OC, n=N, k=C.
  const bool fuse = bias && g_bias_epilogue && alignment(bias) >= 16;
  if (fuse &&
      lt_matmul(true, false, OC, N, C, w, dt, C, inp, C, out, dt, OC, 0.0f, Epilogue{CUBLASLT_EPILOGUE_BIAS, bias}))
    return;
  if (bias && dt != DType::f32) {  // the product in fp32, then bias and one rounding (as the epilogue)
    DeviceBuffer<float> acc(N * OC);
    lt_matmul(true, false, OC, N, C, w, dt, C, inp, C, acc.data(), DType::f32, OC, 0.0f);
    bias_add_round(out, acc.data(), bias, dt, N, OC);
    return;
  }
  lt_matmul(true, false, OC, N, C, w, dt, C, inp, C, out, dt, OC, 0.0f);
  if (bias) bias_add_forward(out, bias, dt, N, OC);
}

void gemm_dinp(void* dinp, const void* dout, const void* w, DType dt, int64_t N, int64_t C, int64_t OC,
               bool accumulate) {
  if (N <= 0 || C <= 0) return;
  if (OC == 0) {
    if (!accumulate) zero(dinp, dt, N * C);
    return;
  }
  // dinp^T [C,N] = w^T [C x OC col-major, no transpose] @ dout^T [OC x N]: m=C, n=N, k=OC.
  lt_matmul(false, false, C, N, OC, w, dt, C, dout, OC, dinp, dt, C, accumulate ? 1.0f : 0.0f);
}

void gemm_strided_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* A, int64_t lda,
                          int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b, void* D, int64_t ldd,
                          int64_t stride_d, int64_t count, DType dt, float beta) {
  if (m <= 0 || n <= 0 || count <= 0) return;
  if (k == 0) fail("gemm_strided_batched: empty inner dimension");
  lt_matmul(ta, tb, m, n, k, A, dt, lda, B, ldb, D, dt, ldd, beta, Epilogue{}, alpha,
            Batch{count, stride_a, stride_b, stride_d});
}

// pre = inp @ w^T + bias and out = gelu(pre) in one GEMM (GELU_AUX_BIAS: pre is the aux
// matrix, [OC, N] column-major = [N, OC] row-major). False when not taken: the switch is
// off, the bias is not 16-byte aligned, OC is not a multiple of 8 (cuBLASLt's aux leading
// dimension), or cuBLASLt has no algorithm for it.
bool gemm_forward_gelu(void* out, void* pre, const void* inp, const void* w, const void* bias, DType dt, int64_t N,
                       int64_t C, int64_t OC) {
  if (!gelu_epilogue() || dt == DType::f32 || N <= 0 || C <= 0 || OC % 8 != 0 || alignment(bias) < 16) return false;
  const bool ran = lt_matmul(true, false, OC, N, C, w, dt, C, inp, C, out, dt, OC, 0.0f,
                             Epilogue{CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre, OC});
  g_gelu_fused += ran ? 1 : 0;
  return ran;
}

// dpre = (dout @ w) * gelu'(pre) in one GEMM (DGELU: pre is the aux matrix; bf16/fp16
// only, see the header). w [OC, C]; dout [N, OC]; pre, dpre [N, C]. False when not taken.
bool gemm_dinp_dgelu(void* dpre, const void* dout, const void* w, const void* pre, DType dt, int64_t N, int64_t C,
                     int64_t OC) {
  if (!gelu_epilogue() || dt == DType::f32 || N <= 0 || OC <= 0 || C % 8 != 0) return false;
  const bool ran = lt_matmul(false, false, C, N, OC, w, dt, C, dout, OC, dpre, dt, C, 0.0f,
                             Epilogue{CUBLASLT_EPILOGUE_DGELU, nullptr, const_cast<void*>(pre), C});
  g_gelu_fused += ran ? 1 : 0;
  return ran;
}

void gemm_dw(float* dw, const void* dout, const void* inp, DType dt, int64_t N, int64_t C, int64_t OC) {
  if (N <= 0 || C <= 0 || OC <= 0) return;
  // dw^T [C,OC] = inp^T [C x N] @ dout [N x OC] (dout^T stored OC x N, transposed): m=C, n=OC, k=N.
  lt_matmul(false, true, C, OC, N, inp, dt, C, dout, OC, dw, DType::f32, C, 1.0f);
}

}  // namespace mtnlg::cuda::k

// ---- bias add and its column-sum backward (db ACCUMULATES, fp32). The column sums add
// fixed 256-row chunks first (the chunk count depends on N only): run-to-run identical,
// rounded differently from the CPU's row-order sum.

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowChunk = 256;

template <typename T>
__global__ void bias_add_kernel(T* x, const T* b, int64_t N, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f<T>(to_f(x[i]) + to_f(b[i % C]));
}

template <typename T>
__global__ void bias_add_round_kernel(T* out, const float* acc, const T* b, int64_t N, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(acc[i] + to_f(b[i % C]));
}

template <typename T>
__global__ void colsum_partial_kernel(float* partial, const T* x, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t chunk = blockIdx.y; chunk * kRowChunk < N; chunk += gridDim.y) {
    const int64_t r1 = (N < (chunk + 1) * kRowChunk ? N : (chunk + 1) * kRowChunk);
    float acc = 0;
    for (int64_t r = chunk * kRowChunk; r < r1; ++r) acc += to_f(x[r * C + c]);
    partial[chunk * C + c] = acc;
  }
}

__global__ void colsum_final_kernel(float* out, const float* partial, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float acc = 0;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * C + c];
  out[c] += acc;
}

}  // namespace

void bias_add_forward(void* x, const void* b, DType dt, int64_t N, int64_t C) {
  if (N * C <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(N * C, kThreads), kThreads, 0, stream(), bias_add_kernel<T>)(
                      static_cast<T*>(x), static_cast<const T*>(b), N, C));
  MTNLG_CUDA_LAUNCH_CHECK("bias_add_kernel");
}

void bias_add_round(void* out, const float* acc, const void* b, DType dt, int64_t N, int64_t C) {
  if (N * C <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(N * C, kThreads), kThreads, 0, stream(), bias_add_round_kernel<T>)(
                      static_cast<T*>(out), acc, static_cast<const T*>(b), N, C));
  MTNLG_CUDA_LAUNCH_CHECK("bias_add_round_kernel");
}

void bias_add_backward(float* db, const void* dout, DType dt, int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return;
  const int64_t chunks = (N + kRowChunk - 1) / kRowChunk;
  DeviceBuffer<float> partial(chunks * C);
  const dim3 grid(col_blocks(C, kThreads), static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid, kThreads, 0, stream(), colsum_partial_kernel<T>)(
                      partial.data(), static_cast<const T*>(dout), N, C));
  MTNLG_CUDA_LAUNCH_CHECK("colsum_partial_kernel");
  MTNLG_LAUNCH(col_blocks(C, kThreads), kThreads, 0, stream(), colsum_final_kernel)(db, partial.data(), chunks, C);
  MTNLG_CUDA_LAUNCH_CHECK("colsum_final_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

bool set_gemm_bias_epilogue(bool on) {
  const bool old = k::g_bias_epilogue;
  k::g_bias_epilogue = on;
  return old;
}

bool set_gemm_gelu_epilogue(bool on) {
  const bool old = k::gelu_epilogue();
  k::gelu_epilogue() = on;
  return old;
}

bool set_gemm_lt(bool on) {
  const bool old = k::g_use_lt;
  k::g_use_lt = on;
  return old;
}

int64_t gemm_gelu_fused() { return k::g_gelu_fused.load(); }

int64_t gemm_fallbacks() {
  std::lock_guard<std::mutex> lock(k::g_algo_mu);
  return k::g_fallbacks;
}

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias) {
  const char* op = "matmul_forward";
  const DType dt = cuda_dtype(op, "out", out.dtype());
  const int64_t OC = w.dim(0), C = w.dim(1), N = C ? inp.numel() / C : 0;
  k::gemm_forward(out.raw(), inp.raw(), w.raw(), p(bias), dt, N, C, OC);
}

void matmul_backward(Tensor* dinp, Tensor* dw, Tensor* dbias, const Tensor& dout, const Tensor& inp, const Tensor& w,
                     bool accumulate_dinp) {
  const char* op = "matmul_backward";
  const DType dt = cuda_dtype(op, "dout", dout.dtype());
  const int64_t OC = w.dim(0), C = w.dim(1), N = C ? inp.numel() / C : 0;
  if (dinp && dinp->defined()) k::gemm_dinp(dinp->raw(), dout.raw(), w.raw(), dt, N, C, OC, accumulate_dinp);
  if (dw && dw->defined()) k::gemm_dw(f(*dw), dout.raw(), inp.raw(), dt, N, C, OC);
  if (dbias && dbias->defined()) k::bias_add_backward(f(*dbias), dout.raw(), dt, N, OC);
}

void matmul_bias_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& w, const Tensor& bias) {
  const DType dt = cuda_dtype("matmul_bias_gelu_forward", "out", out.dtype());
  const int64_t OC = w.dim(0), C = w.dim(1), N = C ? inp.numel() / C : 0;
  if (k::gemm_forward_gelu(out.raw(), pre.raw(), inp.raw(), w.raw(), bias.raw(), dt, N, C, OC)) return;
  matmul_forward(pre, inp, w, &bias);
  gelu_forward(out, pre);
}

void matmul_dgelu_backward(Tensor& dpre, Tensor& dbias, const Tensor& dout, const Tensor& w, const Tensor& pre) {
  const DType dt = cuda_dtype("matmul_dgelu_backward", "dout", dout.dtype());
  const int64_t OC = w.dim(0), C = w.dim(1), N = C ? pre.numel() / C : 0;
  if (k::gemm_dinp_dgelu(dpre.raw(), dout.raw(), w.raw(), pre.raw(), dt, N, C, OC)) {
    bias_add_backward(dbias, dpre);  // from the stored dpre, as the separate kernels do (see the header)
    return;
  }
  matmul_backward(&dpre, nullptr, nullptr, dout, pre, w, false);
  gelu_backward(dpre, pre, dpre);
  bias_add_backward(dbias, dpre);
}

void bias_add_forward(Tensor& x, const Tensor& b) {
  const DType dt = cuda_dtype("bias_add_forward", "x", x.dtype());
  const int64_t C = b.numel(), N = C ? x.numel() / C : 0;
  k::bias_add_forward(x.raw(), b.raw(), dt, N, C);
}

void bias_add_backward(Tensor& db, const Tensor& dout) {
  const DType dt = cuda_dtype("bias_add_backward", "dout", dout.dtype());
  const int64_t C = db.numel(), N = C ? dout.numel() / C : 0;
  k::bias_add_backward(f(db), dout.raw(), dt, N, C);
}

}  // namespace mtnlg::cuda
