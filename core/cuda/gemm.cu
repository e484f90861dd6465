// Matmuls through cuBLASLt. CPU reference: core/cpu/ops_cpu.cpp (matmul_forward,
// matmul_backward), which calls OpenBLAS with the same three shapes:
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
// Algorithms: the heuristic's first choice, cached per (shape, types, alignments). The
// bias epilogue is used when the bias pointer is 16-byte aligned and the heuristic offers
// an algorithm for it; otherwise the GEMM runs plain and bias_add_forward adds the bias.
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>

#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

namespace {

bool g_bias_epilogue = true;

cudaDataType_t cuda_type(Dt dt) {
  switch (dt) {
    case Dt::f32: return CUDA_R_32F;
    case Dt::bf16: return CUDA_R_16BF;
    case Dt::f16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
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

using AlgoKey = std::array<int64_t, 16>;
std::mutex g_algo_mu;
std::map<AlgoKey, std::pair<bool, cublasLtMatmulAlgo_t>> g_algos;  // found?, algo

// Column-major D[m,n] = op(A) op(B) + beta D (+ bias[m]). A is stored [k,m] when ta
// else [m,k]; B is stored [n,k] when tb else [k,n]. Returns false, doing nothing, when
// no algorithm exists for the request (only possible with a bias: the caller retries
// without it).
bool lt_matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* A, Dt adt, int64_t lda, const void* B,
               int64_t ldb, void* D, Dt ddt, int64_t ldd, float beta, const void* bias) {
  Desc ds;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bt = cuda_type(ddt);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  const cudaDataType_t at = cuda_type(adt), dtt = cuda_type(ddt);
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.a, at, ta ? k : m, ta ? m : k, lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.b, at, tb ? n : k, tb ? k : n, ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.d, dtt, m, n, ldd));

  const AlgoKey key{ta, tb, m, n, k, static_cast<int64_t>(adt), static_cast<int64_t>(ddt), lda, ldb, ldd,
                    bias != nullptr, alignment(A), alignment(B), alignment(D), beta != 0.0f, backend_device()};
  cublasLtMatmulAlgo_t algo{};
  {
    std::lock_guard<std::mutex> lock(g_algo_mu);
    auto it = g_algos.find(key);
    if (it == g_algos.end()) {
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&ds.pref));
      const uint64_t ws = static_cast<uint64_t>(cublas_workspace_bytes());
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      const uint32_t al_a = static_cast<uint32_t>(key[11]), al_b = static_cast<uint32_t>(key[12]),
                     al_d = static_cast<uint32_t>(key[13]);
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, 4));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, 4));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, 4));
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, 4));
      cublasLtMatmulHeuristicResult_t res{};
      int found = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(cublaslt(), ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &res, &found);
      if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(st);
      const bool ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
      it = g_algos.emplace(key, std::make_pair(ok, res.algo)).first;
    }
    if (!it->second.first) {
      if (bias) return false;
      fail("cuBLASLt offers no algorithm for a matmul (shape or alignment unsupported)");
    }
    algo = it->second.second;
  }
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasLtMatmul(cublaslt(), ds.op, &alpha, A, ds.a, B, ds.b, &beta, D, ds.d, D, ds.d, &algo,
                              cublas_workspace(), static_cast<size_t>(cublas_workspace_bytes()), stream()));
  return true;
}

}  // namespace

bool set_gemm_bias_epilogue(bool on) {
  const bool old = g_bias_epilogue;
  g_bias_epilogue = on;
  return old;
}

void gemm_forward(void* out, const void* inp, const void* w, const void* bias, Dt dt, int64_t N, int64_t C, int64_t OC) {
  if (N <= 0 || OC <= 0) return;
  if (C == 0) {  // empty sum: out = bias or 0
    fill(out, dt, N * OC, 0.0f);
    if (bias) bias_add_forward(out, bias, dt, N, OC);
    return;
  }
  // out^T [OC,N] = w [as C x OC col-major]^T @ inp^T [C x N]: m=OC, n=N, k=C.
  const bool fuse = bias && g_bias_epilogue && alignment(bias) >= 16;
  if (fuse && lt_matmul(true, false, OC, N, C, w, dt, C, inp, C, out, dt, OC, 0.0f, bias)) return;
  lt_matmul(true, false, OC, N, C, w, dt, C, inp, C, out, dt, OC, 0.0f, nullptr);
  if (bias) bias_add_forward(out, bias, dt, N, OC);
}

void gemm_dinp(void* dinp, const void* dout, const void* w, Dt dt, int64_t N, int64_t C, int64_t OC, bool accumulate) {
  if (N <= 0 || C <= 0) return;
  if (OC == 0) {
    if (!accumulate) fill(dinp, dt, N * C, 0.0f);
    return;
  }
  // dinp^T [C,N] = w^T [C x OC col-major, no transpose] @ dout^T [OC x N]: m=C, n=N, k=OC.
  lt_matmul(false, false, C, N, OC, w, dt, C, dout, OC, dinp, dt, C, accumulate ? 1.0f : 0.0f, nullptr);
}

void gemm_dw(float* dw, const void* dout, const void* inp, Dt dt, int64_t N, int64_t C, int64_t OC) {
  if (N <= 0 || C <= 0 || OC <= 0) return;
  // dw^T [C,OC] = inp^T [C x N] @ dout [N x OC] (dout^T stored OC x N, transposed): m=C, n=OC, k=N.
  lt_matmul(false, true, C, OC, N, inp, dt, C, dout, OC, dw, Dt::f32, C, 1.0f, nullptr);
}

}  // namespace mtnlg::cuda::k
