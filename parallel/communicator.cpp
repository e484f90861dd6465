// Size-1 Local backend, byte accounting, launch discovery and group construction.
// The MPI backend lives in mpi_communicator.cpp (compiled only with MTNLG_HAVE_MPI).
#include "parallel/communicator.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/error.hpp"
#include "parallel/comm_time.hpp"
#include "parallel/nccl_communicator.hpp"
#include "parallel/watchdog.hpp"

namespace mtnlg::parallel {

#ifdef MTNLG_HAVE_MPI
namespace detail {  // mpi_communicator.cpp
std::shared_ptr<Communicator> mpi_init_world(const LaunchInfo& info);
void mpi_finalize();
bool mpi_abort(int code);  // false when MPI is not up
}  // namespace detail
#endif

bool have_mpi() {
#ifdef MTNLG_HAVE_MPI
  return true;
#else
  return false;
#endif
}

// ---- accounting -------------------------------------------------------------------

void Communicator::count_all_reduce(int64_t s) {
  const auto g = static_cast<double>(size());
  bytes_ += 2.0 * (g - 1.0) / g * static_cast<double>(s);
}
void Communicator::count_scatter_gather(int64_t total) {
  const auto g = static_cast<double>(size());
  bytes_ += (g - 1.0) / g * static_cast<double>(total);
}
void Communicator::count_broadcast(int64_t s) {
  const auto g = static_cast<double>(size());
  bytes_ += (g - 1.0) / g * static_cast<double>(s);
}

void Communicator::count_all_to_all(const std::vector<int64_t>& send_counts, DType dt) {
  for (size_t j = 0; j < send_counts.size(); ++j)
    if (static_cast<int64_t>(j) != rank()) bytes_ += static_cast<double>(send_counts[j] * dtype_size(dt));
}

void Communicator::check_all_to_all_counts(const std::vector<int64_t>& send_counts,
                                           const std::vector<int64_t>& recv_counts) const {
  const auto g = static_cast<size_t>(size());
  if (send_counts.size() != g || recv_counts.size() != g)
    throw_runtime("all_to_all_v on the '{}' group of {} ranks: {} send and {} receive counts", name(), g,
                  send_counts.size(), recv_counts.size());
  for (size_t j = 0; j < g; ++j)
    if (send_counts[j] < 0 || recv_counts[j] < 0)
      throw_runtime("all_to_all_v on the '{}' group: a negative count for rank {}", name(), j);
}

// ---- Local ------------------------------------------------------------------------

void LocalCommunicator::do_all_reduce(void*, int64_t, DType, ReduceOp) {}
void LocalCommunicator::do_all_reduce_i64(int64_t*, int64_t, ReduceOp) {}

void LocalCommunicator::copy(void* dst, const void* src, int64_t n, DType dt) const {
  if (src == dst || n <= 0) return;
  const auto bytes = static_cast<size_t>(n * dtype_size(dt));
  if (copy_)
    copy_(dst, src, bytes);
  else
    std::memmove(dst, src, bytes);
}
void LocalCommunicator::do_reduce_scatter(const void* in, void* out, int64_t n, DType dt) { copy(out, in, n, dt); }
void LocalCommunicator::do_all_gather(const void* in, void* out, int64_t n, DType dt) { copy(out, in, n, dt); }
void LocalCommunicator::do_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                        const std::vector<int64_t>& recv_counts, DType dt) {
  if (send_counts[0] != recv_counts[0])
    throw_runtime("all_to_all_v on the size-1 '{}' group: sends {} elements to itself but receives {}", name_,
                  send_counts[0], recv_counts[0]);
  copy(out, in, send_counts[0], dt);
}
void LocalCommunicator::do_broadcast(void*, int64_t, DType, int64_t root) {
  if (root != 0) throw_runtime("broadcast on the size-1 '{}' group from root {}: only root 0 exists", name_, root);
}
void LocalCommunicator::do_send(const void*, int64_t, DType, int64_t peer, int tag) {
  throw_runtime("send to rank {} (tag {}) on the size-1 '{}' group: there is no peer", peer, tag, name_);
}
std::unique_ptr<Request> LocalCommunicator::do_isend(const void*, int64_t, DType, int64_t peer, int tag) {
  throw_runtime("isend to rank {} (tag {}) on the size-1 '{}' group: there is no peer", peer, tag, name_);
}
std::unique_ptr<Request> LocalCommunicator::do_irecv(void*, int64_t, DType, int64_t peer, int tag) {
  throw_runtime("irecv from rank {} (tag {}) on the size-1 '{}' group: there is no peer", peer, tag, name_);
}
void LocalCommunicator::do_recv(void*, int64_t, DType, int64_t peer, int tag) {
  throw_runtime("recv from rank {} (tag {}) on the size-1 '{}' group: there is no peer", peer, tag, name_);
}
namespace {
class DoneRequest final : public Request {
 public:
  void wait() override {}
};
}  // namespace
std::unique_ptr<Request> LocalCommunicator::do_iall_reduce(void*, int64_t, DType, ReduceOp) {
  return std::make_unique<DoneRequest>();  // a group of one: the sum is the input
}
std::shared_ptr<Communicator> LocalCommunicator::split(int64_t color, int64_t, const std::string& name) {
  if (color < 0) return nullptr;
  return std::make_shared<LocalCommunicator>(name, copy_);
}

// ---- launch -----------------------------------------------------------------------

namespace {

const char* env_lookup(const char* name) { return std::getenv(name); }

int64_t env_int(const char* (*getenv)(const char*), const char* name, int64_t lo, int64_t fallback) {
  const char* v = getenv(name);
  if (!v) return fallback;
  std::string_view s(v);
  int64_t x = 0;
  bool ok = !s.empty();
  for (char ch : s) {
    if (ch < '0' || ch > '9' || x > (int64_t{1} << 40)) {
      ok = false;
      break;
    }
    x = x * 10 + (ch - '0');
  }
  if (!ok || x < lo) throw_input("environment variable {}=\"{}\": expected a whole number >= {}", name, v, lo);
  return x;
}

}  // namespace

LaunchInfo detect_launch() { return detect_launch(&env_lookup); }

int64_t local_process_count() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* s = std::getenv(v);
    if (s && std::atoll(s) > 0) return std::atoll(s);
  }
  if (const char* s = std::getenv("SLURM_STEP_TASKS_PER_NODE"))  // "4" or "4(x2)"
    if (std::atoll(s) > 0) return std::atoll(s);
  return 1;
}

LaunchInfo detect_launch(const char* (*getenv)(const char*)) {
  LaunchInfo info;
  auto fill = [&](const char* launcher, const char* size, const char* rank, const char* local) {
    info.launcher = launcher;
    info.world_size = env_int(getenv, size, 1, 1);
    info.rank = env_int(getenv, rank, 0, 0);
    info.local_rank = local ? env_int(getenv, local, 0, 0) : 0;
  };
  if (getenv("OMPI_COMM_WORLD_SIZE")) {
    fill("mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK");
  } else if (getenv("PMI_SIZE") && getenv("PMI_RANK")) {
    fill("mpirun", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID");
  } else if (getenv("SLURM_PROCID") && (getenv("SLURM_STEP_ID") || getenv("SLURM_STEP_NUM_TASKS"))) {
    fill("srun", getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS", "SLURM_PROCID",
         "SLURM_LOCALID");
  } else if (getenv("PMIX_RANK") && getenv("PMIX_SIZE")) {
    fill("mpirun", "PMIX_SIZE", "PMIX_RANK", "PMIX_LOCAL_RANK");
  }
  if (info.rank >= info.world_size)
    throw_input("launcher '{}' reports rank {} in a world of {} processes", info.launcher, info.rank, info.world_size);
  return info;
}

std::shared_ptr<Communicator> init_world(const LaunchInfo& info) {
  if (info.launcher == "single" && info.world_size == 1) return std::make_shared<LocalCommunicator>("world");
#ifdef MTNLG_HAVE_MPI
  return detail::mpi_init_world(info);
#else
  if (info.world_size > 1)
    throw_input("started by {} as {} processes, but this mtnlg was built without MPI (rebuild with -DMTNLG_MPI=ON)",
                info.launcher, info.world_size);
  return std::make_shared<LocalCommunicator>("world");
#endif
}

void finalize_world() {
#ifdef MTNLG_HAVE_MPI
  detail::mpi_finalize();
#endif
}

[[noreturn]] void abort_world(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef MTNLG_HAVE_MPI
  detail::mpi_abort(code);  // returns only when MPI is not up
#endif
  std::exit(code);
}

// ---- groups -----------------------------------------------------------------------

namespace {
// This rank's group of `members` split from `world` (a collective over world: every rank
// calls it, members or not): color = the group's lowest global rank, key = this rank's
// index in the group, so the new group's ranks follow the list's order. nullptr for a
// rank outside the group.
std::shared_ptr<Communicator> split_group(Communicator& world, int64_t rank, const std::vector<int64_t>& members,
                                          const char* name) {
  int64_t index = -1;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i] == rank) index = static_cast<int64_t>(i);
  auto c = world.split(index >= 0 ? members.front() : -1, index >= 0 ? index : 0, name);
  if (index >= 0) {
    MTNLG_CHECK(c && c->size() == static_cast<int64_t>(members.size()) && c->rank() == index,
                "group '{}' of rank {}: expected size {} rank {}", name, rank, members.size(), index);
  }
  return c;
}
}  // namespace

void add_expert_groups(ProcessGroups& g, int64_t ep, int64_t etp) {
  const ExpertGrid grid(g.topo, ep, etp);
  g.ecoord = grid.coord(g.rank);
  g.ep_size = ep;
  g.etp_size = etp;
  g.ep = ep > 1 ? split_group(*g.world, g.rank, grid.ep_group(g.rank), "ep") : nullptr;
  g.etp = etp > 1 ? split_group(*g.world, g.rank, grid.etp_group(g.rank), "etp") : nullptr;
  g.edp = split_group(*g.world, g.rank, grid.edp_group(g.rank), "edp");
  g.emp = split_group(*g.world, g.rank, grid.emp_group(g.rank), "emp");
}

ProcessGroups make_groups(std::shared_ptr<Communicator> world, const Topology& topo) {
  MTNLG_CHECK(world != nullptr, "make_groups needs a world communicator");
  if (topo.world() != world->size())
    throw_input("layout {} needs {} processes but the job has {}", topo.to_string(), topo.world(), world->size());
  set_watchdog_topology(topo);  // its reports name ranks by (tp, pp, dp)
  ProcessGroups g;
  g.topo = topo;
  g.rank = world->rank();
  g.coord = topo.coord(g.rank);
  g.world = world;

  // Every rank takes part in every split in the same order (they are collectives).
  auto make = [&](const std::vector<int64_t>& members, const char* name) {
    return split_group(*world, g.rank, members, name);
  };
  g.tp = make(topo.tp_group(g.rank), "tp");
  g.pp = make(topo.pp_group(g.rank), "pp");
  g.dp = make(topo.dp_group(g.rank), "dp");
  g.embedding = make(topo.embedding_group(g.rank), "embedding");
  g.mp = make(topo.mp_group(g.rank), "mp");
  if (topo.cp() > 1) {  // else no cp group (a null one: one rank), and dp is dp_cp
    g.cp = make(topo.cp_group(g.rank), "cp");
    g.dp_cp = make(topo.dp_cp_group(g.rank), "dp_cp");
  } else {
    g.dp_cp = g.dp;
  }
  return g;
}

ProcessGroups place_groups(const ProcessGroups& g, Device dev) {
  ProcessGroups out = g;
  out.device = dev;
  if (dev != Device::cuda) return out;
#ifdef MTNLG_HAVE_NCCL
  // Every rank creates the groups in the same order; a rank outside a group (embedding
  // on middle stages) has nullptr there and takes no part in its creation.
  auto nccl = [&](const std::shared_ptr<Communicator>& mpi) -> std::shared_ptr<Communicator> {
    return mpi ? make_nccl_communicator(*mpi, mpi->name(), false, g.rank) : nullptr;
  };
  out.tp = nccl(g.tp);
  out.pp = nccl(g.pp);
  out.dp = nccl(g.dp);
  out.embedding = nccl(g.embedding);
  out.mp = nccl(g.mp);
  out.cp = nccl(g.cp);
  out.dp_cp = g.dp_cp == g.dp ? out.dp : nccl(g.dp_cp);
  out.ep = nccl(g.ep);
  out.etp = nccl(g.etp);
  out.edp = nccl(g.edp);
  out.emp = nccl(g.emp);
  return out;
#else
  throw_runtime(
      "tensors on CUDA need NCCL groups, but this build has no NCCL (libnccl was not found at configure time)");
#endif
}

namespace {
thread_local double t_comm_blocked = 0;  // per thread: a background thread's waits are not the step's
}  // namespace

double comm_blocked_seconds() { return t_comm_blocked; }
void add_comm_blocked_seconds(double s) { t_comm_blocked += s; }

}  // namespace mtnlg::parallel
