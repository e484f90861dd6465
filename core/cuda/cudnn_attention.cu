// cuDNN's fused flash attention through the graph (backend) API: the loader, a small
// graph builder over backend descriptors, the forward and backward SDPA graphs, a plan
// cache per shape, and the two Tensor-level calls (core/cuda/cudnn_attention.hpp).
//
// The graphs are the operation patterns cuDNN's runtime fusion engine recognises as
// fused attention (docs/specs/cudnn-sdpa.md lists them op by op, with every tensor's
// dims, strides and type). Layout: mtnlg's qkv rows hold, per head, q then k then v
// (Megatron), so Q, K and V are strided views of one buffer: dims [B, H, T, D], strides
// [T*3HD, 3D, 3HD, 1], K and V at offsets D and 2D; out and dout are [B, T, H*D]
// (strides [T*HD, D, HD, 1]); the statistics are [B, H, T, 1] fp32. Grouped-query
// attention (G groups, rows per group [q_0 .. q_{H/G-1} | k | v]) has K and V with fewer
// heads than Q, still views of the rows (Shape below has the three layouts). Context
// parallelism's p2p blocks are split graphs: Q from the qkv rows, K and V from the ring's
// K/V buffer, a block of Tq query rows against Tkv key rows, causal or unmasked
// (cudnn_block_forward / _backward).
#include <cudnn_graph.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include <dlfcn.h>

#include "core/cuda/common.cuh"
#include "core/cuda/cudnn_attention.hpp"
#include "core/refused.hpp"
#include "core/switches.hpp"

namespace mtnlg::cuda {

namespace {

// ---- the library ---------------------------------------------------------------------
struct Api {
  decltype(&cudnnGetVersion) version = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnGetLastErrorString) last_error = nullptr;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) create_desc = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) destroy_desc = nullptr;
  decltype(&cudnnBackendSetAttribute) set_attr = nullptr;
  decltype(&cudnnBackendGetAttribute) get_attr = nullptr;
  decltype(&cudnnBackendFinalize) finalize = nullptr;
  decltype(&cudnnBackendExecute) execute = nullptr;
  std::string lib;      // which library answered
  std::string failure;  // empty when loaded
};

template <typename F>
void sym(void* h, F& f, const char* name, std::string& failure) {
  f = reinterpret_cast<F>(dlsym(h, name));
  if (!f && failure.empty()) failure = std::string(name) + " missing";
}

// The library `names` names (the first that loads), opened at run time. Its symbols are
// looked up in it (dlsym on its handle), so in the emulated build this reaches the real
// library beside the emulated one the backend is linked with.
void bind_dlopen(Api& a, const std::vector<std::string>& names) {
  void* h = nullptr;
  std::string tried;
  for (const std::string& name : names) {
    h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      a.lib = name;
      break;
    }
    const char* e = dlerror();
    if (!tried.empty()) tried += "; ";
    tried += e ? e : name;
  }
  if (!h) {
    a.failure = names.front() + " does not load (" + tried + ")";
    return;
  }
  sym(h, a.version, "cudnnGetVersion", a.failure);
  sym(h, a.error_string, "cudnnGetErrorString", a.failure);
  sym(h, a.last_error, "cudnnGetLastErrorString", a.failure);
  sym(h, a.create, "cudnnCreate", a.failure);
  sym(h, a.set_stream, "cudnnSetStream", a.failure);
  sym(h, a.create_desc, "cudnnBackendCreateDescriptor", a.failure);
  sym(h, a.destroy_desc, "cudnnBackendDestroyDescriptor", a.failure);
  sym(h, a.set_attr, "cudnnBackendSetAttribute", a.failure);
  sym(h, a.get_attr, "cudnnBackendGetAttribute", a.failure);
  sym(h, a.finalize, "cudnnBackendFinalize", a.failure);
  sym(h, a.execute, "cudnnBackendExecute", a.failure);
}

const std::vector<std::string>& installed_names() {
  static const std::vector<std::string> n{"libcudnn.so.9", "libcudnn_graph.so.9"};
  return n;
}

#ifdef MTNLG_CUDA_EMULATE
// The emulated backend defines the functions (emulator/cudnn.cpp).
void bind_backend(Api& a) {
  a.version = &cudnnGetVersion;
  a.error_string = &cudnnGetErrorString;
  a.last_error = &cudnnGetLastErrorString;
  a.create = &cudnnCreate;
  a.set_stream = &cudnnSetStream;
  a.create_desc = &cudnnBackendCreateDescriptor;
  a.destroy_desc = &cudnnBackendDestroyDescriptor;
  a.set_attr = &cudnnBackendSetAttribute;
  a.get_attr = &cudnnBackendGetAttribute;
  a.finalize = &cudnnBackendFinalize;
  a.execute = &cudnnBackendExecute;
  a.lib = "emulated cuDNN";
}
#else
void bind_backend(Api& a) { bind_dlopen(a, installed_names()); }
#endif

void check_version(Api& a) {
  if (a.failure.empty() && a.version() / 10000 != 9)
    a.failure = fmt::format("{} is version {}, mtnlg needs cuDNN 9", a.lib, a.version());
}

// The backend's cuDNN: what runs attention in this process.
const Api& api() {
  static const Api a = [] {
    Api a;
    if (!switches::on(Switch::cudnn)) {
      a.failure = "switched off (MTNLG_CUDNN=0)";
      return a;
    }
    bind_backend(a);
    check_version(a);
    return a;
  }();
  return a;
}

// A library asked offline (plan_offline): the backend's, or one opened by name.
const Api& api_named(const std::string& library) {
  if (library.empty()) return api();
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Api>> opened;  // kept for the process
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = opened[library];
  if (!slot) {
    slot = std::make_unique<Api>();
    bind_dlopen(*slot, library == "installed" ? installed_names() : std::vector<std::string>{library});
    check_version(*slot);
  }
  return *slot;
}

// A cuDNN refusal: the call, the status and cuDNN's own last message.
[[noreturn]] void refuse(const Api& a, cudnnStatus_t s, const char* what) {
  char msg[512] = {0};
  if (a.last_error) a.last_error(msg, sizeof msg);
  throw Refused(fmt::format("cuDNN {}: {}{}{}", what, a.error_string(s), msg[0] ? ": " : "", msg));
}
void check(const Api& a, cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) refuse(a, s, what);
}

// Deprecated in cuDNN 9's headers, and still how a graph and a plan get their handle.
constexpr auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);  // CUDNN_ATTR_OPERATIONGRAPH_HANDLE
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);   // CUDNN_ATTR_EXECUTION_PLAN_HANDLE

// ---- descriptors --------------------------------------------------------------------
class Desc {
 public:
  Desc(const Api& a, cudnnBackendDescriptorType_t t) : a_(&a) { check(a, a.create_desc(t, &d_), "create descriptor"); }
  ~Desc() {
    if (d_) a_->destroy_desc(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

  Desc& set(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t count, const void* v) {
    check(*a_, a_->set_attr(d_, n, t, count, v), "set attribute");
    return *this;
  }
  Desc& i64(cudnnBackendAttributeName_t n, int64_t v) { return set(n, CUDNN_TYPE_INT64, 1, &v); }
  Desc& i64s(cudnnBackendAttributeName_t n, const std::array<int64_t, 4>& v) {
    return set(n, CUDNN_TYPE_INT64, 4, v.data());
  }
  Desc& dtype(cudnnBackendAttributeName_t n, cudnnDataType_t v) { return set(n, CUDNN_TYPE_DATA_TYPE, 1, &v); }
  Desc& boolean(cudnnBackendAttributeName_t n, bool b) {
    const bool v = b;
    return set(n, CUDNN_TYPE_BOOLEAN, 1, &v);
  }
  Desc& desc(cudnnBackendAttributeName_t n, const Desc& o) {
    cudnnBackendDescriptor_t v = o.get();
    return set(n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  Desc& handle(cudnnBackendAttributeName_t n, cudnnHandle_t h) { return set(n, CUDNN_TYPE_HANDLE, 1, &h); }
  Desc& finalize() {
    check(*a_, a_->finalize(d_), "finalize");
    return *this;
  }

 private:
  const Api* a_;
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::array<int64_t, 4>;

// Tensor unique ids of the graphs' inputs and outputs (the variant pack's keys).
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kdO,
  kdQ,
  kdK,
  kdV,
  kdQAccum,
  kSeed,
  kOffset,
  kScale = 20,
  kLowest,
  kDropScale,
  kDropKeep,
  kOne,  // by-value scalars
  kFirstVirtual = 100,
};

// Where a plan is made: on this process's device (its handle), or offline for the device
// a device-property descriptor describes (cuDNN >= 9.8 plans without a GPU then).
struct Target {
  cudnnHandle_t handle = nullptr;
  const Desc* device = nullptr;
};

// One graph under construction: every descriptor it creates lives as long as it does.
class Graph {
 public:
  explicit Graph(const Api& a) : a_(a) {}
  const Desc& tensor(int64_t uid, cudnnDataType_t dt, Dims dim, Dims stride, bool is_virtual = false,
                     bool by_value = false, cudnnBackendTensorReordering_t reorder = CUDNN_TENSOR_REORDERING_NONE) {
    Desc& t = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
        .dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, dt)
        .i64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dim)
        .i64s(CUDNN_ATTR_TENSOR_STRIDES, stride)
        .i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16)
        .boolean(CUDNN_ATTR_TENSOR_IS_VIRTUAL, is_virtual);
    if (by_value) t.boolean(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
    if (reorder != CUDNN_TENSOR_REORDERING_NONE)
      t.set(CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &reorder);
    if (!is_virtual) io_uids_.push_back(uid);
    return t.finalize();
  }
  // An intermediate the engine keeps on chip.
  const Desc& virt(Dims dim, Dims stride, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    return tensor(next_uid_++, dt, dim, stride, /*is_virtual=*/true);
  }
  // A host float passed by value (its value is in the variant pack); one descriptor per
  // uid however often the graph uses it.
  const Desc& scalar(int64_t uid) {
    if (auto it = scalars_.find(uid); it != scalars_.end()) return *it->second;
    return *(scalars_[uid] = &tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true));
  }
  // The uids of the graph's non-virtual tensors (what its variant pack must name).
  const std::vector<int64_t>& io_uids() const { return io_uids_; }

  // y = mode(x[, b[, t]]); math in `prec`; GEN_INDEX takes `axis`.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc* t, const Desc& y,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc& pw = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode).dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) pw.i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pw.finalize();
    Desc& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw).desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t) op.desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    add(op.finalize());
  }
  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    Desc& mm = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.dtype(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize();
    Desc& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    add(op.finalize());
  }
  void reduction(cudnnReduceTensorOp_t how, const Desc& x, const Desc& y) {
    Desc& r = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how)
        .dtype(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT)
        .finalize();
    Desc& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    add(op.finalize());
  }
  // y = Bernoulli(keep) draws of the Philox stream (seed, offset).
  void rng(const Desc& seed, const Desc& offset, const Desc& y, double keep_probability) {
    Desc& r = keep(CUDNN_BACKEND_RNG_DESCRIPTOR);
    const cudnnRngDistribution_t dist = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
    r.set(CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &dist)
        .set(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &keep_probability)
        .finalize();
    Desc& op = keep(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
    op.desc(CUDNN_ATTR_OPERATION_RNG_YDESC, y)
        .desc(CUDNN_ATTR_OPERATION_RNG_SEED, seed)
        .desc(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, offset)
        .desc(CUDNN_ATTR_OPERATION_RNG_DESC, r);
    add(op.finalize());
  }
  void reshape(const Desc& x, const Desc& y) {
    Desc& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add(op.finalize());
  }

  // The operation graph, the heuristic's engine configurations (mode A), and the first
  // one cuDNN finalizes into an execution plan.
  std::unique_ptr<Desc> plan(const Target& at, int64_t* workspace) {
    Desc& g = keep(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const Desc* o : ops_) ops.push_back(o->get());
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()), ops.data());
    if (at.handle) g.handle(kGraphHandle, at.handle);
    g.finalize();
    Desc& heur = keep(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (at.device) heur.desc(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *at.device);
    heur.finalize();
    int64_t count = 0;
    check(a_, a_.get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
          "engine heuristic");
    if (count <= 0) {
      char msg[512] = {0};
      if (a_.last_error) a_.last_error(msg, sizeof msg);
      throw Refused(fmt::format("cuDNN has no engine for this graph{}{}", msg[0] ? ": " : "", msg));
    }
    std::vector<std::unique_ptr<Desc>> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.push_back(std::make_unique<Desc>(a_, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(cfgs.back()->get());
    }
    int64_t got = 0;
    check(
        a_,
        a_.get_attr(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
        "engine heuristic results");
    std::string last = "cuDNN has no engine for this graph";
    for (int64_t i = 0; i < got; ++i) {
      try {
        auto p = std::make_unique<Desc>(a_, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        if (at.handle) p->handle(kPlanHandle, at.handle);
        if (at.device) p->desc(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, *at.device);
        p->desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *cfgs[i]).finalize();
        int64_t n = 0;
        check(a_, a_.get_attr(p->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, workspace),
              "plan workspace size");
        for (auto& c : cfgs) owned_.push_back(std::move(c));
        return p;
      } catch (const Refused& e) {
        last = e.what();
      }
    }
    throw Refused(last);
  }

 private:
  Desc& keep(cudnnBackendDescriptorType_t t) {
    owned_.push_back(std::make_unique<Desc>(a_, t));
    return *owned_.back();
  }
  void add(const Desc& op) { ops_.push_back(&op); }

  const Api& a_;
  std::vector<std::unique_ptr<Desc>> owned_;
  std::vector<const Desc*> ops_;
  std::map<int64_t, const Desc*> scalars_;
  std::vector<int64_t> io_uids_;
  int64_t next_uid_ = kFirstVirtual;
};

cudnnDataType_t cudnn_type(DType dt) { return dt == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// One graph's problem: the op's (B, T, H heads, G groups, D), the dims cuDNN sees
// ([nb, hq, T, D] queries, [nb, hk, Tk, D] keys and values: cuDNN's SDPA takes fewer key/value
// heads than query heads, hq % hk == 0) and the strides of the views of the packed qkv
// rows, one of three layouts (docs/specs/cudnn-sdpa.md):
//  - G == H: per head q, k, v (Megatron): nb B, hq = hk = H, heads 3D apart, rows 3HD;
//  - G == 1 (multi-query): nb B, hq H, hk 1; the q heads D apart, k at HD, v at (H+1)D;
//  - 1 < G < H: a group's H/G query heads are D apart but the groups (H/G+2)D, so no one
//    head stride reaches them all: the groups are cuDNN's batch (nb G, hq H/G, hk 1, batch
//    stride (H/G+2)D, sequence stride the row), one execution per sample (`calls` B, the
//    pointers moved a sample on each time; one when B is 1).
// A split graph (context parallelism's blocks) reads K and V from a K/V buffer of rows
// G*2*D (per group [k | v]) instead: its own batch, head and row strides (kb, kh, krow),
// and every buffer may hold more positions than the block covers (qrows, kvrows).
struct Shape {
  DType dt;
  int64_t B, T, H, G, D;  // the op's problem; T the query positions
  int64_t Tk;             // key/value positions
  int64_t nb, hq, hk;     // the graph's batch, query heads, key/value heads
  int64_t row;            // qkv row width, (H + 2G) D
  int64_t qb, qh;         // Q's batch and head strides (elements)
  int64_t krow, kb, kh;   // K/V's row, batch and head strides
  int64_t koff, voff;     // where k and v of the first head or group start (from the K/V base)
  int64_t ob;             // out's batch stride
  int64_t qrows, kvrows;  // positions per sample of the buffers the views are of
  int64_t calls;          // executions per op call
  bool causal;

  Dims q_dims() const { return {nb, hq, T, D}; }
  Dims kv_dims() const { return {nb, hk, Tk, D}; }
  Dims kv_t_dims() const { return {nb, hk, D, Tk}; }
  Dims kv_full_dims() const { return {nb, hq, Tk, D}; }   // dK, dV per query head (grouped)
  Dims qkv_stride() const { return {qb, qh, row, 1}; }    // Q as [nb, hq, T, D]
  Dims kv_stride() const { return {kb, kh, krow, 1}; }    // K, V as [nb, hk, Tk, D]
  Dims kv_t_stride() const { return {kb, kh, 1, krow}; }  // K^T, V^T as [nb, hk, D, Tk]
  Dims out_stride() const { return {ob, D, H * D, 1}; }   // out, dout as [nb, hq, T, D]
  Dims fullhead_stride() const { return {hq * T * D, T * D, D, 1}; }
  Dims kv_fullhead_stride() const { return {hq * Tk * D, Tk * D, D, 1}; }
  Dims scores() const { return {nb, hq, T, Tk}; }
  Dims scores_stride() const { return {hq * T * Tk, T * Tk, Tk, 1}; }
  Dims scores_t() const { return {nb, hq, Tk, T}; }
  Dims scores_t_stride() const { return {hq * T * Tk, T * Tk, 1, Tk}; }
  Dims rows() const { return {nb, hq, T, 1}; }
  Dims rows_stride() const { return {hq * T, T, 1, 1}; }
  Dims stats_stride() const { return {hq * qrows, qrows, 1, 1}; }  // Stats as a view of [B, H, qrows]
  bool grouped() const { return hk != hq; }
};

Shape make_shape(DType dt, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D) {
  if (G <= 0) G = H;
  Shape s{dt, B, T, H, G, D, T, B, H, H, (H + 2 * G) * D, 0, 0, 0, 0, 0, 0, 0, T * H * D, T, T, 1, true};
  s.qb = T * s.row;
  s.krow = s.row;
  if (G == H) {
    s.qh = s.kh = 3 * D;
    s.koff = D, s.voff = 2 * D;
  } else if (G == 1) {
    s.hk = 1;
    s.qh = s.kh = D;
    s.koff = H * D, s.voff = (H + 1) * D;
  } else {
    const int64_t r = H / G;
    s.nb = G, s.hq = r, s.hk = 1;
    s.qb = (r + 2) * D;
    s.qh = s.kh = D;
    s.koff = r * D, s.voff = (r + 1) * D;
    s.ob = r * D;
    s.calls = B;
  }
  s.kb = s.qb;
  return s;
}

// A split graph's shape: Q, O and the statistics as above but over buffers of qrows
// positions; K and V from the K/V buffer [B, kvrows, G*2*D] (k of group g at 2gD, v at
// (2g+1)D), Tk of its positions.
Shape make_split_shape(DType dt, int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t G, int64_t D, int64_t qrows,
                       int64_t kvrows, bool causal) {
  Shape s = make_shape(dt, B, T, H, G, D);
  s.Tk = Tk, s.qrows = qrows, s.kvrows = kvrows, s.causal = causal;
  s.krow = 2 * s.G * D;
  s.koff = 0, s.voff = D;
  s.kh = 2 * D;
  if (s.calls == 1) {  // every head or group in one execution
    s.qb = qrows * s.row;
    s.kb = kvrows * s.krow;
    s.ob = qrows * H * D;
  } else {
    s.kb = 2 * D;  // the groups as the batch
  }
  return s;
}

// The causal mask on scores s: s where row >= column, the lowest float elsewhere.
// `index_type` is the type the two index tensors are generated in.
const Desc& causal(Graph& g, const Shape& sh, const Desc& s, cudnnDataType_t index_type) {
  const Desc& row = g.virt(sh.scores(), sh.scores_stride(), index_type);
  const Desc& col = g.virt(sh.scores(), sh.scores_stride(), index_type);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, row, index_type, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr, col, index_type, 3);
  const Desc& keep = g.virt(sh.scores(), sh.scores_stride(), CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  const Desc& lowest = g.scalar(kLowest);
  const Desc& masked = g.virt(sh.scores(), sh.scores_stride());
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &lowest, &keep, masked);
  return masked;
}

// y = op(x, b) into a new intermediate of the scores' shape (of type `dt`).
const Desc& scores_op(Graph& g, const Shape& sh, cudnnPointwiseMode_t mode, const Desc& x, const Desc* b,
                      cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
  const Desc& y = g.virt(sh.scores(), sh.scores_stride(), dt);
  g.pointwise(mode, x, b, nullptr, y);
  return y;
}

const Desc& seed_tensor(Graph& g) { return g.tensor(kSeed, CUDNN_DATA_INT64, {1, 1, 1, 1}, {1, 1, 1, 1}); }
const Desc& offset_tensor(Graph& g) { return g.tensor(kOffset, CUDNN_DATA_INT64, {1, 1, 1, 1}, {1, 1, 1, 1}); }

// Forward: S = scale Q K^T; the causal mask (unless a block without one); softmax with its statistics
// (Stats = max + log(sum exp(S - max)), P = exp(S - max) / sum); P' = P * mask / (1 - p);
// O = P' V. The last op before P V writes P' in the I/O type (the matmul's A type).
void build_forward(Graph& g, const Shape& sh, double p, SdpaGraph::Flaw flaw) {
  const cudnnDataType_t io = cudnn_type(sh.dt);
  const Desc& q = g.tensor(kQ, io, sh.q_dims(), sh.qkv_stride());
  const Desc& kt = g.tensor(kK, io, sh.kv_t_dims(), sh.kv_t_stride());
  const Desc& v = g.tensor(kV, io, sh.kv_dims(), sh.kv_stride());
  const Desc& o = g.tensor(kO, io, sh.q_dims(), sh.out_stride());
  const Desc& stats = g.tensor(kStats, CUDNN_DATA_FLOAT, sh.rows(), sh.stats_stride());

  const Desc& s = g.virt(sh.scores(), sh.scores_stride());
  g.matmul(q, kt, s);
  const Desc& scale = g.scalar(kScale);
  const Desc& s1 = scores_op(g, sh, CUDNN_POINTWISE_MUL, s, &scale);
  const Desc& s2 = sh.causal ? causal(g, sh, s1, CUDNN_DATA_FLOAT) : s1;

  const Desc& m = g.virt(sh.rows(), sh.rows_stride());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s2, m);
  const Desc& centred = scores_op(g, sh, CUDNN_POINTWISE_SUB, s2, &m);
  const Desc& e = scores_op(g, sh, CUDNN_POINTWISE_EXP, centred, nullptr);
  const Desc& z = g.virt(sh.rows(), sh.rows_stride());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  const Desc& logz = g.virt(sh.rows(), sh.rows_stride());
  g.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, nullptr, logz);
  const bool sub_for_add = flaw == SdpaGraph::Flaw::stats_sub_for_add;
  g.pointwise(sub_for_add ? CUDNN_POINTWISE_SUB : CUDNN_POINTWISE_ADD, m, &logz, nullptr, stats);
  // The operand P of the second matmul: in the I/O type (fp32 only as a planted flaw).
  const cudnnDataType_t p_type = flaw == SdpaGraph::Flaw::fp32_probs ? CUDNN_DATA_FLOAT : io;
  const Desc* probs = nullptr;
  if (p > 0) {
    const Desc& softmax = scores_op(g, sh, CUDNN_POINTWISE_DIV, e, &z);
    const Desc& mask = g.virt(sh.scores(), sh.scores_stride());
    g.rng(seed_tensor(g), offset_tensor(g), mask, 1.0 - p);
    const Desc& kept = scores_op(g, sh, CUDNN_POINTWISE_MUL, softmax, &mask);
    const Desc& dscale = g.scalar(kDropScale);
    probs = &scores_op(g, sh, CUDNN_POINTWISE_MUL, kept, &dscale, p_type);
  } else {
    probs = &scores_op(g, sh, CUDNN_POINTWISE_DIV, e, &z, p_type);
  }
  g.matmul(*probs, v, o);
}

// Backward (the forward's P recomputed from the statistics):
//   rowsum = sum_d dO O (times 1 - p: the dropout-free P . dP' sum)
//   P = exp(causal(scale Q K^T) - Stats) (no mask in an unmasked block); P' = P * mask / (1 - p)
//   dV = P'^T dO
//   dS = scale * P * (dO V^T * mask - rowsum) / (1 - p)
//   dK = dS^T Q;  dQ = dS K (into the fp32 dQ accumulator unless deterministic)
// Grouped (fewer key/value heads): dV and dK per query head, [nb, hq, T, D] in the I/O
// type (virtual), then summed over each group's query heads (a reduction) into dV, dK.
void build_backward(Graph& g, const Shape& sh, double p, bool dq_accumulator, SdpaGraph::Flaw flaw) {
  const cudnnDataType_t io = cudnn_type(sh.dt);
  const Dims bhtd = sh.q_dims();
  const Desc& q = g.tensor(kQ, io, bhtd, sh.qkv_stride());
  const Desc& kt = g.tensor(kK, io, sh.kv_t_dims(), sh.kv_t_stride());
  const Desc& vt = g.tensor(kV, io, sh.kv_t_dims(), sh.kv_t_stride());
  const Desc& o = g.tensor(kO, io, bhtd, sh.out_stride());
  const Desc& dout = g.tensor(kdO, io, bhtd, sh.out_stride());
  const Desc& stats = g.tensor(kStats, CUDNN_DATA_FLOAT, sh.rows(), sh.stats_stride());
  const Desc& dq = g.tensor(kdQ, io, bhtd, sh.qkv_stride());
  const Desc& dk = g.tensor(kdK, io, sh.kv_dims(), sh.kv_stride());
  const Desc& dv = g.tensor(kdV, io, sh.kv_dims(), sh.kv_stride());
  // A product per query head, summed over the group into `to` when grouped.
  auto per_group = [&](const Desc& a, const Desc& b, const Desc& to) {
    if (!sh.grouped() || flaw == SdpaGraph::Flaw::grouped_unsummed) return g.matmul(a, b, to);
    const Desc& full = g.virt(sh.kv_full_dims(), sh.kv_fullhead_stride(), io);
    g.matmul(a, b, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, to);
  };
  const Desc& scale = g.scalar(kScale);

  const Desc* mask = nullptr;
  if (p > 0) {
    mask = &g.virt(sh.scores(), sh.scores_stride());
    g.rng(seed_tensor(g), offset_tensor(g), *mask, 1.0 - p);
  }
  // rowsum
  const Desc& dout_o = g.virt(bhtd, {sh.hq * sh.T * sh.D, sh.T * sh.D, sh.hq * sh.D, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dout, &o, nullptr, dout_o);
  const Desc& rowsum0 = g.virt(sh.rows(), sh.rows_stride());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dout_o, rowsum0);
  const Desc& keep_or_one = g.scalar(p > 0 ? kDropKeep : kOne);
  const Desc& rowsum = g.virt(sh.rows(), sh.rows_stride());
  g.pointwise(CUDNN_POINTWISE_MUL, rowsum0, &keep_or_one, nullptr, rowsum);

  // P and P'
  const Desc& s = g.virt(sh.scores(), sh.scores_stride());
  g.matmul(q, kt, s);
  const Desc& s1 = scores_op(g, sh, CUDNN_POINTWISE_MUL, s, &scale);
  const Desc& s2 = sh.causal ? causal(g, sh, s1, CUDNN_DATA_INT32) : s1;
  const Desc& centred = scores_op(g, sh, CUDNN_POINTWISE_SUB, s2, &stats);
  const Desc& probs = scores_op(g, sh, CUDNN_POINTWISE_EXP, centred, nullptr);
  const Desc* dropped = &probs;
  const Desc* dscale = nullptr;
  if (p > 0) {
    dscale = &g.scalar(kDropScale);
    const Desc& kept = scores_op(g, sh, CUDNN_POINTWISE_MUL, probs, mask);
    dropped = &scores_op(g, sh, CUDNN_POINTWISE_MUL, kept, dscale);
  }
  const Desc& dropped_t = g.virt(sh.scores_t(), sh.scores_t_stride(), io);
  g.reshape(*dropped, dropped_t);
  per_group(dropped_t, dout, dv);

  // dS
  const Desc& dp = g.virt(sh.scores(), sh.scores_stride());
  g.matmul(dout, vt, dp);
  const Desc& mask_or_one = p > 0 ? *mask : g.scalar(kOne);
  const Desc& dp1 = scores_op(g, sh, CUDNN_POINTWISE_MUL, dp, &mask_or_one);
  const Desc& dp2 = scores_op(g, sh, CUDNN_POINTWISE_SUB, dp1, &rowsum);
  const Desc* ds = &scores_op(g, sh, CUDNN_POINTWISE_MUL, dp2, &probs);
  if (p > 0) ds = &scores_op(g, sh, CUDNN_POINTWISE_MUL, *ds, dscale);
  const Desc& ds_scaled = scores_op(g, sh, CUDNN_POINTWISE_MUL, *ds, &scale);
  const Desc& ds_t = g.virt(sh.scores_t(), sh.scores_t_stride(), io);
  g.reshape(ds_scaled, ds_t);
  per_group(ds_t, q, dk);

  // dQ = dS K, with K back in [nb, hk, T, D] order
  const Desc& k = g.virt(sh.kv_dims(), sh.kv_stride(), io);
  g.reshape(kt, k);
  if (dq_accumulator) {
    const Desc& acc = g.tensor(kdQAccum, CUDNN_DATA_FLOAT, bhtd, sh.fullhead_stride());
    g.matmul(ds_scaled, k, acc);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, acc, nullptr, nullptr, dq);
  } else {
    g.matmul(ds_scaled, k, dq);
  }
}

// ---- plans, one per graph ----------------------------------------------------------
struct Plan {
  explicit Plan(const Api& a) : graph(a) {}
  Graph graph;
  std::unique_ptr<Desc> plan;
  int64_t workspace = 0;
  bool dq_accumulator = false;
  float scale = 1, lowest = 0, drop_scale = 1, drop_keep = 1, one = 1;
};
// (direction, dtype, B, T, H, G, D, p, deterministic, split, causal, Tkv, q_rows, kv_rows)
using PlanKey = std::tuple<bool, DType, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool, bool, bool, int64_t,
                           int64_t, int64_t>;
Shape shape_of(const SdpaGraph& g);
PlanKey key_of(const SdpaGraph& g) {
  const Shape sh = shape_of(g);
  return {g.forward, g.dt,      g.B,   g.T,      g.H,      sh.G, g.D, g.dropout_p, !g.forward && g.deterministic,
          g.split,   sh.causal, sh.Tk, sh.qrows, sh.kvrows};
}

struct Library {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::map<PlanKey, std::string> refused;  // shapes cuDNN would not plan, and why
};
Library& library() {
  static Library* l = new Library();  // lives to exit (descriptors are not destroyed after the driver)
  return *l;
}

Shape shape_of(const SdpaGraph& g) {
  if (!g.split) return make_shape(g.dt, g.B, g.T, g.H, g.G, g.D);
  const int64_t Tk = g.Tkv > 0 ? g.Tkv : g.T;
  return make_split_shape(g.dt, g.B, g.T, Tk, g.H, g.G, g.D, g.q_rows > 0 ? g.q_rows : g.T,
                          g.kv_rows > 0 ? g.kv_rows : Tk, g.causal);
}

// What the builders take of a graph beyond the shape, refused before cuDNN is asked.
void check_spec(const SdpaGraph& spec) {
  if (spec.dt != DType::bf16 && spec.dt != DType::f16)
    throw Refused(fmt::format("cuDNN's fused attention takes bf16 or fp16, not {}", to_string(spec.dt)));
  if (spec.G < 0 || (spec.G > 0 && spec.H % spec.G != 0))
    throw Refused(fmt::format("{} heads do not split into {} query groups", spec.H, spec.G));
  if (!spec.split) {
    if (!spec.causal || (spec.Tkv > 0 && spec.Tkv != spec.T) || spec.q_rows > 0 || spec.kv_rows > 0)
      throw Refused("the packed qkv graph is causal self-attention over all its rows (a block is a split graph)");
    return;
  }
  const int64_t Tk = spec.Tkv > 0 ? spec.Tkv : spec.T;
  if (spec.causal && Tk != spec.T)
    throw Refused(fmt::format("a causal block is square: {} queries against {} keys", spec.T, Tk));
  if ((spec.q_rows > 0 && spec.q_rows < spec.T) || (spec.kv_rows > 0 && spec.kv_rows < Tk))
    throw Refused(
        fmt::format("a block of {} x {} positions in buffers of {} and {}", spec.T, Tk, spec.q_rows, spec.kv_rows));
  if (spec.dropout_p > 0) throw Refused("context parallelism's cuDNN blocks take no attention dropout");
}

// The graph `spec` describes, built into `pl` and planned at `at` (Refused when cuDNN
// will not). The dQ accumulator is cuDNN 9's rule (cudnn-frontend's, for cuDNN >= 9.0):
// the backward always accumulates dQ in fp32, except in the deterministic algorithm,
// which keeps dP in a [B, H, T, T] workspace instead.
void build_and_plan(Plan& pl, const SdpaGraph& spec, const Target& at) {
  check_spec(spec);
  const Shape sh = shape_of(spec);
  pl.dq_accumulator = dq_accumulator_bytes(spec) > 0;
  if (spec.forward)
    build_forward(pl.graph, sh, spec.dropout_p, spec.flaw);
  else
    build_backward(pl.graph, sh, spec.dropout_p, pl.dq_accumulator, spec.flaw);
  pl.plan = pl.graph.plan(at, &pl.workspace);
}

Plan& plan_for(const SdpaGraph& spec) {
  const Api& a = api();
  if (!a.failure.empty()) throw Refused("cuDNN " + a.failure);
  Library& lib = library();
  const PlanKey key = key_of(spec);
  if (auto it = lib.plans.find(key); it != lib.plans.end()) return *it->second;
  if (auto it = lib.refused.find(key); it != lib.refused.end()) throw Refused(it->second);
  try {
    if (!lib.handle) check(a, a.create(&lib.handle), "create handle");
    auto pl = std::make_unique<Plan>(a);
    build_and_plan(*pl, spec, Target{lib.handle, nullptr});
    const double p = spec.dropout_p;
    pl->scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.D)));
    pl->lowest = std::numeric_limits<float>::lowest();
    pl->drop_scale = p > 0 ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;
    pl->drop_keep = static_cast<float>(1.0 - p);
    return *lib.plans.emplace(key, std::move(pl)).first->second;
  } catch (const Refused& e) {
    lib.refused.emplace(key, e.what());
    throw;
  }
}

SdpaGraph spec_of(bool forward, const Shape& sh, const ops::AttentionDropout& drop) {
  SdpaGraph g;
  g.forward = forward;
  g.dt = sh.dt;
  g.B = sh.B, g.T = sh.T, g.H = sh.H, g.G = sh.G, g.D = sh.D;
  g.dropout_p = drop.p;
  g.deterministic = deterministic_attention();
  return g;
}

// seed = the dropout key, offset = (sample * heads_total + head_offset) * T * T, the key
// and the sample taken from device memory when `dkey` says so.
// The two live 16 bytes apart (dst[0] and dst[kOffsetAt]): every tensor of the graphs
// declares 16-byte alignment, the offset tensor included.
constexpr int64_t kOffsetAt = 2;
__global__ void seed_offset_kernel(int64_t* dst, uint64_t key, int64_t sample, int64_t heads_total, int64_t head_offset,
                                   int64_t TT, DeviceKey dkey) {
  dst[0] = static_cast<int64_t>(dkey.key(key));
  dst[kOffsetAt] = (static_cast<int64_t>(dkey.offset(static_cast<uint64_t>(sample))) * heads_total + head_offset) * TT;
}

// Runs `pl` with the variant pack `uids` -> `ptrs` (plus the by-value scalars), on the
// backend stream, with workspace from the caching allocator.
// `sample`: the first sample of this execution (the groups-as-batch layout runs one per sample).
void execute(Plan& pl, std::vector<int64_t> uids, std::vector<void*> ptrs, const ops::AttentionDropout& drop, int64_t T,
             int64_t sample = 0) {
  Library& lib = library();
  check(api(), api().set_stream(lib.handle, stream()), "set stream");
  const std::vector<int64_t>& graph_uids = pl.graph.io_uids();
  auto in_graph = [&](int64_t uid) { return std::find(graph_uids.begin(), graph_uids.end(), uid) != graph_uids.end(); };
  for (const auto& [uid, value] : {std::pair<int64_t, float*>{kScale, &pl.scale},
                                   {kLowest, &pl.lowest},
                                   {kDropScale, &pl.drop_scale},
                                   {kDropKeep, &pl.drop_keep},
                                   {kOne, &pl.one}})
    if (in_graph(uid)) {
      uids.push_back(uid);
      ptrs.push_back(value);
    }
  DeviceBuffer<int64_t> seed_offset;
  if (drop.p > 0) {
    // cuDNN's Philox stream: seed = the dropout key; the counter offset starts these
    // rows' (sample, head) block where the CPU's mask index does.
    seed_offset = DeviceBuffer<int64_t>(2 * kOffsetAt);
    MTNLG_LAUNCH(1, 1, 0, stream(), seed_offset_kernel)
    (seed_offset.data(), drop.key, drop.sample_offset + sample, drop.heads_total, drop.head_offset, T * T, drop.dkey);
    MTNLG_CUDA_LAUNCH_CHECK("seed_offset_kernel");
    uids.insert(uids.end(), {kSeed, kOffset});
    ptrs.insert(ptrs.end(), {seed_offset.data(), seed_offset.data() + kOffsetAt});
  }
  DeviceBuffer<char> workspace(std::max<int64_t>(pl.workspace, 1));
  Desc pack(api(), CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  void* ws = workspace.data();
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)
      .finalize();
  check(api(), api().execute(lib.handle, pl.plan->get(), pack.get()), "execute");
}

Shape shape_of(const char* op, const Tensor& qkv, int64_t heads, int64_t groups) {
  const int64_t G = groups <= 0 ? heads : groups;
  const int64_t D = qkv.dim(2) / (heads + 2 * G);
  if (heads % G != 0 || D * (heads + 2 * G) != qkv.dim(2))
    throw_runtime("{}: qkv's {} columns are not (heads {} + 2 x groups {}) x head size", op, qkv.dim(2), heads, G);
  return make_shape(qkv.dtype(), qkv.dim(0), qkv.dim(1), heads, G, D);
}

char* at(const Tensor& t, int64_t elements) {
  return static_cast<char*>(const_cast<void*>(t.raw())) + elements * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace

int64_t dq_accumulator_bytes(const SdpaGraph& g) {
  return g.forward || g.deterministic ? 0 : g.B * g.H * g.T * g.D * static_cast<int64_t>(sizeof(float));
}

namespace {
std::atomic<bool> g_deterministic{false};
}  // namespace

void set_deterministic_attention(bool on) { g_deterministic = on; }
bool deterministic_attention() { return g_deterministic; }

bool fused_attention_supported(DType dt, int64_t B, int64_t T, int64_t H, int64_t D, double dropout_p, std::string* why,
                               int64_t groups) {
  std::lock_guard<std::mutex> lock(library().mu);
  if (groups > 0 && H % groups != 0) {
    if (why) *why = fmt::format("{} heads do not split into {} query groups", H, groups);
    return false;
  }
  const Shape sh = make_shape(dt, B, T, H, groups, D);
  ops::AttentionDropout drop;
  drop.p = dropout_p;
  try {
    plan_for(spec_of(true, sh, drop));
    plan_for(spec_of(false, sh, drop));
    return true;
  } catch (const Refused& e) {
    if (why) *why = e.what();
    return false;
  }
}

void cudnn_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads,
                             const ops::AttentionDropout& drop, int64_t groups) {
  std::lock_guard<std::mutex> lock(library().mu);
  const Shape sh = shape_of("attention_forward_lse", qkv, heads, groups);
  try {
    Plan& pl = plan_for(spec_of(true, sh, drop));
    for (int64_t c = 0; c < sh.calls; ++c) {  // c: the sample (one execution per sample when calls is B)
      const int64_t x = c * sh.T * sh.row, o = c * sh.T * sh.H * sh.D, l = c * sh.H * sh.T;
      execute(pl, {kQ, kK, kV, kO, kStats},
              {at(qkv, x), at(qkv, x + sh.koff), at(qkv, x + sh.voff), at(out, o), at(lse, l)}, drop, sh.T, c);
    }
  } catch (const Refused& e) {
    throw_refused("attention_forward_lse on CUDA (B {}, T {}, heads {}, groups {}, head size {}): {}", sh.B, sh.T, sh.H,
                  sh.G, sh.D, e.what());
  }
}

void cudnn_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              int64_t heads, const ops::AttentionDropout& drop, int64_t groups) {
  std::lock_guard<std::mutex> lock(library().mu);
  const Shape sh = shape_of("attention_backward_lse", qkv, heads, groups);
  try {
    Plan& pl = plan_for(spec_of(false, sh, drop));
    DeviceBuffer<float> acc;
    if (pl.dq_accumulator) {
      acc = DeviceBuffer<float>(sh.B * sh.H * sh.T * sh.D);
      CUDA_CHECK(cudaMemsetAsync(acc.data(), 0, static_cast<size_t>(acc.size()) * sizeof(float), stream()));
    }
    for (int64_t c = 0; c < sh.calls; ++c) {  // c: the sample (one execution per sample when calls is B)
      const int64_t x = c * sh.T * sh.row, o = c * sh.T * sh.H * sh.D, l = c * sh.H * sh.T;
      std::vector<int64_t> uids{kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV};
      std::vector<void*> ptrs{at(qkv, x),  at(qkv, x + sh.koff),  at(qkv, x + sh.voff),
                              at(out, o),  at(dout, o),           at(lse, l),
                              at(dqkv, x), at(dqkv, x + sh.koff), at(dqkv, x + sh.voff)};
      if (pl.dq_accumulator) {
        uids.push_back(kdQAccum);
        ptrs.push_back(acc.data() + c * sh.H * sh.T * sh.D);
      }
      execute(pl, std::move(uids), std::move(ptrs), drop, sh.T, c);
    }
  } catch (const Refused& e) {
    throw_refused("attention_backward_lse on CUDA (B {}, T {}, heads {}, groups {}, head size {}): {}", sh.B, sh.T,
                  sh.H, sh.G, sh.D, e.what());
  }
}

namespace {
// A p2p block's graph from the ring's tensors (cudnn_block_forward's arguments).
SdpaGraph block_spec(const char* op, bool forward, const Tensor& qkv, const Tensor& kv, int64_t heads, int64_t groups,
                     const ops::AttentionBlock& blk) {
  const int64_t G = groups <= 0 ? heads : groups;
  if (qkv.ndim() != 3 || kv.ndim() != 3 || heads % G != 0 || qkv.dim(2) % (heads + 2 * G) != 0)
    throw_runtime("{}: qkv [B, L, (heads + 2 groups) D] and kv [B, Lk, groups 2 D], got {} and {}", op,
                  shape_str(qkv.shape()), shape_str(kv.shape()));
  const int64_t D = qkv.dim(2) / (heads + 2 * G), L = qkv.dim(1), Lk = kv.dim(1);
  if (kv.dim(0) != qkv.dim(0) || kv.dim(2) != 2 * G * D || kv.dtype() != qkv.dtype())
    throw_runtime("{}: kv {} {} does not go with qkv {} {}", op, shape_str(kv.shape()), to_string(kv.dtype()),
                  shape_str(qkv.shape()), to_string(qkv.dtype()));
  const int64_t nq = blk.q_count < 0 ? L - blk.q_begin : blk.q_count;
  const int64_t nk = blk.k_count < 0 ? Lk - blk.k_begin : blk.k_count;
  if (blk.q_begin < 0 || nq <= 0 || blk.q_begin + nq > L || blk.k_begin < 0 || nk <= 0 || blk.k_begin + nk > Lk)
    throw_runtime("{}: query rows [{}, +{}) of {} or key rows [{}, +{}) of {} out of range", op, blk.q_begin, nq, L,
                  blk.k_begin, nk, Lk);
  if (blk.drop.p > 0 || blk.causal_offset != 0)
    throw Refused("cuDNN's context-parallel blocks take no attention dropout and no causal offset");
  // The statistics' pointer moves by q_begin floats: cuDNN needs it 16-byte aligned.
  if (blk.q_begin % 4 != 0)
    throw Refused(fmt::format("a block from query row {} (the statistics would not be 16-byte aligned)", blk.q_begin));
  SdpaGraph g;
  g.split = true;
  g.forward = forward;
  g.dt = qkv.dtype();
  g.B = qkv.dim(0), g.T = nq, g.Tkv = nk, g.H = heads, g.G = groups, g.D = D;
  g.causal = blk.causal;
  g.q_rows = L, g.kv_rows = Lk;
  g.deterministic = deterministic_attention();
  return g;
}

// Element offsets of one execution's views (c: the sample when the groups are the batch).
struct BlockAt {
  int64_t q, kv, o, l;
};
BlockAt block_at(const Shape& sh, const ops::AttentionBlock& blk, int64_t c) {
  const int64_t qb = c * sh.qrows, kb = c * sh.kvrows;  // the sample's first rows
  return {(qb + blk.q_begin) * sh.row, (kb + blk.k_begin) * sh.krow, (qb + blk.q_begin) * sh.H * sh.D,
          c * sh.H * sh.qrows + blk.q_begin};
}
}  // namespace

void cudnn_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv, int64_t heads,
                         const ops::AttentionBlock& blk, int64_t groups) {
  std::lock_guard<std::mutex> lock(library().mu);
  const SdpaGraph spec = block_spec("cudnn_block_forward", true, qkv, kv, heads, groups, blk);
  const Shape sh = shape_of(spec);
  try {
    Plan& pl = plan_for(spec);
    for (int64_t c = 0; c < sh.calls; ++c) {
      const BlockAt x = block_at(sh, blk, c);
      execute(pl, {kQ, kK, kV, kO, kStats},
              {at(qkv, x.q), at(kv, x.kv + sh.koff), at(kv, x.kv + sh.voff), at(out, x.o), at(lse, x.l)}, {}, sh.T, c);
    }
  } catch (const Refused& e) {
    throw_refused("cp attention block on CUDA ({} x {}, {}): {}", sh.T, sh.Tk, sh.causal ? "causal" : "unmasked",
                  e.what());
  }
}

void cudnn_block_backward(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                          const Tensor& out, const Tensor& lse, int64_t heads, const ops::AttentionBlock& blk,
                          int64_t groups) {
  std::lock_guard<std::mutex> lock(library().mu);
  const SdpaGraph spec = block_spec("cudnn_block_backward", false, qkv, kv, heads, groups, blk);
  const Shape sh = shape_of(spec);
  try {
    Plan& pl = plan_for(spec);
    DeviceBuffer<float> acc;
    if (pl.dq_accumulator) {
      acc = DeviceBuffer<float>(sh.B * sh.H * sh.T * sh.D);
      CUDA_CHECK(cudaMemsetAsync(acc.data(), 0, static_cast<size_t>(acc.size()) * sizeof(float), stream()));
    }
    for (int64_t c = 0; c < sh.calls; ++c) {
      const BlockAt x = block_at(sh, blk, c);
      std::vector<int64_t> uids{kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV};
      std::vector<void*> ptrs{at(qkv, x.q), at(kv, x.kv + sh.koff),  at(kv, x.kv + sh.voff),
                              at(out, x.o), at(dout, x.o),           at(lse, x.l),
                              at(dq, x.q),  at(dkv, x.kv + sh.koff), at(dkv, x.kv + sh.voff)};
      if (pl.dq_accumulator) {
        uids.push_back(kdQAccum);
        ptrs.push_back(acc.data() + c * sh.H * sh.T * sh.D);
      }
      execute(pl, std::move(uids), std::move(ptrs), {}, sh.T, c);
    }
  } catch (const Refused& e) {
    throw_refused("cp attention block backward on CUDA ({} x {}, {}): {}", sh.T, sh.Tk,
                  sh.causal ? "causal" : "unmasked", e.what());
  }
}

std::vector<SdpaGraph> cp_block_graphs(DType dt, int64_t B, int64_t L, int64_t H, int64_t D, int64_t groups,
                                       int64_t gather_ranks) {
  const int64_t c = L / 2, n = gather_ranks, Lk = n > 0 ? n * L : L;
  // (queries, keys, causal): p2p's diagonal, L x c and c x L; all_gather's chunk diagonal
  // and the prefixes of 1 .. 2n-1 chunks before a chunk
  std::vector<std::tuple<int64_t, int64_t, bool>> blocks{{L, L, true}, {L, c, false}, {c, L, false}};
  if (n > 0) {
    blocks = {{c, c, true}};
    for (int64_t k = 1; k < 2 * n; ++k) blocks.emplace_back(c, k * c, false);
  }
  std::vector<SdpaGraph> out;
  for (bool forward : {true, false})
    for (const auto& [tq, tk, causal] : blocks) {
      SdpaGraph g;
      g.split = true, g.forward = forward, g.dt = dt;
      g.B = B, g.T = tq, g.Tkv = tk, g.H = H, g.G = groups, g.D = D, g.causal = causal;
      g.q_rows = L, g.kv_rows = Lk;
      g.deterministic = deterministic_attention();
      out.push_back(g);
    }
  return out;
}

bool fused_cp_blocks_supported(DType dt, int64_t B, int64_t L, int64_t H, int64_t D, std::string* why, int64_t groups,
                               int64_t gather_ranks) {
  std::lock_guard<std::mutex> lock(library().mu);
  const int64_t G = groups <= 0 ? H : groups, c = L / 2;
  try {
    if (H % G != 0) throw Refused(fmt::format("{} heads do not split into {} query groups", H, G));
    if (L % 2 != 0 || c % 4 != 0)
      throw Refused(fmt::format("{} local rows: a chunk of {} is no multiple of 4 (the statistics' alignment)", L, c));
    for (const SdpaGraph& g : cp_block_graphs(dt, B, L, H, D, groups, gather_ranks)) plan_for(g);
    return true;
  } catch (const Refused& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::string cudnn_description(const std::string& library) {
  const Api& a = api_named(library);
  if (!a.failure.empty()) return "cuDNN unavailable: " + a.failure;
  const size_t v = a.version();
  return fmt::format("cuDNN {}.{}.{} ({})", v / 10000, v / 100 % 100, v % 100, a.lib);
}

std::string device_json_of_gpu(int device) {
  const Api& a = api();
  if (!a.failure.empty()) throw Refused("cuDNN " + a.failure);
  Desc d(a, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  const int32_t id = device;
  d.set(CUDNN_ATTR_DEVICEPROP_DEVICE_ID, CUDNN_TYPE_INT32, 1, &id).finalize();
  int64_t n = 0;
  check(a, a.get_attr(d.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &n, nullptr),
        "device properties' JSON size");
  std::string json(static_cast<size_t>(n), '\0');
  check(a, a.get_attr(d.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n, json.data()),
        "device properties' JSON");
  json.resize(static_cast<size_t>(n));
  while (!json.empty() && json.back() == '\0') json.pop_back();
  return json;
}

SdpaPlan plan_offline(const SdpaGraph& g, const std::string& device_json, const std::string& library) {
  SdpaPlan r;
  const Api& a = api_named(library);
  if (!a.failure.empty()) {
    r.why = "cuDNN " + a.failure;
    return r;
  }
  if (a.version() < 90800) {
    r.why = fmt::format("{} plans only on a GPU (offline planning needs cuDNN >= 9.8)", cudnn_description(library));
    return r;
  }
  try {
    Desc device(a, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
    device
        .set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, static_cast<int64_t>(device_json.size()),
             device_json.data())
        .finalize();
    Plan pl(a);
    build_and_plan(pl, g, Target{nullptr, &device});
    r.planned = true;
    r.workspace = pl.workspace;
    r.accumulator = dq_accumulator_bytes(g);
  } catch (const Refused& e) {
    r.why = e.what();
  }
  return r;
}

}  // namespace mtnlg::cuda
