// Emulated cuDNN graph (backend) API: the subset mtnlg calls for fused attention
// (core/cuda/cudnn_attention.cu), with the library's validation where it is documented,
// executed on the CPU by mtnlg's own attention ops when the stream runs.
//
// Model (docs/specs/cuda-emulation.md, "cuDNN"): descriptors keep their attributes; a
// descriptor must be finalized before it is used as another's attribute, and is frozen
// after. An operation graph is recognised when its operations are, in order, one of the
// two fused-attention patterns of docs/specs/cudnn-sdpa.md (forward, backward; each with
// or without dropout; each causal, or without the mask's four operations: context
// parallelism's unmasked blocks, Tq queries against Tkv keys; the backward with or without the fp32 dQ accumulator, and, when K
// and V have fewer heads than Q (grouped-query attention), with dK and dV summed over each
// group's query heads) with P handed to the second matmul in the I/O type. The heuristic, for the device of the handle (the
// emulated GPU, sm90) or of a device-property descriptor (cuDNN >= 9.8's offline
// planning: its JSON must name deviceVer 900), then offers one engine configuration when
// the graph is inside the support surface the real cuDNN 9.19 shows on sm90, and none
// otherwise (with the reason as the last error): I/O bf16 or fp16, one type for all,
// fp32 statistics, head size a multiple of 8, at most 256 for the backward (the forward
// of a larger head size plans too, on an engine without workspace), unit innermost
// strides, 16-byte alignment. The plan's workspace is the real one's (workspace_bytes);
// test/core/cuda/test_cudnn_plan_table.cpp checks every answer against the real library.
// Execution reads the variant pack (every non-virtual tensor's pointer, device memory of
// the right extent and aligned as declared; the by-value scalars from host memory; a
// workspace of the plan's size) and runs ops::attention_forward_lse /
// attention_backward_lse (with the graph's key/value heads as the op's groups), or for an
// unmasked or split graph ops::attention_block_forward / _backward, on CPU copies gathered by the
// tensors' strides. The dropout mask is the CPU op's Philox draw at
// index offset + ((b*H + h)*T + i)*T + j (not cuDNN's generator: not modelled).
// Fault injection: MTNLG_EMU_CUDNN_FAIL=plans makes every plan's finalize answer
// CUDNN_STATUS_NOT_SUPPORTED (a cuDNN that takes none of these graphs).
#include <cudnn_graph.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ops.hpp"
#include "core/switches.hpp"
#include "core/tensor.hpp"
#include "emulator/emu.hpp"
#include "emulator/internal.hpp"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

namespace mtnlg::emu {
namespace {

constexpr uint64_t kMagic = 0x63756e6e31ull;
constexpr int kPlanHandle = 400;  // CUDNN_ATTR_EXECUTION_PLAN_HANDLE (deprecated in cuDNN 9's headers)
thread_local std::string tl_last_error;

cudnnStatus_t refuse(cudnnStatus_t s, const std::string& why) {
  tl_last_error = why;
  return s;
}

struct Desc;
struct Pattern {  // a recognised fused-attention graph
  bool forward = false, dropout = false, accumulator = false;
  bool grouped = false;  // the backward sums dK and dV over each group's query heads
  bool probs_io = true;  // P reaches the second matmul in the I/O type
  bool causal = true;    // the causal mask; false: a block without one (context parallelism)
  double keep = 1;
  // The roles' tensors (descriptors of the graph's non-virtual tensors).
  const Desc *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *stats = nullptr, *dout = nullptr, *dq = nullptr,
             *dk = nullptr, *dv = nullptr, *acc = nullptr, *seed = nullptr, *offset = nullptr, *scale = nullptr;
};

struct Desc {
  uint64_t magic = kMagic;
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  std::map<int, std::pair<cudnnBackendAttributeType_t, std::vector<char>>> attrs;
  // An engine configuration and a plan point at their graph's pattern.
  const Desc* graph = nullptr;
  Pattern pattern;             // an operation graph's, after finalize
  int64_t device_version = 0;  // a device-property descriptor's deviceVer, after finalize

  bool has(int n) const { return attrs.count(n) != 0; }
  template <typename T>
  std::vector<T> get(int n) const {
    auto it = attrs.find(n);
    if (it == attrs.end()) return {};
    std::vector<T> v(it->second.second.size() / sizeof(T));
    std::memcpy(v.data(), it->second.second.data(), v.size() * sizeof(T));
    return v;
  }
  template <typename T>
  T one(int n, T fallback = T{}) const {
    auto it = attrs.find(n);
    if (it == attrs.end() || it->second.second.size() < sizeof(T)) return fallback;
    T v;
    std::memcpy(&v, it->second.second.data(), sizeof(T));
    return v;
  }
  const Desc* ref(int n) const { return static_cast<const Desc*>(one<void*>(n, nullptr)); }
  std::vector<const Desc*> refs(int n) const {
    std::vector<const Desc*> r;
    for (void* p : get<void*>(n)) r.push_back(static_cast<const Desc*>(p));
    return r;
  }
  // Tensor attributes.
  int64_t uid() const { return one<int64_t>(CUDNN_ATTR_TENSOR_UNIQUE_ID, -1); }
  cudnnDataType_t dtype() const { return one<cudnnDataType_t>(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT); }
  std::vector<int64_t> dims() const { return get<int64_t>(CUDNN_ATTR_TENSOR_DIMENSIONS); }
  std::vector<int64_t> strides() const { return get<int64_t>(CUDNN_ATTR_TENSOR_STRIDES); }
  bool is_virtual() const { return one<bool>(CUDNN_ATTR_TENSOR_IS_VIRTUAL, false); }
  bool by_value() const { return one<bool>(CUDNN_ATTR_TENSOR_IS_BY_VALUE, false); }
};

Desc* as_desc(cudnnBackendDescriptor_t d) {
  auto* p = static_cast<Desc*>(d);
  if (!p || p->magic != kMagic) fatal("cudnnBackend*: not a live descriptor (destroyed, or never created)");
  return p;
}

size_t type_size(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(void*);
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_CHAR: return 1;
    case CUDNN_TYPE_INT64:
    case CUDNN_TYPE_DOUBLE: return 8;
    case CUDNN_TYPE_FLOAT:
    case CUDNN_TYPE_INT32: return 4;
    case CUDNN_TYPE_DATA_TYPE:
    case CUDNN_TYPE_POINTWISE_MODE:
    case CUDNN_TYPE_HEUR_MODE:
    case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE:
    case CUDNN_TYPE_RNG_DISTRIBUTION:
    case CUDNN_TYPE_TENSOR_REORDERING_MODE: return sizeof(int);
    default: fatal(fmt_str("cudnnBackendSetAttribute: attribute type %d is not emulated", int(t)));
  }
}

// ---- recognition ----------------------------------------------------------------------
// One token per operation: "mm", "red:<op>", "rng", "reshape", "pw:<mode>[:axis]".
std::string token(const Desc& op) {
  switch (op.type) {
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: return "mm";
    case CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR: return "rng";
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return "reshape";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
      const Desc* r = op.ref(CUDNN_ATTR_OPERATION_REDUCTION_DESC);
      const auto how = r ? r->one<cudnnReduceTensorOp_t>(CUDNN_ATTR_REDUCTION_OPERATOR) : CUDNN_REDUCE_TENSOR_ADD;
      return how == CUDNN_REDUCE_TENSOR_MAX ? "red:max" : how == CUDNN_REDUCE_TENSOR_ADD ? "red:add" : "red:?";
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
      const Desc* pw = op.ref(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
      if (!pw) return "pw:?";
      const auto mode = pw->one<cudnnPointwiseMode_t>(CUDNN_ATTR_POINTWISE_MODE);
      switch (mode) {
        case CUDNN_POINTWISE_MUL: return "mul";
        case CUDNN_POINTWISE_ADD: return "add";
        case CUDNN_POINTWISE_SUB: return "sub";
        case CUDNN_POINTWISE_DIV: return "div";
        case CUDNN_POINTWISE_EXP: return "exp";
        case CUDNN_POINTWISE_LOG: return "log";
        case CUDNN_POINTWISE_IDENTITY: return "id";
        case CUDNN_POINTWISE_CMP_GE: return "ge";
        case CUDNN_POINTWISE_BINARY_SELECT: return "select";
        case CUDNN_POINTWISE_GEN_INDEX:
          return fmt_str("index%lld", (long long)pw->one<int64_t>(CUDNN_ATTR_POINTWISE_AXIS, -1));
        default: return fmt_str("pw%d", int(mode));
      }
    }
    default: return fmt_str("op%d", int(op.type));
  }
}

const char* const kCausal = " index2 index3 ge select";
std::string fwd_tokens(bool dropout, bool causal) {
  return std::string("mm mul") + (causal ? kCausal : "") + " red:max sub exp red:add log add div" +
         (dropout ? " rng mul mul" : "") + " mm";
}
// `grouped`: dV and dK per query head, then a sum over the group's heads (red:add).
std::string bwd_tokens(bool dropout, bool acc, bool grouped, bool causal) {
  const char* sum = grouped ? " red:add" : "";
  return std::string(dropout ? "rng " : "") + "mul red:add mul mm mul" + (causal ? kCausal : "") + " sub exp" +
         (dropout ? " mul mul" : "") + " reshape mm" + sum + " mm mul sub mul" + (dropout ? " mul" : "") +
         " mul reshape mm" + sum + " reshape mm" + (acc ? " id" : "");
}

const Desc* X(const Desc* op) { return op->ref(CUDNN_ATTR_OPERATION_POINTWISE_XDESC); }
const Desc* B(const Desc* op) { return op->ref(CUDNN_ATTR_OPERATION_POINTWISE_BDESC); }
const Desc* Y(const Desc* op) { return op->ref(CUDNN_ATTR_OPERATION_POINTWISE_YDESC); }
const Desc* MA(const Desc* op) { return op->ref(CUDNN_ATTR_OPERATION_MATMUL_ADESC); }
const Desc* MB(const Desc* op) { return op->ref(CUDNN_ATTR_OPERATION_MATMUL_BDESC); }
const Desc* MC(const Desc* op) { return op->ref(CUDNN_ATTR_OPERATION_MATMUL_CDESC); }
const Desc* RX(const Desc* op) { return op->ref(CUDNN_ATTR_OPERATION_REDUCTION_XDESC); }
const Desc* RY(const Desc* op) { return op->ref(CUDNN_ATTR_OPERATION_REDUCTION_YDESC); }

// Fills `p` when the graph's operations are one of the patterns; false otherwise.
bool recognise(const std::vector<const Desc*>& ops, Pattern& p) {
  std::string sig;
  for (const Desc* o : ops) {
    if (!sig.empty()) sig += ' ';
    sig += token(*o);
  }
  std::vector<const Desc*> mms;
  const Desc* rng = nullptr;
  for (const Desc* o : ops) {
    if (o->type == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR) mms.push_back(o);
    if (o->type == CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR) rng = o;
  }
  for (int form = 0; form < 4; ++form) {
    const bool drop = form & 1, causal = !(form & 2);
    const size_t masked = causal ? 4 : 0;  // the causal mask's four operations
    if (sig == fwd_tokens(drop, causal)) {
      p.forward = true;
      p.dropout = drop;
      p.causal = causal;
      p.q = MA(mms[0]);
      p.k = MB(mms[0]);
      p.scale = B(ops[1]);
      p.v = MB(mms[1]);
      p.o = MC(mms[1]);
      p.probs_io = MA(mms[1])->dtype() == p.q->dtype();
      p.stats = Y(ops[7 + masked]);  // add(max, log sum)
    }
    for (int variant = 0; variant < 4; ++variant) {
      const bool acc = variant & 1, grouped = variant & 2;
      if (sig != bwd_tokens(drop, acc, grouped, causal)) continue;
      const size_t first = drop ? 1 : 0;
      p.forward = false;
      p.dropout = drop;
      p.causal = causal;
      p.accumulator = acc;
      p.grouped = grouped;
      // The gradient a matmul makes: its output, or, grouped, the sum that follows it
      // (which must read that output).
      auto grad_of = [&](const Desc* mm) -> const Desc* {
        if (!grouped) return MC(mm);
        const size_t i = size_t(std::find(ops.begin(), ops.end(), mm) - ops.begin());
        return RX(ops[i + 1]) == MC(mm) ? RY(ops[i + 1]) : nullptr;
      };
      p.dout = X(ops[first]);
      p.o = B(ops[first]);
      p.q = MA(mms[0]);
      p.k = MB(mms[0]);
      p.scale = B(ops[first + 4]);
      p.stats = B(ops[first + 5 + masked]);  // sub(scores, stats)
      p.dv = grad_of(mms[1]);
      p.v = MB(mms[2]);
      p.dk = grad_of(mms[3]);
      if (!p.dv || !p.dk) p.q = nullptr;  // a sum of something else: not the pattern
      p.dq = acc ? Y(ops.back()) : MC(mms[4]);
      p.acc = acc ? MC(mms[4]) : nullptr;
    }
  }
  if (!p.q) return false;
  if (p.dropout) {
    const Desc* r = rng->ref(CUDNN_ATTR_OPERATION_RNG_DESC);
    p.seed = rng->ref(CUDNN_ATTR_OPERATION_RNG_SEED);
    p.offset = rng->ref(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC);
    p.keep = r ? r->one<double>(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, 1.0) : 1.0;
  }
  return true;
}

// cuDNN's support surface for fused attention (what the plan's finalize checks).
std::string support(const Pattern& p) {
  const cudnnDataType_t io = p.q->dtype();
  if (io != CUDNN_DATA_HALF && io != CUDNN_DATA_BFLOAT16) return "fused attention takes fp16 or bf16 Q, K, V";
  for (const Desc* t : {p.k, p.v, p.o, p.dout, p.dq, p.dk, p.dv})
    if (t && t->dtype() != io) return "fused attention needs one I/O type for Q, K, V, O and their gradients";
  if (p.stats->dtype() != CUDNN_DATA_FLOAT) return "fused attention's statistics are fp32";
  const auto qd = p.q->dims();
  if (qd.size() != 4) return "fused attention takes 4-d tensors";
  const int64_t d = qd[3];
  const auto kd = p.k->dims();
  if (kd.size() != 4 || kd[0] != qd[0] || kd[1] < 1 || qd[1] % kd[1] != 0)
    return "fused attention needs the query heads a multiple of the key/value heads";
  if (kd[2] != d) return "fused attention needs one head size for Q and K";
  if (p.causal && kd[3] != qd[2])
    return "the emulated cuDNN runs the causal mask (row >= column) on square scores only";
  if (!p.forward && (kd[1] != qd[1]) != p.grouped)
    return "the backward sums dK and dV over the query heads exactly when K and V have fewer heads";
  if (d % 8 != 0 || (!p.forward && d > 256))
    return fmt_str("head dimension %lld: must be a multiple of 8, up to 256 in the backward (sm90)", (long long)d);
  if (!p.probs_io) return "the second matmul of fused attention takes P in the I/O type";
  for (const Desc* t : {p.q, p.o, p.dout, p.dq, p.dk, p.dv})
    if (t && t->strides().back() != 1) return "fused attention needs unit stride in the head dimension";
  if (p.k->strides()[2] != 1) return "fused attention needs K^T with unit stride in the head dimension";
  for (const Desc* t : {p.q, p.k, p.v, p.o, p.stats, p.dout, p.dq, p.dk, p.dv})
    if (t && t->one<int64_t>(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0) < 16)
      return "fused attention needs 16-byte alignment";
  if (p.dropout && (!p.seed || !p.offset)) return "dropout needs seed and offset tensors";
  return "";
}

// The plan's workspace, as the real cuDNN 9.19 reports it on sm90 (the plan table's
// cases): the forward 256 bytes (0 for a head size above 256, another engine); the
// backward 256 + the rows' fp32 softmax sums rounded up to 128 bytes, and with the
// deterministic algorithm (no dQ accumulator) dP in bf16/fp16 as [B, H, T rounded up to
// 64, T rounded up to 128]; a grouped backward (K and V of fewer heads) 4 bytes more per
// query-head element, B*H*T*D*4 (H the graph's query heads).
int64_t workspace_bytes(const Pattern& p) {
  const auto d = p.q->dims();
  const int64_t B = d[0], H = d[1], T = d[2], D = d[3], Tk = p.k->dims()[3];
  auto up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  if (p.forward) return D > 256 ? 0 : 256;
  int64_t ws = 256 + up(B * H * T * 4, 128);
  if (!p.accumulator) ws += B * H * up(T, 64) * up(Tk, 128) * 2;
  if (p.grouped) ws += B * H * Tk * D * 4;
  return ws;
}

// The device a heuristic plans for: a device-property descriptor's version, else the
// handle's (the emulated GPU is sm90).
std::string device_refusal(const Desc* device) {
  const int64_t v = device ? device->device_version : 900;
  if (v != 900) return fmt_str("the emulated cuDNN models sm90 (deviceVer 900) only, not deviceVer %lld", (long long)v);
  return "";
}

// ---- execution ------------------------------------------------------------------------
DType mtnlg_dtype(cudnnDataType_t t) { return t == CUDNN_DATA_BFLOAT16 ? DType::bf16 : DType::f16; }

struct Call {
  Pattern p;
  std::map<int64_t, void*> ptr;
  int64_t seed = 0, offset = 0;
};

void* need(const Call& c, const Desc* t) {
  auto it = c.ptr.find(t->uid());
  if (it == c.ptr.end()) fatal(fmt_str("cudnnBackendExecute: no pointer for tensor uid %lld", (long long)t->uid()));
  return it->second;
}

// A graph tensor as rows of D contiguous elements: (a, b, t) at base + (a*s0 + b*s1 + t*st)*es,
// K^T and V^T read with their last two dimensions swapped. Its extent is checked as device
// memory.
struct Rows {
  char* base;
  int64_t n0, n1, T, D, s0, s1, st;
};
Rows rows_of(const Call& c, const Desc* t, bool transposed, int64_t es, const char* what) {
  const auto d = t->dims(), s = t->strides();
  Rows r{static_cast<char*>(need(c, t)), d[0], d[1], transposed ? d[3] : d[2],
         transposed ? d[2] : d[3],       s[0], s[1], transposed ? s[3] : s[2]};
  const int64_t last = (r.n0 - 1) * r.s0 + (r.n1 - 1) * r.s1 + (r.T - 1) * r.st + r.D;
  check_device_range(r.base, size_t(last * es), fmt_str("cudnnBackendExecute: %s", what).c_str());
  return r;
}
// Copies every row between `r` and a CPU tensor [n0, T, cols] where row (a, b, t) is at
// column col(b).
template <typename Col>
void move_rows(const Rows& r, char* cpu, int64_t cols, int64_t es, Col col, bool to_cpu) {
  for (int64_t a = 0; a < r.n0; ++a)
    for (int64_t b = 0; b < r.n1; ++b)
      for (int64_t t = 0; t < r.T; ++t) {
        char* dev = r.base + (a * r.s0 + b * r.s1 + t * r.st) * es;
        char* host = cpu + ((a * r.T + t) * cols + col(b)) * es;
        if (to_cpu)
          std::memcpy(host, dev, size_t(r.D * es));
        else
          std::memcpy(dev, host, size_t(r.D * es));
      }
}

// Copies the statistics [Bn, H, T, 1] fp32 (one float per (b, h, t), at the graph's
// strides) between the device and lse [Bn, H, T].
void move_stats(const Call& c, const Desc* stats, Tensor& lse, bool to_cpu) {
  const int64_t Bn = lse.dim(0), H = lse.dim(1), T = lse.dim(2);
  const auto ss = stats->strides();
  auto* st = static_cast<float*>(need(c, stats));
  check_device_range(st, size_t(((Bn - 1) * ss[0] + (H - 1) * ss[1] + (T - 1) * ss[2] + 1) * 4),
                     "cudnnBackendExecute: Stats");
  float* l = static_cast<float*>(lse.raw());
  for (int64_t b = 0; b < Bn; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        float* dev = st + b * ss[0] + h * ss[1] + t * ss[2];
        float* host = l + (b * H + h) * T + t;
        if (to_cpu)
          *host = *dev;
        else
          *dev = *host;
      }
}

ops::AttentionDropout dropout_of(const Call& c, int64_t H, int64_t T) {
  ops::AttentionDropout drop;
  if (!c.p.dropout) return drop;
  if (c.offset % (T * T) != 0)
    fatal("cudnnBackendExecute: the emulated dropout needs an offset that is a multiple of T*T");
  drop.p = 1.0 - c.p.keep;
  drop.key = static_cast<uint64_t>(c.seed);
  drop.heads_total = H;
  drop.head_offset = c.offset / (T * T);
  return drop;
}

// Runs the graph with mtnlg's CPU ops: the tensors are gathered from whatever strides the
// graph declares, and the results scattered back the same way. The packed causal graph:
// into the per-group qkv layout of ops::attention_forward_lse ([q_0 .. q_{r-1} | k | v] for
// each of the hk key/value heads, r = hq/hk; hk == hq is Megatron's per-head q, k, v). A
// split graph (context parallelism's blocks: K/V rows of their own, causal or unmasked): Q
// into qkv rows of that layout (the q columns), K and V into a K/V buffer [Bn, Tk, hk*2*D]
// (per head [k | v]), for ops::attention_block_forward / attention_block_backward over
// every row, whose backward takes rowsum from the O it is given as cuDNN's does (a ring
// hands it the whole attention's O and statistics; attention_backward_lse recomputes it
// from its own keys).
void run(const Call& c) {
  const Pattern& p = c.p;
  const auto d = p.q->dims();
  const int64_t Bn = d[0], H = d[1], T = d[2], D = d[3], G = p.k->dims()[1], r = H / G, Tk = p.k->dims()[3];
  const DType dt = mtnlg_dtype(p.q->dtype());
  // K/V rows of their own (the split layout: K's row stride is not Q's), or unmasked.
  const bool block = !p.causal || p.k->strides()[3] != p.q->strides()[2];
  const int64_t es = dtype_size(dt), row = (H + 2 * G) * D, kvrow = block ? 2 * G * D : row;
  auto q_col = [&](int64_t h) { return ((h / r) * (r + 2) + h % r) * D; };
  auto k_col = [&](int64_t g) { return block ? 2 * g * D : (g * (r + 2) + r) * D; };
  auto v_col = [&](int64_t g) { return k_col(g) + D; };
  auto head_col = [&](int64_t h) { return h * D; };
  const ops::AttentionDropout drop = dropout_of(c, H, T);
  ops::AttentionBlock all;  // every row
  all.causal = p.causal;
  Tensor qkv = Tensor::zeros({Bn, T, row}, dt, Device::cpu);
  Tensor kv = block ? Tensor::zeros({Bn, Tk, kvrow}, dt, Device::cpu) : qkv;
  char* kx = static_cast<char*>(kv.raw());
  move_rows(rows_of(c, p.q, false, es, "Q"), static_cast<char*>(qkv.raw()), row, es, q_col, true);
  move_rows(rows_of(c, p.k, true, es, "K"), kx, kvrow, es, k_col, true);
  move_rows(rows_of(c, p.v, !p.forward, es, "V"), kx, kvrow, es, v_col, true);
  Tensor out = Tensor::empty({Bn, T, H * D}, dt, Device::cpu);
  Tensor lse = Tensor::empty({Bn, H, T}, DType::f32, Device::cpu);
  const Rows o = rows_of(c, p.o, false, es, "O");
  if (p.forward) {
    if (block)
      ops::attention_block_forward(out, lse, qkv, kv, H, all, G);
    else
      ops::attention_forward_lse(out, lse, qkv, H, drop, G);
    move_rows(o, static_cast<char*>(out.raw()), H * D, es, head_col, false);
    move_stats(c, p.stats, lse, false);
    return;
  }
  move_rows(o, static_cast<char*>(out.raw()), H * D, es, head_col, true);
  move_stats(c, p.stats, lse, true);
  Tensor dout = Tensor::empty({Bn, T, H * D}, dt, Device::cpu);
  move_rows(rows_of(c, p.dout, false, es, "dO"), static_cast<char*>(dout.raw()), H * D, es, head_col, true);
  Tensor dqkv = Tensor::zeros({Bn, T, row}, dt, Device::cpu);
  Tensor dkv = block ? Tensor::zeros({Bn, Tk, kvrow}, dt, Device::cpu) : dqkv;
  if (block)
    ops::attention_block_backward(dqkv, dkv, dout, nullptr, qkv, kv, out, lse, H, all, G);
  else
    ops::attention_backward_lse(dqkv, dout, qkv, out, lse, H, drop, G);
  char* dkx = static_cast<char*>(dkv.raw());
  move_rows(rows_of(c, p.dq, false, es, "dQ"), static_cast<char*>(dqkv.raw()), row, es, q_col, false);
  move_rows(rows_of(c, p.dk, false, es, "dK"), dkx, kvrow, es, k_col, false);
  move_rows(rows_of(c, p.dv, false, es, "dV"), dkx, kvrow, es, v_col, false);
  if (p.acc) {  // the accumulator holds dQ in fp32 (its engine-private order is not modelled)
    float* acc = static_cast<float*>(need(c, p.acc));
    check_device_range(acc, size_t(Bn * H * T * D * 4), "cudnnBackendExecute: dQ accumulator");
    std::memset(acc, 0, size_t(Bn * H * T * D * 4));
  }
}

}  // namespace
}  // namespace mtnlg::emu

using namespace mtnlg::emu;

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    default: return "CUDNN_STATUS_(other)";
  }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  std::snprintf(message, max_size, "%s", tl_last_error.c_str());
  tl_last_error.clear();
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  *handle = new cudnnContext();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t s) {
  handle->stream = s;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t t, cudnnBackendDescriptor_t* d) {
  auto* p = new Desc();
  p->type = t;
  *d = p;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
  Desc* p = as_desc(d);
  p->magic = 0;
  delete p;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n,
                                       cudnnBackendAttributeType_t t, int64_t count, const void* v) {
  Desc* p = as_desc(d);
  if (p->finalized) return refuse(CUDNN_STATUS_BAD_PARAM, "attribute set on a finalized descriptor");
  if (count < 0 || (count > 0 && !v)) return refuse(CUDNN_STATUS_BAD_PARAM, "attribute without values");
  if (t == CUDNN_TYPE_BACKEND_DESCRIPTOR)
    for (int64_t i = 0; i < count; ++i) {
      const Desc* o = as_desc(static_cast<void* const*>(v)[i]);
      if (!o->finalized) return refuse(CUDNN_STATUS_BAD_PARAM, "a descriptor attribute that is not finalized");
    }
  const size_t bytes = type_size(t) * size_t(count);
  p->attrs[int(n)] = {t, std::vector<char>(static_cast<const char*>(v), static_cast<const char*>(v) + bytes)};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
  Desc* p = as_desc(d);
  if (p->finalized) return refuse(CUDNN_STATUS_BAD_PARAM, "descriptor finalized twice");
  switch (p->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
      const auto dims = p->dims(), strides = p->strides();
      if (p->uid() < 0 || dims.empty() || dims.size() != strides.size() || !p->has(CUDNN_ATTR_TENSOR_DATA_TYPE) ||
          !p->has(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT))
        return refuse(CUDNN_STATUS_BAD_PARAM, "tensor needs uid, data type, dims, strides and alignment");
      break;
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
      if (!p->has(CUDNN_ATTR_OPERATIONGRAPH_OPS)) return refuse(CUDNN_STATUS_BAD_PARAM, "graph without operations");
      recognise(p->refs(CUDNN_ATTR_OPERATIONGRAPH_OPS), p->pattern);
      break;
    }
    case CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR: {
      // cuDNN's JSON of device properties (core/cuda/cudnn_device.hpp writes one), or a
      // device id: the emulated GPU's properties (cudaGetDeviceProperties), serialized.
      if (!p->has(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION)) {
        const auto id = p->get<int32_t>(CUDNN_ATTR_DEVICEPROP_DEVICE_ID);
        cudaDeviceProp prop{};
        if (id.size() != 1 || cudaGetDeviceProperties(&prop, id[0]) != cudaSuccess)
          return refuse(CUDNN_STATUS_BAD_PARAM, "device properties: neither a JSON nor a device id of a device");
        nlohmann::json d{{"cudaDeviceId", id[0]},
                         {"deviceName", prop.name},
                         {"deviceVer", prop.major * 100 + prop.minor * 10},
                         {"driverVer", CUDART_VERSION},
                         {"multiProcessorCount", prop.multiProcessorCount},
                         {"totalGlobalMem", static_cast<int64_t>(prop.totalGlobalMem)},
                         {"l2CacheSize", prop.l2CacheSize},
                         {"maxSharedMemoryPerBlock", static_cast<int64_t>(prop.sharedMemPerBlock)},
                         {"maxSharedMemoryPerBlockOptin", static_cast<int64_t>(prop.sharedMemPerBlockOptin)},
                         {"regsPerBlock", prop.regsPerBlock},
                         {"maxThreadsPerBlock", prop.maxThreadsPerBlock},
                         {"maxThreadsPerSM", prop.maxThreadsPerMultiProcessor},
                         {"warpSize", 32}};
        const std::string text = d.dump();
        p->attrs[CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION] = {CUDNN_TYPE_CHAR,
                                                               std::vector<char>(text.begin(), text.end())};
      }
      const auto text = p->get<char>(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION);
      const auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object())
        return refuse(CUDNN_STATUS_BAD_PARAM, "device properties: not a JSON object");
      for (const char* key : {"deviceVer", "multiProcessorCount", "maxSharedMemoryPerBlockOptin", "driverVer"})
        if (!j.contains(key) || !j[key].is_number_integer())
          return refuse(CUDNN_STATUS_BAD_PARAM, fmt_str("device properties: no integer \"%s\"", key));
      p->device_version = j["deviceVer"].get<int64_t>();
      break;
    }
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      if (!p->ref(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH))
        return refuse(CUDNN_STATUS_BAD_PARAM, "heuristic without graph");
      break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
      const Desc* cfg = p->ref(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
      if (!cfg || !cfg->graph) return refuse(CUDNN_STATUS_BAD_PARAM, "plan without an engine configuration");
      if (!p->has(kPlanHandle) && !p->ref(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP))
        return refuse(CUDNN_STATUS_BAD_PARAM, "plan without a handle or device properties");
      p->graph = cfg->graph;
      if (::mtnlg::switches::text(::mtnlg::Switch::emu_cudnn_fail) == "plans")
        return refuse(CUDNN_STATUS_NOT_SUPPORTED, "no engine takes this graph (MTNLG_EMU_CUDNN_FAIL=plans)");
      break;
    }
    default: break;
  }
  p->finalized = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t n,
                                       cudnnBackendAttributeType_t t, int64_t requested, int64_t* count, void* out) {
  Desc* p = as_desc(d);
  if (!p->finalized) return refuse(CUDNN_STATUS_BAD_PARAM, "attribute read from a descriptor that is not finalized");
  if (p->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && n == CUDNN_ATTR_ENGINEHEUR_RESULTS &&
      t == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    const Desc* g = p->ref(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
    // One engine for a recognised graph inside the support surface on this device; none
    // otherwise, with the reason as the last error (the real cuDNN offers none then).
    std::string why = g->pattern.q ? device_refusal(p->ref(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP)) : "";
    if (g->pattern.q && why.empty()) why = support(g->pattern);
    const int64_t offered = g->pattern.q && why.empty() ? 1 : 0;
    if (!offered) tl_last_error = g->pattern.q ? why : "the emulated cuDNN recognises mtnlg's attention graphs only";
    if (count) *count = requested == 0 ? offered : std::min(requested, offered);
    for (int64_t i = 0; i < std::min(requested, offered); ++i) {
      Desc* cfg = as_desc(static_cast<void**>(out)[i]);
      if (cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
        return refuse(CUDNN_STATUS_BAD_PARAM, "heuristic results go into engine configuration descriptors");
      cfg->graph = g;
      cfg->finalized = true;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (p->type == CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR && n == CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION &&
      t == CUDNN_TYPE_CHAR) {
    const auto text = p->get<char>(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION);
    if (count) *count = static_cast<int64_t>(text.size());
    if (requested > 0 && out) std::memcpy(out, text.data(), std::min<size_t>(size_t(requested), text.size()));
    return CUDNN_STATUS_SUCCESS;
  }
  if (p->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && n == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE &&
      t == CUDNN_TYPE_INT64 && requested >= 1) {
    *static_cast<int64_t*>(out) = workspace_bytes(p->graph->pattern);
    if (count) *count = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  fatal(fmt_str("cudnnBackendGetAttribute: attribute %d of descriptor type %d is not emulated", int(n), int(p->type)));
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
  const Desc* pl = as_desc(plan);
  const Desc* vp = as_desc(pack);
  if (!pl->finalized || !vp->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "execute with an unfinalized plan or pack");
  Call c;
  c.p = pl->graph->pattern;
  const auto uids = vp->get<int64_t>(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  const auto ptrs = vp->get<void*>(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  if (uids.size() != ptrs.size())
    return refuse(CUDNN_STATUS_BAD_PARAM, "variant pack: ids and pointers differ in number");
  for (size_t i = 0; i < uids.size(); ++i) c.ptr[uids[i]] = ptrs[i];
  void* ws = vp->one<void*>(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, nullptr);
  UseCollector uses;  // the op's device memory, rechecked by a graph's replay
  if (const int64_t need_ws = workspace_bytes(c.p); need_ws > 0)
    check_device_range(ws, size_t(need_ws), "cudnnBackendExecute: workspace (smaller than the plan's workspace size)");
  for (const auto& [uid, p] : c.ptr)  // the tensors' extents are checked when the op runs
    if (is_device_pointer(p))
      check_device_range(p, 1, fmt_str("cudnnBackendExecute: tensor uid %lld", static_cast<long long>(uid)).c_str());
  // Every pointer as aligned as its tensor declares (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT).
  for (const Desc* t :
       {c.p.q, c.p.k, c.p.v, c.p.o, c.p.stats, c.p.dout, c.p.dq, c.p.dk, c.p.dv, c.p.acc, c.p.seed, c.p.offset}) {
    if (!t) continue;
    const int64_t align = t->one<int64_t>(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 1);
    const auto it = c.ptr.find(t->uid());
    if (it != c.ptr.end() && align > 0 && reinterpret_cast<uintptr_t>(it->second) % uint64_t(align) != 0)
      return refuse(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                    fmt_str("variant pack: tensor uid %lld is not %lld-byte aligned as its descriptor declares",
                            (long long)t->uid(), (long long)align));
  }
  // By-value scalars are read now (host memory); the scale must be 1/sqrt(D) for the CPU op.
  const float scale = *static_cast<const float*>(need(c, c.p.scale));
  const int64_t D = c.p.q->dims()[3];
  if (std::abs(scale * std::sqrt(float(D)) - 1.0f) > 1e-6f)
    fatal("cudnnBackendExecute: the emulated fused attention computes the scale 1/sqrt(head size) only");
  cudaStream_t s = handle->stream;
  enqueue(s, Op{c.p.forward ? "cudnn fused attention forward" : "cudnn fused attention backward", [c]() mutable {
                  if (c.p.dropout) {
                    std::memcpy(&c.seed, need(c, c.p.seed), 8);
                    std::memcpy(&c.offset, need(c, c.p.offset), 8);
                  }
                  run(c);
                  return true;
                }});
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
