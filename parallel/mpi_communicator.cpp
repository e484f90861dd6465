// MPI backend of Communicator (host buffers). Compiled only when MTNLG_HAVE_MPI.
// Every call runs under MPI_ERRORS_RETURN and turns a failure into RuntimeError
// naming the operation, the group and this process's global rank. Counts above
// INT_MAX are split into several calls where the operation allows it. With the
// collective watchdog on (parallel/watchdog.hpp) each operation is issued in its
// nonblocking form and waited for by watched_wait(), which ends the job, naming the
// rank that did not arrive, when the wait passes the timeout; off, the blocking calls.
#ifdef MTNLG_HAVE_MPI
// The C API only: Open MPI's mpi.h would otherwise pull in the deprecated C++ bindings,
// which live in a library (libmpi_cxx) we do not link.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <list>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "parallel/communicator.hpp"
#include "parallel/comm_time.hpp"
#include "parallel/watchdog.hpp"

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
      fn = o == 0 ? reduce_half<half::bf16_to_f32, half::f32_to_bf16, false>
                  : reduce_half<half::bf16_to_f32, half::f32_to_bf16, true>;
    else
      fn = o == 0 ? reduce_half<half::f16_to_f32, half::f32_to_f16, false>
                  : reduce_half<half::f16_to_f32, half::f32_to_f16, true>;
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

// ---- collective watchdog (parallel/watchdog.hpp) -----------------------------------
//
// Every MpiCommunicator owns a GroupInfo: its name, the world ranks of its members and
// how many collectives (and point-to-point operations) this rank has started on it.
// A waiting rank records what it waits for in `g_wd.current`. When a wait passes the
// timeout, the rank sends a Query to every other rank over `g_wd.side` (a duplicate of
// MPI_COMM_WORLD, so these messages can never match the program's own); each rank
// answers from inside its own wait loop with a Reply saying how many collectives it
// has started on the asker's group and what it is waiting for. No answer within the
// grace period: the rank is stopped, wedged outside MPI, or dead. Why this and not a
// per-collective arrival message: it costs nothing until something is already late
// (the normal path only polls MPI_Test), and the answers come from the ranks
// themselves, so a rank that is alive but blocked in another group's collective is
// told apart from one that is gone.

using Clock = std::chrono::steady_clock;
// A gap between two polls of a wait longer than this: the process was stopped meanwhile.
constexpr auto kPauseGap = std::chrono::seconds(3);

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct GroupInfo {
  std::string name;
  std::vector<int64_t> world_ranks;  // group rank -> world rank
  int64_t coll_seq = 0;              // collectives started on this group (split included)
  int64_t p2p_seq = 0;               // sends and receives started on it
};

// What one wait is for: collective #seq on `group`, or a transfer with `peer` (a group
// rank; -1 for collectives).
struct OpDesc {
  std::shared_ptr<GroupInfo> group;
  const char* op = "";  // all_reduce, broadcast, ..., send, recv
  int64_t seq = 0;
  int64_t peer = -1;
  int tag = 0;
};

constexpr int kQueryTag = 1, kReplyTag = 2;
constexpr size_t kNameLen = 32;

struct Query {
  int64_t round = 0;       // the asker's query count: stale replies are dropped
  int64_t group_root = 0;  // world rank of the group's rank 0 (with the name: which group)
  char group[kNameLen] = {};
};

struct Reply {
  int64_t round = 0;
  int64_t seq_on_group = -1;  // collectives started on the asked-about group; -1: not a member
  int64_t waiting = 0;        // 1 when inside a wait (always, for a rank that answers)
  int64_t wait_seq = 0;
  int64_t wait_peer = -1;  // world rank, point-to-point only
  double waited_s = 0;
  char wait_group[kNameLen] = {};
  char wait_op[kNameLen] = {};
};

void copy_name(char (&dst)[kNameLen], const std::string& src) {
  std::memset(dst, 0, kNameLen);
  std::memcpy(dst, src.data(), std::min(src.size(), kNameLen - 1));
}

struct Watchdog {
  MPI_Comm side = MPI_COMM_NULL;
  int64_t me = 0, world = 1;
  std::vector<std::string> hosts;   // by world rank
  std::vector<GroupInfo*> groups;   // live communicators of this process
  const OpDesc* current = nullptr;  // what this rank waits for now
  Clock::time_point current_since;
  int64_t round = 0;
  std::deque<Query> queries;  // send buffers of queries: kept, they are few (timeouts only)
  std::list<std::pair<Reply, MPI_Request>> replies_out;
};
Watchdog& g_wd = *new Watchdog;  // never destroyed: communicators may outlive static destruction order

std::string host_of(int64_t world_rank) {
  return world_rank >= 0 && world_rank < static_cast<int64_t>(g_wd.hosts.size())
             ? g_wd.hosts[static_cast<size_t>(world_rank)]
             : std::string();
}

void fill_waiting(Reply& r) {
  if (!g_wd.current) return;
  const OpDesc& d = *g_wd.current;
  r.waiting = 1;
  r.wait_seq = d.seq;
  r.wait_peer = d.peer >= 0 ? d.group->world_ranks[static_cast<size_t>(d.peer)] : -1;
  r.waited_s = seconds_since(g_wd.current_since);
  copy_name(r.wait_group, d.group->name);
  copy_name(r.wait_op, d.op);
}

// Answers every query that has arrived; forgets replies whose send has completed.
void serve_queries() {
  if (g_wd.side == MPI_COMM_NULL) return;
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, g_wd.side, &flag, &st) != MPI_SUCCESS || !flag) break;
    Query q;
    if (MPI_Recv(&q, static_cast<int>(sizeof q), MPI_BYTE, st.MPI_SOURCE, kQueryTag, g_wd.side, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      break;
    q.group[kNameLen - 1] = '\0';
    auto& out = g_wd.replies_out.emplace_back();
    Reply& r = out.first;
    r.round = q.round;
    for (const GroupInfo* g : g_wd.groups)
      if (g->name == q.group && !g->world_ranks.empty() && g->world_ranks.front() == q.group_root)
        r.seq_on_group = g->coll_seq;
    fill_waiting(r);
    out.second = MPI_REQUEST_NULL;
    MPI_Isend(&r, static_cast<int>(sizeof r), MPI_BYTE, st.MPI_SOURCE, kReplyTag, g_wd.side, &out.second);
  }
  for (auto it = g_wd.replies_out.begin(); it != g_wd.replies_out.end();) {
    int done = 1;
    if (it->second != MPI_REQUEST_NULL) MPI_Test(&it->second, &done, MPI_STATUS_IGNORE);
    it = done ? g_wd.replies_out.erase(it) : std::next(it);
  }
}

void sleep_us(int us) { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

std::string where(const Reply& r) {
  std::string grp(r.wait_group, strnlen(r.wait_group, kNameLen)), op(r.wait_op, strnlen(r.wait_op, kNameLen));
  if (r.wait_peer >= 0)
    return fmt::format("it is waiting in {} with rank {} (group {}) since {:.1f} s", op, r.wait_peer, grp, r.waited_s);
  return fmt::format("it is waiting in collective #{} ({}, group {}) since {:.1f} s", r.wait_seq, op, grp, r.waited_s);
}

bool test_all(std::vector<MPI_Request>& reqs, MPI_Status* st, const OpDesc& d) {
  int flag = 0;
  check(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, st), d.op, d.group->name);
  return flag != 0;
}

// The wait that passed the timeout: ask, judge, report, abort. Returns only when the
// operation completes after all (a late rank arrived while we were asking).
// Sends this round's question (where are you?) to every other rank over the side channel.
void ask_everyone(int64_t round, const OpDesc& d) {
  if (g_wd.side == MPI_COMM_NULL) return;
  Query& q = g_wd.queries.emplace_back();
  q.round = round;
  q.group_root = d.group->world_ranks.front();
  copy_name(q.group, d.group->name);
  for (int64_t r = 0; r < g_wd.world; ++r) {
    if (r == g_wd.me) continue;
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(&q, static_cast<int>(sizeof q), MPI_BYTE, static_cast<int>(r), kQueryTag, g_wd.side, &req) ==
        MPI_SUCCESS)
      MPI_Request_free(&req);  // the buffer lives in g_wd.queries
  }
}

// Takes the replies to `round` that have arrived into `got`; returns how many were new.
int64_t take_replies(int64_t round, std::vector<std::optional<Reply>>& got) {
  int64_t added = 0;
  for (;;) {
    int flag = 0;
    MPI_Status rs;
    if (g_wd.side == MPI_COMM_NULL || MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, g_wd.side, &flag, &rs) != MPI_SUCCESS ||
        !flag)
      break;
    Reply r;
    if (MPI_Recv(&r, static_cast<int>(sizeof r), MPI_BYTE, rs.MPI_SOURCE, kReplyTag, g_wd.side, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      break;
    auto& slot = got[static_cast<size_t>(rs.MPI_SOURCE)];
    if (r.round == round && !slot) {
      slot = r;
      ++added;
    }
  }
  return added;
}

// Who is where, judged from the replies. Collective: a member arrived when it has started
// collective #seq on this group. Point-to-point: the peer is the one we wait for.
struct Verdict {
  std::vector<int64_t> missing_silent, missing_elsewhere, arrived, silent_anywhere;
};
Verdict judge(const std::vector<std::optional<Reply>>& got, const OpDesc& d) {
  Verdict v;
  std::vector<int64_t> members;
  if (d.peer >= 0)
    members.push_back(d.group->world_ranks[static_cast<size_t>(d.peer)]);
  else
    members = d.group->world_ranks;
  for (int64_t m : members) {
    const auto& r = got[static_cast<size_t>(m)];
    if (m == g_wd.me)
      v.arrived.push_back(m);
    else if (!r)
      v.missing_silent.push_back(m);
    else if (d.peer < 0 && r->seq_on_group >= d.seq)
      v.arrived.push_back(m);
    else
      v.missing_elsewhere.push_back(m);
  }
  for (int64_t r = 0; r < g_wd.world; ++r)
    if (!got[static_cast<size_t>(r)]) v.silent_anywhere.push_back(r);
  return v;
}

// The one-line report: the rank that did not arrive and where it is instead.
std::string timeout_line(const Verdict& v, const std::vector<std::optional<Reply>>& got, const OpDesc& d, double waited,
                         double timeout) {
  const std::string what =
      d.peer >= 0 ? fmt::format("{} (rank {} waits for it, tag {}, group {})", d.op, g_wd.me, d.tag, d.group->name)
                  : fmt::format("collective #{} ({}, group {})", d.seq, d.op, d.group->name);
  std::string line;
  if (!v.missing_silent.empty() || !v.missing_elsewhere.empty()) {
    const bool silent = !v.missing_silent.empty();
    const int64_t culprit = silent ? v.missing_silent.front() : v.missing_elsewhere.front();
    line = fmt::format("error: {} did not arrive at {} after {:.1f} s: ", describe_rank(culprit, host_of(culprit)),
                       what, waited);
    line +=
        silent ? "it does not answer (stopped, hung outside MPI, or dead)" : where(*got[static_cast<size_t>(culprit)]);
    std::vector<int64_t> others;
    for (int64_t m : v.missing_silent)
      if (m != culprit) others.push_back(m);
    for (int64_t m : v.missing_elsewhere)
      if (m != culprit) others.push_back(m);
    if (!others.empty())
      line += fmt::format("; also missing: rank{} {}", others.size() > 1 ? "s" : "", fmt::join(others, ", "));
    if (!silent && !v.silent_anywhere.empty()) {
      line += fmt::format("; {} does not answer",
                          describe_rank(v.silent_anywhere.front(), host_of(v.silent_anywhere.front())));
      if (v.silent_anywhere.size() > 1) line += fmt::format(" (nor do {} more)", v.silent_anywhere.size() - 1);
    }
  } else {
    line = fmt::format(
        "error: {} did not complete after {:.1f} s although every rank of the group is in it (MPI itself is stuck)",
        what, waited);
  }
  line += fmt::format(" [seen by {}, collective timeout {:.0f} s]", describe_rank(g_wd.me, host_of(g_wd.me)), timeout);
  return line;
}

void on_timeout(std::vector<MPI_Request>& reqs, MPI_Status* st, const OpDesc& d, Clock::time_point start,
                double timeout) {
  const double grace = std::clamp(timeout / 4, 1.0, 10.0);
  const auto late = [&] {
    std::fprintf(stderr,
                 "mtnlg: warning: rank %lld: %s on group %s completed after %.1f s (collective timeout %.1f s)\n",
                 static_cast<long long>(g_wd.me), d.op, d.group->name.c_str(), seconds_since(start), timeout);
  };
  // Ask every other rank where it is; answer their questions while waiting for replies.
  const int64_t round = ++g_wd.round;
  std::vector<std::optional<Reply>> got(static_cast<size_t>(g_wd.world));
  {
    Reply self;
    self.round = round;
    self.seq_on_group = d.group->coll_seq;
    fill_waiting(self);
    got[static_cast<size_t>(g_wd.me)] = self;
  }
  ask_everyone(round, d);
  int64_t answered = 1;
  const auto asked = Clock::now();
  while (answered < g_wd.world && seconds_since(asked) < grace) {
    if (test_all(reqs, st, d)) return late();
    serve_queries();
    answered += take_replies(round, got);
    sleep_us(200);
  }
  const Verdict v = judge(got, d);
  const std::string line = timeout_line(v, got, d, seconds_since(start), timeout);

  // One report is enough. The lowest arrived rank reports at once when it knows the
  // cause (a silent member) or when nobody is silent (a mismatch: nobody knows more).
  // Everyone else keeps answering for a while, then reports and aborts too.
  const bool knows_cause = !v.missing_silent.empty() || v.silent_anywhere.empty();
  const bool first =
      d.peer >= 0 || (!v.arrived.empty() && *std::min_element(v.arrived.begin(), v.arrived.end()) == g_wd.me);
  if (!(knows_cause && first)) {
    const auto t = Clock::now();
    while (seconds_since(t) < 2 * grace) {
      if (test_all(reqs, st, d)) return late();
      serve_queries();
      sleep_us(500);
    }
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

// Waits for `reqs` (statuses into `st`, or MPI_STATUSES_IGNORE) under the watchdog:
// MPI_Testall, spinning, then yielding the CPU, then sleeping 0.2 ms between polls once
// the wait passes 0.1 s; queries from other ranks are answered after 10 ms.
void watched_wait(std::vector<MPI_Request>& reqs, MPI_Status* st, const OpDesc& d) {
  if (reqs.empty()) return;
  const double timeout = collective_timeout();
  if (timeout <= 0) {
    check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), st), d.op, d.group->name);
    return;
  }
  if (test_all(reqs, st, d)) return;
  const auto start = Clock::now();
  const OpDesc* outer = g_wd.current;
  const auto outer_since = g_wd.current_since;
  g_wd.current = &d;
  g_wd.current_since = start;
  struct Restore {
    const OpDesc* o;
    Clock::time_point s;
    ~Restore() {
      g_wd.current = o;
      g_wd.current_since = s;
    }
  } restore{outer, outer_since};
  auto last_serve = start;
  auto since = start;  // the timeout counts from here: the start, or the end of a pause of this process
  auto last_pass = start;
  for (int64_t i = 1;; ++i) {
    if (test_all(reqs, st, d)) return;
    if (i < 64) continue;
    const auto now = Clock::now();
    // A pass far later than the last (they are at most 0.2 ms apart): this process was
    // stopped (SIGSTOP, a suspended job). Its peers may wake later than it: they get a
    // full timeout again from now.
    if (now - last_pass > kPauseGap) since = now;
    last_pass = now;
    const double waited = std::chrono::duration<double>(now - since).count();
    if (waited >= timeout) {
      on_timeout(reqs, st, d, since, timeout);
      return;
    }
    if (waited > 0.01 && now - last_serve > std::chrono::milliseconds(1)) {
      serve_queries();
      last_serve = now;
    }
    if (waited < 0.1)
      sched_yield();
    else
      sleep_us(200);
  }
}

// MPI_Comm_dup of the world for the watchdog's messages, and every rank's host name.
void watchdog_init() {
  if (g_wd.side != MPI_COMM_NULL) return;
  int r = 0, s = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  g_wd.me = r;
  g_wd.world = s;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &g_wd.side), "MPI_Comm_dup", "world");
  MPI_Comm_set_errhandler(g_wd.side, MPI_ERRORS_RETURN);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(static_cast<size_t>(s) * MPI_MAX_PROCESSOR_NAME);
  check(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                      MPI_COMM_WORLD),
        "MPI_Allgather (host names)", "world");
  g_wd.hosts.clear();
  for (int i = 0; i < s; ++i) {
    const char* h = all.data() + static_cast<size_t>(i) * MPI_MAX_PROCESSOR_NAME;
    g_wd.hosts.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
}

class MpiRequest final : public Request {
 public:
  // `collective`: requests of a nonblocking collective, which MPI does not allow to free.
  MpiRequest(std::vector<MPI_Request> reqs, OpDesc desc, timing::StepPart part, bool collective = false)
      : reqs_(std::move(reqs)), desc_(std::move(desc)), part_(part), collective_(collective) {}
  ~MpiRequest() override {
    if (!mpi_up() || collective_) return;
    for (auto& r : reqs_)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  void wait() override {
    const CommBlockedScope blocked(part_);  // straggler detection; the step's parts
    if (reqs_.empty()) return;
    watched_wait(reqs_, MPI_STATUSES_IGNORE, desc_);
    reqs_.clear();
  }

 private:
  std::vector<MPI_Request> reqs_;
  OpDesc desc_;
  timing::StepPart part_;  // what waiting on it is in the step's parts
  bool collective_;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor) unless it is MPI_COMM_WORLD.
  MpiCommunicator(MPI_Comm comm, std::string name)
      : comm_(comm), name_(std::move(name)), info_(std::make_shared<GroupInfo>()) {
    int r = 0, s = 0;
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", name_);
    check(MPI_Comm_rank(comm_, &r), "MPI_Comm_rank", name_);
    check(MPI_Comm_size(comm_, &s), "MPI_Comm_size", name_);
    rank_ = r;
    size_ = s;
    // Which world ranks the members are, for the watchdog's questions and reports.
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    std::vector<int> in(static_cast<size_t>(s)), out(static_cast<size_t>(s));
    for (int i = 0; i < s; ++i) in[static_cast<size_t>(i)] = i;
    check(MPI_Comm_group(comm_, &mine), "MPI_Comm_group", name_);
    check(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group", "world");
    check(MPI_Group_translate_ranks(mine, s, in.data(), world, out.data()), "MPI_Group_translate_ranks", name_);
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    info_->name = name_;
    part_ = timing::comm_step_part(name_);
    recv_part_ = timing::comm_step_part(name_, true);
    info_->world_ranks.assign(out.begin(), out.end());
    g_wd.groups.push_back(info_.get());
  }
  ~MpiCommunicator() override {
    std::erase(g_wd.groups, info_.get());
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL && mpi_up()) MPI_Comm_free(&comm_);
  }
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  std::string name() const override { return name_; }
  const char* backend() const override { return "mpi"; }


  // Each collective below is one logical operation (its number N for the watchdog),
  // whatever the number of MPI calls its chunks take. With the watchdog on (the default
  // in train/eval) it runs as the nonblocking MPI call plus watched_wait; off, as the
  // blocking call.
  void do_all_reduce(void* d, int64_t n, DType dt, ReduceOp op) override {
    const CommBlockedScope blocked(part_);  // straggler detection; the step's parts
    const int64_t es = dtype_size(dt);
    const OpDesc desc = collective("all_reduce");
    std::vector<MPI_Request> reqs;
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      char* p = static_cast<char*>(d) + off * es;
      if (!watched()) {
        check(MPI_Allreduce(MPI_IN_PLACE, p, c, mpi_type(dt), mpi_op(dt, op), comm_), "MPI_Allreduce", name_);
        continue;
      }
      check(MPI_Iallreduce(MPI_IN_PLACE, p, c, mpi_type(dt), mpi_op(dt, op), comm_, &reqs.emplace_back()),
            "MPI_Iallreduce", name_);
    }
    watched_wait(reqs, MPI_STATUSES_IGNORE, desc);
    count_all_reduce(n * es);
  }
  void do_all_reduce_i64(int64_t* d, int64_t n, ReduceOp op) override {
    const CommBlockedScope blocked(part_);  // straggler detection; the step's parts
    const OpDesc desc = collective("all_reduce");
    std::vector<MPI_Request> reqs;
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      if (!watched()) {
        check(MPI_Allreduce(MPI_IN_PLACE, d + off, c, MPI_INT64_T, mpi_op(op), comm_), "MPI_Allreduce", name_);
        continue;
      }
      check(MPI_Iallreduce(MPI_IN_PLACE, d + off, c, MPI_INT64_T, mpi_op(op), comm_, &reqs.emplace_back()),
            "MPI_Iallreduce", name_);
    }
    watched_wait(reqs, MPI_STATUSES_IGNORE, desc);
    count_all_reduce(n * static_cast<int64_t>(sizeof(int64_t)));
  }
  void do_reduce_scatter(const void* in, void* out, int64_t n, DType dt) override {
    const CommBlockedScope blocked(part_);  // straggler detection; the step's parts
    check_count(n, "reduce_scatter");
    if (n == 0) return;
    const OpDesc desc = collective("reduce_scatter");
    const size_t es = static_cast<size_t>(dtype_size(dt));
    std::vector<char> tmp;
    const size_t in_bytes = static_cast<size_t>(n * size_) * es;
    if (overlaps(in, in_bytes, out, static_cast<size_t>(n) * es)) {
      tmp.assign(static_cast<const char*>(in), static_cast<const char*>(in) + in_bytes);
      in = tmp.data();
    }
    if (watched()) {
      std::vector<MPI_Request> reqs(1);
      check(MPI_Ireduce_scatter_block(in, out, static_cast<int>(n), mpi_type(dt), mpi_op(dt, ReduceOp::sum), comm_,
                                      &reqs[0]),
            "MPI_Ireduce_scatter_block", name_);
      watched_wait(reqs, MPI_STATUSES_IGNORE, desc);
    } else {
      check(MPI_Reduce_scatter_block(in, out, static_cast<int>(n), mpi_type(dt), mpi_op(dt, ReduceOp::sum), comm_),
            "MPI_Reduce_scatter_block", name_);
    }
    count_scatter_gather(static_cast<int64_t>(in_bytes));
  }
  void do_all_gather(const void* in, void* out, int64_t n, DType dt) override {
    const CommBlockedScope blocked(part_);  // straggler detection; the step's parts
    check_count(n, "all_gather");
    if (n == 0) return;
    const OpDesc desc = collective("all_gather");
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
    if (watched()) {
      std::vector<MPI_Request> reqs(1);
      check(MPI_Iallgather(sendbuf, static_cast<int>(n), mpi_type(dt), out, static_cast<int>(n), mpi_type(dt), comm_,
                           &reqs[0]),
            "MPI_Iallgather", name_);
      watched_wait(reqs, MPI_STATUSES_IGNORE, desc);
    } else {
      check(MPI_Allgather(sendbuf, static_cast<int>(n), mpi_type(dt), out, static_cast<int>(n), mpi_type(dt), comm_),
            "MPI_Allgather", name_);
    }
    count_scatter_gather(static_cast<int64_t>(out_bytes));
  }
  void do_all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                       const std::vector<int64_t>& recv_counts, DType dt) override {
    const CommBlockedScope blocked(part_);  // straggler detection; the step's parts
    const OpDesc desc = collective("all_to_all");
    std::vector<int> sc, sd, rc, rd;  // counts and displacements, in elements
    auto layout = [&](const std::vector<int64_t>& counts, std::vector<int>& c, std::vector<int>& d) {
      int64_t off = 0;
      for (int64_t n : counts) {
        check_count(n, "all_to_all");
        check_count(off, "all_to_all");
        c.push_back(static_cast<int>(n));
        d.push_back(static_cast<int>(off));
        off += n;
      }
    };
    layout(send_counts, sc, sd);
    layout(recv_counts, rc, rd);
    if (watched()) {
      std::vector<MPI_Request> reqs(1);
      check(MPI_Ialltoallv(in, sc.data(), sd.data(), mpi_type(dt), out, rc.data(), rd.data(), mpi_type(dt), comm_,
                           &reqs[0]),
            "MPI_Ialltoallv", name_);
      watched_wait(reqs, MPI_STATUSES_IGNORE, desc);
    } else {
      check(MPI_Alltoallv(in, sc.data(), sd.data(), mpi_type(dt), out, rc.data(), rd.data(), mpi_type(dt), comm_),
            "MPI_Alltoallv", name_);
    }
    count_all_to_all(send_counts, dt);
  }
  void do_broadcast(void* data, int64_t n, DType dt, int64_t root) override {
    const CommBlockedScope blocked(part_);  // straggler detection; the step's parts
    check_peer(root, "broadcast root", true);
    const OpDesc desc = collective("broadcast");
    const int64_t es = dtype_size(dt);
    std::vector<MPI_Request> reqs;
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      char* p = static_cast<char*>(data) + off * es;
      if (!watched()) {
        check(MPI_Bcast(p, c, mpi_type(dt), static_cast<int>(root), comm_), "MPI_Bcast", name_);
        continue;
      }
      check(MPI_Ibcast(p, c, mpi_type(dt), static_cast<int>(root), comm_, &reqs.emplace_back()), "MPI_Ibcast", name_);
    }
    watched_wait(reqs, MPI_STATUSES_IGNORE, desc);
    count_broadcast(n * es);
  }
  void do_send(const void* data, int64_t n, DType dt, int64_t peer, int tag) override {
    const CommBlockedScope blocked(part_);  // straggler detection; the step's parts
    check_peer(peer, "send", false);
    const OpDesc desc = p2p("send", peer, tag);
    const int64_t es = dtype_size(dt);
    std::vector<MPI_Request> reqs;
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      const char* p = static_cast<const char*>(data) + off * es;
      if (!watched()) {
        check(MPI_Send(p, c, mpi_type(dt), static_cast<int>(peer), tag, comm_), "MPI_Send", name_);
        continue;
      }
      check(MPI_Isend(p, c, mpi_type(dt), static_cast<int>(peer), tag, comm_, &reqs.emplace_back()), "MPI_Isend",
            name_);
    }
    watched_wait(reqs, MPI_STATUSES_IGNORE, desc);
    count_send(n * es);
  }
  std::unique_ptr<Request> do_isend(const void* data, int64_t n, DType dt, int64_t peer, int tag) override {
    check_peer(peer, "isend", false);
    // n == 0 sends nothing, like send() and recv() (they skip empty messages alike).
    std::vector<MPI_Request> reqs = chunked(n, dt, [&](int64_t off, int c, MPI_Request* r) {
      check(MPI_Isend(static_cast<const char*>(data) + off, c, mpi_type(dt), static_cast<int>(peer), tag, comm_, r),
            "MPI_Isend", name_);
    });
    count_send(n * dtype_size(dt));
    return std::make_unique<MpiRequest>(std::move(reqs), p2p("isend", peer, tag), part_);
  }
  // Its completion is not checked against the expected count (recv's check): a message of
  // another size with the same tag would be a bug of the caller's protocol, which MPI
  // reports as truncation when it is longer.
  std::unique_ptr<Request> do_irecv(void* data, int64_t n, DType dt, int64_t peer, int tag) override {
    check_peer(peer, "irecv", false);
    std::vector<MPI_Request> reqs = chunked(n, dt, [&](int64_t off, int c, MPI_Request* r) {
      check(MPI_Irecv(static_cast<char*>(data) + off, c, mpi_type(dt), static_cast<int>(peer), tag, comm_, r),
            "MPI_Irecv", name_);
    });
    return std::make_unique<MpiRequest>(std::move(reqs), p2p("irecv", peer, tag), recv_part_);
  }
  std::unique_ptr<Request> do_iall_reduce(void* data, int64_t n, DType dt, ReduceOp op) override {
    const int64_t es = dtype_size(dt);
    OpDesc desc = collective("iall_reduce");
    std::vector<MPI_Request> reqs;
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      MPI_Request r = MPI_REQUEST_NULL;
      check(
          MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + off * es, c, mpi_type(dt), mpi_op(dt, op), comm_, &r),
          "MPI_Iallreduce", name_);
      reqs.push_back(r);
    }
    count_all_reduce(n * es);
    return std::make_unique<MpiRequest>(std::move(reqs), std::move(desc), part_, true);
  }
  void do_recv(void* data, int64_t n, DType dt, int64_t peer, int tag) override {
    const CommBlockedScope blocked(recv_part_);  // straggler detection; the step's parts (a pp receive: the bubble)
    check_peer(peer, "recv", false);
    const OpDesc desc = p2p("recv", peer, tag);
    const int64_t es = dtype_size(dt);
    std::vector<MPI_Request> reqs;
    std::vector<int> want;
    for (int64_t off = 0; off < n; off += kChunk) {
      int c = static_cast<int>(std::min(kChunk, n - off));
      check(MPI_Irecv(static_cast<char*>(data) + off * es, c, mpi_type(dt), static_cast<int>(peer), tag, comm_,
                      &reqs.emplace_back()),
            "MPI_Irecv", name_);
      want.push_back(c);
    }
    std::vector<MPI_Status> st(reqs.size());
    watched_wait(reqs, st.data(), desc);
    for (size_t i = 0; i < st.size(); ++i) {
      int got = 0;
      MPI_Get_count(&st[i], mpi_type(dt), &got);
      if (got != want[i])
        throw_runtime("rank {}: recv on the '{}' group from rank {} (tag {}) got {} {} elements, expected {}",
                      world_rank(), name_, peer, tag, got, to_string(dt), want[i]);
    }
  }
  void barrier() override {
    const CommBlockedScope blocked(part_);  // straggler detection; the step's parts
    const OpDesc desc = collective("barrier");
    if (!watched()) {
      check(MPI_Barrier(comm_), "MPI_Barrier", name_);
      return;
    }
    std::vector<MPI_Request> reqs(1);
    check(MPI_Ibarrier(comm_, &reqs[0]), "MPI_Ibarrier", name_);
    watched_wait(reqs, MPI_STATUSES_IGNORE, desc);
  }

  std::shared_ptr<Communicator> split(int64_t color, int64_t key, const std::string& name) override {
    ++info_->coll_seq;  // a collective too (blocking: MPI has no nonblocking split)
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : static_cast<int>(color), static_cast<int>(key), &out),
          "MPI_Comm_split", name_);
    if (out == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiCommunicator>(out, name);
  }

 private:
  // The requests of one message of n elements posted in chunks of at most kChunk (MPI's
  // counts are int): post(byte offset, count, request) for each.
  template <typename F>
  static std::vector<MPI_Request> chunked(int64_t n, DType dt, F&& post) {
    std::vector<MPI_Request> reqs;
    for (int64_t off = 0; off < n; off += kChunk) {
      MPI_Request r = MPI_REQUEST_NULL;
      post(off * dtype_size(dt), static_cast<int>(std::min(kChunk, n - off)), &r);
      reqs.push_back(r);
    }
    return reqs;
  }
  static bool watched() { return collective_timeout() > 0; }
  OpDesc collective(const char* op) {
    OpDesc d;
    d.group = info_;
    d.op = op;
    d.seq = ++info_->coll_seq;
    return d;
  }
  OpDesc p2p(const char* op, int64_t peer, int tag) {
    OpDesc d;
    d.group = info_;
    d.op = op;
    d.seq = ++info_->p2p_seq;
    d.peer = peer;
    d.tag = tag;
    return d;
  }
  void check_count(int64_t n, const char* op) const {
    if (n < 0 || n > INT_MAX)
      throw_runtime("rank {}: {} of {} elements per rank on the '{}' group: at most {} supported", world_rank(), op, n,
                    name_, INT_MAX);
  }
  void check_peer(int64_t peer, const char* op, bool self_ok) const {
    if (peer < 0 || peer >= size_ || (!self_ok && peer == rank_))
      throw_runtime("rank {}: {} with peer {} on the '{}' group of {} ranks (this rank is {})", world_rank(), op, peer,
                    name_, size_, rank_);
  }

  MPI_Comm comm_;
  std::string name_;
  std::shared_ptr<GroupInfo> info_;
  int64_t rank_ = 0, size_ = 1;
  // The step's part its blocked time is charged to, and that of its receives
  // (core/step_parts.hpp: on "pp" a receive is the pipeline bubble).
  timing::StepPart part_ = timing::StepPart::other, recv_part_ = timing::StepPart::other;
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
  watchdog_init();
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
