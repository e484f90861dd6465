// Communicators: collectives and point-to-point over a group of ranks, plus the
// per-rank ProcessGroups value (world, tp, pp, dp, embedding, mp) built from a
// Topology, and launch discovery (single process, mpirun, Slurm srun).
//
// Backends: LocalCommunicator (size 1, always built; collectives are copies or
// no-ops) and MpiCommunicator (parallel/mpi_communicator.cpp, only with
// MTNLG_HAVE_MPI). Communicators are move-free, copy-free objects held by
// shared_ptr; nothing here is global state except MPI's own initialisation.
//
// Error contract. MPI calls run under MPI_ERRORS_RETURN; a failing call throws
// RuntimeError naming the operation, the group and the global rank. A rank that
// cannot continue must not leave its peers blocked in a collective: the top level
// (app/main, test drivers) catches the exception, prints it and calls abort_world(),
// which is MPI_Abort on MPI_COMM_WORLD when MPI is up (mpirun/srun then kill every
// rank and exit non-zero) and a plain exit otherwise.
//
// Point-to-point contract: send() may block until the matching recv() is posted
// (MPI_Send semantics, not guaranteed buffered); isend() returns at once and the
// buffer must stay untouched until the Request's wait() returns; recv() blocks until
// the data is there. Messages between one pair of ranks with the same tag arrive in
// the order they were sent. The pipeline executor (schedules/pipeline_schedule.hpp)
// uses isend for every send and blocking recv, which its tables are checked against.
//
// Byte accounting (compared with the planner's ring model, planner.md): each call
// adds to bytes_sent() this rank's share of the traffic a ring algorithm would put on
// the wire, with g = size() and S = the payload in bytes:
//   all_reduce        2 (g-1)/g * S           (S = n * dtype size; also iall_reduce)
//   reduce_scatter    (g-1)/g * S_total       (S_total = n * g * dtype size, the whole input)
//   all_gather        (g-1)/g * S_total       (S_total = n * g * dtype size, the whole output)
//   broadcast         (g-1)/g * S             (a pipelined chain moves (g-1) S in all)
//   send              S;  recv, barrier: 0
//   all_to_all_v      the elements this rank sends to the other ranks (its own block
//                     stays home)
// Size-1 groups count 0 for all of them. Summed over a group's ranks this is the
// total ring traffic, so per-rank numbers times ranks match the planner's volumes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "parallel/topology.hpp"

namespace mtnlg::parallel {

enum class ReduceOp { sum, max };

// A pending nonblocking operation (isend, iall_reduce). wait() blocks until the buffer
// may be reused (for iall_reduce: holds the result) and throws RuntimeError on failure.
// Destroying an unfinished send detaches it (MPI_Request_free) so unwinding after an
// error never blocks; an unfinished collective is abandoned (MPI forbids freeing it;
// the job is being aborted anyway). Normal code always calls wait().
class Request {
 public:
  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  virtual ~Request() = default;
  virtual void wait() = 0;
  // Like wait() for whatever the caller does next on the compute stream: on NCCL the
  // compute stream waits for the operation and the host goes on (a CUDA graph can
  // capture it); elsewhere wait().
  virtual void wait_stream() { wait(); }
};

class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;

  virtual int64_t rank() const = 0;  // rank inside this group
  virtual int64_t size() const = 0;
  // "world", "tp", "pp", "dp", "embedding", "mp", or what split() was given.
  virtual std::string name() const = 0;
  // What carries the traffic: "local" (a group of one: nothing moves), "mpi" or "nccl".
  virtual const char* backend() const = 0;

  // Payloads carry their dtype: f32, f64, bf16 or f16 (bf16/f16 sums are taken in fp32
  // and rounded to nearest even at each step, as NCCL does). Tensor- and pipeline-
  // parallel traffic travels in the activation dtype, gradient reduction in f32.
  //
  // In place; every rank passes the same n, dtype and op.
  void all_reduce(void* data, int64_t n, DType dt, ReduceOp op) { do_all_reduce(data, n, dt, op); }
  void all_reduce(int64_t* data, int64_t n, ReduceOp op) { do_all_reduce_i64(data, n, op); }  // flags, counters
  // Sum of the ranks' inputs (n * size() each), rank i keeps block i (n elements).
  // `out` may alias `in + rank() * n` (the in-place layout of a ZeRO shard).
  void reduce_scatter(const void* in, void* out, int64_t n, DType dt) { do_reduce_scatter(in, out, n, dt); }
  // out (n * size()) = concatenation of every rank's `in` (n) in rank order.
  // `in` may alias `out + rank() * n`.
  void all_gather(const void* in, void* out, int64_t n, DType dt) { do_all_gather(in, out, n, dt); }
  void broadcast(void* data, int64_t n, DType dt, int64_t root) { do_broadcast(data, n, dt, root); }
  // All-to-all with a count per peer (MPI_Alltoallv): `in` holds size() blocks in rank
  // order, block j (send_counts[j] elements) going to rank j; `out` receives block j
  // (recv_counts[j] elements) from rank j, in rank order. Rank j's send_counts[me] must
  // equal this rank's recv_counts[j] (the caller exchanges the counts first). Any dtype,
  // i32 included; `in` and `out` must not overlap.
  void all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                    const std::vector<int64_t>& recv_counts, DType dt) {
    check_all_to_all_counts(send_counts, recv_counts);
    do_all_to_all_v(in, send_counts, out, recv_counts, dt);
  }
  // peer is a rank in this group; sending to or receiving from oneself throws.
  void send(const void* data, int64_t n, DType dt, int64_t peer, int tag) { do_send(data, n, dt, peer, tag); }
  void recv(void* data, int64_t n, DType dt, int64_t peer, int tag) { do_recv(data, n, dt, peer, tag); }
  // Nonblocking send (MPI_Isend); bytes are counted when it is posted.
  std::unique_ptr<Request> isend(const void* data, int64_t n, DType dt, int64_t peer, int tag) {
    return do_isend(data, n, dt, peer, tag);
  }
  // Nonblocking receive (MPI_Irecv; on NCCL on a side stream): `data` is not read by the
  // caller until wait() / wait_stream(). Messages between two ranks with one tag match in
  // the order they were posted, as MPI's do.
  std::unique_ptr<Request> irecv(void* data, int64_t n, DType dt, int64_t peer, int tag) {
    return do_irecv(data, n, dt, peer, tag);
  }
  // Nonblocking in-place all-reduce (MPI_Iallreduce): `data` is neither read nor written
  // by the caller until wait(). Every rank must start its nonblocking collectives on
  // this communicator in the same order. Bytes are counted when it is posted.
  std::unique_ptr<Request> iall_reduce(void* data, int64_t n, DType dt, ReduceOp op) {
    return do_iall_reduce(data, n, dt, op);
  }

  // Typed shorthands for host scalars and f32 buffers.
  void all_reduce(float* d, int64_t n, ReduceOp op) { all_reduce(static_cast<void*>(d), n, DType::f32, op); }
  void all_reduce(double* d, int64_t n, ReduceOp op) { all_reduce(static_cast<void*>(d), n, DType::f64, op); }
  void reduce_scatter(const float* in, float* out, int64_t n) { reduce_scatter(in, out, n, DType::f32); }
  void all_gather(const float* in, float* out, int64_t n) { all_gather(in, out, n, DType::f32); }
  void broadcast(float* d, int64_t n, int64_t root) { broadcast(d, n, DType::f32, root); }
  void send(const float* d, int64_t n, int64_t peer, int tag) { send(d, n, DType::f32, peer, tag); }
  void recv(float* d, int64_t n, int64_t peer, int tag) { recv(d, n, DType::f32, peer, tag); }
  std::unique_ptr<Request> isend(const float* d, int64_t n, int64_t peer, int tag) {
    return isend(d, n, DType::f32, peer, tag);
  }
  std::unique_ptr<Request> iall_reduce(float* d, int64_t n, ReduceOp op) { return iall_reduce(d, n, DType::f32, op); }
  virtual void barrier() = 0;

  // Collective over this communicator (like MPI_Comm_split): ranks passing the same
  // color >= 0 form one new group, ordered by key; color < 0 gets nullptr back.
  virtual std::shared_ptr<Communicator> split(int64_t color, int64_t key, const std::string& name) = 0;

  // Bytes this rank has sent under the ring model above, since construction or the
  // last reset_bytes().
  int64_t bytes_sent() const { return static_cast<int64_t>(bytes_ + 0.5); }
  void reset_bytes() { bytes_ = 0; }
  // The same, unrounded, and the bytes of collectives queued again without a call (a CUDA
  // graph's replay of collectives it captured: what they counted at capture).
  double bytes_counted() const { return bytes_; }
  void count_replayed(double bytes) { bytes_ += bytes; }

 protected:
  // What a backend implements (the public calls above forward to these, so the typed
  // shorthands never hide a backend's overrides).
  virtual void do_all_reduce(void* data, int64_t n, DType dt, ReduceOp op) = 0;
  virtual void do_all_reduce_i64(int64_t* data, int64_t n, ReduceOp op) = 0;
  virtual void do_reduce_scatter(const void* in, void* out, int64_t n, DType dt) = 0;
  virtual void do_all_gather(const void* in, void* out, int64_t n, DType dt) = 0;
  virtual void do_broadcast(void* data, int64_t n, DType dt, int64_t root) = 0;
  virtual void do_send(const void* data, int64_t n, DType dt, int64_t peer, int tag) = 0;
  virtual void do_recv(void* data, int64_t n, DType dt, int64_t peer, int tag) = 0;
  virtual std::unique_ptr<Request> do_isend(const void* data, int64_t n, DType dt, int64_t peer, int tag) = 0;
  virtual std::unique_ptr<Request> do_irecv(void* data, int64_t n, DType dt, int64_t peer, int tag) = 0;
  virtual std::unique_ptr<Request> do_iall_reduce(void* data, int64_t n, DType dt, ReduceOp op) = 0;
  virtual void do_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                               const std::vector<int64_t>& recv_counts, DType dt) = 0;

  // Accounting helpers for backends (g = size()).
  void count_all_reduce(int64_t payload_bytes);
  void count_scatter_gather(int64_t total_bytes);  // reduce_scatter / all_gather
  void count_broadcast(int64_t payload_bytes);
  void count_send(int64_t payload_bytes) { bytes_ += static_cast<double>(payload_bytes); }
  void count_all_to_all(const std::vector<int64_t>& send_counts, DType dt);

 private:
  void check_all_to_all_counts(const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts) const;
  double bytes_ = 0;  // double: 2(g-1)/g * S is fractional; rounded when read
};

// A group of one: all_reduce and barrier do nothing, reduce_scatter / all_gather copy
// n elements, broadcast needs root 0, send/isend/recv throw RuntimeError (no peer exists).
// The copy is a host memmove unless the group carries device memory (`copy` is then the
// device's; make_nccl_communicator gives a group of one on the GPU that one).
class LocalCommunicator final : public Communicator {
 public:
  using Copy = void (*)(void* dst, const void* src, size_t bytes);
  explicit LocalCommunicator(std::string name = "world", Copy copy = nullptr) : name_(std::move(name)), copy_(copy) {}
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  std::string name() const override { return name_; }
  const char* backend() const override { return "local"; }
  void barrier() override {}
  std::shared_ptr<Communicator> split(int64_t color, int64_t key, const std::string& name) override;

 protected:
  void do_all_reduce(void*, int64_t n, DType dt, ReduceOp) override;
  void do_all_reduce_i64(int64_t*, int64_t n, ReduceOp) override;
  void do_reduce_scatter(const void* in, void* out, int64_t n, DType dt) override;
  void do_all_gather(const void* in, void* out, int64_t n, DType dt) override;
  void do_broadcast(void* data, int64_t n, DType dt, int64_t root) override;
  void do_send(const void* data, int64_t n, DType dt, int64_t peer, int tag) override;
  void do_recv(void* data, int64_t n, DType dt, int64_t peer, int tag) override;
  std::unique_ptr<Request> do_isend(const void* data, int64_t n, DType dt, int64_t peer, int tag) override;
  std::unique_ptr<Request> do_irecv(void* data, int64_t n, DType dt, int64_t peer, int tag) override;
  std::unique_ptr<Request> do_iall_reduce(void* data, int64_t n, DType dt, ReduceOp op) override;  // done at once
  void do_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                       const std::vector<int64_t>& recv_counts, DType dt) override;  // the one block copied

 private:
  void copy(void* dst, const void* src, int64_t n, DType dt) const;
  std::string name_;
  Copy copy_;
};

// World + sub-groups for this rank, as a value that travels explicitly (no globals).
// Group ranks equal the varying coordinate: tp->rank() == coord.tp, pp->rank() ==
// coord.pp, dp->rank() == coord.dp, mp->rank() == coord.pp * tp + coord.tp.
// `embedding` is {first, last} stage of this pipeline ({first} when pp == 1); its rank
// 0 is the first stage. It is nullptr on ranks of the middle stages, which hold no
// word embedding.
//
// Two kinds of traffic, two kinds of group:
//   world                       host collectives: payloads in host memory (flags,
//                               counters, the step's loss, timings). MPI, or the local
//                               group of a single process.
//   tp, pp, dp, embedding, mp   tensor collectives: payloads in the memory of the
//                               model's device (activations, gradients, the grad norm).
//                               MPI on the CPU and the test device; NCCL groups of the
//                               same ranks on GPUs (place_groups).
struct ProcessGroups {
  Topology topo{1, 1, 1};
  int64_t rank = 0;  // global rank
  Coord coord{};
  std::shared_ptr<Communicator> world, tp, pp, dp, embedding, mp;
  // Context parallelism: the ranks that split one sequence (cp; null when cp is 1), and
  // the ranks that hold the same parameters, over which gradients are reduced and ZeRO-1
  // shards (dp_cp: dp x cp; the dp group itself when cp is 1).
  std::shared_ptr<Communicator> cp, dp_cp;
  // A mixture-of-experts model's expert grid (ExpertGrid; add_expert_groups): the experts'
  // all-to-all group (ep; null when ep is 1), the expert-tensor-parallel group (etp; null
  // when 1), the ranks holding the same experts (edp),
  // over which their gradients are reduced and ZeRO-1 shards, and the expert
  // model-parallel group (emp) their gradient norm is summed over. Null for dense models.
  std::shared_ptr<Communicator> ep, edp, emp;
  std::shared_ptr<Communicator> etp;  // the ranks splitting each expert's width (null when etp is 1)
  ExpertCoord ecoord{};
  int64_t ep_size = 1, etp_size = 1;
  Device device = Device::cpu;  // where the tensor groups' payloads live

  // The group gradients are reduced and ZeRO-1 shards over: dp_cp, or dp where a caller
  // (a test) set only that.
  const std::shared_ptr<Communicator>& grad_group() const { return dp_cp ? dp_cp : dp; }
  bool is_first_stage() const { return coord.pp == 0; }
  bool is_last_stage() const { return coord.pp == topo.pp() - 1; }
};

// The groups for tensors on `dev`: unchanged for the CPU and the test device; for CUDA,
// NCCL groups with the same ranks replace tp, pp, dp, embedding, mp, cp and dp_cp (each group's
// NCCL unique id is made on its rank 0 and sent over the MPI group it replaces, which
// is the bootstrap); a group of one becomes a local group with device copies (no NCCL). Collective over world: every rank calls it. RuntimeError for CUDA
// in a build without NCCL.
ProcessGroups place_groups(const ProcessGroups& g, Device dev);

struct LaunchInfo {
  int64_t world_size = 1;
  int64_t rank = 0;
  int64_t local_rank = 0;
  std::string launcher = "single";  // "single", "mpirun", "srun"
};

// Reads the launcher's environment, first match wins:
//   OMPI_COMM_WORLD_SIZE/_RANK/_LOCAL_RANK   -> "mpirun" (Open MPI mpirun/prterun)
//   PMI_SIZE/PMI_RANK (+MPI_LOCALRANKID)     -> "mpirun" (MPICH hydra)
//   SLURM_PROCID with SLURM_STEP_ID or SLURM_STEP_NUM_TASKS (a task of an srun step;
//     an sbatch script itself has no step) -> "srun": size SLURM_STEP_NUM_TASKS or
//     SLURM_NTASKS, rank SLURM_PROCID, local rank SLURM_LOCALID
//   PMIX_RANK with PMIX_SIZE                 -> "mpirun"
//   otherwise                                -> "single" (1, 0, 0)
// InputError naming the variable when a value is not a number or is out of range.
LaunchInfo detect_launch();
// Same, from an explicit lookup (tests). `getenv(name)` returns nullptr when unset.
LaunchInfo detect_launch(const char* (*getenv)(const char*));
// Processes of this job on this node, from the launcher's environment
// (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE,
// SLURM_STEP_TASKS_PER_NODE "4" or "4(x2)"); 1 when none is set.
int64_t local_process_count();

// "single" -> LocalCommunicator. Otherwise MPI_Init_thread(FUNNELED) + MPI_ERRORS_RETURN
// on MPI_COMM_WORLD, and RuntimeError if MPI's size/rank disagree with `info`.
// InputError when world_size > 1 and this build has no MPI.
std::shared_ptr<Communicator> init_world(const LaunchInfo& info);
// Splits `world` into this rank's groups (collective over world: every rank calls it).
// InputError when topo.world() != world->size().
ProcessGroups make_groups(std::shared_ptr<Communicator> world, const Topology& topo);
// Adds the expert grid's groups (ExpertGrid(g.topo, ep, etp)) to `g`: collective over
// g.world, every rank calls it. InputError when the grid does not fit the topology.
void add_expert_groups(ProcessGroups& g, int64_t ep, int64_t etp = 1);
// MPI_Finalize when MPI was initialised here and is not finalised yet; else nothing.
void finalize_world();
// Ends the whole job with `code`: MPI_Abort(MPI_COMM_WORLD) when MPI is up, else exit.
[[noreturn]] void abort_world(int code);
// True when MPI support was compiled in.
bool have_mpi();

}  // namespace mtnlg::parallel
