// Emulated cuBLASLt and cuBLAS: the subset mtnlg calls, with the semantics and the
// refusals of the real libraries, executed on the CPU when the stream runs.
//
// Semantics (cuBLASLt's documentation, in our words, docs/specs/cuda-emulation.md):
//   D = epilogue(alpha * op(A) op(B) + beta * C), column-major, per batch;
//   op(A) is m x k (A stored k x m when TRANSA), op(B) is k x n (B stored n x k when
//   TRANSB); C and D are m x n with their own leading dimensions; beta == 0 never reads C
//   (it may hold NaN); fp32 accumulation (CUBLAS_COMPUTE_32F) whatever the storage type,
//   results rounded once to D's type. Epilogues: BIAS adds bias[row]; GELU (tanh form),
//   with AUX storing the pre-activation; DGELU multiplies by gelu'(aux); BGRAD variants
//   reduce to the bias pointer (DGELU_BGRAD over D's columns, BGRADA over op(A)'s k,
//   BGRADB over op(B)'s k).
// Strictness: every operand's extent (leading dimension, batch stride) must lie inside
// one device allocation; an algorithm from the heuristic is valid only for the problem
// and the alignments it was chosen for (a reused algorithm is a cache-key bug, fatal);
// the workspace must be device memory of at least the size the heuristic reported;
// alpha and beta are read at the call, everything else when the stream runs.
#include <cblas.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "emulator/emu.hpp"
#include "emulator/internal.hpp"

struct cublasLtContext {
  uint32_t magic = 0x4c54;
};
struct cublasContext {
  cudaStream_t stream = nullptr;
  void* state = nullptr;      // device memory cublasCreate allocates (cuBLAS's handle state)
  void* workspace = nullptr;  // cublasSetWorkspace's; cublasSetStream resets it to the default
  size_t workspace_bytes = 0;
};

namespace mtnlg::emu {
namespace {

constexpr uint64_t kDescMagic = 0x6465736331ull, kLayoutMagic = 0x6c61796f31ull, kPrefMagic = 0x7072656631ull;
constexpr uint64_t kAlgoMagic = 0x616c676f31ull;

struct Desc {
  uint64_t magic = kDescMagic;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
  int32_t bias_type = -1;
  int64_t bias_batch_stride = 0;
  void* aux = nullptr;
  int64_t aux_ld = 0, aux_batch_stride = 0;
  int32_t aux_type = -1;
};
struct Layout {
  uint64_t magic = kLayoutMagic;
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;  // elements
  int32_t order = CUBLASLT_ORDER_COL;
};
struct Pref {
  uint64_t magic = kPrefMagic;
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

bool has_bias(cublasLtEpilogue_t e) { return (e & CUBLASLT_EPILOGUE_BIAS) && !(e & 16) && e < 256; }
bool is_gelu(cublasLtEpilogue_t e) { return (e & CUBLASLT_EPILOGUE_GELU) != 0 && e < 256; }
bool is_dgelu(cublasLtEpilogue_t e) { return (e & 64) != 0 && e < 256; }
bool has_aux(cublasLtEpilogue_t e) { return (e & 128) != 0 && e < 256; }
bool is_bgrad(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}

const char* epi_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU: return "GELU";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADA: return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return nullptr;
  }
}

size_t type_bytes(int32_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 0;
  }
}
const char* type_name(int32_t t) {
  switch (t) {
    case CUDA_R_32F: return "f32";
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "f16";
    default: return "unsupported";
  }
}

float load(const void* p, int32_t t, int64_t i) {
  switch (t) {
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
void store(void* p, int32_t t, int64_t i, float v) {
  switch (t) {
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v); break;
    case CUDA_R_16F: static_cast<__half*>(p)[i] = __float2half(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// GELU, tanh form (what cuBLASLt's GELU epilogues compute), and its derivative.
float gelu(float x) {
  const float c = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}
float dgelu(float x) {
  const float c = 0.7978845608028654f;
  const float u = c * (x + 0.044715f * x * x * x);
  const float t = std::tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
}

// A stored matrix: column-major rows x cols with leading dimension ld, per batch.
struct Mat {
  const void* p = nullptr;
  int32_t type = CUDA_R_32F;
  int64_t rows = 0, cols = 0, ld = 0, stride = 0;
  float at(int64_t b, int64_t r, int64_t c) const { return load(p, type, b * stride + c * ld + r); }
  // The batch's stored matrix as fp32 (exact for bf16/f16), column-major with the same ld.
  std::vector<float> f32(int64_t b) const {
    std::vector<float> v(static_cast<size_t>(ld * (cols - 1) + rows));
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) v[static_cast<size_t>(c * ld + r)] = at(b, r, c);
    return v;
  }
};

size_t extent_bytes(const Layout& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  const uint64_t one = (l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows;
  return type_bytes(l.type) * (one + static_cast<uint64_t>(l.batch - 1) * static_cast<uint64_t>(l.stride));
}

uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al) al /= 2;
  return al;
}

// What an algorithm was chosen for.
uint64_t problem_hash(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dd) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (uint64_t v : {uint64_t(d.compute), uint64_t(d.ta), uint64_t(d.tb), uint64_t(d.epi),
                     uint64_t(uint32_t(d.bias_type)), uint64_t(uint32_t(d.aux_type))})
    mix(v);
  for (const Layout* l : {&a, &b, &c, &dd})
    for (uint64_t v : {uint64_t(l->type), l->rows, l->cols, uint64_t(l->ld), uint64_t(l->batch), uint64_t(l->stride)})
      mix(v);
  return h;
}

constexpr int kCandidates = 3;  // per problem; each needs a different workspace size
uint64_t candidate_workspace(int i, uint64_t max_ws) {
  const uint64_t want[kCandidates] = {uint64_t{4} << 20, uint64_t{1} << 20, 0};
  return std::min(want[i], max_ws);
}

// The emulator's object behind an opaque handle, or null when it is not a live one.
template <typename T>
T* checked(void* h, uint64_t magic) {
  T* p = static_cast<T*>(h);
  return p && p->magic == magic ? p : nullptr;
}

// cublasLt*Destroy: a handle destroyed twice (or never created) is a fatal error.
template <typename T>
cublasStatus_t destroy_checked(void* h, uint64_t magic, const char* fn) {
  T* p = checked<T>(h, magic);
  if (h && !p) fatal(fmt_str("%s: not a live handle (destroyed twice?)", fn));
  if (p) p->magic = 0;
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

// Validates one call's descriptors; returns CUBLAS_STATUS_SUCCESS or the status cuBLASLt
// would return, with a detail in `why`.
// What cuBLASLt 13 documents that it takes, for the compute type mtnlg asks for
// (CUBLAS_COMPUTE_32F with an f32 scale) and the storage types the emulator has; a call
// outside it gets the status the real library answers (docs/specs/cuda-emulation.md).
//   A/B type -> D (= C) type: f32 -> f32; bf16 -> bf16 or f32; f16 -> f16 or f32.
//   Epilogues: every one the emulator runs (BIAS, GELU[_AUX][_BIAS], DGELU[_BGRAD],
//   BGRADA/B) on every row.
//   Bias (and bias-gradient) vector type: D's type. The documented exceptions (IMMA
//   kernels, FP8 outputs) are types the emulator does not have. Another type set through
//   BIAS_DATA_TYPE: CUBLAS_STATUS_INVALID_VALUE.
//   GELU aux matrix type: D's type, and EPILOGUE_AUX_DATA_TYPE left unset (-1): a
//   non-default aux type is documented for FP8 outputs only. Set to anything for these
//   types: CUBLAS_STATUS_INVALID_VALUE (an H200 with CUDA 13.0 answered so to a bf16
//   GELU_AUX_BIAS call that set it to bf16, D's own type).
struct AcceptedTypes {
  int32_t ab, d;
};
constexpr AcceptedTypes kAccepted[] = {{CUDA_R_32F, CUDA_R_32F},
                                       {CUDA_R_16BF, CUDA_R_16BF},
                                       {CUDA_R_16BF, CUDA_R_32F},
                                       {CUDA_R_16F, CUDA_R_16F},
                                       {CUDA_R_16F, CUDA_R_32F}};

bool accepted_types(int32_t ab, int32_t d) {
  for (const AcceptedTypes& t : kAccepted)
    if (t.ab == ab && t.d == d) return true;
  return false;
}

cublasStatus_t validate(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dd,
                        std::string& why) {
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F) {
    why = "only CUBLAS_COMPUTE_32F with fp32 scale is emulated (mtnlg never enables TF32)";
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
    why = "only host pointer mode for alpha/beta is emulated";
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!epi_name(d.epi)) {
    why = fmt_str("epilogue %d is not emulated", int(d.epi));
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  for (const Layout* l : {&a, &b, &c, &dd}) {
    if (l->order != CUBLASLT_ORDER_COL) {
      why = "only column-major layouts are emulated";
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!type_bytes(l->type)) {
      why = fmt_str("matrix type %d is not emulated", int(l->type));
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (l->ld < static_cast<int64_t>(l->rows) || l->ld <= 0) {
      why = fmt_str("leading dimension %lld below the %llu rows", static_cast<long long>(l->ld),
                    static_cast<unsigned long long>(l->rows));
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (l->batch < 1 || (l->batch > 1 && l->stride < 0)) {
      why = "bad batch count or stride";
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  if (a.type != b.type) {
    why = fmt_str("A is %s but B is %s", type_name(a.type), type_name(b.type));
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!accepted_types(a.type, dd.type)) {
    why = fmt_str("D is %s for %s inputs (D must be the inputs' type or f32)", type_name(dd.type), type_name(a.type));
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (c.type != dd.type || c.rows != dd.rows || c.cols != dd.cols) {
    why = "C and D differ in type or shape";
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const uint64_t m = dd.rows, n = dd.cols;
  const uint64_t am = d.ta == CUBLAS_OP_T ? a.cols : a.rows, ak = d.ta == CUBLAS_OP_T ? a.rows : a.cols;
  const uint64_t bk = d.tb == CUBLAS_OP_T ? b.cols : b.rows, bn = d.tb == CUBLAS_OP_T ? b.rows : b.cols;
  if (am != m || bn != n || ak != bk) {
    why = fmt_str("shapes do not chain: op(A) %llux%llu, op(B) %llux%llu, D %llux%llu", (unsigned long long)am,
                  (unsigned long long)ak, (unsigned long long)bk, (unsigned long long)bn, (unsigned long long)m,
                  (unsigned long long)n);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  for (const Layout* l : {&a, &b, &c})
    if (l->batch != dd.batch && l->batch != 1) {
      why = "batch counts differ";
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  if ((has_bias(d.epi) || is_bgrad(d.epi)) && !d.bias) {
    why = fmt_str("epilogue %s needs CUBLASLT_MATMUL_DESC_BIAS_POINTER", epi_name(d.epi));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (d.bias_type >= 0 && d.bias_type != dd.type) {
    why = fmt_str("BIAS_DATA_TYPE %s for a %s output (the bias vector has D's type outside FP8 and IMMA kernels)",
                  type_name(d.bias_type), type_name(dd.type));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (d.aux_type >= 0) {
    why = fmt_str("EPILOGUE_AUX_DATA_TYPE set (to %s) for a %s output: a non-default aux type is for FP8 outputs only",
                  type_name(d.aux_type), type_name(dd.type));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (has_aux(d.epi)) {
    if (!d.aux) {
      why = fmt_str("epilogue %s needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", epi_name(d.epi));
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (d.aux_ld < static_cast<int64_t>(m) || d.aux_ld % 8) {
      why = fmt_str("EPILOGUE_AUX_LD %lld must be a multiple of 8 and at least D's %llu rows",
                    static_cast<long long>(d.aux_ld), (unsigned long long)m);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

struct MatmulCall {
  Desc d;
  Layout a, b, c, dd;
  float alpha = 1, beta = 0;
  const void *A = nullptr, *B = nullptr, *C = nullptr;
  void* D = nullptr;
};

// Runs a validated call (device memory accessible).
void execute(const MatmulCall& call) {
  const Desc& d = call.d;
  const int64_t m = static_cast<int64_t>(call.dd.rows), n = static_cast<int64_t>(call.dd.cols);
  const bool ta = d.ta == CUBLAS_OP_T, tb = d.tb == CUBLAS_OP_T;
  const int64_t k = static_cast<int64_t>(ta ? call.a.rows : call.a.cols);
  const int32_t bt = call.dd.type, auxt = call.dd.type;  // validate(): the bias and aux matrix have D's type
  const Mat A{
      call.A, call.a.type, int64_t(call.a.rows), int64_t(call.a.cols), call.a.ld, call.a.batch > 1 ? call.a.stride : 0};
  const Mat B{
      call.B, call.b.type, int64_t(call.b.rows), int64_t(call.b.cols), call.b.ld, call.b.batch > 1 ? call.b.stride : 0};
  const Mat C{call.C, call.c.type, m, n, call.c.ld, call.c.batch > 1 ? call.c.stride : 0};
  std::vector<float> acc(static_cast<size_t>(m * n));
  for (int64_t batch = 0; batch < call.dd.batch; ++batch) {
    if (k > 0) {
      const std::vector<float> af = A.f32(batch), bf = B.f32(batch);
      cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
                  1.0f, af.data(), int(A.ld), bf.data(), int(B.ld), 0.0f, acc.data(), int(m));
    } else {
      std::fill(acc.begin(), acc.end(), 0.0f);
    }
    char* bias = static_cast<char*>(d.bias) + batch * d.bias_batch_stride * int64_t(type_bytes(bt));
    char* aux = static_cast<char*>(d.aux) + batch * d.aux_batch_stride * int64_t(type_bytes(auxt));
    char* D = static_cast<char*>(call.D) + batch * call.dd.stride * int64_t(type_bytes(call.dd.type));
    std::vector<double> bgrad;
    if (d.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) bgrad.assign(static_cast<size_t>(m), 0.0);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        float v = call.alpha * acc[static_cast<size_t>(j * m + i)];
        if (call.beta != 0.0f) v += call.beta * C.at(batch, i, j);  // beta == 0: C is never read
        if (has_bias(d.epi)) v += load(bias, bt, i);
        if (is_gelu(d.epi)) {
          if (has_aux(d.epi)) store(aux, auxt, j * d.aux_ld + i, v);
          v = gelu(v);
        } else if (is_dgelu(d.epi)) {
          v *= dgelu(load(aux, auxt, j * d.aux_ld + i));
        }
        if (!bgrad.empty()) bgrad[static_cast<size_t>(i)] += v;
        store(D, call.dd.type, j * call.dd.ld + i, v);
      }
    if (d.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD)
      for (int64_t i = 0; i < m; ++i) store(bias, bt, i, static_cast<float>(bgrad[static_cast<size_t>(i)]));
    if (d.epi == CUBLASLT_EPILOGUE_BGRADA)  // per row of op(A), over k
      for (int64_t i = 0; i < m; ++i) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk) s += ta ? A.at(batch, kk, i) : A.at(batch, i, kk);
        store(bias, bt, i, static_cast<float>(s));
      }
    if (d.epi == CUBLASLT_EPILOGUE_BGRADB)  // per column of op(B), over k
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk) s += tb ? B.at(batch, j, kk) : B.at(batch, kk, j);
        store(bias, bt, j, static_cast<float>(s));
      }
  }
}

void check_extents(const MatmulCall& call, bool read_c) {
  check_device_range(call.A, extent_bytes(call.a), "cublasLtMatmul: matrix A (rows, cols, ld, batch stride)");
  check_device_range(call.B, extent_bytes(call.b), "cublasLtMatmul: matrix B (rows, cols, ld, batch stride)");
  if (read_c)
    check_device_range(call.C, extent_bytes(call.c), "cublasLtMatmul: matrix C (rows, cols, ld, batch stride)");
  check_device_range(call.D, extent_bytes(call.dd), "cublasLtMatmul: matrix D (rows, cols, ld, batch stride)");
  const Desc& d = call.d;
  const int32_t bt = call.dd.type;  // validate(): the bias vector and the aux matrix have D's type
  const int64_t batches = call.dd.batch;
  if (has_bias(d.epi) || is_bgrad(d.epi)) {
    const int64_t len = d.epi == CUBLASLT_EPILOGUE_BGRADB ? int64_t(call.dd.cols) : int64_t(call.dd.rows);
    check_device_range(d.bias, type_bytes(bt) * size_t(len + (batches - 1) * d.bias_batch_stride),
                       "cublasLtMatmul: bias vector (CUBLASLT_MATMUL_DESC_BIAS_POINTER)");
  }
  if (has_aux(d.epi)) {
    check_device_range(d.aux,
                       type_bytes(bt) * size_t((int64_t(call.dd.cols) - 1) * d.aux_ld + int64_t(call.dd.rows) +
                                               (batches - 1) * d.aux_batch_stride),
                       "cublasLtMatmul: epilogue aux matrix (EPILOGUE_AUX_POINTER, AUX_LD)");
  }
}

template <typename T>
cublasStatus_t set_attr(T& field, const void* buf, size_t size) {
  if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace mtnlg::emu

using namespace mtnlg::emu;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  auto* p = new Desc;
  p->compute = compute;
  p->scale = scale;
  *d = reinterpret_cast<cublasLtMatmulDesc_t>(p);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  return destroy_checked<Desc>(d, kDescMagic, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  Desc* d = checked<Desc>(desc, kDescMagic);
  if (!d) return CUBLAS_STATUS_NOT_INITIALIZED;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set_attr(d->compute, buf, size);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set_attr(d->scale, buf, size);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set_attr(d->pointer_mode, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_attr(d->ta, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_attr(d->tb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attr(d->epi, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attr(d->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return set_attr(d->bias_batch_stride, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_attr(d->bias_type, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_attr(d->aux, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_attr(d->aux_ld, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return set_attr(d->aux_batch_stride, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return set_attr(d->aux_type, buf, size);
    default:
      fatal(fmt_str("cublasLtMatmulDescSetAttribute: attribute %d is not emulated (add it to emulator/cublas.cpp)",
                    int(attr)));
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  auto* p = new Layout;
  p->type = type;
  p->rows = rows;
  p->cols = cols;
  p->ld = ld;
  *l = reinterpret_cast<cublasLtMatrixLayout_t>(p);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(const cublasLtMatrixLayout_t l) {
  return destroy_checked<Layout>(l, kLayoutMagic, "cublasLtMatrixLayoutDestroy");
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  Layout* p = checked<Layout>(l, kLayoutMagic);
  if (!p) return CUBLAS_STATUS_NOT_INITIALIZED;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set_attr(p->type, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set_attr(p->order, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set_attr(p->rows, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set_attr(p->cols, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_LD: return set_attr(p->ld, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set_attr(p->batch, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set_attr(p->stride, buf, size);
    default: fatal(fmt_str("cublasLtMatrixLayoutSetAttribute: attribute %d is not emulated", int(attr)));
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return destroy_checked<Pref>(pref, kPrefMagic, "cublasLtMatmulPreferenceDestroy");
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  Pref* p = checked<Pref>(pref, kPrefMagic);
  if (!p) return CUBLAS_STATUS_NOT_INITIALIZED;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set_attr(p->max_workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_attr(p->align[0], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_attr(p->align[1], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_attr(p->align[2], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_attr(p->align[3], buf, size);
    default: fatal(fmt_str("cublasLtMatmulPreferenceSetAttribute: attribute %d is not emulated", int(attr)));
  }
}

// Candidates: kCandidates algorithms per valid problem, each asking for a different
// workspace (within the preference's maximum). An algorithm remembers the problem and the
// minimum alignments it was chosen for.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Ad,
                                              cublasLtMatrixLayout_t Bd, cublasLtMatrixLayout_t Cd,
                                              cublasLtMatrixLayout_t Dd, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  const Desc* d = checked<Desc>(desc, kDescMagic);
  const Layout *a = checked<Layout>(Ad, kLayoutMagic), *b = checked<Layout>(Bd, kLayoutMagic),
               *c = checked<Layout>(Cd, kLayoutMagic), *dd = checked<Layout>(Dd, kLayoutMagic);
  const Pref* p = checked<Pref>(pref, kPrefMagic);
  if (!h || !d || !a || !b || !c || !dd || !p || !results || !returned || requested < 1)
    return CUBLAS_STATUS_INVALID_VALUE;
  std::string why;
  *returned = 0;
  const cublasStatus_t st = validate(*d, *a, *b, *c, *dd, why);
  if (st != CUBLAS_STATUS_SUCCESS) return st == CUBLAS_STATUS_INVALID_VALUE ? st : CUBLAS_STATUS_NOT_SUPPORTED;
  if (d->epi != CUBLASLT_EPILOGUE_DEFAULT && lt_refuse_epilogues()) return CUBLAS_STATUS_INVALID_VALUE;
  // Vectorised kernels want operands aligned to at least one element (16 bytes for the
  // epilogue's bias vector); below that cuBLASLt has no algorithm.
  const uint32_t elt = static_cast<uint32_t>(type_bytes(a->type));
  if (p->align[0] < elt || p->align[1] < elt || p->align[3] < type_bytes(dd->type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (has_bias(d->epi) && alignment_of(d->bias) < 16) return CUBLAS_STATUS_NOT_SUPPORTED;
  const uint64_t hash = problem_hash(*d, *a, *b, *c, *dd);
  const int n = std::min(requested, kCandidates);
  for (int i = 0; i < n; ++i) {
    cublasLtMatmulHeuristicResult_t& r = results[i];
    std::memset(&r, 0, sizeof r);
    r.algo.data[0] = kAlgoMagic;
    r.algo.data[1] = hash;
    r.algo.data[2] = static_cast<uint64_t>(i);
    r.algo.data[3] = candidate_workspace(i, p->max_workspace);
    for (int j = 0; j < 4; ++j) r.algo.data[4 + j] = p->align[j];
    r.workspaceSize = r.algo.data[3];
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
  }
  *returned = n;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Ad, const void* B, cublasLtMatrixLayout_t Bd, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cd, void* D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  UseCollector uses;  // the operands checked below become the op's uses (a graph's replay rechecks them)
  const Desc* d = checked<Desc>(desc, kDescMagic);
  const Layout *a = checked<Layout>(Ad, kLayoutMagic), *b = checked<Layout>(Bd, kLayoutMagic),
               *c = checked<Layout>(Cd, kLayoutMagic), *dd = checked<Layout>(Dd, kLayoutMagic);
  if (!h || !d || !a || !b || !c || !dd || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  std::string why;
  const cublasStatus_t st = validate(*d, *a, *b, *c, *dd, why);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (algo) {
    if (algo->data[0] != kAlgoMagic)
      fatal("cublasLtMatmul: the algorithm did not come from cublasLtMatmulAlgoGetHeuristic");
    if (algo->data[1] != problem_hash(*d, *a, *b, *c, *dd))
      fatal(
          "cublasLtMatmul: an algorithm chosen by the heuristic for a different problem (shape, types, transposes, "
          "epilogue) is reused: the algorithm cache's key misses a field");
    const void* ptrs[4] = {A, B, C, D};
    const char* names = "ABCD";
    for (int j = 0; j < 4; ++j)
      if (alignment_of(ptrs[j]) < algo->data[4 + j])
        fatal(
            fmt_str("cublasLtMatmul: matrix %c at %p is %u-byte aligned, but its algorithm was chosen for a minimum "
                    "alignment of %llu bytes (misaligned address on a GPU): the algorithm cache's key misses the "
                    "alignment",
                    names[j], ptrs[j], alignment_of(ptrs[j]), static_cast<unsigned long long>(algo->data[4 + j])));
    if (workspace_bytes < algo->data[3])
      fatal(fmt_str("cublasLtMatmul: %zu bytes of workspace for an algorithm that needs %llu", workspace_bytes,
                    static_cast<unsigned long long>(algo->data[3])));
    if (lt_candidates_fail()) return CUBLAS_STATUS_NOT_SUPPORTED;
  } else if (lt_candidates_fail()) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (workspace_bytes > 0) check_device_range(workspace, workspace_bytes, "cublasLtMatmul: workspace");
  MatmulCall call;
  call.d = *d;
  call.a = *a;
  call.b = *b;
  call.c = *c;
  call.dd = *dd;
  call.alpha = *static_cast<const float*>(alpha);
  call.beta = *static_cast<const float*>(beta);
  call.A = A;
  call.B = B;
  call.C = C;
  call.D = D;
  check_extents(call, call.beta != 0.0f);
  enqueue(stream, Op{fmt_str("cublasLtMatmul (%s)", epi_name(d->epi)), [call] {
                       execute(call);
                       return true;
                     }});
  return CUBLAS_STATUS_SUCCESS;
}

// ---- classic cuBLAS (the fallback path) ------------------------------------------------

// cublasCreate allocates device memory, as the real one does (cudaMalloc): during a
// capture that forbids it, the runtime refuses and invalidates the capture, and cuBLAS
// answers CUBLAS_STATUS_ALLOC_FAILED.
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  void* state = nullptr;
  if (cudaMalloc(&state, 4096) != cudaSuccess) return CUBLAS_STATUS_ALLOC_FAILED;
  *h = new cublasContext;
  (*h)->state = state;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  if (h) cudaFree(h->state);
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
// As documented: setting a stream resets the handle to cuBLAS's default workspace pool.
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = s;
  h->workspace = nullptr;
  h->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void* workspace, size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && (!workspace || reinterpret_cast<uintptr_t>(workspace) % 256 != 0))
    return CUBLAS_STATUS_INVALID_VALUE;
  h->workspace = workspace;
  h->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (m < 0 || n < 0 || k < 0 || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  // Without a workspace of its own, cuBLAS takes one from its default pool, which CUDA >=
  // 12.2 allocates stream-ordered inside a graph being captured: mtnlg gives the handle
  // its workspace (cublasSetWorkspace after cublasSetStream), and a captured call without
  // one is a bug the emulator stops at.
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(h->stream, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusActive && !h->workspace)
    fatal(
        "cublasGemmEx captured into a CUDA graph on a handle without its own workspace (cublasSetWorkspace after "
        "cublasSetStream): cuBLAS would allocate its default workspace inside the graph");
  UseCollector uses;  // the operands checked below become the op's uses (a graph's replay rechecks them)
  Layout a, b, c;
  a.type = Atype;
  a.rows = static_cast<uint64_t>(ta == CUBLAS_OP_T ? k : m);
  a.cols = static_cast<uint64_t>(ta == CUBLAS_OP_T ? m : k);
  a.ld = lda;
  b.type = Btype;
  b.rows = static_cast<uint64_t>(tb == CUBLAS_OP_T ? n : k);
  b.cols = static_cast<uint64_t>(tb == CUBLAS_OP_T ? k : n);
  b.ld = ldb;
  c.type = Ctype;
  c.rows = static_cast<uint64_t>(m);
  c.cols = static_cast<uint64_t>(n);
  c.ld = ldc;
  Desc d;
  d.compute = compute;
  d.ta = ta;
  d.tb = tb;
  std::string why;
  const cublasStatus_t st = validate(d, a, b, c, c, why);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  MatmulCall call;
  call.d = d;
  call.a = a;
  call.b = b;
  call.c = c;
  call.dd = c;
  call.alpha = *static_cast<const float*>(alpha);
  call.beta = *static_cast<const float*>(beta);
  call.A = A;
  call.B = B;
  call.C = C;
  call.D = C;
  check_extents(call, call.beta != 0.0f);
  enqueue(h->stream, Op{"cublasGemmEx", [call] {
                          execute(call);
                          return true;
                        }});
  return CUBLAS_STATUS_SUCCESS;
}

// cublasGemmGroupedBatchedEx as cuBLAS 12.5+ documents it: group i's group_size[i]
// problems share transa/transb, m, n, k, the leading dimensions, alpha and beta; the
// dimension, leading-dimension, scale and group-size arrays are host memory (group_count
// long), the matrix pointer arrays device memory (problem_count long), read when the
// stream runs. Accepted types: CUBLAS_COMPUTE_32F with f32 scale and A = B = C of bf16,
// f16 or f32 (no wider output for 16-bit inputs), anything else NOT_SUPPORTED; the
// documented INVALID_VALUE cases; 16-bit matrices aligned as documented (16 bytes when a
// column of k elements is a multiple of 16 bytes, 4 when of 4), which on a GPU is a
// misaligned-address fault at run time and here a fatal error.
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t transa_array[],
                                          const cublasOperation_t transb_array[], const int m_array[],
                                          const int n_array[], const int k_array[], const void* alpha_array,
                                          const void* const Aarray[], cudaDataType_t Atype, const int lda_array[],
                                          const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
                                          const void* beta_array, void* const Carray[], cudaDataType_t Ctype,
                                          const int ldc_array[], int group_count, const int group_size[],
                                          cublasComputeType_t compute) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  const void* host_arrays[] = {transa_array, transb_array, m_array,    n_array,   k_array,   alpha_array,
                               lda_array,    ldb_array,    beta_array, ldc_array, group_size};
  for (const void* a : host_arrays)
    if (!a) return CUBLAS_STATUS_INVALID_VALUE;
  if (group_count < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (const void* a : host_arrays)
    if (is_device_pointer(a))
      fatal(
          "cublasGemmGroupedBatchedEx: a dimension, scale or group-size array is in device memory (they are "
          "host arrays; only Aarray, Barray and Carray are device memory)");
  if (compute != CUBLAS_COMPUTE_32F || Atype != Btype || Btype != Ctype ||
      (Atype != CUDA_R_32F && Atype != CUDA_R_16BF && Atype != CUDA_R_16F))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  int64_t problems = 0;
  for (int g = 0; g < group_count; ++g) {
    const cublasOperation_t ta = transa_array[g], tb = transb_array[g];
    const int m = m_array[g], n = n_array[g], k = k_array[g];
    if (m < 0 || n < 0 || k < 0 || group_size[g] < 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (cublasOperation_t t : {ta, tb})
      if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda_array[g] < std::max(1, ta == CUBLAS_OP_N ? m : k) ||
        ldb_array[g] < std::max(1, tb == CUBLAS_OP_N ? k : n) || ldc_array[g] < std::max(1, m))
      return CUBLAS_STATUS_INVALID_VALUE;
    problems += group_size[g];
  }
  if (problems == 0) return CUBLAS_STATUS_SUCCESS;
  for (const void* arr :
       {static_cast<const void*>(Aarray), static_cast<const void*>(Barray), static_cast<const void*>(Carray)})
    check_device_range(arr, sizeof(void*) * static_cast<size_t>(problems),
                       "cublasGemmGroupedBatchedEx: a matrix pointer array (device memory, problem_count long)");
  // One call per problem, as the documentation's equivalent loop; the pointers are read
  // from device memory when the stream gets there.
  std::vector<MatmulCall> calls;
  for (int g = 0; g < group_count; ++g)
    for (int j = 0; j < group_size[g]; ++j) {
      MatmulCall call;
      call.d.ta = transa_array[g] == CUBLAS_OP_N ? CUBLAS_OP_N : CUBLAS_OP_T;
      call.d.tb = transb_array[g] == CUBLAS_OP_N ? CUBLAS_OP_N : CUBLAS_OP_T;
      const auto m = static_cast<uint64_t>(m_array[g]), n = static_cast<uint64_t>(n_array[g]),
                 k = static_cast<uint64_t>(k_array[g]);
      call.a.type = Atype, call.a.rows = call.d.ta == CUBLAS_OP_T ? k : m,
      call.a.cols = call.d.ta == CUBLAS_OP_T ? m : k;
      call.b.type = Btype, call.b.rows = call.d.tb == CUBLAS_OP_T ? n : k,
      call.b.cols = call.d.tb == CUBLAS_OP_T ? k : n;
      call.c.type = Ctype, call.c.rows = m, call.c.cols = n;
      call.a.ld = lda_array[g], call.b.ld = ldb_array[g], call.c.ld = ldc_array[g];
      call.dd = call.c;
      call.alpha = static_cast<const float*>(alpha_array)[g];
      call.beta = static_cast<const float*>(beta_array)[g];
      calls.push_back(call);
    }
  const size_t esize = type_bytes(Atype);
  enqueue(h->stream, Op{"cublasGemmGroupedBatchedEx", [calls, Aarray, Barray, Carray, esize]() mutable {
                          for (size_t i = 0; i < calls.size(); ++i) {
                            MatmulCall& c = calls[i];
                            c.A = Aarray[i], c.B = Barray[i], c.C = Carray[i], c.D = Carray[i];
                            if (esize < 4) {
                              const uint64_t k = c.d.ta == CUBLAS_OP_T ? c.a.rows : c.a.cols;
                              const uintptr_t need = (k * esize) % 16 == 0 ? 16 : (k * esize) % 4 == 0 ? 4 : 1;
                              for (const void* p : {c.A, c.B, static_cast<const void*>(c.D)})
                                if (reinterpret_cast<uintptr_t>(p) % need != 0)
                                  fatal(
                                      fmt_str("cublasGemmGroupedBatchedEx: problem %zu's matrix at %p is not "
                                              "%zu-byte aligned (misaligned address on a GPU)",
                                              i, p, size_t(need)));
                            }
                            check_extents(c, c.beta != 0.0f);
                            if (c.dd.rows > 0 && c.dd.cols > 0) execute(c);
                          }
                          return true;
                        }});
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
