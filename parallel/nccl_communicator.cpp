// NcclCommunicator: Communicator over NCCL on device pointers (see
// nccl_communicator.hpp for the stream and point-to-point contracts).
#include "parallel/nccl_communicator.hpp"

#include "core/error.hpp"

#ifdef MTNLG_HAVE_NCCL
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda/cuda_check.hpp"
#include "core/cuda/device.hpp"
#include "parallel/flight_recorder.hpp"
#include "parallel/watchdog.hpp"
#endif

namespace mtnlg::parallel {

#ifdef MTNLG_HAVE_NCCL

namespace {

// Non-blocking communicators (created with config.blocking = 0, so that a watchdog can
// abort them and initialisation has a deadline): a call may return ncclInProgress, and
// the communicator is usable again once ncclCommGetAsyncError stops saying so. Waits
// for that, up to the collective timeout (0: forever); another error, or the deadline,
// aborts the communicator and throws naming `what`.
void wait_ready(ncclComm_t c, const std::string& what) {
  const double limit = collective_timeout();
  const auto t0 = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(c, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      ncclCommAbort(c);
      throw_runtime("{}: NCCL error {} ({})", what, static_cast<int>(state), ncclGetErrorString(state));
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (limit > 0 && waited > limit) {
      ncclCommAbort(c);
      throw_runtime(
          "{}: still in progress after {:.1f} s (parallel.distributed_timeout_minutes): a peer never joined; "
          "communicator aborted",
          what, waited);
    }
    if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// The result of a call on a non-blocking communicator: ncclInProgress waits (wait_ready).
void nccl_call(ncclResult_t r, ncclComm_t c, const char* call, const std::string& group) {
  if (r == ncclInProgress) {
    wait_ready(c, fmt::format("{} on NCCL group '{}'", call, group));
    return;
  }
  if (r != ncclSuccess)
    throw_runtime("NCCL error {} ({}) in {} on group '{}'", static_cast<int>(r), ncclGetErrorString(r), call, group);
}

// RAII, move-only owner of an ncclComm_t. A non-blocking communicator is finalised (its
// queued work flushed) before it is destroyed.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t c) : c_(c) {}
  ~NcclComm() {
    if (!c_) return;
    if (ncclCommFinalize(c_) == ncclInProgress) {
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(c_, &state) == ncclSuccess && state == ncclInProgress)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ncclCommDestroy(c_);
  }
  NcclComm(NcclComm&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  NcclComm& operator=(NcclComm&& o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return c_; }

 private:
  ncclComm_t c_ = nullptr;
};

// A send or nonblocking collective in flight on a side stream. wait(): `host` requests
// block the host on the completion event (isend: the caller may overwrite the buffer);
// the others only make the compute stream wait for it (iall_reduce: everything the
// caller does with the buffer afterwards is queued on the compute stream, including
// the allocator's reuse of it), so communication keeps overlapping compute.
class NcclRequest final : public Request {
 public:
  NcclRequest(cuda::CudaEvent done, bool host) : done_(std::move(done)), host_(host) {}
  void wait() override {
    if (waited_) return;
    if (host_)
      done_.synchronize();
    else
      CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), done_.get(), 0));
    waited_ = true;
  }
  void wait_stream() override {
    if (waited_) return;
    CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), done_.get(), 0));
    waited_ = true;
  }

 private:
  cuda::CudaEvent done_;
  bool host_;
  bool waited_ = false;
};

// The watchdog's view of one operation: two events from a pool, recorded on the op's
// stream before and after it. poll() only queries them (never blocks); the probe is
// released on the watchdog thread once complete, its events going back to the pool.
class EventPool {
 public:
  cudaEvent_t get() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void put(cudaEvent_t e) {
    std::lock_guard lock(mu_);
    free_.push_back(e);
  }

 private:
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};
EventPool& event_pool() {
  static EventPool* p = new EventPool;  // never destroyed: probes may be released at exit
  return *p;
}

class EventProbe final : public OpProbe {
 public:
  explicit EventProbe(cudaStream_t s) : start_(event_pool().get()), end_(event_pool().get()) {
    CUDA_CHECK(cudaEventRecord(start_, s));
  }
  ~EventProbe() override {
    event_pool().put(start_);
    event_pool().put(end_);
  }
  void mark_end(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(end_, s)); }
  OpState poll() override {
    if (cudaEventQuery(end_) == cudaSuccess) return OpState::completed;
    if (cudaEventQuery(start_) == cudaSuccess) return OpState::started;
    return OpState::enqueued;
  }

 private:
  cudaEvent_t start_, end_;
};

void install_probe_factory() {
  static std::once_flag once;
  std::call_once(once, [] {
    Watchdog::ProbeFactory f;
    f.begin = [](void* s) -> std::shared_ptr<OpProbe> {
      return std::make_shared<EventProbe>(static_cast<cudaStream_t>(s));
    };
    f.end = [](OpProbe& p, void* s) { static_cast<EventProbe&>(p).mark_end(static_cast<cudaStream_t>(s)); };
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    f.thread_init = [device] { cudaSetDevice(device); };  // the events' and communicators' device
    device_watchdog().set_probe_factory(std::move(f));
  });
}

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
  }
  return ncclFloat32;
}

class NcclCommunicator final : public Communicator {
 public:
  // `members`: the group's world ranks in group rank order (empty: unknown, not watched).
  NcclCommunicator(NcclComm coll, NcclComm up, NcclComm down, std::string name, std::vector<int64_t> members)
      : coll_(std::move(coll)), up_(std::move(up)), down_(std::move(down)), name_(std::move(name)) {
    int r = 0, s = 0;
    NCCL_CHECK(ncclCommUserRank(coll_.get(), &r));
    NCCL_CHECK(ncclCommCount(coll_.get(), &s));
    rank_ = r;
    size_ = s;
    if (members.empty())
      for (int64_t i = 0; i < size_; ++i) members.push_back(i);
    // Each of the group's three NCCL communicators is watched (its own sequence numbers,
    // asynchronous error and abort).
    install_probe_factory();
    const char* channels[3] = {"coll", "up", "down"};
    const ncclComm_t comms[3] = {coll_.get(), up_.get(), down_.get()};
    for (int i = 0; i < 3; ++i) {
      WatchedComm w;
      w.group = name_;
      w.channel = channels[i];
      w.members = members;
      w.group_rank = rank_;
      const ncclComm_t c = comms[i];
      w.async_error = [c]() -> std::string {
        ncclResult_t e = ncclSuccess;
        if (ncclCommGetAsyncError(c, &e) != ncclSuccess) return "ncclInternalError";
        if (e == ncclSuccess || e == ncclInProgress) return "";
        switch (e) {
          case ncclRemoteError: return "ncclRemoteError (a peer failed or a connection broke)";
          case ncclSystemError: return "ncclSystemError";
          case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
          case ncclInvalidUsage: return "ncclInvalidUsage";
          default: return fmt::format("NCCL error {}", static_cast<int>(e));
        }
      };
      w.abort = [c] { ncclCommAbort(c); };
      ids_[i] = device_watchdog().add_comm(std::move(w));
    }
  }

  ~NcclCommunicator() override {
    for (int id : ids_) device_watchdog().drop_comm(id);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  std::string name() const override { return name_; }
  const char* backend() const override { return "nccl"; }


  void do_all_reduce(void* d, int64_t n, DType dt, ReduceOp op) override {
    if (n <= 0) return;
    watched(kColl, "all_reduce", -1, n * dtype_size(dt), dt, cuda::stream(), [&] {
      nccl_call(ncclAllReduce(d, d, static_cast<size_t>(n), nccl_type(dt), nccl_op(op), coll_.get(), cuda::stream()),
                coll_.get(), "ncclAllReduce", name_);
    });
    count_all_reduce(n * dtype_size(dt));
  }
  void do_all_reduce_i64(int64_t* d, int64_t n, ReduceOp op) override {
    if (n <= 0) return;
    const int64_t bytes = n * static_cast<int64_t>(sizeof(int64_t));
    watched(kColl, "all_reduce", -1, bytes, DType::f64, cuda::stream(), [&] {
      nccl_call(ncclAllReduce(d, d, static_cast<size_t>(n), ncclInt64, nccl_op(op), coll_.get(), cuda::stream()),
                coll_.get(), "ncclAllReduce", name_);
    });
    count_all_reduce(bytes);
  }

  void do_reduce_scatter(const void* in, void* out, int64_t n, DType dt) override {
    if (n <= 0) return;
    // NCCL is in place when out == in + rank * n, the ZeRO shard layout.
    watched(kColl, "reduce_scatter", -1, n * size_ * dtype_size(dt), dt, cuda::stream(), [&] {
      nccl_call(ncclReduceScatter(in, out, static_cast<size_t>(n), nccl_type(dt), ncclSum, coll_.get(), cuda::stream()),
                coll_.get(), "ncclReduceScatter", name_);
    });
    count_scatter_gather(n * size_ * dtype_size(dt));
  }

  void do_all_gather(const void* in, void* out, int64_t n, DType dt) override {
    if (n <= 0) return;
    watched(kColl, "all_gather", -1, n * size_ * dtype_size(dt), dt, cuda::stream(), [&] {
      nccl_call(ncclAllGather(in, out, static_cast<size_t>(n), nccl_type(dt), coll_.get(), cuda::stream()), coll_.get(),
                "ncclAllGather", name_);
    });
    count_scatter_gather(n * size_ * dtype_size(dt));
  }

  void do_broadcast(void* data, int64_t n, DType dt, int64_t root) override {
    check_peer(root, "broadcast root", true);
    if (n <= 0) return;
    watched(kColl, "broadcast", -1, n * dtype_size(dt), dt, cuda::stream(), [&] {
      nccl_call(ncclBroadcast(data, data, static_cast<size_t>(n), nccl_type(dt), static_cast<int>(root), coll_.get(),
                              cuda::stream()),
                coll_.get(), "ncclBroadcast", name_);
    });
    count_broadcast(n * dtype_size(dt));
  }

  // NCCL's all-to-all: one grouped send and receive per peer on the collective channel,
  // this rank's own block copied on the stream.
  void do_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                       const std::vector<int64_t>& recv_counts, DType dt) override {
    const int64_t es = dtype_size(dt);
    int64_t so = 0, ro = 0, bytes = 0;
    std::vector<int64_t> soff, roff;
    for (int64_t j = 0; j < size_; ++j) {
      soff.push_back(so);
      roff.push_back(ro);
      so += send_counts[static_cast<size_t>(j)];
      ro += recv_counts[static_cast<size_t>(j)];
      if (j != rank_) bytes += send_counts[static_cast<size_t>(j)] * es;
    }
    const auto me = static_cast<size_t>(rank_);
    if (send_counts[me] != recv_counts[me])
      throw_runtime("all_to_all_v on the NCCL group '{}': rank {} sends {} elements to itself but receives {}", name_,
                    rank_, send_counts[me], recv_counts[me]);
    if (send_counts[me] > 0)
      CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(out) + roff[me] * es, static_cast<const char*>(in) + soff[me] * es,
                                 static_cast<size_t>(send_counts[me] * es), cudaMemcpyDeviceToDevice, cuda::stream()));
    watched(kColl, "all_to_all", -1, bytes, dt, cuda::stream(), [&] {
      nccl_call(ncclGroupStart(), coll_.get(), "ncclGroupStart", name_);
      for (int64_t j = 0; j < size_; ++j) {
        const auto jj = static_cast<size_t>(j);
        if (j == rank_) continue;
        if (send_counts[jj] > 0)
          nccl_call(ncclSend(static_cast<const char*>(in) + soff[jj] * es, static_cast<size_t>(send_counts[jj]),
                             nccl_type(dt), static_cast<int>(j), coll_.get(), cuda::stream()),
                    coll_.get(), "ncclSend", name_);
        if (recv_counts[jj] > 0)
          nccl_call(ncclRecv(static_cast<char*>(out) + roff[jj] * es, static_cast<size_t>(recv_counts[jj]),
                             nccl_type(dt), static_cast<int>(j), coll_.get(), cuda::stream()),
                    coll_.get(), "ncclRecv", name_);
      }
      nccl_call(ncclGroupEnd(), coll_.get(), "ncclGroupEnd", name_);
    });
    count_all_to_all(send_counts, dt);
  }

  void do_send(const void* data, int64_t n, DType dt, int64_t peer, int tag) override {
    isend(data, n, dt, peer, tag)->wait();
  }

  std::unique_ptr<Request> do_isend(const void* data, int64_t n, DType dt, int64_t peer, int) override {
    check_peer(peer, "isend peer", false);
    // The send stream starts after everything queued so far on the compute stream.
    cuda::CudaEvent ready;
    ready.record(cuda::stream());
    CUDA_CHECK(cudaStreamWaitEvent(send_stream_.get(), ready.get(), 0));
    const int ch = rank_ < peer ? kUp : kDown;
    watched(ch, "send", peer, n * dtype_size(dt), dt, send_stream_.get(), [&] {
      nccl_call(ncclSend(data, static_cast<size_t>(n), nccl_type(dt), static_cast<int>(peer), p2p_comm(rank_, peer),
                         send_stream_.get()),
                p2p_comm(rank_, peer), "ncclSend", name_);
    });
    cuda::record_stream(data, send_stream_.get());  // the buffer may be dropped before the send is done
    cuda::CudaEvent done;
    done.record(send_stream_.get());
    count_send(n * dtype_size(dt));
    return std::make_unique<NcclRequest>(std::move(done), /*host=*/true);
  }

  // On the receive stream, after everything queued so far on the compute stream (the
  // buffer's earlier readers); wait_stream() / wait() make the compute stream wait for it.
  std::unique_ptr<Request> do_irecv(void* data, int64_t n, DType dt, int64_t peer, int) override {
    check_peer(peer, "irecv peer", false);
    cuda::CudaEvent ready;
    ready.record(cuda::stream());
    CUDA_CHECK(cudaStreamWaitEvent(recv_stream_.get(), ready.get(), 0));
    const int ch = peer < rank_ ? kUp : kDown;
    watched(ch, "recv", peer, n * dtype_size(dt), dt, recv_stream_.get(), [&] {
      nccl_call(ncclRecv(data, static_cast<size_t>(n), nccl_type(dt), static_cast<int>(peer), p2p_comm(peer, rank_),
                         recv_stream_.get()),
                p2p_comm(peer, rank_), "ncclRecv", name_);
    });
    cuda::record_stream(data, recv_stream_.get());
    cuda::CudaEvent done;
    done.record(recv_stream_.get());
    return std::make_unique<NcclRequest>(std::move(done), /*host=*/false);
  }

  std::unique_ptr<Request> do_iall_reduce(void* data, int64_t n, DType dt, ReduceOp op) override {
    cuda::CudaEvent ready;
    ready.record(cuda::stream());
    CUDA_CHECK(cudaStreamWaitEvent(coll_stream_.get(), ready.get(), 0));
    if (n > 0)
      watched(kColl, "all_reduce", -1, n * dtype_size(dt), dt, coll_stream_.get(), [&] {
        nccl_call(ncclAllReduce(data, data, static_cast<size_t>(n), nccl_type(dt), nccl_op(op), coll_.get(),
                                coll_stream_.get()),
                  coll_.get(), "ncclAllReduce", name_);
      });
    cuda::record_stream(data, coll_stream_.get());
    cuda::CudaEvent done;
    done.record(coll_stream_.get());
    count_all_reduce(n * dtype_size(dt));
    return std::make_unique<NcclRequest>(std::move(done), /*host=*/false);
  }

  void do_recv(void* data, int64_t n, DType dt, int64_t peer, int) override {
    check_peer(peer, "recv peer", false);
    const int ch = peer < rank_ ? kUp : kDown;
    watched(ch, "recv", peer, n * dtype_size(dt), dt, cuda::stream(), [&] {
      nccl_call(ncclRecv(data, static_cast<size_t>(n), nccl_type(dt), static_cast<int>(peer), p2p_comm(peer, rank_),
                         cuda::stream()),
                p2p_comm(peer, rank_), "ncclRecv", name_);
    });
  }

  void barrier() override {
    cuda::DeviceBuffer<int64_t> one(1);
    CUDA_CHECK(cudaMemsetAsync(one.data(), 0, sizeof(int64_t), cuda::stream()));
    watched(kColl, "barrier", -1, sizeof(int64_t), DType::f64, cuda::stream(), [&] {
      nccl_call(ncclAllReduce(one.data(), one.data(), 1, ncclInt64, ncclSum, coll_.get(), cuda::stream()), coll_.get(),
                "ncclAllReduce", name_);
    });
    cuda::synchronize();
  }

  std::shared_ptr<Communicator> split(int64_t color, int64_t key, const std::string& name) override {
    const int c = color < 0 ? NCCL_SPLIT_NOCOLOR : static_cast<int>(color);
    ncclComm_t nc = nullptr, nu = nullptr, nd = nullptr;
    // Non-blocking like the parents (a NULL config would inherit theirs anyway).
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    nccl_call(ncclCommSplit(coll_.get(), c, static_cast<int>(key), &nc, &cfg), coll_.get(), "ncclCommSplit", name_);
    nccl_call(ncclCommSplit(up_.get(), c, static_cast<int>(key), &nu, &cfg), up_.get(), "ncclCommSplit", name_);
    nccl_call(ncclCommSplit(down_.get(), c, static_cast<int>(key), &nd, &cfg), down_.get(), "ncclCommSplit", name_);
    for (ncclComm_t x : {nc, nu, nd})
      if (x) wait_ready(x, fmt::format("ncclCommSplit of NCCL group '{}' into '{}'", name_, name));
    NcclComm a(nc), b(nu), d(nd);
    if (color < 0) return nullptr;
    return std::make_shared<NcclCommunicator>(std::move(a), std::move(b), std::move(d), name, std::vector<int64_t>{});
  }

 private:
  enum { kColl = 0, kUp = 1, kDown = 2 };

  // Enqueues an operation through `issue` under the device watchdog: parked once it has
  // tripped; recorded (with a probe on `stream`) while it runs; noted for the graph
  // while `stream` captures one.
  template <typename Issue>
  void watched(int channel, const char* op, int64_t peer, int64_t bytes, DType dt, cudaStream_t stream, Issue&& issue) {
    Watchdog& w = device_watchdog();
    w.before_op();
    if (!w.enabled()) {
      issue();
      return;
    }
    if (capturing(stream)) {
      w.note_captured(ids_[channel], op, peer, bytes, dt);
      issue();
      return;
    }
    auto probe = std::make_shared<EventProbe>(stream);
    issue();
    probe->mark_end(stream);
    w.record(ids_[channel], op, peer, bytes, dt, std::move(probe));
  }

  // Messages from a lower to a higher rank use `up`, the others `down`.
  ncclComm_t p2p_comm(int64_t from, int64_t to) const { return from < to ? up_.get() : down_.get(); }

  void check_peer(int64_t peer, const char* what, bool self_ok) const {
    if (peer < 0 || peer >= size_ || (!self_ok && peer == rank_))
      throw_runtime("{} {} invalid on the NCCL group '{}' (rank {} of {})", what, peer, name_, rank_, size_);
  }

  NcclComm coll_, up_, down_;
  std::string name_;
  int64_t rank_ = 0, size_ = 1;
  int ids_[3] = {0, 0, 0};  // the watchdog's ids of coll_, up_, down_
  cuda::CudaStream send_stream_;
  cuda::CudaStream recv_stream_;  // irecv
  cuda::CudaStream coll_stream_;  // iall_reduce
};

// Shares an ncclUniqueId from rank 0 through the bootstrap's int64 sum all-reduce
// (every other rank contributes zeros), which every backend supports exactly.
ncclUniqueId share_id(Communicator& boot) {
  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0, "ncclUniqueId size");
  constexpr int64_t words = sizeof(ncclUniqueId) / sizeof(int64_t);
  ncclUniqueId id{};
  if (boot.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  int64_t buf[words] = {};
  if (boot.rank() == 0) std::memcpy(buf, &id, sizeof(id));
  boot.all_reduce(buf, words, ReduceOp::sum);
  std::memcpy(&id, buf, sizeof(id));
  return id;
}

// Non-blocking initialisation (config.blocking = 0): the call returns at once and the
// communicator is ready when ncclCommGetAsyncError says ncclSuccess, so a peer that never
// joins ends in an error after the collective timeout instead of a hang.
NcclComm init_comm(Communicator& boot, const std::string& name) {
  const ncclUniqueId id = share_id(boot);
  ncclComm_t c = nullptr;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  const ncclResult_t r =
      ncclCommInitRankConfig(&c, static_cast<int>(boot.size()), id, static_cast<int>(boot.rank()), &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (c) ncclCommAbort(c);
    throw_runtime("ncclCommInitRankConfig of NCCL group '{}': NCCL error {} ({})", name, static_cast<int>(r),
                  ncclGetErrorString(r));
  }
  wait_ready(c, fmt::format("initialisation of NCCL group '{}' (rank {} of {})", name, boot.rank(), boot.size()));
  return NcclComm(c);
}

// The group's world ranks in group rank order (a sum all-reduce over the bootstrap).
std::vector<int64_t> world_members(Communicator& boot, int64_t world_rank) {
  if (world_rank < 0) return {};
  std::vector<int64_t> m(static_cast<size_t>(boot.size()), 0);
  m[static_cast<size_t>(boot.rank())] = world_rank;
  boot.all_reduce(m.data(), boot.size(), ReduceOp::sum);
  return m;
}

}  // namespace

namespace {
// A group of one's copies (reduce_scatter / all_gather out of place), queued on the compute
// stream as NCCL's would be.
void device_copy(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::stream()));
}
}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, const std::string& name,
                                                     bool even_for_one, int64_t world_rank) {
  if (!cuda::backend_ready())
    throw_runtime("NCCL group '{}': call cuda::init_backend(device) before creating NCCL communicators", name);
  // A group of one moves nothing: no NCCL communicator (whose set-up probes the device,
  // and costs three communicators per group) is made for it.
  if (bootstrap.size() == 1 && !even_for_one) return std::make_shared<LocalCommunicator>(name, device_copy);
  std::vector<int64_t> members = world_members(bootstrap, world_rank);
  NcclComm coll = init_comm(bootstrap, name);
  NcclComm up = init_comm(bootstrap, name);
  NcclComm down = init_comm(bootstrap, name);
  return std::make_shared<NcclCommunicator>(std::move(coll), std::move(up), std::move(down), name, std::move(members));
}

#endif  // MTNLG_HAVE_NCCL

}  // namespace mtnlg::parallel
