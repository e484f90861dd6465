// NcclCommunicator: Communicator over NCCL on device pointers (see
// nccl_communicator.hpp for the stream and point-to-point contracts).
#include "parallel/nccl_communicator.hpp"

#include "core/error.hpp"

#ifdef MTNLG_HAVE_NCCL
#include <nccl.h>

#include <cstring>
#include <utility>

#include "core/cuda/cuda_check.hpp"
#include "core/cuda/device.hpp"
#endif

namespace mtnlg::parallel {

#ifdef MTNLG_HAVE_NCCL

namespace {

// RAII, move-only owner of an ncclComm_t.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t c) : c_(c) {}
  ~NcclComm() {
    if (c_) ncclCommDestroy(c_);
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

 private:
  cuda::CudaEvent done_;
  bool host_;
  bool waited_ = false;
};

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
  NcclCommunicator(NcclComm coll, NcclComm up, NcclComm down, std::string name)
      : coll_(std::move(coll)), up_(std::move(up)), down_(std::move(down)), name_(std::move(name)) {
    int r = 0, s = 0;
    NCCL_CHECK(ncclCommUserRank(coll_.get(), &r));
    NCCL_CHECK(ncclCommCount(coll_.get(), &s));
    rank_ = r;
    size_ = s;
  }

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  std::string name() const override { return name_; }
  const char* backend() const override { return "nccl"; }


  void do_all_reduce(void* d, int64_t n, DType dt, ReduceOp op) override {
    if (n <= 0) return;
    NCCL_CHECK(ncclAllReduce(d, d, static_cast<size_t>(n), nccl_type(dt), nccl_op(op), coll_.get(), cuda::stream()));
    count_all_reduce(n * dtype_size(dt));
  }
  void do_all_reduce_i64(int64_t* d, int64_t n, ReduceOp op) override {
    if (n <= 0) return;
    NCCL_CHECK(ncclAllReduce(d, d, static_cast<size_t>(n), ncclInt64, nccl_op(op), coll_.get(), cuda::stream()));
    count_all_reduce(n * static_cast<int64_t>(sizeof(int64_t)));
  }

  void do_reduce_scatter(const void* in, void* out, int64_t n, DType dt) override {
    if (n <= 0) return;
    // NCCL is in place when out == in + rank * n, the ZeRO shard layout.
    NCCL_CHECK(ncclReduceScatter(in, out, static_cast<size_t>(n), nccl_type(dt), ncclSum, coll_.get(), cuda::stream()));
    count_scatter_gather(n * size_ * dtype_size(dt));
  }

  void do_all_gather(const void* in, void* out, int64_t n, DType dt) override {
    if (n <= 0) return;
    NCCL_CHECK(ncclAllGather(in, out, static_cast<size_t>(n), nccl_type(dt), coll_.get(), cuda::stream()));
    count_scatter_gather(n * size_ * dtype_size(dt));
  }

  void do_broadcast(void* data, int64_t n, DType dt, int64_t root) override {
    check_peer(root, "broadcast root", true);
    if (n <= 0) return;
    NCCL_CHECK(ncclBroadcast(data, data, static_cast<size_t>(n), nccl_type(dt), static_cast<int>(root), coll_.get(),
                             cuda::stream()));
    count_broadcast(n * dtype_size(dt));
  }

  void do_send(const void* data, int64_t n, DType dt, int64_t peer, int tag) override { isend(data, n, dt, peer, tag)->wait(); }

  std::unique_ptr<Request> do_isend(const void* data, int64_t n, DType dt, int64_t peer, int) override {
    check_peer(peer, "isend peer", false);
    // The send stream starts after everything queued so far on the compute stream.
    cuda::CudaEvent ready;
    ready.record(cuda::stream());
    CUDA_CHECK(cudaStreamWaitEvent(send_stream_.get(), ready.get(), 0));
    NCCL_CHECK(ncclSend(data, static_cast<size_t>(n), nccl_type(dt), static_cast<int>(peer), p2p_comm(rank_, peer),
                        send_stream_.get()));
    cuda::record_stream(data, send_stream_.get());  // the buffer may be dropped before the send is done
    cuda::CudaEvent done;
    done.record(send_stream_.get());
    count_send(n * dtype_size(dt));
    return std::make_unique<NcclRequest>(std::move(done), /*host=*/true);
  }

  std::unique_ptr<Request> do_iall_reduce(void* data, int64_t n, DType dt, ReduceOp op) override {
    cuda::CudaEvent ready;
    ready.record(cuda::stream());
    CUDA_CHECK(cudaStreamWaitEvent(coll_stream_.get(), ready.get(), 0));
    if (n > 0)
      NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), nccl_type(dt), nccl_op(op), coll_.get(),
                               coll_stream_.get()));
    cuda::record_stream(data, coll_stream_.get());
    cuda::CudaEvent done;
    done.record(coll_stream_.get());
    count_all_reduce(n * dtype_size(dt));
    return std::make_unique<NcclRequest>(std::move(done), /*host=*/false);
  }

  void do_recv(void* data, int64_t n, DType dt, int64_t peer, int) override {
    check_peer(peer, "recv peer", false);
    NCCL_CHECK(ncclRecv(data, static_cast<size_t>(n), nccl_type(dt), static_cast<int>(peer), p2p_comm(peer, rank_),
                        cuda::stream()));
  }

  void barrier() override {
    cuda::DeviceBuffer<int64_t> one(1);
    CUDA_CHECK(cudaMemsetAsync(one.data(), 0, sizeof(int64_t), cuda::stream()));
    NCCL_CHECK(ncclAllReduce(one.data(), one.data(), 1, ncclInt64, ncclSum, coll_.get(), cuda::stream()));
    cuda::synchronize();
  }

  std::shared_ptr<Communicator> split(int64_t color, int64_t key, const std::string& name) override {
    const int c = color < 0 ? NCCL_SPLIT_NOCOLOR : static_cast<int>(color);
    ncclComm_t nc = nullptr, nu = nullptr, nd = nullptr;
    NCCL_CHECK(ncclCommSplit(coll_.get(), c, static_cast<int>(key), &nc, nullptr));
    NCCL_CHECK(ncclCommSplit(up_.get(), c, static_cast<int>(key), &nu, nullptr));
    NCCL_CHECK(ncclCommSplit(down_.get(), c, static_cast<int>(key), &nd, nullptr));
    NcclComm a(nc), b(nu), d(nd);
    if (color < 0) return nullptr;
    return std::make_shared<NcclCommunicator>(std::move(a), std::move(b), std::move(d), name);
  }

 private:
  // Messages from a lower to a higher rank use `up`, the others `down`.
  ncclComm_t p2p_comm(int64_t from, int64_t to) const { return from < to ? up_.get() : down_.get(); }

  void check_peer(int64_t peer, const char* what, bool self_ok) const {
    if (peer < 0 || peer >= size_ || (!self_ok && peer == rank_))
      throw_runtime("{} {} invalid on the NCCL group '{}' (rank {} of {})", what, peer, name_, rank_, size_);
  }

  NcclComm coll_, up_, down_;
  std::string name_;
  int64_t rank_ = 0, size_ = 1;
  cuda::CudaStream send_stream_;
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

NcclComm init_comm(Communicator& boot) {
  const ncclUniqueId id = share_id(boot);
  ncclComm_t c = nullptr;
  NCCL_CHECK(ncclCommInitRank(&c, static_cast<int>(boot.size()), id, static_cast<int>(boot.rank())));
  return NcclComm(c);
}

}  // namespace

namespace {
// A group of one's copies (reduce_scatter / all_gather out of place), queued on the compute
// stream as NCCL's would be.
void device_copy(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::stream()));
}
}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, const std::string& name, bool even_for_one) {
  if (!cuda::backend_ready())
    throw_runtime("NCCL group '{}': call cuda::init_backend(device) before creating NCCL communicators", name);
  // A group of one moves nothing: no NCCL communicator (whose set-up probes the device,
  // and costs three communicators per group) is made for it.
  if (bootstrap.size() == 1 && !even_for_one) return std::make_shared<LocalCommunicator>(name, device_copy);
  NcclComm coll = init_comm(bootstrap);
  NcclComm up = init_comm(bootstrap);
  NcclComm down = init_comm(bootstrap);
  return std::make_shared<NcclCommunicator>(std::move(coll), std::move(up), std::move(down), name);
}

#endif  // MTNLG_HAVE_NCCL

}  // namespace mtnlg::parallel
