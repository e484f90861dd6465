// Emulated NCCL over MPI: the communicator calls and collectives mtnlg makes, with
// NCCL's semantics, executed when the stream that carries them runs.
//
//   - A communicator is an MPI communicator of its members in NCCL rank order.
//     ncclGetUniqueId names the creating process (its world rank) and a counter;
//     ncclCommInitRank sends each member's world rank to the creator, which answers
//     with the ordered list, and the members build the group with
//     MPI_Comm_create_group (collective over the members only, as NCCL's init is).
//     ncclCommSplit is MPI_Comm_split of the parent (NCCL_SPLIT_NOCOLOR: no comm).
//   - A collective is a communication Op on its stream. When the stream runs it, the op
//     copies its input from device memory into a private host buffer and posts a
//     nonblocking MPI call on those buffers (device memory is inaccessible between the
//     emulator's drains, so MPI never touches it); later steps test for completion and
//     copy the result to the output. Ops of one communicator are posted in the order
//     they were enqueued, whatever streams carry them, as NCCL requires every rank to
//     issue them in one order: the emulated streams run lazily and in different orders
//     on different ranks, so without this the MPI collectives could pair up wrongly.
//   - Reductions gather every rank's contribution and combine them in rank order
//     (bf16 and f16 add in fp32 and round after each addition, NCCL's arithmetic), so
//     every rank gets bit-identical results.
//   - Non-blocking communicators (ncclCommInitRankConfig with config->blocking = 0): the
//     init call posts its exchange with the creator as nonblocking MPI messages and
//     returns ncclInProgress; ncclCommGetAsyncError advances it (on the calling thread,
//     which must be the one that talks to MPI) and says ncclSuccess once the group
//     exists. A creator or member that never calls leaves the others in ncclInProgress.
//   - Failure: ncclCommGetAsyncError reads the communicator's asynchronous error without
//     any lock (a watchdog thread polls it); MTNLG_EMU_NCCL_FAULT injects one. A failed
//     communicator completes no further operation (its streams stall in it, as a GPU's
//     kernels would). ncclCommAbort, from any thread, marks the communicator aborted:
//     every operation of it, queued or waiting for peers, finishes at once without
//     touching its output, so the threads of this process blocked on it are released;
//     any later call on it is ncclInvalidUsage. Peers in other processes learn of it as
//     on a GPU cluster, from their own watchdogs (timeout, or the run's abort marker).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only
#endif
#include <mpi.h>
#include <nccl.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/switches.hpp"
#include "emulator/emu.hpp"
#include "emulator/internal.hpp"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL when the comm has one rank
  int rank = 0, size = 1;
  int world = 0;          // this process's world rank (ncclCommAbort runs on any thread)
  uint64_t enqueued = 0;  // ops enqueued on this comm
  uint64_t posted = 0;    // ops that have posted their MPI call (in enqueue order)
  bool destroyed = false;
  // Read by other threads without a lock (ncclCommGetAsyncError, ncclCommAbort).
  std::atomic<int> async_error{ncclSuccess};
  std::atomic<bool> aborted{false};
  // Non-blocking initialisation in progress (ncclCommInitRankConfig, blocking = 0).
  struct Init {
    bool pending = false;
    int creator = 0, tag = 0;
    int msg[2] = {0, 0};
    std::vector<int> members;
    std::vector<int> inbox;  // creator: (rank, world rank) pairs received
    std::vector<MPI_Request> reqs;
    int stage = 0;         // 0: exchanging with the creator, 1: creator answering, 2: done
    bool stalled = false;  // MTNLG_EMU_NCCL_FAULT init=N: this rank never joins
  } init;
};

namespace mtnlg::emu {
namespace {

constexpr uint64_t kIdMagic = 0x6d746e6c67656d75ull;  // "mtnlgemu"
constexpr int kBootTag = 0x4e4300;                    // + counter % 4096: init exchange on MPI_COMM_WORLD

struct Id {
  uint64_t magic;
  int32_t creator;  // world rank
  int32_t counter;
};
static_assert(sizeof(Id) <= sizeof(ncclUniqueId));

thread_local std::string tl_last_nccl_error;

ncclResult_t nccl_fail(ncclResult_t r, const std::string& why) {
  tl_last_nccl_error = why;
  return r;
}

bool mpi_up() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}
int world_rank() {
  int r = 0;
  if (mpi_up()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

template <typename T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return a + b;
    case ncclProd: return a * b;
    case ncclMax: return std::max(a, b);
    case ncclMin: return std::min(a, b);
    default: return a + b;
  }
}

// acc (n elements) op= x, elementwise, in the type's arithmetic.
void reduce_into(void* acc, const void* x, size_t n, ncclDataType_t t, ncclRedOp_t op) {
  auto each = [&](auto* a, const auto* b) {
    for (size_t i = 0; i < n; ++i) a[i] = combine(a[i], b[i], op);
  };
  switch (t) {
    case ncclInt8: each(static_cast<int8_t*>(acc), static_cast<const int8_t*>(x)); break;
    case ncclUint8: each(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(x)); break;
    case ncclInt32: each(static_cast<int32_t*>(acc), static_cast<const int32_t*>(x)); break;
    case ncclUint32: each(static_cast<uint32_t*>(acc), static_cast<const uint32_t*>(x)); break;
    case ncclInt64: each(static_cast<int64_t*>(acc), static_cast<const int64_t*>(x)); break;
    case ncclUint64: each(static_cast<uint64_t*>(acc), static_cast<const uint64_t*>(x)); break;
    case ncclFloat32: each(static_cast<float*>(acc), static_cast<const float*>(x)); break;
    case ncclFloat64: each(static_cast<double*>(acc), static_cast<const double*>(x)); break;
    case ncclBfloat16: {
      auto* a = static_cast<__nv_bfloat16*>(acc);
      const auto* b = static_cast<const __nv_bfloat16*>(x);
      for (size_t i = 0; i < n; ++i)
        a[i] = __float2bfloat16(combine(__bfloat162float(a[i]), __bfloat162float(b[i]), op));
      break;
    }
    case ncclFloat16: {
      auto* a = static_cast<__half*>(acc);
      const auto* b = static_cast<const __half*>(x);
      for (size_t i = 0; i < n; ++i) a[i] = __float2half(combine(__half2float(a[i]), __half2float(b[i]), op));
      break;
    }
    default: fatal("NCCL reduction: unsupported data type");
  }
}

enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast, send, recv };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "ncclAllReduce";
    case Kind::reduce_scatter: return "ncclReduceScatter";
    case Kind::all_gather: return "ncclAllGather";
    case Kind::broadcast: return "ncclBroadcast";
    case Kind::send: return "ncclSend";
    case Kind::recv: return "ncclRecv";
  }
  return "nccl";
}

// One enqueued collective or point-to-point operation.
struct CommOp {
  Kind kind = Kind::all_reduce;
  ncclComm* comm = nullptr;
  uint64_t seq = 0;  // position in the comm's enqueue order
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;  // elements per rank (the op's NCCL count)
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int peer = 0;  // root (broadcast) or peer (send/recv)
  bool posted = false;
  MPI_Request req = MPI_REQUEST_NULL;
  std::vector<char> sendbuf, recvbuf;

  size_t bytes() const { return count * type_bytes(type); }

  // Copies the input to host memory and posts the MPI call.
  void post() {
    const int n = comm->size;
    const size_t b = bytes();
    auto mpi_check = [&](int rc) {
      if (rc != MPI_SUCCESS) fatal(fmt_str("%s: MPI call failed (code %d)", kind_name(kind), rc));
    };
    if (b > static_cast<size_t>(INT32_MAX) / std::max(n, 1))
      fatal(fmt_str("%s of %zu bytes exceeds what the MPI emulation moves in one call", kind_name(kind), b));
    const int ib = static_cast<int>(b);
    switch (kind) {
      case Kind::reduce_scatter:  // in holds n * count; rank r receives everyone's chunk r
        sendbuf.assign(static_cast<const char*>(in), static_cast<const char*>(in) + b * n);
        recvbuf.resize(b * n);
        if (n == 1)
          std::memcpy(recvbuf.data(), sendbuf.data(), b);
        else
          mpi_check(MPI_Ialltoall(sendbuf.data(), ib, MPI_BYTE, recvbuf.data(), ib, MPI_BYTE, comm->mpi, &req));
        break;
      case Kind::all_reduce:  // gathers every rank's input; finish() sums them in rank order
      case Kind::all_gather:
        sendbuf.assign(static_cast<const char*>(in), static_cast<const char*>(in) + b);
        recvbuf.resize(b * n);
        if (n == 1)
          std::memcpy(recvbuf.data(), sendbuf.data(), b);
        else
          mpi_check(MPI_Iallgather(sendbuf.data(), ib, MPI_BYTE, recvbuf.data(), ib, MPI_BYTE, comm->mpi, &req));
        break;
      case Kind::broadcast:
        recvbuf.resize(b);
        if (comm->rank == peer) std::memcpy(recvbuf.data(), in, b);
        if (n > 1) mpi_check(MPI_Ibcast(recvbuf.data(), ib, MPI_BYTE, peer, comm->mpi, &req));
        break;
      case Kind::send:
        sendbuf.assign(static_cast<const char*>(in), static_cast<const char*>(in) + b);
        mpi_check(MPI_Isend(sendbuf.data(), ib, MPI_BYTE, peer, 0, comm->mpi, &req));
        break;
      case Kind::recv:
        recvbuf.resize(b);
        mpi_check(MPI_Irecv(recvbuf.data(), ib, MPI_BYTE, peer, 0, comm->mpi, &req));
        break;
    }
    posted = true;
  }

  void finish() {
    const size_t b = bytes();
    const int n = comm->size;
    switch (kind) {
      case Kind::all_reduce:
      case Kind::reduce_scatter: {
        std::vector<char> acc(recvbuf.begin(), recvbuf.begin() + static_cast<std::ptrdiff_t>(b));
        for (int r = 1; r < n; ++r) reduce_into(acc.data(), recvbuf.data() + b * r, count, type, op);
        std::memcpy(out, acc.data(), b);
        break;
      }
      case Kind::all_gather: std::memcpy(out, recvbuf.data(), b * n); break;
      case Kind::broadcast:
      case Kind::recv: std::memcpy(out, recvbuf.data(), b); break;
      case Kind::send: break;
    }
  }

  // Op::step: post when the comm's earlier ops have posted, then test. An aborted
  // communicator's ops finish at once (output untouched); a failed one's never do.
  bool step() {
    if (comm->aborted.load()) return true;
    if (comm->async_error.load() != ncclSuccess) return false;
    if (!posted) {
      if (comm->posted != seq) return false;  // an earlier op of this comm has not posted yet
      post();
      ++comm->posted;
    }
    if (req != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (!done) return false;
    }
    finish();
    return true;
  }
};

ncclResult_t check_comm(ncclComm_t c, const char* fn) {
  if (!c) return nccl_fail(ncclInvalidArgument, fmt_str("%s: null communicator", fn));
  if (c->destroyed) fatal(fmt_str("%s on a destroyed communicator", fn));
  if (c->aborted.load()) return nccl_fail(ncclInvalidUsage, fmt_str("%s on an aborted communicator", fn));
  if (c->init.pending)
    return nccl_fail(ncclInvalidUsage, fmt_str("%s on a communicator whose non-blocking initialisation is still in "
                                               "progress (poll ncclCommGetAsyncError until ncclSuccess first)",
                                               fn));
  return ncclSuccess;
}

// MTNLG_EMU_NCCL_FAULT="rank=R:op=N:error=remote|system": on world rank R, the N-th NCCL
// operation queued to run (counted over every communicator, from 1) sets its
// communicator's asynchronous error to ncclRemoteError or ncclSystemError; that
// operation and every later one of the communicator never complete (until an abort).
// MTNLG_EMU_NCCL_FAULT="rank=R:init=N": on world rank R, the N-th communicator
// initialisation (ncclCommInitRank(Config), from 1) never joins its group: its own and
// its peers' initialisations stay in progress (a process that never reaches NCCL's set-up).
// MTNLG_EMU_NCCL_FAULT="rank=R:abort_ms=N" (alone or with one of the above): every
// ncclCommAbort on world rank R takes N ms (a real abort tears down proxy threads and
// connections, which can take seconds).
struct Fault {
  int rank = -1;
  long long op = 0, init = 0, abort_ms = 0;
  ncclResult_t error = ncclSuccess;
};
const Fault& nccl_fault() {
  static const Fault f = [] {
    Fault x;
    const std::optional<std::string> v = ::mtnlg::switches::text(::mtnlg::Switch::emu_nccl_fault);
    if (!v || v->empty()) return x;
    const std::string spec(*v);
    auto bad = [&](const char* why) {
      fatal(
          fmt_str("MTNLG_EMU_NCCL_FAULT=\"%s\": %s; expected rank=R:op=N:error=remote|system, rank=R:init=N or "
                  "rank=R:abort_ms=N",
                  spec.c_str(), why));
    };
    size_t at = 0;
    while (at <= spec.size()) {
      const size_t end = std::min(spec.find(':', at), spec.size());
      const std::string part = spec.substr(at, end - at);
      const size_t eq = part.find('=');
      if (eq == std::string::npos) bad("a part is not key=value");
      const std::string key = part.substr(0, eq), val = part.substr(eq + 1);
      char* e = nullptr;
      if (key == "rank" || key == "op" || key == "init" || key == "abort_ms") {
        const long long n = std::strtoll(val.c_str(), &e, 10);
        if (val.empty() || *e || n < 0) bad("rank, op, init and abort_ms are whole numbers");
        if (key == "rank")
          x.rank = static_cast<int>(n);
        else if (key == "op")
          x.op = n;
        else if (key == "init")
          x.init = n;
        else
          x.abort_ms = n;
      } else if (key == "error") {
        if (val == "remote")
          x.error = ncclRemoteError;
        else if (val == "system")
          x.error = ncclSystemError;
        else
          bad("error is remote or system");
      } else {
        bad("unknown key");
      }
      at = end + 1;
    }
    const bool op_fault = x.op >= 1 && x.error != ncclSuccess,
               init_fault = x.init >= 1 && x.op == 0 && x.error == ncclSuccess,
               abort_only = x.abort_ms >= 1 && x.op == 0 && x.init == 0 && x.error == ncclSuccess;
    if (x.rank < 0 || !(op_fault || init_fault || abort_only))
      bad("rank with op (>= 1) and error, rank with init (>= 1), or rank with abort_ms (>= 1), is required");
    return x;
  }();
  return f;
}
long long g_ops_armed = 0;
long long g_inits = 0;

// An operation checked and waiting for its stream: alone, or with the others of an
// ncclGroupStart/End group, which NCCL issues together.
struct Pending {
  CommOp proto;
  std::string name, label;
  cudaStream_t stream;
  std::vector<MemoryUse> uses;
};
int g_group_depth = 0;
std::vector<Pending> g_group;

// One stream op for a list of operations (one, or an NCCL group: a rank's sends and
// receives to its peers must all be posted before any is waited on, or two ranks whose
// sends wait for the other's receive never finish). Each operation takes its place in its
// communicator's order when queued to run (a captured op takes none until a graph launch
// queues it, and one each time), and each execution has its own buffers and requests.
void enqueue_group(std::vector<Pending> ops) {
  Op o;
  o.name = ops.size() == 1 ? ops[0].label
                           : fmt_str("ncclGroup of %zu operations: %s, ...", ops.size(), ops[0].label.c_str());
  o.communication = true;
  for (Pending& p : ops) {
    if (p.stream != ops[0].stream)
      fatal("an NCCL group with operations on different streams is not modelled by the emulator");
    for (MemoryUse& u : p.uses) o.uses.push_back(std::move(u));
  }
  std::vector<std::pair<CommOp, std::string>> protos;
  for (const Pending& p : ops) protos.emplace_back(p.proto, p.name);
  o.arm = [protos] {
    std::vector<std::shared_ptr<CommOp>> cops;
    for (const auto& [proto, name] : protos) {
      if (proto.comm->destroyed)
        fatal(fmt_str("%s replayed (cudaGraphLaunch) on a destroyed communicator", name.c_str()));
      auto cop = std::make_shared<CommOp>(proto);
      cop->seq = proto.comm->enqueued++;
      const Fault& f = nccl_fault();
      if (f.rank >= 0 && ++g_ops_armed == f.op && f.rank == world_rank()) {
        std::fprintf(stderr,
                     "mtnlg cuda-emulator: MTNLG_EMU_NCCL_FAULT: %s (operation %lld of this process) fails with %s\n",
                     name.c_str(), f.op, ncclGetErrorString(f.error));
        std::fflush(stderr);
        proto.comm->async_error.store(f.error);
      }
      cops.push_back(std::move(cop));
    }
    auto done = std::make_shared<std::vector<bool>>(cops.size(), false);
    return std::function<bool()>([cops, done] {
      bool all = true;  // every operation stepped in order, each posting as soon as its turn comes
      for (size_t i = 0; i < cops.size(); ++i) {
        if (!(*done)[i]) (*done)[i] = cops[i]->step();
        all = all && (*done)[i];
      }
      return all;
    });
  };
  enqueue(ops[0].stream, std::move(o));
}

ncclResult_t enqueue_op(Kind kind, ncclComm_t comm, const void* in, void* out, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int peer, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(comm, kind_name(kind)); r != ncclSuccess) return r;
  if (!type_bytes(type))
    return nccl_fail(ncclInvalidArgument, fmt_str("%s: unsupported data type %d", kind_name(kind), int(type)));
  if ((kind == Kind::send || kind == Kind::recv || kind == Kind::broadcast) && (peer < 0 || peer >= comm->size))
    return nccl_fail(ncclInvalidArgument, fmt_str("%s: peer/root %d outside the communicator's %d ranks",
                                                  kind_name(kind), peer, comm->size));
  if ((kind == Kind::send || kind == Kind::recv) && peer == comm->rank)
    return nccl_fail(ncclInvalidArgument, fmt_str("%s to itself", kind_name(kind)));
  const size_t b = count * type_bytes(type);
  const size_t n = static_cast<size_t>(comm->size);
  const std::string name = kind_name(kind);
  UseCollector uses;  // the buffers checked below become the op's uses (a graph's replay rechecks them)
  // Buffers must be device memory of the op's extent (NCCL reads and writes them from the GPU).
  switch (kind) {
    case Kind::all_reduce:
      check_device_range(in, b, (name + ": send buffer").c_str());
      check_device_range(out, b, (name + ": receive buffer").c_str());
      break;
    case Kind::reduce_scatter:
      check_device_range(in, b * n, (name + ": send buffer (count x ranks)").c_str());
      check_device_range(out, b, (name + ": receive buffer").c_str());
      break;
    case Kind::all_gather:
      check_device_range(in, b, (name + ": send buffer").c_str());
      check_device_range(out, b * n, (name + ": receive buffer (count x ranks)").c_str());
      break;
    case Kind::broadcast:
      if (comm->rank == peer) check_device_range(in, b, (name + ": root's send buffer").c_str());
      check_device_range(out, b, (name + ": receive buffer").c_str());
      break;
    case Kind::send: check_device_range(in, b, (name + ": send buffer").c_str()); break;
    case Kind::recv: check_device_range(out, b, (name + ": receive buffer").c_str()); break;
  }
  if ((kind != Kind::send && kind != Kind::recv) && comm->size > 1 && comm->mpi == MPI_COMM_NULL)
    fatal("NCCL communicator without its MPI group");
  CommOp proto;
  proto.kind = kind;
  proto.comm = comm;
  proto.in = in;
  proto.out = out;
  proto.count = count;
  proto.type = type;
  proto.op = op;
  proto.peer = peer;
  const std::string label =
      fmt_str("%s (%zu x %d bytes, rank %d of %d)", name.c_str(), count, int(type_bytes(type)), comm->rank, comm->size);
  Pending mine{proto, name, label, stream, uses.take()};
  if (g_group_depth > 0) {  // issued together at ncclGroupEnd
    g_group.push_back(std::move(mine));
    return ncclSuccess;
  }
  std::vector<Pending> one;
  one.push_back(std::move(mine));
  enqueue_group(std::move(one));
  return ncclSuccess;
}

int g_id_counter = 0;

}  // namespace
}  // namespace mtnlg::emu

using namespace mtnlg::emu;

extern "C" {

ncclResult_t ncclGetVersion(int* v) {
  if (!v) return ncclInvalidArgument;
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return tl_last_nccl_error.empty() ? "invalid argument" : tl_last_nccl_error.c_str();
    case ncclInvalidUsage: return tl_last_nccl_error.empty() ? "invalid usage" : tl_last_nccl_error.c_str();
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* ncclGetLastError(ncclComm_t) { return tl_last_nccl_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return nccl_fail(ncclInvalidArgument, "ncclGetUniqueId: null id");
  std::memset(id, 0, sizeof *id);
  const Id v{kIdMagic, world_rank(), g_id_counter++};
  std::memcpy(id->internal, &v, sizeof v);
  return ncclSuccess;
}

}  // extern "C"

namespace mtnlg::emu {
namespace {

// One step of a non-blocking initialisation (see the file comment): returns true once
// the communicator is ready. Members send (rank, world rank) to the creator and wait for
// the member list; the creator collects them all, answers, and then every member builds
// the MPI group (MPI_Comm_create_group, collective over the members only).
bool advance_init(ncclComm* c) {
  auto& in = c->init;
  if (!in.pending) return true;
  if (in.stalled) return false;
  auto all_done = [&] {
    if (in.reqs.empty()) return true;
    int done = 0;
    MPI_Testall(static_cast<int>(in.reqs.size()), in.reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) in.reqs.clear();
    return done != 0;
  };
  const int n = c->size;
  const bool creator = world_rank() == in.creator;
  if (in.stage == 0) {
    if (!all_done()) return false;
    if (creator) {
      in.members.assign(static_cast<size_t>(n), -1);
      in.members[0] = world_rank();
      for (int i = 1; i < n; ++i) {
        const int r = in.inbox[2 * static_cast<size_t>(i - 1)], w = in.inbox[2 * static_cast<size_t>(i - 1) + 1];
        if (r < 1 || r >= n || in.members[static_cast<size_t>(r)] != -1)
          fatal(fmt_str("ncclCommInitRank: two processes claim rank %d", r));
        in.members[static_cast<size_t>(r)] = w;
      }
      in.reqs.resize(static_cast<size_t>(n - 1));
      for (int i = 1; i < n; ++i)
        MPI_Isend(in.members.data(), n, MPI_INT, in.members[static_cast<size_t>(i)], in.tag, MPI_COMM_WORLD,
                  &in.reqs[static_cast<size_t>(i - 1)]);
    }
    in.stage = 1;
  }
  if (in.stage == 1) {
    if (!all_done()) return false;
    MPI_Group world, group;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, n, in.members.data(), &group);
    if (MPI_Comm_create_group(MPI_COMM_WORLD, group, in.tag, &c->mpi) != MPI_SUCCESS)
      fatal("ncclCommInitRank: MPI_Comm_create_group failed");
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    int r = -1;
    MPI_Comm_rank(c->mpi, &r);
    if (r != c->rank) fatal("ncclCommInitRank: the MPI group's rank order differs from NCCL's");
    in.stage = 2;
    in.pending = false;
  }
  return true;
}

}  // namespace
}  // namespace mtnlg::emu

extern "C" {

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId uid, int rank, ncclConfig_t* config) {
  if (!out || nranks < 1 || rank < 0 || rank >= nranks)
    return nccl_fail(ncclInvalidArgument, fmt_str("ncclCommInitRank: rank %d of %d", rank, nranks));
  if (config && (config->size != sizeof(ncclConfig_t) || config->magic != 0xcafebeef))
    return nccl_fail(ncclInvalidArgument,
                     "ncclCommInitRankConfig: the config was not set from NCCL_CONFIG_INITIALIZER");
  // NCCL_CONFIG_UNDEF_INT (unset) means blocking, NCCL's default.
  const bool blocking = !config || config->blocking != 0;
  Id id;
  std::memcpy(&id, uid.internal, sizeof id);
  if (id.magic != kIdMagic)
    return nccl_fail(ncclInvalidArgument, "ncclCommInitRank: the unique id did not come from ncclGetUniqueId");
  auto* c = new ncclComm;
  c->rank = rank;
  c->size = nranks;
  c->world = world_rank();
  *out = c;
  if (nranks == 1) return ncclSuccess;
  if (!mpi_up())
    fatal("ncclCommInitRank: the emulated NCCL runs over MPI, and MPI is not initialised (launch with mpirun or srun)");
  auto& in = c->init;
  in.pending = true;
  in.creator = id.creator;
  in.tag = kBootTag + id.counter % 4096;
  in.members.assign(static_cast<size_t>(nranks), -1);
  const int me = world_rank();
  const Fault& f = nccl_fault();
  if (f.init >= 1 && ++g_inits == f.init && f.rank == me) {
    std::fprintf(stderr,
                 "mtnlg cuda-emulator: MTNLG_EMU_NCCL_FAULT: communicator initialisation %lld of this process never "
                 "joins its group\n",
                 f.init);
    std::fflush(stderr);
    in.stalled = true;
    if (blocking) fatal("ncclCommInitRank: a blocking initialisation with MTNLG_EMU_NCCL_FAULT init= would hang");
    return ncclInProgress;
  }
  if (me == id.creator) {
    if (rank != 0) fatal("ncclCommInitRank: the process that created the unique id must be rank 0");
    in.inbox.resize(2 * static_cast<size_t>(nranks - 1));
    in.reqs.resize(static_cast<size_t>(nranks - 1));
    for (int i = 1; i < nranks; ++i)
      MPI_Irecv(&in.inbox[2 * static_cast<size_t>(i - 1)], 2, MPI_INT, MPI_ANY_SOURCE, in.tag, MPI_COMM_WORLD,
                &in.reqs[static_cast<size_t>(i - 1)]);
  } else {
    in.msg[0] = rank;
    in.msg[1] = me;
    in.reqs.resize(2);
    MPI_Isend(in.msg, 2, MPI_INT, id.creator, in.tag, MPI_COMM_WORLD, &in.reqs[0]);
    MPI_Irecv(in.members.data(), nranks, MPI_INT, id.creator, in.tag, MPI_COMM_WORLD, &in.reqs[1]);
  }
  if (!blocking) return advance_init(c) ? ncclSuccess : ncclInProgress;
  while (!advance_init(c)) {}
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId uid, int rank) {
  return ncclCommInitRankConfig(out, nranks, uid, rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out, ncclConfig_t*) {
  if (ncclResult_t r = check_comm(comm, "ncclCommSplit"); r != ncclSuccess) return r;
  if (!out) return nccl_fail(ncclInvalidArgument, "ncclCommSplit: null output");
  *out = nullptr;
  if (comm->size == 1) {
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    auto* c = new ncclComm;
    c->world = comm->world;
    *out = c;
    return ncclSuccess;
  }
  // ncclCommSplit blocks until every rank of the parent has called it: so does MPI_Comm_split.
  MPI_Comm m = MPI_COMM_NULL;
  if (MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &m) != MPI_SUCCESS)
    fatal("ncclCommSplit: MPI_Comm_split failed");
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  auto* c = new ncclComm;
  c->world = comm->world;
  MPI_Comm_rank(m, &c->rank);
  MPI_Comm_size(m, &c->size);
  if (c->size > 1)
    c->mpi = m;
  else
    MPI_Comm_free(&m);
  *out = c;
  return ncclSuccess;
}

// NCCL finalises a communicator before freeing it: operations still queued are flushed
// (they complete if every peer issued them too), so the streams run.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (ncclResult_t r = check_comm(comm, "ncclCommFinalize"); r != ncclSuccess) return r;
  if (comm->posted != comm->enqueued) cudaDeviceSynchronize();
  if (comm->posted != comm->enqueued)
    fatal(fmt_str("ncclCommFinalize: %llu operations of the communicator never started",
                  static_cast<unsigned long long>(comm->enqueued - comm->posted)));
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  if (comm->destroyed) fatal("ncclCommDestroy: communicator destroyed twice");
  if (comm->aborted.load()) fatal("ncclCommDestroy on an aborted communicator (ncclCommAbort already freed it)");
  if (ncclResult_t r = ncclCommFinalize(comm); r != ncclSuccess) return r;
  if (comm->mpi != MPI_COMM_NULL && mpi_up()) MPI_Comm_free(&comm->mpi);
  comm->destroyed = true;  // kept (leaked) so that a use after destroy is caught
  return ncclSuccess;
}
// From any thread: the communicator's operations finish at once (see the file comment).
// Its MPI group is left to the process's end (MPI is the training thread's).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm->aborted.store(true);
  if (const Fault& f = nccl_fault(); f.abort_ms >= 1 && f.rank == comm->world)
    std::this_thread::sleep_for(std::chrono::milliseconds(f.abort_ms));
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (ncclResult_t r = check_comm(comm, "ncclCommCount"); r != ncclSuccess) return r;
  *count = comm->size;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (ncclResult_t r = check_comm(comm, "ncclCommUserRank"); r != ncclSuccess) return r;
  *rank = comm->rank;
  return ncclSuccess;
}
// A non-blocking initialisation advances here (the caller's thread talks to MPI); once
// ready, the asynchronous error is read without any lock (a watchdog thread polls it).
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* e) {
  if (!comm || !e) return nccl_fail(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  if (comm->destroyed) fatal("ncclCommGetAsyncError on a destroyed communicator");
  if (comm->init.pending) {
    *e = advance_init(comm) ? ncclSuccess : ncclInProgress;
    return ncclSuccess;
  }
  *e = static_cast<ncclResult_t>(comm->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* in, void* out, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t s) {
  return enqueue_op(Kind::all_reduce, comm, in, out, count, t, op, 0, s);
}
ncclResult_t ncclReduceScatter(const void* in, void* out, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s) {
  return enqueue_op(Kind::reduce_scatter, comm, in, out, count, t, op, 0, s);
}
ncclResult_t ncclAllGather(const void* in, void* out, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t s) {
  return enqueue_op(Kind::all_gather, comm, in, out, count, t, ncclSum, 0, s);
}
ncclResult_t ncclBroadcast(const void* in, void* out, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t s) {
  return enqueue_op(Kind::broadcast, comm, in, out, count, t, ncclSum, root, s);
}
ncclResult_t ncclSend(const void* in, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s) {
  return enqueue_op(Kind::send, comm, in, nullptr, count, t, ncclSum, peer, s);
}
ncclResult_t ncclRecv(void* out, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s) {
  return enqueue_op(Kind::recv, comm, nullptr, out, count, t, ncclSum, peer, s);
}

// Groups: the operations between ncclGroupStart and the outermost ncclGroupEnd are queued
// as one stream op that posts them all (nonblocking MPI calls) before waiting on any, as
// NCCL issues a group together: a rank's send and receive to the same peers cannot
// deadlock on each other.
ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (g_group_depth == 0) return nccl_fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth == 0 && !g_group.empty()) enqueue_group(std::exchange(g_group, {}));
  return ncclSuccess;
}

}  // extern "C"
