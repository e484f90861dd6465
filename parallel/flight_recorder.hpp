// The device-collective watchdog and its flight recorder (docs/RELIABILITY.md, class 11):
// what ends a run whose NCCL collective never completes, or fails, with a
// report naming the rank, instead of a silent hang.
//
// The recorder. Every operation a watched communicator (the NCCL groups of
// parallel/nccl_communicator.cpp) enqueues gets a row: its group, channel, operation,
// bytes, dtype, a sequence number (per communicator for collectives, per communicator
// and peer for point-to-point: every rank of a group enters them in the same order, so
// the numbers agree across ranks), the trainer's context when it was enqueued
// (iteration, micro batch, chunk, phase) and its state, enqueued -> started -> completed,
// with times. The backend supplies a probe per operation (CUDA events recorded on the
// op's stream before and after it); a CUDA graph replay gets one probe for all the
// collectives its capture recorded. The last `ring` rows are kept (and every
// communicator's count of operations entered, which the ring may have outlived).
//
// The watchdog thread (start() .. stop(), one per process) polls, every `poll_s`: the
// probes of the operations still pending; every communicator's asynchronous error
// (ncclCommGetAsyncError); and its connection to the run's liveness service
// (parallel/liveness.hpp, served by rank 0), which says when a peer's process ended (its
// connection closed without a goodbye), when a peer has been silent for longer than the
// heartbeat timeout, and when another rank tripped. It trips when an operation has been
// pending longer than the timeout (parallel.distributed_timeout_minutes, the MPI
// watchdog's key), on an asynchronous error, on another rank's trip, on a dead peer or on
// a silent one. Nothing is polled on the filesystem: a thousand ranks' watchdogs cost
// the run directory's filesystem nothing until one trips.
//
// A pause is not a hang. A process stopped and continued (SIGSTOP/SIGCONT, a suspended
// Slurm job, a debugger) finds, at its first pass after waking, a gap far longer than
// `poll_s` (PauseClock): every pending operation then gets a full timeout again from
// that moment, so a whole job suspended for longer than the timeout goes on when
// resumed, and a peer that wakes a little later than this rank is not judged for it.
// A peer stopped for good is left to the timeout (or the heartbeat timeout).
//
// Tripping, in this order: the abort is told to the liveness service (the first rank's
// wins; without the service, the marker RUN_DIR/flight_recorder/abort_<token>), one line
// on stderr, this rank's dump RUN_DIR/flight_recorder/rank<R>.json, a wait (at most
// `grace_s`) for the dumps of the ranks that are neither dead nor silent; the first rank
// then reads all dumps and writes the verdict (explain_hang) to
// RUN_DIR/flight_recorder/report.txt and stderr (the others wait for it, at most
// `grace_s`: a launcher ends the job when the first process exits); then every watched
// communicator is aborted (ncclCommAbort), the rank says it is leaving and waits (at
// most `grace_s`) until every rank that dumped has said so too, so that no rank is
// killed by the launcher before its last line, and the process ends with kExitCode. Each
// step is told over the liveness service (dumped, verdict, exiting) and also left as a
// file, which a rank without the service reads instead. The
// training thread, if it asks to enqueue another operation meanwhile, is parked (it
// must not touch an aborted communicator). Checkpoints are committed by rename
// (core/atomic_file.hpp), so ending the process at any point leaves the last committed
// one intact.
//
// SIGUSR1 (which also asks the trainer to save and stop) and dump() write a live dump
// without tripping.
//
// Off (no thread, nothing recorded, no probes made) until start(): `train` and `eval`
// start it (app/process/device_watchdog.hpp) for runs on CUDA with more than one process
// and a timeout > 0.
//
// The verdict (explain_hang) reads the rows' states: a member that entered fewer
// operations of a communicator never entered the one its peers wait in; a member whose
// row of that operation is still enqueued (never started) entered it, but its stream is
// busy with earlier work (compute, or an earlier operation); a started row is in the
// collective, waiting for a peer; every member started and none completed: the
// collective itself is stuck.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mtnlg::parallel {

enum class OpState { enqueued, started, completed };
const char* op_state_name(OpState s);

// One operation's (or one graph replay's) completion, as its backend sees it.
class OpProbe {
 public:
  virtual ~OpProbe() = default;
  // Where the operation is; never blocks (the watchdog thread calls it while the
  // training thread may be blocked in the operation).
  virtual OpState poll() = 0;
};

// What the backend hands the recorder for one of its communicators.
struct WatchedComm {
  std::string group;             // "tp", "pp", "dp", "embedding", "mp"
  std::string channel;           // the NCCL communicator within the group: "coll", "up", "down"
  std::vector<int64_t> members;  // world ranks in group rank order
  int64_t group_rank = 0;
  std::function<std::string()> async_error;  // "" or the error's name (ncclRemoteError ...); never blocks
  std::function<void()> abort;               // ncclCommAbort
};

// Where the training thread is: set by the trainer and the pipeline executor, copied into
// every row recorded. `phase` must be a string literal.
struct OpContext {
  int64_t iteration = -1;    // 1-based
  int64_t micro_batch = -1;  // -1: outside the micro batches (gradient reduction, optimizer)
  int64_t chunk = -1;        // virtual pipeline chunk on this rank
  const char* phase = "setup";
};
std::string describe_context(const OpContext& c, int64_t stage);

// One collective a CUDA graph captured (no probe: the replay gets one).
struct CapturedOp {
  int comm = 0;
  const char* op = "";
  int64_t peer = -1;
  int64_t bytes = 0;
  DType dtype = DType::f32;
};

struct WatchdogOptions {
  double timeout_s = 600;  // an operation pending longer trips the watchdog
  std::string
      run_dir;  // the dumps, the report (and without a liveness service the markers) go to RUN_DIR/flight_recorder
  std::string token;  // the same on every rank of this run (files of earlier runs are ignored)
  int64_t rank = 0, world = 1;
  int64_t stage = 0;  // this rank's pipeline stage (for the dump's context)
  std::string coord;  // "tp=1,pp=1,dp=0", for the dump and the messages
  double poll_s = 0.05;
  double grace_s = 10;     // how long a tripped rank waits for the other ranks' dumps
  double pause_gap_s = 3;  // a gap between two passes longer than this: this process was stopped
  // The run's liveness service (rank 0's, parallel/liveness.hpp): port 0 = none (a single
  // process, or a test); then peers' deaths are left to the timeout.
  std::string liveness_host;
  int liveness_port = 0;
  double connect_s = 30;  // how long to retry reaching it
  size_t ring = 2048;
};

class Watchdog {
 public:
  // The ranks' agreed exit status when the watchdog ends a run.
  static constexpr int kExitCode = 3;

  // Whether rows are recorded (between start() and stop()).
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // The backend's probe factory: makes a probe and marks the start on `stream` now;
  // `end` marks the end (after the operation is enqueued); `thread_init` (optional) runs
  // first on the watchdog thread (CUDA: makes the process's device current there).
  struct ProbeFactory {
    std::function<std::shared_ptr<OpProbe>(void* stream)> begin;
    std::function<void(OpProbe&, void* stream)> end;
    std::function<void()> thread_init;
  };
  void set_probe_factory(ProbeFactory f);
  bool has_probe_factory() const;

  // Registers a communicator; returns its id. Its rows outlive it; drop_comm (its
  // destructor) stops the polling of its error and its abort.
  int add_comm(WatchedComm c);
  void drop_comm(int comm);

  // Called by the training thread before it enqueues an operation: parks the thread for
  // good once the watchdog has tripped, or after inject_hang() (a rank that stops
  // entering collectives).
  void before_op();
  // Records an operation on communicator `comm` enqueued with `probe` (nullptr while
  // disabled). `peer` (group rank) >= 0 for point-to-point.
  void record(int comm, const char* op, int64_t peer, int64_t bytes, DType dt, std::shared_ptr<OpProbe> probe);
  // While a stream captures a CUDA graph: the collective is noted for the graph instead.
  void note_captured(int comm, const char* op, int64_t peer, int64_t bytes, DType dt);
  // The collectives noted since the last call (a graph's capture).
  std::vector<CapturedOp> take_captured();
  // Launches a graph (`launch`) whose capture recorded `ops`: one probe on `stream` around
  // it, a row per op with fresh sequence numbers (each replay enters them again).
  void replay(const std::vector<CapturedOp>& ops, void* stream, const std::function<void()>& launch);

  void set_context(const OpContext& c);
  OpContext context() const;
  // Shorthands: a new iteration (outside any micro batch, phase "data"); the micro batch,
  // chunk and phase within the current iteration.
  void set_iteration(int64_t iteration);
  void set_phase(int64_t micro_batch, int64_t chunk, const char* phase);

  // configure() turns recording on and connects to the liveness service, without a
  // thread (tests drive check() themselves); start() is configure() plus the thread.
  // An unreachable service is warned about once: the watchdog then goes on without it.
  void configure(const WatchdogOptions& o);
  void start(const WatchdogOptions& o);
  void stop();  // joins the thread, says goodbye to the liveness service; recording stops

  // What the watchdog has cost this process so far: filesystem calls made by its thread
  // (none in the steady state), messages it sent and received over the liveness
  // service, and the seconds since configure().
  struct Stats {
    uint64_t fs_calls = 0, sent = 0, received = 0;
    double seconds = 0, paused_s = 0;
  };
  Stats stats() const;

  // Writes RUN_DIR/flight_recorder/rank<R>.json with `reason`; returns its path.
  std::string dump(const std::string& reason);
  // This rank's recorder as JSON text (what dump() writes).
  std::string dump_json(const std::string& reason) const;

  // Testing aid (MTNLG_FAULT_INJECT mode=hang): from now on this process enters no
  // operation; the training thread parks in before_op().
  void inject_hang() { hang_.store(true); }

  // One pass of the watchdog's checks at time `now` (seconds since the epoch): the
  // reason to trip ("" = none) and whether this rank found it itself (else another
  // rank's marker told it). `mono` (a monotonic clock; < 0: read it now) tells a pause
  // of this process from a pass on time. The thread calls it; tests call it directly.
  struct Trip {
    std::string reason;
    bool origin = true;
  };
  Trip check(double now, double mono = -1);
  // What the thread does on `reason` (the tripping sequence above, ending the process);
  // `origin`: this rank detected it (writes the marker and the verdict).
  [[noreturn]] void trip(const std::string& reason, bool origin);
  bool dumped_this_trip(int64_t rank) const;  // rank's dump is of this run's trip
  // Whether peer `r` has reached a step of the trip ("dumped", "verdict", "exiting"), as
  // the liveness service told it (or, without one, as its file says).
  bool peer_reached(int64_t r, const char* step) const;
  bool peer_gone(int64_t r) const;  // dead or silent, as the liveness service told
  template <typename Pred>
  bool every_peer(Pred pred) const;  // pred(r) for every other rank r
  void leave_together();             // wait until every tripped rank is leaving

  // SIGUSR1's handler: asks the thread for a live dump (async-signal-safe).
  void request_dump() { dump_requested_.store(true); }

  Watchdog();
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  struct State;
  void loop();
  std::string dir() const;
  void record_row(int comm, const char* op, int64_t peer, int64_t bytes, DType dt, std::shared_ptr<OpProbe> probe,
                  bool replay);
  void on_woken(double now, double gap);  // this process was stopped for `gap` s
  Trip liveness_news();                   // what the liveness service said since the last pass
  void pump();                            // the same during a trip: only the peers' states
  bool first_to_trip(const std::string& reason);

  std::atomic<bool> enabled_{false}, hang_{false}, tripped_{false}, dump_requested_{false};
  WatchdogOptions opt_;
  std::unique_ptr<State> s_;
};

// The process's watchdog.
Watchdog& device_watchdog();
// Seconds since the epoch (the recorder's clock: comparable across ranks of a node).
double wall_now();

// The verdict over a run's dumps (RUN_DIR/flight_recorder/rank*.json of the newest
// token): which rank the others wait for and in which operation.
struct HangVerdict {
  bool found = false;    // any dump of a tripped run
  int64_t culprit = -1;  // the rank the others wait for (-1: none identified)
  std::string culprit_coord, culprit_context;
  std::string group, channel, op;  // the operation it never entered (or never started)
  bool not_started = false;        // the culprit entered it, but its stream never started it
  uint64_t seq = 0;
  int64_t bytes = 0;
  std::string dtype;
  std::vector<int64_t> members;  // the group's world ranks
  std::vector<int64_t> waiting;  // ranks blocked on it
  std::vector<int64_t> missing;  // ranks without a dump (dead)
  std::string origin_reason;     // the first rank's reason to trip
  int64_t origin_rank = -1;
  int64_t dumps = 0, world = 0;
  std::string text;  // the verdict in sentences
};
// InputError when `dir` has no flight recorder dumps, or one is not valid JSON.
HangVerdict explain_hang(const std::string& run_dir);
// The verdict over dumps given as JSON texts (tests).
HangVerdict explain_hang_dumps(const std::vector<std::string>& dumps);

}  // namespace mtnlg::parallel
