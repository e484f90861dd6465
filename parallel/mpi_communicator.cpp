// MPI backend of Communicator (host buffers). Compiled only when MTNLG_HAVE_MPI.
// Every call runs under MPI_ERRORS_RETURN and turns a failure into RuntimeError
// naming the operation, the group and this process's global rank. Counts above
// INT_MAX are split into several calls where the operation allows it.
#ifdef MTNLG_HAVE_MPI
// The C API only: Open MPI's mpi.h would otherwise pull in the deprecated C++ bindings,
// which live in a library (libmpi_cxx) we do not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::parallel {

namespace {

bool mpi_up() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

int64_t world_rank() {
  if (!mpi_up()) return -1;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

std::string error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(buf, static_cast<size_t>(len));
}

void check(int rc, const char* op, const std::string& group) {
  if (rc != MPI_SUCCESS)
    throw_runtime("rank {}: {} on the '{}' group failed: {}", world_rank(), op, group, error_text(rc));
}

// bf16 and f16 travel as 2-byte words; their reductions are user operations that add
// (or compare) in fp32 and round to nearest even, the arithmetic of NCCL's bf16/fp16.
template <float (*Load)(uint16_t), uint16_t (*Store)(float), bool Max>
void reduce_half(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = Load(a[i]), y = Load(b[i]);
    b[i] = Store(Max ? (x > y || std::isnan(x) ? x : y) : x + y);
  }
}

MPI_Op half_op(DType dt, ReduceOp op) {
  // Created once after MPI_Init; MPI frees user operations at MPI_Finalize.
  static MPI_Op ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};
  const int d = dt == DType::bf16 ? 0 : 1, o = op == ReduceOp::sum ? 0 : 1;
  if (ops[d][o] == MPI_OP_NULL) {
    MPI_User_function* fn = nullptr;
    if (d == 0)
      fn = o == 0 ? reduce_half<half::bf16_to_f32, half::f32_to_bf16, false> : reduce_half<half::bf16_to_f32, half::f32_to_bf16, true>;
    else
      fn = o == 0 ? reduce_half<half::f16_to_f32, half::f32_to_f16, false> : reduce_half<half::f16_to_f32, half::f32_to_f16, true>;
    MPI_Op_create(fn, /*commute=*/1, &ops[d][o]);
  }
  return ops[d][o];
}

MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
  }
  return MPI_BYTE;
}
MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::sum ? MPI_SUM : MPI_MAX; }
MPI_Op mpi_op(DType dt, ReduceOp op) {
  if (dt == DType::bf16 || dt == DType::f16) return half_op(dt, op);
  return mpi_op(op);
}

constexpr int64_t kChunk = INT_MAX / 2;  // elements per MPI call

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + bn && pb < pa + an;
}

class MpiRequest final : public Request {
 public:
  // `collective`: requests of a nonblocking collective, which MPI does not allow to free.
  MpiRequest(std::vector<MPI_Request> reqs, std::string group, const char* op = "MPI_Isend", bool collective = false)
      : reqs_(std::move(reqs)), group_(std::move(group)), op_(op), collective_(collective) {}
  ~MpiRequest() override {
    if (!mpi_up() || collective_) return;
    for (auto& r : reqs_)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  void wait() override {
    if (reqs_.empty()) return;
    check(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE),
          fmt::format("{} (wait)", op_).c_str(), group_);
    reqs_.clear();
  }

 private:
  std::vector<MPI_Request> reqs_;
  std::string group_;
  const char* op_;
  bool collective_;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor) unless it is MPI_COMM_WORLD.
  MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
    int r = 0, s = 0;
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", name_);
    check(MPI_Comm_rank(comm_, &r), "MPI_Comm_rank", name_);
    check(MPI_Comm_size(comm_, &s), "MPI_Comm_size", name_);
    rank_ = r;
    size_ = s;
  }
  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL && mpi_up()) MPI_Comm_free(&comm_);
  }
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  std::string name() const override { return name_; }

  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::broadcast;
  using Communicator::iall_reduce;
  using Communicator::isend;
  using Communicator::recv;
  using Communicator::reduce_scatter;
  using Communicator::send;

  void all_reduce(void* d, int64_t n, DType dt, ReduceOp op) override {
    const int64_t es = dtype_size(dt);
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      check(MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(d) + off * es, c, mpi_type(dt), mpi_op(dt, op), comm_),
            "MPI_Allreduce", name_);
    }
    count_all_reduce(n * es);
  }
  void all_reduce(int64_t* d, int64_t n, ReduceOp op) override {
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      check(MPI_Allreduce(MPI_IN_PLACE, d + off, c, MPI_INT64_T, mpi_op(op), comm_), "MPI_Allreduce", name_);
    }
    count_all_reduce(n * static_cast<int64_t>(sizeof(int64_t)));
  }
  void reduce_scatter(const void* in, void* out, int64_t n, DType dt) override {
    check_count(n, "reduce_scatter");
    if (n == 0) return;
    const size_t es = static_cast<size_t>(dtype_size(dt));
    std::vector<char> tmp;
    const size_t in_bytes = static_cast<size_t>(n * size_) * es;
    if (overlaps(in, in_bytes, out, static_cast<size_t>(n) * es)) {
      tmp.assign(static_cast<const char*>(in), static_cast<const char*>(in) + in_bytes);
      in = tmp.data();
    }
    check(MPI_Reduce_scatter_block(in, out, static_cast<int>(n), mpi_type(dt), mpi_op(dt, ReduceOp::sum), comm_),
          "MPI_Reduce_scatter_block", name_);
    count_scatter_gather(static_cast<int64_t>(in_bytes));
  }
  void all_gather(const void* in, void* out, int64_t n, DType dt) override {
    check_count(n, "all_gather");
    if (n == 0) return;
    const size_t es = static_cast<size_t>(dtype_size(dt));
    const size_t out_bytes = static_cast<size_t>(n * size_) * es;
    const void* sendbuf = in;
    std::vector<char> tmp;
    if (in == static_cast<char*>(out) + static_cast<size_t>(rank_ * n) * es) {
      sendbuf = MPI_IN_PLACE;
    } else if (overlaps(in, static_cast<size_t>(n) * es, out, out_bytes)) {
      tmp.assign(static_cast<const char*>(in), static_cast<const char*>(in) + static_cast<size_t>(n) * es);
      sendbuf = tmp.data();
    }
    check(MPI_Allgather(sendbuf, static_cast<int>(n), mpi_type(dt), out, static_cast<int>(n), mpi_type(dt), comm_),
          "MPI_Allgather", name_);
    count_scatter_gather(static_cast<int64_t>(out_bytes));
  }
  void broadcast(void* data, int64_t n, DType dt, int64_t root) override {
    check_peer(root, "broadcast root", true);
    const int64_t es = dtype_size(dt);
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      check(MPI_Bcast(static_cast<char*>(data) + off * es, c, mpi_type(dt), static_cast<int>(root), comm_), "MPI_Bcast",
            name_);
    }
    count_broadcast(n * es);
  }
  void send(const void* data, int64_t n, DType dt, int64_t peer, int tag) override {
    check_peer(peer, "send", false);
    const int64_t es = dtype_size(dt);
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      check(MPI_Send(static_cast<const char*>(data) + off * es, c, mpi_type(dt), static_cast<int>(peer), tag, comm_),
            "MPI_Send", name_);
    }
    count_send(n * es);
  }
  std::unique_ptr<Request> isend(const void* data, int64_t n, DType dt, int64_t peer, int tag) override {
    check_peer(peer, "isend", false);
    const int64_t es = dtype_size(dt);
    std::vector<MPI_Request> reqs;
    // n == 0 sends nothing, like send() and recv() (they skip empty messages alike).
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      MPI_Request r = MPI_REQUEST_NULL;
      check(MPI_Isend(static_cast<const char*>(data) + off * es, c, mpi_type(dt), static_cast<int>(peer), tag, comm_, &r),
            "MPI_Isend", name_);
      reqs.push_back(r);
    }
    count_send(n * es);
    return std::make_unique<MpiRequest>(std::move(reqs), name_);
  }
  std::unique_ptr<Request> iall_reduce(void* data, int64_t n, DType dt, ReduceOp op) override {
    const int64_t es = dtype_size(dt);
    std::vector<MPI_Request> reqs;
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      MPI_Request r = MPI_REQUEST_NULL;
      check(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + off * es, c, mpi_type(dt), mpi_op(dt, op), comm_, &r),
            "MPI_Iallreduce", name_);
      reqs.push_back(r);
    }
    count_all_reduce(n * es);
    return std::make_unique<MpiRequest>(std::move(reqs), name_, "MPI_Iallreduce", true);
  }
  void recv(void* data, int64_t n, DType dt, int64_t peer, int tag) override {
    check_peer(peer, "recv", false);
    const int64_t es = dtype_size(dt);
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      MPI_Status st;
      check(MPI_Recv(static_cast<char*>(data) + off * es, c, mpi_type(dt), static_cast<int>(peer), tag, comm_, &st),
            "MPI_Recv", name_);
      int got = 0;
      MPI_Get_count(&st, mpi_type(dt), &got);
      if (got != c)
        throw_runtime("rank {}: recv on the '{}' group from rank {} (tag {}) got {} {} elements, expected {}", world_rank(),
                      name_, peer, tag, got, to_string(dt), c);
    }
  }
  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier", name_); }

  std::shared_ptr<Communicator> split(int64_t color, int64_t key, const std::string& name) override {
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : static_cast<int>(color), static_cast<int>(key), &out),
          "MPI_Comm_split", name_);
    if (out == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiCommunicator>(out, name);
  }

 private:
  void check_count(int64_t n, const char* op) const {
    if (n < 0 || n > INT_MAX)
      throw_runtime("rank {}: {} of {} elements per rank on the '{}' group: at most {} supported", world_rank(), op, n, name_,
                    INT_MAX);
  }
  void check_peer(int64_t peer, const char* op, bool self_ok) const {
    if (peer < 0 || peer >= size_ || (!self_ok && peer == rank_))
      throw_runtime("rank {}: {} with peer {} on the '{}' group of {} ranks (this rank is {})", world_rank(), op, peer, name_,
                    size_, rank_);
  }

  MPI_Comm comm_;
  std::string name_;
  int64_t rank_ = 0, size_ = 1;
};

bool g_initialised_here = false;  // MPI_Init was called by mpi_init_world (not by a host program)

}  // namespace

namespace detail {

std::shared_ptr<Communicator> mpi_init_world(const LaunchInfo& info) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    // FUNNELED: only the main thread talks to MPI; OpenMP threads only compute.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw_runtime("MPI_Init_thread failed (launcher {}, rank {})", info.launcher, info.rank);
    g_initialised_here = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  auto world = std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, "world");
  if (info.launcher != "single" && (world->size() != info.world_size || world->rank() != info.rank))
    throw_runtime("MPI reports rank {} of {} but the {} environment says rank {} of {}", world->rank(), world->size(),
                  info.launcher, info.rank, info.world_size);
  return world;
}

void mpi_finalize() {
  if (g_initialised_here && mpi_up()) MPI_Finalize();
}

bool mpi_abort(int code) {
  if (!mpi_up()) return false;
  MPI_Abort(MPI_COMM_WORLD, code);
  return true;
}

}  // namespace detail

}  // namespace mtnlg::parallel
#endif  // MTNLG_HAVE_MPI
