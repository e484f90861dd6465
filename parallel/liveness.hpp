// The run's liveness service (docs/RELIABILITY.md, class 11): how the device watchdogs of
// a run learn that a peer ended, went silent or tripped, at a cost per rank that does not
// grow with the world size, and without the shared filesystem.
//
// Rank 0 serves it (a thread; TCP on an ephemeral port of every interface); every rank,
// rank 0 too, holds one connection to it. A client says `hello R` once, `beat` every
// second, during a trip `abort REASON` and `state dumped|verdict|exiting`, and `bye` when
// it ends normally. In the steady state the server says nothing; it tells every client
// what happened, once:
//   dead R T      R's connection closed without `bye` at T (rank 0's clock): its process
//                 ended, however it ended (the kernel closes an exiting process's sockets,
//                 SIGKILL included). A stopped process keeps its connection: it is not dead.
//   silent R S    R has sent nothing for S s, longer than the heartbeat timeout
//                 (parallel.heartbeat_timeout_minutes): stopped, swapping, or unreachable
//   abort R TEXT  the first rank that tripped, and why (later aborts are dropped)
//   state R WHAT  R dumped its flight recorder / wrote the verdict / is leaving
//   closing       rank 0 ended normally: no more news
// A client whose connection closes without `closing` learns that rank 0 itself died.
//
// Cost, steady state: per rank one message sent per second, none received, no file
// system call; rank 0's service receives `world` messages per second and holds `world`
// sockets. A pause of the process (SIGSTOP, a suspended Slurm job, a debugger) is not
// silence: a poll loop that finds a gap between two of its passes longer than
// PauseClock's limit was itself stopped, and the service gives every peer a fresh
// heartbeat timeout from its waking.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mtnlg::parallel {

// Tells the time a process spent stopped from the time it ran. A poll loop calls tick()
// on every pass with a monotonic `now` (seconds); a gap longer than `gap_s` since the
// previous pass was a pause (the loop polls far more often than that).
class PauseClock {
 public:
  explicit PauseClock(double gap_s = 3.0) : gap_s_(gap_s) {}
  // The length of the pause that just ended (0 when the loop ran on time).
  double tick(double now);
  double paused_total() const { return total_; }

 private:
  double gap_s_;
  double last_ = -1, total_ = 0;
};

// Seconds of a monotonic clock (not comparable across processes).
double monotonic_now();

struct LivenessEvent {
  enum class Kind { dead, silent, abort, state, closing, lost };
  Kind kind = Kind::closing;
  int64_t rank = -1;
  double seconds = 0;  // dead: rank 0's wall clock when it saw the connection close; silent: the silence
  std::string text;    // abort: the reason; state: dumped, verdict or exiting
};

// Messages counted by either end (the benchmark's figures).
struct LivenessStats {
  uint64_t sent = 0, received = 0;
};

class LivenessServer {
 public:
  // Listens on an ephemeral port of every interface and starts its thread. A client
  // silent for longer than `heartbeat_timeout_s` (0: never judged) is reported once.
  // RuntimeError when no socket can be had.
  LivenessServer(int64_t world, double heartbeat_timeout_s);
  ~LivenessServer();  // says `closing` to every client and ends the thread
  LivenessServer(const LivenessServer&) = delete;
  LivenessServer& operator=(const LivenessServer&) = delete;
  int port() const;
  LivenessStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

class LivenessClient {
 public:
  // Connects to HOST:PORT (an IPv4 address), retrying for up to `connect_s`, and says
  // hello. RuntimeError naming the address when it cannot.
  LivenessClient(const std::string& host, int port, int64_t rank, double connect_s);
  ~LivenessClient();  // says `bye` (a normal end) unless the connection is gone
  LivenessClient(const LivenessClient&) = delete;
  LivenessClient& operator=(const LivenessClient&) = delete;

  // Sends one line (without its newline); never blocks for long (a full buffer drops it).
  void send(const std::string& line);
  // Sends `beat` when a second has passed since the last message (`now`: monotonic).
  void beat(double now);
  // What has arrived; never blocks. A connection that closed without `closing` gives one
  // `lost` event.
  std::vector<LivenessEvent> poll();
  // Closes without `bye` (a tripped rank leaving: its peers know why already).
  void drop();
  bool open() const { return fd_ >= 0; }
  LivenessStats stats() const { return {sent_.load(), received_.load()}; }

 private:
  int fd_ = -1;
  int64_t rank_ = 0;
  double last_sent_ = 0;
  std::string in_;
  std::atomic<uint64_t> sent_{0}, received_{0};
};

// The address rank 0 offers its peers: MTNLG_WATCHDOG_ADDR when set (an IPv4 address),
// else the first IPv4 address of an interface that is up and not loopback, else 127.0.0.1.
std::string liveness_host();
// IPv4 text <-> a number that a double holds exactly (for the world's all-reduce).
uint32_t ipv4_to_u32(const std::string& host);
std::string u32_to_ipv4(uint32_t a);

}  // namespace mtnlg::parallel
