// The device-collective watchdog and flight recorder (see flight_recorder.hpp). Backend
// free: the NCCL communicator supplies the probes (CUDA events) and the abort calls.
#include "parallel/flight_recorder.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "parallel/liveness.hpp"
#include "parallel/watchdog.hpp"

namespace mtnlg::parallel {

namespace fs = std::filesystem;
using nlohmann::json;

const char* op_state_name(OpState s) {
  switch (s) {
    case OpState::enqueued: return "enqueued";
    case OpState::started: return "started";
    case OpState::completed: return "completed";
  }
  return "?";
}

double wall_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string describe_context(const OpContext& c, int64_t stage) {
  std::string s =
      c.iteration >= 0 ? fmt::format("iteration {}", c.iteration) : std::string("before the first iteration");
  s += fmt::format(", stage {}", stage);
  if (c.chunk >= 0) s += fmt::format(" (chunk {})", c.chunk);
  if (c.micro_batch >= 0) s += fmt::format(", micro batch {}", c.micro_batch);
  s += fmt::format(", {}", c.phase);
  return s;
}

struct Watchdog::State {
  struct CommRec {
    WatchedComm c;
    uint64_t coll = 0;                // collectives entered
    std::map<int64_t, uint64_t> p2p;  // point-to-point operations entered, per peer (group rank)
  };
  struct Row {
    uint64_t id = 0;
    int comm = 0;
    uint64_t seq = 0;
    const char* op = "";
    int64_t peer = -1, bytes = 0;
    DType dt = DType::f32;
    OpState state = OpState::enqueued;
    double t_enq = 0, t_start = 0, t_done = 0;
    double t_age = 0;  // its timeout counts from here: t_enq, or the end of a pause of this process
    OpContext ctx;
    bool replay = false;
    std::shared_ptr<OpProbe> probe;
  };
  mutable std::mutex mu;
  ProbeFactory factory;
  bool has_factory = false;
  std::vector<CommRec> comms;
  std::deque<Row> ring;
  size_t done_prefix = 0;  // leading rows of `ring` known complete: a poll starts after them
  uint64_t next_id = 0;
  OpContext ctx;
  std::vector<CapturedOp> captured;
  std::thread thread;
  std::atomic<bool> stop{false};
  // The liveness service and what it told (the watchdog thread's; under mu).
  std::unique_ptr<LivenessClient> live;
  PauseClock pause;
  std::map<int64_t, double> dead;                    // rank -> when its process ended (rank 0's clock)
  std::map<int64_t, double> silent;                  // rank -> seconds of silence when told
  std::map<int64_t, std::set<std::string>> reached;  // rank -> trip steps it told
  int64_t abort_rank = -1;                           // the first rank to trip, as the service told
  std::atomic<uint64_t> fs_calls{0};                 // filesystem calls by the watchdog's own checks
  double t_configured = 0;
};

Watchdog::Watchdog() : s_(std::make_unique<State>()) {}
Watchdog::~Watchdog() {
  if (s_->thread.joinable()) {  // a process that never called stop(): end the thread quietly
    s_->stop = true;
    s_->thread.join();
  }
}

Watchdog& device_watchdog() {
  static Watchdog* w = new Watchdog;  // never destroyed: the thread may outlive static destruction order
  return *w;
}

void Watchdog::set_probe_factory(ProbeFactory f) {
  std::lock_guard lock(s_->mu);
  s_->factory = std::move(f);
  s_->has_factory = true;
}
bool Watchdog::has_probe_factory() const {
  std::lock_guard lock(s_->mu);
  return s_->has_factory;
}

int Watchdog::add_comm(WatchedComm c) {
  std::lock_guard lock(s_->mu);
  s_->comms.push_back({std::move(c), 0, {}});
  return static_cast<int>(s_->comms.size() - 1);
}

void Watchdog::drop_comm(int comm) {
  std::lock_guard lock(s_->mu);
  auto& c = s_->comms.at(static_cast<size_t>(comm)).c;
  c.async_error = nullptr;
  c.abort = nullptr;
}

void Watchdog::before_op() {
  if (!hang_.load(std::memory_order_relaxed) && !tripped_.load(std::memory_order_relaxed)) return;
  if (hang_) {
    std::fprintf(stderr, "mtnlg: rank %lld: MTNLG_FAULT_INJECT hang: this rank enters no further collective\n",
                 static_cast<long long>(opt_.rank));
    std::fflush(stderr);
  }
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the watchdog thread ends the process
}

void Watchdog::record_row(int comm, const char* op, int64_t peer, int64_t bytes, DType dt,
                          std::shared_ptr<OpProbe> probe, bool replay) {
  // Called with s_->mu held.
  auto& c = s_->comms.at(static_cast<size_t>(comm));
  State::Row r;
  r.id = s_->next_id++;
  r.comm = comm;
  r.seq = peer >= 0 ? ++c.p2p[peer] : ++c.coll;
  r.op = op;
  r.peer = peer;
  r.bytes = bytes;
  r.dt = dt;
  r.t_enq = wall_now();
  r.t_age = r.t_enq;
  r.ctx = s_->ctx;
  r.replay = replay;
  r.probe = std::move(probe);
  if (!r.probe) r.state = OpState::completed;  // nothing to watch (recorded for the counts only)
  s_->ring.push_back(std::move(r));
  // Trim completed rows from the front; a pending row stays however old it is.
  while (s_->ring.size() > opt_.ring && s_->ring.front().state == OpState::completed) {
    s_->ring.pop_front();
    if (s_->done_prefix > 0) --s_->done_prefix;
  }
}

void Watchdog::record(int comm, const char* op, int64_t peer, int64_t bytes, DType dt, std::shared_ptr<OpProbe> probe) {
  std::lock_guard lock(s_->mu);
  record_row(comm, op, peer, bytes, dt, std::move(probe), false);
}

void Watchdog::note_captured(int comm, const char* op, int64_t peer, int64_t bytes, DType dt) {
  std::lock_guard lock(s_->mu);
  s_->captured.push_back({comm, op, peer, bytes, dt});
}

std::vector<CapturedOp> Watchdog::take_captured() {
  std::lock_guard lock(s_->mu);
  return std::exchange(s_->captured, {});
}

void Watchdog::replay(const std::vector<CapturedOp>& ops, void* stream, const std::function<void()>& launch) {
  if (!enabled() || ops.empty() || !has_probe_factory()) {
    launch();
    return;
  }
  before_op();
  ProbeFactory f;
  {
    std::lock_guard lock(s_->mu);
    f = s_->factory;
  }
  std::shared_ptr<OpProbe> probe = f.begin(stream);
  launch();
  f.end(*probe, stream);
  std::lock_guard lock(s_->mu);
  for (const CapturedOp& o : ops) record_row(o.comm, o.op, o.peer, o.bytes, o.dtype, probe, true);
}

void Watchdog::set_context(const OpContext& c) {
  std::lock_guard lock(s_->mu);
  s_->ctx = c;
}
void Watchdog::set_iteration(int64_t iteration) {
  std::lock_guard lock(s_->mu);
  s_->ctx = OpContext{iteration, -1, -1, "data"};
}
void Watchdog::set_phase(int64_t micro_batch, int64_t chunk, const char* phase) {
  std::lock_guard lock(s_->mu);
  s_->ctx.micro_batch = micro_batch;
  s_->ctx.chunk = chunk;
  s_->ctx.phase = phase;
}
OpContext Watchdog::context() const {
  std::lock_guard lock(s_->mu);
  return s_->ctx;
}

std::string Watchdog::dir() const { return (fs::path(opt_.run_dir) / "flight_recorder").string(); }

namespace {
std::string marker_path(const std::string& dir, const std::string& token) {
  return fmt::format("{}/abort_{}", dir, token);
}
std::string dump_path(const std::string& dir, int64_t rank) { return fmt::format("{}/rank{}.json", dir, rank); }

// Polls `done` every 20 ms until it holds or `limit_s` has passed.
template <typename Done>
void poll_until(double limit_s, Done done) {
  const double t0 = wall_now();
  while (!done() && wall_now() - t0 <= limit_s) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

double mtime(const std::string& path) {  // -1: no such file
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
}
std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::string join(const std::vector<int64_t>& m, const char* sep) {
  std::string s;
  for (int64_t r : m) {
    if (!s.empty()) s += sep;
    s += std::to_string(r);
  }
  return s;
}
std::string members_text(const std::vector<int64_t>& m) { return join(m, ","); }
}  // namespace

void Watchdog::configure(const WatchdogOptions& o) {
  MTNLG_CHECK(!s_->thread.joinable(), "the device watchdog is already running");
  opt_ = o;
  fs::create_directories(dir());
  s_->pause = PauseClock(opt_.pause_gap_s);
  s_->t_configured = wall_now();
  s_->live.reset();
  if (opt_.liveness_port > 0) {
    try {
      s_->live = std::make_unique<LivenessClient>(opt_.liveness_host, opt_.liveness_port, opt_.rank, opt_.connect_s);
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "mtnlg: warning: %s; the NCCL watchdog goes on without it: a peer that dies is found by the "
                   "collective timeout alone (set MTNLG_WATCHDOG_ADDR to an address of rank 0's host that every "
                   "rank reaches)\n",
                   e.what());
    }
  }
  s_->stop = false;
  enabled_ = true;
}

void Watchdog::start(const WatchdogOptions& o) {
  configure(o);
  s_->thread = std::thread([this] { loop(); });
}

void Watchdog::stop() {
  if (!enabled_) return;
  if (s_->thread.joinable()) {
    s_->stop = true;
    s_->thread.join();
  }
  enabled_ = false;
  s_->live.reset();  // says goodbye: this rank ended normally, it is not judged
}

Watchdog::Stats Watchdog::stats() const {
  Stats st;
  st.fs_calls = s_->fs_calls.load();
  if (s_->live) {
    const LivenessStats l = s_->live->stats();
    st.sent = l.sent;
    st.received = l.received;
  }
  st.seconds = wall_now() - s_->t_configured;
  st.paused_s = s_->pause.paused_total();
  return st;
}

void Watchdog::on_woken(double now, double gap) {
  {
    std::lock_guard lock(s_->mu);
    for (size_t i = s_->done_prefix; i < s_->ring.size(); ++i)
      if (s_->ring[i].state != OpState::completed) s_->ring[i].t_age = now;
  }
  std::fprintf(stderr,
               "mtnlg: %s: NCCL watchdog: this process was stopped for %.1f s (SIGSTOP, a suspended job); its pending "
               "operations get a full timeout again from now\n",
               describe_rank(opt_.rank, "").c_str(), gap);
  std::fflush(stderr);
}

void Watchdog::pump() { (void)liveness_news(); }

Watchdog::Trip Watchdog::liveness_news() {
  if (!s_->live || !s_->live->open()) return {};
  s_->live->beat(monotonic_now());
  Trip t;
  std::lock_guard lock(s_->mu);
  for (const LivenessEvent& e : s_->live->poll()) {
    using K = LivenessEvent::Kind;
    std::string why;
    bool origin = true;
    if (e.kind == K::dead && e.rank != opt_.rank) {
      s_->dead[e.rank] = e.seconds;
      why = fmt::format(
          "dead peer: {} ended: its connection to the run's liveness service closed without a goodbye "
          "(the process exited or was killed)",
          describe_rank(e.rank, ""));
    } else if (e.kind == K::silent && e.rank != opt_.rank) {
      s_->silent[e.rank] = e.seconds;
      why = fmt::format(
          "silent peer: {} has sent no heartbeat for {:.0f} s (parallel.heartbeat_timeout_minutes): "
          "stopped, swapped out or unreachable",
          describe_rank(e.rank, ""), e.seconds);
    } else if (e.kind == K::lost) {
      s_->dead[0] = wall_now();
      why = fmt::format("dead peer: {} ended: the run's liveness service it served closed without a goodbye",
                        describe_rank(0, ""));
    } else if (e.kind == K::abort) {
      if (s_->abort_rank < 0) s_->abort_rank = e.rank;
      if (e.rank != opt_.rank) why = fmt::format("rank {}: {}", e.rank, e.text), origin = false;
    } else if (e.kind == K::state) {
      s_->reached[e.rank].insert(e.text);
    }
    if (t.reason.empty() && !why.empty()) t = {why, origin};
  }
  return t;
}

Watchdog::Trip Watchdog::check(double now, double mono) {
  if (const double gap = s_->pause.tick(mono < 0 ? monotonic_now() : mono); gap > 0) on_woken(now, gap);
  if (Trip t = liveness_news(); !t.reason.empty()) return t;
  if (!s_->live) {  // without the liveness service, another rank's trip is its marker
    s_->fs_calls.fetch_add(1, std::memory_order_relaxed);
    if (double t = mtime(marker_path(dir(), opt_.token)); t >= 0)
      return {"rank " + read_text(marker_path(dir(), opt_.token)), false};
  }
  std::vector<std::pair<std::string, std::function<std::string()>>> errors;
  {
    std::lock_guard lock(s_->mu);
    const State::Row* oldest = nullptr;
    for (size_t i = s_->done_prefix; i < s_->ring.size(); ++i) {
      State::Row& r = s_->ring[i];
      if (r.state == OpState::completed) continue;
      const OpState now_state = r.probe ? r.probe->poll() : OpState::completed;
      if (now_state != r.state) {
        if (r.t_start == 0 && now_state != OpState::enqueued) r.t_start = now;
        if (now_state == OpState::completed) {
          r.t_done = now;
          r.probe.reset();
        }
        r.state = now_state;
      }
      if (r.state != OpState::completed && (!oldest || r.t_age < oldest->t_age)) oldest = &r;
    }
    while (s_->done_prefix < s_->ring.size() && s_->ring[s_->done_prefix].state == OpState::completed)
      ++s_->done_prefix;
    if (oldest && opt_.timeout_s > 0 && now - oldest->t_age > opt_.timeout_s) {
      const auto& c = s_->comms[static_cast<size_t>(oldest->comm)].c;
      return {
          fmt::format("timeout: {} #{} {}{} on group {} ({} channel, ranks {}), {} bytes {}, enqueued at {}, still {} "
                      "after {:.1f} s (parallel.distributed_timeout_minutes: {:.1f} s)",
                      oldest->replay ? "graph-replayed" : "operation", oldest->seq, oldest->op,
                      oldest->peer >= 0 ? fmt::format(" with group rank {}", oldest->peer) : "", c.group, c.channel,
                      members_text(c.members), oldest->bytes, to_string(oldest->dt),
                      describe_context(oldest->ctx, opt_.stage), op_state_name(oldest->state), now - oldest->t_age,
                      opt_.timeout_s),
          true};
    }
    for (const auto& c : s_->comms)
      if (c.c.async_error)
        errors.emplace_back(
            fmt::format("group {} ({} channel, ranks {})", c.c.group, c.c.channel, members_text(c.c.members)),
            c.c.async_error);
  }
  for (auto& [what, probe] : errors)
    if (std::string e = probe(); !e.empty()) return {fmt::format("NCCL asynchronous error {} on {}", e, what), true};
  return {};
}

void Watchdog::loop() {
  std::function<void()> init;
  {
    std::lock_guard lock(s_->mu);
    init = s_->factory.thread_init;
  }
  if (init) init();
  for (;;) {
    if (dump_requested_.exchange(false)) {  // also when stopping: a request is never lost
      try {
        dump("live dump (SIGUSR1)");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "mtnlg: rank %lld: flight recorder dump failed: %s\n", static_cast<long long>(opt_.rank),
                     e.what());
      }
    }
    if (s_->stop.load()) break;
    Trip t = check(wall_now());
    if (!t.reason.empty()) trip(t.reason, t.origin);
    std::this_thread::sleep_for(std::chrono::duration<double>(opt_.poll_s));
  }
}

std::string Watchdog::dump_json(const std::string& reason) const {
  std::lock_guard lock(s_->mu);
  json j;
  j["token"] = opt_.token;
  j["rank"] = opt_.rank;
  j["world"] = opt_.world;
  j["coord"] = opt_.coord;
  j["host"] = host_name();
  j["time"] = wall_now();
  j["reason"] = reason;
  j["tripped"] = tripped_.load();
  j["timeout_s"] = opt_.timeout_s;
  j["context"] = describe_context(s_->ctx, opt_.stage);
  j["iteration"] = s_->ctx.iteration;
  j["micro_batch"] = s_->ctx.micro_batch;
  j["stage"] = opt_.stage;
  j["phase"] = s_->ctx.phase;
  // What the liveness service told this rank: a culprit that left no dump is dead (its
  // process ended) or alive but silent (stopped, wedged outside NCCL).
  json dead = json::object(), silent = json::object();
  for (auto [r, t] : s_->dead) dead[std::to_string(r)] = t;
  for (auto [r, t] : s_->silent) silent[std::to_string(r)] = t;
  j["liveness"] = {
      {"connected", s_->live != nullptr}, {"dead", dead}, {"silent", silent}, {"paused_s", s_->pause.paused_total()}};
  j["comms"] = json::array();
  for (size_t i = 0; i < s_->comms.size(); ++i) {
    const auto& c = s_->comms[i];
    json p = json::object();
    for (auto [peer, n] : c.p2p) p[std::to_string(peer)] = n;
    json coords = json::array();  // the members' coordinates: a culprit that leaves no dump is still named by them
    for (int64_t m : c.c.members) coords.push_back(rank_coord(m));
    j["comms"].push_back({{"id", i},
                          {"group", c.c.group},
                          {"channel", c.c.channel},
                          {"members", c.c.members},
                          {"group_rank", c.c.group_rank},
                          {"member_coords", coords},
                          {"entered", c.coll},
                          {"entered_p2p", p}});
  }
  j["ops"] = json::array();
  for (const auto& r : s_->ring)
    j["ops"].push_back({{"comm", r.comm},
                        {"seq", r.seq},
                        {"op", r.op},
                        {"peer", r.peer},
                        {"bytes", r.bytes},
                        {"dtype", to_string(r.dt)},
                        {"state", op_state_name(r.state)},
                        {"t_enqueued", r.t_enq},
                        {"t_started", r.t_start},
                        {"t_completed", r.t_done},
                        {"context", describe_context(r.ctx, opt_.stage)},
                        {"replay", r.replay}});
  return j.dump(1);
}

std::string Watchdog::dump(const std::string& reason) {
  const std::string path = dump_path(dir(), opt_.rank);
  AtomicFile f(path);
  f.write(dump_json(reason));
  f.commit();
  return path;
}

template <typename Pred>
bool Watchdog::every_peer(Pred pred) const {
  for (int64_t r = 0; r < opt_.world; ++r)
    if (r != opt_.rank && !pred(r)) return false;
  return true;
}

bool Watchdog::first_to_trip(const std::string& reason) {
  if (s_->live && s_->live->open()) {  // the service keeps the first abort it hears
    s_->live->send("abort " + reason);
    int64_t first = -1;
    poll_until(2.0, [&] {
      pump();
      std::lock_guard lock(s_->mu);
      first = s_->abort_rank;
      return first >= 0 || !s_->live->open();
    });
    return first < 0 || first == opt_.rank;
  }
  const std::string m = marker_path(dir(), opt_.token);
  const int fd = ::open(m.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  if (fd < 0) return false;  // another rank was first: it writes the verdict
  const std::string text = fmt::format("{}: {}", opt_.rank, reason);
  [[maybe_unused]] ssize_t n = ::write(fd, text.data(), text.size());
  ::close(fd);
  return true;
}

namespace {
// A trip step's file, for a rank without the liveness service.
std::string step_path(const std::string& dir, const std::string& token, int64_t rank, const char* step) {
  return fmt::format("{}/{}_{}_rank{}", dir, step, token, rank);
}
void touch(const std::string& path) {
  if (std::FILE* f = std::fopen(path.c_str(), "w")) std::fclose(f);
}
}  // namespace

bool Watchdog::peer_gone(int64_t r) const {
  std::lock_guard lock(s_->mu);
  return s_->dead.count(r) > 0 || s_->silent.count(r) > 0;
}

bool Watchdog::peer_reached(int64_t r, const char* step) const {
  if (s_->live && s_->live->open()) {
    std::lock_guard lock(s_->mu);
    auto it = s_->reached.find(r);
    return it != s_->reached.end() && it->second.count(step) > 0;
  }
  s_->fs_calls.fetch_add(1, std::memory_order_relaxed);
  return std::string(step) == "dumped" ? dumped_this_trip(r) : mtime(step_path(dir(), opt_.token, r, step)) >= 0;
}

void Watchdog::trip(const std::string& reason, bool origin) {
  tripped_ = true;  // the training thread parks at its next operation
  const std::string me = describe_rank(opt_.rank, "");
  if (origin) origin = first_to_trip(reason);
  const auto tell = [&](const char* step) {
    if (s_->live) s_->live->send(std::string("state ") + step);
    touch(step_path(dir(), opt_.token, opt_.rank, step));
  };
  std::fprintf(stderr, "mtnlg: %s: NCCL watchdog: %s; aborting the NCCL communicators (flight recorder: %s)\n",
               me.c_str(), reason.c_str(), dump_path(dir(), opt_.rank).c_str());
  std::fflush(stderr);
  try {
    dump(reason);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mtnlg: %s: flight recorder dump failed: %s\n", me.c_str(), e.what());
  }
  tell("dumped");
  // Wait for the dumps of the ranks still there (neither dead nor silent), at most grace_s.
  poll_until(opt_.grace_s, [&] {
    pump();
    return every_peer([&](int64_t r) { return peer_gone(r) || peer_reached(r, "dumped"); });
  });
  if (origin) {
    try {
      const HangVerdict v = explain_hang(opt_.run_dir);
      AtomicFile f((fs::path(dir()) / "report.txt").string());
      f.write_line(v.text);
      f.commit();
      std::fprintf(stderr, "mtnlg: NCCL watchdog verdict: %s\n", v.text.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mtnlg: NCCL watchdog: no verdict: %s\n", e.what());
    }
    tell("verdict");
  } else {
    // The first rank writes the verdict: stay until it has (a launcher ends the job when
    // the first process exits), at most grace_s more.
    poll_until(opt_.grace_s, [&] {
      pump();
      return !every_peer([&](int64_t r) { return !peer_reached(r, "verdict"); });
    });
  }
  std::vector<std::function<void()>> aborts;
  {
    std::lock_guard lock(s_->mu);
    for (const auto& c : s_->comms)
      if (c.c.abort) aborts.push_back(c.c.abort);
  }
  for (auto& a : aborts) a();
  std::fprintf(stderr, "mtnlg: %s: NCCL watchdog: communicators aborted, exiting with status %d\n", me.c_str(),
               kExitCode);
  std::fflush(stderr);
  tell("exiting");
  leave_together();
  ::_exit(kExitCode);
}

bool Watchdog::dumped_this_trip(int64_t rank) const {
  const std::string text = read_text(dump_path(dir(), rank));
  return text.find(fmt::format("\"token\": \"{}\"", opt_.token)) != std::string::npos &&
         text.find("\"tripped\": true") != std::string::npos;
}

void Watchdog::leave_together() {
  // A launcher kills every process once the first one exits: a rank whose aborts took
  // longer would die before saying why. So each rank has said it is leaving, and waits
  // (at most grace_s) until every rank that dumped for this trip has said so too.
  poll_until(opt_.grace_s, [&] {  // a rank not part of this trip is not waited for
    pump();
    return every_peer([&](int64_t r) { return peer_reached(r, "exiting") || !peer_reached(r, "dumped"); });
  });
  // and leaves the launcher a moment to forward every rank's last line before it ends the job
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (s_->live) s_->live->drop();
}

// ---- the verdict ------------------------------------------------------------------------

namespace {

struct RankDump {
  json j;
  int64_t rank = -1;
  // group instance key -> (collectives entered, point-to-point entered per peer group rank)
  struct Counts {
    uint64_t coll = 0;
    std::map<int64_t, uint64_t> p2p;
    const json* comm = nullptr;
  };
  std::map<std::string, Counts> counts;
  std::map<int64_t, std::string> key_of;  // comm id -> key
  // Its rows still in the ring: (comm key, peer group rank or -1, sequence number) -> row.
  std::map<std::tuple<std::string, int64_t, uint64_t>, const json*> rows;
  // Its oldest row not completed (nullptr: none).
  const json* oldest_pending = nullptr;
};

std::string comm_key(const json& c) {
  std::string m;
  for (const auto& x : c.at("members")) m += std::to_string(x.get<int64_t>()) + ",";
  return c.at("group").get<std::string>() + "/" + c.at("channel").get<std::string>() + "/" + m;
}

// `from` waits for `to` in `op`: `to` never entered it (entered fewer operations of that
// communicator), or (`not_started`: `from` started it) entered it but its row never
// started: the stream that carries it on `to` is still busy with earlier work.
struct Edge {
  int64_t from = -1, to = -1;
  const json* op = nullptr;
  const json* comm = nullptr;
  bool not_started = false;
};

bool row_in(const json& op, const char* state) { return op.at("state").get<std::string>() == state; }

// What a rank's row state says about where the rank is.
std::string state_meaning(const json& op) {
  if (row_in(op, "started")) return "started: stuck in it, waiting for a peer";
  if (row_in(op, "enqueued")) return "enqueued but never started: its stream is still busy with earlier work";
  return "completed";
}

// The dumps of the newest run among `texts` (a run directory reused by a later run keeps
// older ones), by rank, with each communicator's entered counts, the rows still in the
// ring and each rank's oldest pending row.
std::map<int64_t, RankDump> newest_run_dumps(const std::vector<std::string>& texts) {
  std::vector<RankDump> all;
  for (const std::string& t : texts) {
    RankDump d;
    try {
      d.j = json::parse(t);
    } catch (const std::exception& e) {
      throw_input("flight recorder dump: not valid JSON: {}", e.what());
    }
    all.push_back(std::move(d));
  }
  if (all.empty()) return {};
  std::string token;
  double newest = -1;
  for (const auto& d : all)
    if (d.j.value("time", 0.0) > newest) {
      newest = d.j.value("time", 0.0);
      token = d.j.value("token", "");
    }
  std::map<int64_t, RankDump> by_rank;
  for (auto& d : all) {
    if (d.j.value("token", "") != token) continue;
    d.rank = d.j.at("rank").get<int64_t>();
    by_rank[d.rank] = std::move(d);
  }
  for (auto& [r, d] : by_rank) {
    for (const auto& c : d.j.at("comms")) {
      RankDump::Counts& k = d.counts[comm_key(c)];
      k.coll = c.value("entered", uint64_t{0});
      for (auto it = c.at("entered_p2p").begin(); it != c.at("entered_p2p").end(); ++it)
        k.p2p[std::stoll(it.key())] = it.value().get<uint64_t>();
      k.comm = &c;
      d.key_of[c.at("id").get<int64_t>()] = comm_key(c);
    }
    for (const auto& op : d.j.at("ops")) {
      d.rows[{d.key_of.at(op.at("comm").get<int64_t>()), op.at("peer").get<int64_t>(), op.at("seq").get<uint64_t>()}] =
          &op;
      if (!row_in(op, "completed") &&
          (!d.oldest_pending || op.at("t_enqueued").get<double>() < d.oldest_pending->at("t_enqueued").get<double>()))
        d.oldest_pending = &op;
    }
  }
  return by_rank;
}

// The origin: the rank that wrote the marker (its reason is not a peer's).
void find_origin(HangVerdict& v, const std::map<int64_t, RankDump>& by_rank) {
  double first = 1e300;
  for (const auto& [r, d] : by_rank) {
    const std::string why = d.j.value("reason", "");
    if (why.rfind("rank ", 0) == 0 || why.rfind("live dump", 0) == 0) continue;
    if (d.j.value("time", 0.0) < first) {
      first = d.j.value("time", 0.0);
      v.origin_rank = r;
      v.origin_reason = why;
    }
  }
}

// Whether rank `r`'s pending `op` (on communicator `ck`, `comm` its entry) waits for
// member `m`: `m` left no dump, entered fewer operations there, or entered `op` but (`op`
// started here) its row never started. Returns the edge's `not_started` in `not_started`.
bool waits_for(const std::map<int64_t, RankDump>& by_rank, const json& op, const std::string& ck, const json& comm,
               int64_t m, bool& not_started) {
  const uint64_t seq = op.at("seq").get<uint64_t>();
  const int64_t peer = op.at("peer").get<int64_t>();
  const int64_t my_group_rank = comm.at("group_rank").get<int64_t>();
  auto it = by_rank.find(m);
  bool behind = it == by_rank.end();
  not_started = false;
  if (!behind) {
    const auto c = it->second.counts.find(ck);
    if (c == it->second.counts.end())
      behind = true;
    else if (peer >= 0) {
      auto p = c->second.p2p.find(my_group_rank);
      behind = (p == c->second.p2p.end() ? 0 : p->second) < seq;
    } else {
      behind = c->second.coll < seq;
    }
    // It entered the operation; if this rank is inside it (started) and that one
    // never started it, this rank waits for that one's stream. (A row of this rank
    // still enqueued says nothing about the peer: its own stream has not got there.)
    if (!behind && row_in(op, "started")) {
      const auto row = it->second.rows.find({ck, peer >= 0 ? my_group_rank : -1, seq});
      not_started = row != it->second.rows.end() && row_in(*row->second, "enqueued");
    }
  }
  return behind || not_started;
}

// Who waits for whom: a pending operation waits for every member (the peer, for
// point-to-point) that has entered fewer operations on that communicator. The ranks that
// wait for someone go into `waits_for_someone`.
std::vector<Edge> wait_edges(const std::map<int64_t, RankDump>& by_rank, std::set<int64_t>& waits_for_someone) {
  std::vector<Edge> edges;
  for (const auto& [r, d] : by_rank) {
    std::map<std::string, const json*> first_pending;  // per communicator, its oldest pending op
    for (const auto& op : d.j.at("ops")) {
      if (op.at("state").get<std::string>() == "completed") continue;
      std::string key = d.key_of.at(op.at("comm").get<int64_t>());  // point-to-point: per peer too
      if (const int64_t peer = op.at("peer").get<int64_t>(); peer >= 0) {
        key += 'p';
        key += std::to_string(peer);
      }
      if (!first_pending.count(key)) first_pending[key] = &op;
    }
    for (const auto& [key, op] : first_pending) {
      const std::string ck = d.key_of.at(op->at("comm").get<int64_t>());
      const json& comm = *d.counts.at(ck).comm;
      const auto& members = comm.at("members");
      const int64_t peer = op->at("peer").get<int64_t>();
      for (size_t gi = 0; gi < members.size(); ++gi) {
        const int64_t m = members[gi].get<int64_t>();
        if (m == r || (peer >= 0 && static_cast<int64_t>(gi) != peer)) continue;
        bool not_started = false;
        if (waits_for(by_rank, *op, ck, comm, m, not_started)) {
          edges.push_back({r, m, op, &comm, not_started});
          waits_for_someone.insert(r);
        }
      }
    }
  }
  return edges;
}

// A collective every member entered and started, none completed (no edge stands for it):
// the first rank's (in rank order) oldest pending row, with that rank in `stuck_rank`;
// nullptr when there is none.
const json* stuck_collective(const std::map<int64_t, RankDump>& by_rank, int64_t& stuck_rank) {
  const json* stuck = nullptr;
  for (const auto& [r, d] : by_rank) {
    const json* op = d.oldest_pending;
    if (stuck || !op || !row_in(*op, "started") || op->at("peer").get<int64_t>() >= 0) continue;
    const std::string ck = d.key_of.at(op->at("comm").get<int64_t>());
    bool all = true;
    for (const auto& m : d.counts.at(ck).comm->at("members")) {
      bool started = false;
      if (const auto o = by_rank.find(m.get<int64_t>()); o != by_rank.end()) {
        const auto row = o->second.rows.find({ck, -1, op->at("seq").get<uint64_t>()});
        started = row != o->second.rows.end() && row_in(*row->second, "started");
      }
      all = all && started;
    }
    if (all) stuck_rank = r, stuck = op;
  }
  return stuck;
}

// The operation rank `best`'s waiters wait for it in: one it never entered (definite)
// before one it entered but never started, then the oldest. Fills the verdict's
// operation fields from it.
const Edge* culprit_operation(HangVerdict& v, const std::vector<Edge>& edges, int64_t best) {
  const Edge* e0 = nullptr;
  for (const Edge& e : edges)
    if (e.to == best && (!e0 || (e0->not_started && !e.not_started) ||
                         (e0->not_started == e.not_started &&
                          e.op->at("t_enqueued").get<double>() < e0->op->at("t_enqueued").get<double>())))
      e0 = &e;
  v.group = e0->comm->at("group").get<std::string>();
  v.channel = e0->comm->at("channel").get<std::string>();
  v.op = e0->op->at("op").get<std::string>();
  v.seq = e0->op->at("seq").get<uint64_t>();
  v.bytes = e0->op->at("bytes").get<int64_t>();
  v.dtype = e0->op->at("dtype").get<std::string>();
  for (const auto& m : e0->comm->at("members")) v.members.push_back(m.get<int64_t>());
  return e0;
}

// The ranks waiting for `best` in `e0`'s very operation (into v.waiting); the culprit's
// other waiters are returned, to be listed apart.
std::set<int64_t> split_waiters(HangVerdict& v, const std::vector<Edge>& edges, const Edge* e0, int64_t best) {
  std::set<int64_t> same, other;
  for (const Edge& e : edges)
    if (e.to == best) {
      const bool collective = e.op->at("peer").get<int64_t>() < 0 && e0->op->at("peer").get<int64_t>() < 0;
      const bool in_op = e.from == e0->from || (collective && comm_key(*e.comm) == comm_key(*e0->comm) &&
                                                e.op->at("seq") == e0->op->at("seq"));
      (in_op ? same : other).insert(e.from);
    }
  for (int64_t x : same) other.erase(x);
  v.waiting.assign(same.begin(), same.end());
  return other;
}

// Each waiter's own row: started (in the collective, waiting for the culprit) or not yet
// started (its own stream still behind).
std::string waiter_states_text(const HangVerdict& v, const std::vector<Edge>& edges, int64_t best) {
  std::string text;
  std::vector<int64_t> in_op, queued;
  for (const Edge& e : edges)
    if (e.to == best && std::count(v.waiting.begin(), v.waiting.end(), e.from) &&
        !std::count(in_op.begin(), in_op.end(), e.from) && !std::count(queued.begin(), queued.end(), e.from))
      (row_in(*e.op, "started") ? in_op : queued).push_back(e.from);
  const auto many = [](const std::vector<int64_t>& x) { return x.size() > 1; };
  if (!in_op.empty())
    text += fmt::format("; rank{} {} started {} and {} stuck in {}, waiting for a peer", many(in_op) ? "s" : "",
                        join(in_op, ", "), many(in_op) ? "their operations" : "its operation",
                        many(in_op) ? "are" : "is", many(in_op) ? "them" : "it");
  if (!queued.empty())
    text +=
        fmt::format("; rank{} {} enqueued {} but {} not started {} (a stream still busy with earlier work)",
                    many(queued) ? "s" : "", join(queued, ", "), many(queued) ? "their operations" : "its operation",
                    many(queued) ? "have" : "has", many(queued) ? "them" : "it");
  return text;
}

// Rank `r`'s coordinates as the dumps of its group peers list them ("" when none does).
std::string coord_from_peers(const std::map<int64_t, RankDump>& by_rank, int64_t r) {
  for (const auto& [rank, d] : by_rank)
    for (const auto& c : d.j.at("comms")) {
      const auto& m = c.at("members");
      const json coords = c.value("member_coords", json::array());
      for (size_t i = 0; i < m.size() && i < coords.size(); ++i)
        if (m[i].get<int64_t>() == r && !coords[i].get<std::string>().empty()) return coords[i].get<std::string>();
    }
  return "";
}

// Why rank `r` left no dump, from what the liveness service told the ranks that did: its
// process ended, or it is alive (still connected) but never answered: stopped or wedged.
std::string missing_fate(const std::map<int64_t, RankDump>& by_rank, int64_t r) {
  bool connected = false, dead = false, silent = false;
  for (const auto& [rank, d] : by_rank) {
    const json l = d.j.value("liveness", json::object());
    connected = connected || l.value("connected", false);
    dead = dead || l.value("dead", json::object()).contains(std::to_string(r));
    silent = silent || l.value("silent", json::object()).contains(std::to_string(r));
  }
  if (dead) return "the process died: its connection to the liveness service closed";
  if (silent) return "its process went silent: no heartbeat for longer than the heartbeat timeout";
  if (connected)
    return "its process is alive (still connected to the liveness service) but did not answer: stopped (SIGSTOP, a "
           "debugger) or wedged";
  return "the process died or was stopped";
}

// Where the culprit was (`d`: its dump, nullptr when it left none: `fate` says why), and,
// when its waiters wait for it to enter, its own oldest pending operation.
std::string culprit_whereabouts(const HangVerdict& v, const RankDump* d, const Edge* e0, const std::string& fate) {
  if (!d) return "; it left no flight record (" + fate + ")";
  std::string text = "; it was at " + v.culprit_context;
  if (!e0->not_started) {  // where the culprit itself is
    const json* own = d->oldest_pending;
    if (own)
      text += fmt::format(" (its oldest pending operation: {} #{} on group {}, {})", own->at("op").get<std::string>(),
                          own->at("seq").get<uint64_t>(),
                          d->j.at("comms").at(own->at("comm").get<size_t>()).at("group").get<std::string>(),
                          state_meaning(*own));
    else
      text += " (no NCCL operation of it pending: it stopped before entering the next one)";
  }
  return text;
}

// The verdict's text when rank `best` is waited for (and the verdict's fields for it):
// the operation its waiters are in, who waits in it and who in others, where each was.
std::string culprit_text(HangVerdict& v, const std::map<int64_t, RankDump>& by_rank, const std::vector<Edge>& edges,
                         int64_t best) {
  v.culprit = best;
  const Edge* e0 = culprit_operation(v, edges, best);
  const std::set<int64_t> other = split_waiters(v, edges, e0, best);
  auto it = by_rank.find(best);
  if (it != by_rank.end()) {
    v.culprit_coord = it->second.j.value("coord", "");
    v.culprit_context = it->second.j.value("context", "");
  } else {
    v.culprit_coord = coord_from_peers(by_rank, best);
  }
  const std::string waiting = join(v.waiting, ", ");
  std::string entered;
  if (it != by_rank.end()) {
    const auto c = it->second.counts.find(comm_key(*e0->comm));
    if (c != it->second.counts.end())
      entered = e0->op->at("peer").get<int64_t>() >= 0 ? "" : fmt::format(" (it entered {} there)", c->second.coll);
  }
  v.not_started = e0->not_started;
  std::string text = fmt::format(
      "rank {}{} is the culprit: rank{} {} wait{} for it in {} #{} ({} bytes {}) on group {} (ranks {}, {} "
      "channel), which rank {} {}",
      best, v.culprit_coord.empty() ? "" : " (" + v.culprit_coord + ")", v.waiting.size() > 1 ? "s" : "", waiting,
      v.waiting.size() > 1 ? "" : "s", v.op, v.seq, v.bytes, v.dtype, v.group, members_text(v.members), v.channel, best,
      e0->not_started ? "enqueued but never started: its stream is still busy with earlier work (compute, "
                        "or an earlier operation on that stream)"
                      : "never entered" + entered);
  text += waiter_states_text(v, edges, best);
  text += culprit_whereabouts(v, it == by_rank.end() ? nullptr : &it->second, e0, missing_fate(by_rank, best));
  text += fmt::format("; the waiters were at {}", e0->op->at("context").get<std::string>());
  if (!other.empty()) {
    const std::string o = join(std::vector<int64_t>(other.begin(), other.end()), ", ");
    text += fmt::format("; rank{} {} wait{} for it too, in other operations", other.size() > 1 ? "s" : "", o,
                        other.size() > 1 ? "" : "s");
  }
  return text;
}

// The verdict's text (and fields) for a collective every member started and none
// completed (`stuck`, rank `stuck_rank`'s row): no rank is behind.
std::string stuck_text(HangVerdict& v, const std::map<int64_t, RankDump>& by_rank, int64_t stuck_rank,
                       const json* stuck) {
  const auto& d = by_rank.at(stuck_rank);
  const json& comm = *d.counts.at(d.key_of.at(stuck->at("comm").get<int64_t>())).comm;
  v.group = comm.at("group").get<std::string>();
  v.channel = comm.at("channel").get<std::string>();
  v.op = stuck->at("op").get<std::string>();
  v.seq = stuck->at("seq").get<uint64_t>();
  for (const auto& m : comm.at("members")) v.members.push_back(m.get<int64_t>());
  v.waiting = v.members;
  return fmt::format(
      "no rank is behind: every member of group {} (ranks {}, {} channel) entered and started {} #{} and "
      "none completed it: the collective itself is stuck (NCCL's transport or the network between them), "
      "not a rank that failed to arrive; they were at {}",
      v.group, members_text(v.members), v.channel, v.op, v.seq, stuck->at("context").get<std::string>());
}

// The verdict's text (and culprit fields) when the origin rank failed on its own.
std::string own_failure_text(HangVerdict& v, const std::map<int64_t, RankDump>& by_rank) {
  v.culprit = v.origin_rank;
  const auto& d = by_rank.at(v.origin_rank);
  v.culprit_coord = d.j.value("coord", "");
  v.culprit_context = d.j.value("context", "");
  return fmt::format("rank {} ({}) failed on its own: {}; it was at {}", v.culprit, v.culprit_coord, v.origin_reason,
                     v.culprit_context);
}

}  // namespace

HangVerdict explain_hang_dumps(const std::vector<std::string>& texts) {
  HangVerdict v;
  std::map<int64_t, RankDump> by_rank = newest_run_dumps(texts);
  if (by_rank.empty()) return v;
  v.found = true;
  v.dumps = static_cast<int64_t>(by_rank.size());
  v.world = by_rank.begin()->second.j.value("world", int64_t{0});
  for (int64_t r = 0; r < v.world; ++r)
    if (!by_rank.count(r)) v.missing.push_back(r);
  find_origin(v, by_rank);
  std::set<int64_t> waits_for_someone;
  const std::vector<Edge> edges = wait_edges(by_rank, waits_for_someone);
  std::map<int64_t, std::set<int64_t>> waiters;
  for (const Edge& e : edges) waiters[e.to].insert(e.from);
  int64_t best = -1;
  auto better = [&](int64_t a, int64_t b) {  // a root beats a non-root, then more waiters, then the lower rank
    const bool ra = !waits_for_someone.count(a), rb = !waits_for_someone.count(b);
    if (ra != rb) return ra;
    if (waiters[a].size() != waiters[b].size()) return waiters[a].size() > waiters[b].size();
    return a < b;
  };
  for (auto& [c, w] : waiters)
    if (best < 0 || better(c, best)) best = c;
  int64_t stuck_rank = -1;
  const json* stuck = stuck_collective(by_rank, stuck_rank);
  std::string text;
  // A failure one rank saw itself (an asynchronous NCCL error) or a dead peer names its
  // rank: the others' lags are then only where each happened to be.
  const bool async = v.origin_reason.rfind("NCCL asynchronous error", 0) == 0;
  int64_t dead_peer = -1;
  if (v.origin_reason.rfind("dead peer: rank ", 0) == 0) dead_peer = std::stoll(v.origin_reason.substr(16));
  const bool silent = v.origin_reason.rfind("silent peer: rank ", 0) == 0;
  if (silent) dead_peer = std::stoll(v.origin_reason.substr(18));
  if (async && by_rank.count(v.origin_rank)) {
    text = own_failure_text(v, by_rank);
    const size_t g = v.origin_reason.find(" on group ");
    if (g != std::string::npos) v.group = v.origin_reason.substr(g + 10, v.origin_reason.find(' ', g + 10) - (g + 10));
    v.waiting.assign(waiters[v.culprit].begin(), waiters[v.culprit].end());
  } else if (dead_peer >= 0) {
    v.culprit = dead_peer;
    text = silent ? fmt::format("rank {} went silent ({})", dead_peer, v.origin_reason.substr(13))
                  : fmt::format("rank {} died ({})", dead_peer, v.origin_reason.substr(11));
    if (auto it = by_rank.find(dead_peer); it != by_rank.end())
      text += "; it was at " + it->second.j.value("context", "");
  } else if (best >= 0) {
    text = culprit_text(v, by_rank, edges, best);
  } else if (stuck && v.missing.empty() && v.origin_reason.rfind("timeout", 0) == 0) {
    text = stuck_text(v, by_rank, stuck_rank, stuck);
  } else if (!v.missing.empty()) {
    v.culprit = v.missing.front();
    text = fmt::format("rank {} left no flight record ({}); no operation was waiting on a missing peer", v.culprit,
                       missing_fate(by_rank, v.culprit));
  } else if (v.origin_rank >= 0) {
    text = own_failure_text(v, by_rank);
  } else {
    text = "no rank waits for another in the flight recorder dumps (a live dump?)";
  }
  if (v.origin_rank >= 0)
    text += fmt::format(". The watchdog tripped first on rank {}: {}", v.origin_rank, v.origin_reason);
  text += fmt::format(". Dumps from {} of {} ranks", v.dumps, v.world);
  if (!v.missing.empty()) text += fmt::format(" (none from rank {})", members_text(v.missing));
  text += ".";
  v.text = text;
  return v;
}

HangVerdict explain_hang(const std::string& run_dir) {
  const fs::path d = fs::path(run_dir) / "flight_recorder";
  std::vector<std::string> texts;
  std::error_code ec;
  if (fs::is_directory(d, ec))
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("rank", 0) == 0 && e.path().extension() == ".json") texts.push_back(read_text(e.path().string()));
    }
  if (texts.empty()) throw_input("{}: no flight recorder dumps (rank<R>.json)", d.string());
  return explain_hang_dumps(texts);
}

}  // namespace mtnlg::parallel
