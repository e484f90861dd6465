// The device watchdog and flight recorder (parallel/flight_recorder.hpp) without a GPU:
// probes are fakes whose state the test sets, check() is called with chosen clocks, and
// the verdict runs over the dumps of several recorders standing for the ranks of a run.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "parallel/flight_recorder.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::parallel;
namespace fs = std::filesystem;

namespace {

struct FakeProbe final : OpProbe {
  OpState state = OpState::enqueued;
  OpState poll() override { return state; }
};

WatchdogOptions options(const std::string& dir, int64_t rank, int64_t world, double timeout = 10) {
  WatchdogOptions o;
  o.timeout_s = timeout;
  o.run_dir = dir;
  o.token = "t1";
  o.rank = rank;
  o.world = world;
  o.coord = fmt::format("r{}", rank);
  o.stage = rank / 2;
  return o;
}

WatchedComm comm(const std::string& group, const std::string& channel, std::vector<int64_t> members, int64_t group_rank,
                 std::string* error = nullptr, int* aborted = nullptr) {
  WatchedComm c;
  c.group = group;
  c.channel = channel;
  c.members = std::move(members);
  c.group_rank = group_rank;
  if (error) c.async_error = [error] { return *error; };
  if (aborted) c.abort = [aborted] { ++*aborted; };
  return c;
}

// A run directory for one test case (removed with it).
struct RunDir {
  explicit RunDir(const char* tag) : tmp(tag) {}
  test::TempDir tmp;
  operator std::string() const { return tmp.str(); }
};

}  // namespace

TEST_CASE("flight recorder: sequence numbers, states and the timeout", "[parallel]") {
  const RunDir rd("fr-timeout");
  const std::string dir = rd;
  Watchdog w;
  CHECK_FALSE(w.enabled());
  w.configure(options(dir, 0, 1, 10));
  CHECK(w.enabled());
  const int tp = w.add_comm(comm("tp", "coll", {0, 1}, 0));
  const int up = w.add_comm(comm("pp", "up", {0, 4}, 0));
  auto a = std::make_shared<FakeProbe>(), b = std::make_shared<FakeProbe>(), c = std::make_shared<FakeProbe>();
  w.set_iteration(3);
  w.set_phase(1, 0, "forward");
  w.record(tp, "all_reduce", -1, 4096, DType::f32, a);
  w.record(up, "send", 1, 512, DType::bf16, b);
  w.record(tp, "all_gather", -1, 64, DType::f32, c);
  const double t0 = wall_now();
  CHECK(w.check(t0).reason.empty());
  a->state = OpState::completed;
  b->state = OpState::started;
  CHECK(w.check(t0 + 5).reason.empty());
  // The oldest pending operation passes the timeout: the send (seq 1 of its pair).
  const Watchdog::Trip t = w.check(t0 + 11);
  CHECK(t.origin);
  CHECK_THAT(t.reason,
             Catch::Contains("timeout: operation #1 send with group rank 1 on group pp (up channel, ranks 0,4)"));
  CHECK_THAT(t.reason, Catch::Contains("512 bytes bf16"));
  CHECK_THAT(t.reason, Catch::Contains("iteration 3, stage 0 (chunk 0), micro batch 1, forward"));
  CHECK_THAT(t.reason, Catch::Contains("still started"));
  // The dump: every row, its state, and the counts per communicator.
  const auto j = nlohmann::json::parse(w.dump_json("why"));
  CHECK(j["reason"] == "why");
  REQUIRE(j["ops"].size() == 3);
  CHECK(j["ops"][0]["state"] == "completed");
  CHECK(j["ops"][0]["t_completed"].get<double>() > 0);
  CHECK(j["ops"][1]["state"] == "started");
  CHECK(j["ops"][2]["seq"] == 2);  // the second collective of tp
  CHECK(j["comms"][0]["entered"] == 2);
  CHECK(j["comms"][1]["entered_p2p"]["1"] == 1);
  // dump() writes it atomically into the run directory.
  const std::string path = w.dump("live");
  CHECK(path == dir + "/flight_recorder/rank0.json");
  CHECK(nlohmann::json::parse(std::ifstream(path))["reason"] == "live");
  w.stop();
  // Nothing but the dump in the run directory: no heartbeat or other per-rank files.
  CHECK(std::distance(fs::directory_iterator(dir + "/flight_recorder"), fs::directory_iterator{}) == 1);
}

TEST_CASE("flight recorder: the ring keeps pending rows however old", "[parallel]") {
  const RunDir rd("fr-ring");
  const std::string dir = rd;
  Watchdog w;
  WatchdogOptions o = options(dir, 0, 1);
  o.ring = 4;
  w.configure(o);
  const int dp = w.add_comm(comm("dp", "coll", {0, 2}, 0));
  auto stuck = std::make_shared<FakeProbe>();
  w.record(dp, "all_reduce", -1, 8, DType::f32, stuck);
  for (int i = 0; i < 10; ++i) {
    auto p = std::make_shared<FakeProbe>();
    p->state = OpState::completed;
    w.record(dp, "all_reduce", -1, 8, DType::f32, p);
    w.check(wall_now());
  }
  const auto j = nlohmann::json::parse(w.dump_json(""));
  CHECK(j["ops"].size() == 11);  // nothing trimmed past the pending front row
  CHECK(j["ops"][0]["state"] == "enqueued");
  stuck->state = OpState::completed;
  w.check(wall_now());
  auto p = std::make_shared<FakeProbe>();
  w.record(dp, "all_reduce", -1, 8, DType::f32, p);
  CHECK(nlohmann::json::parse(w.dump_json(""))["ops"].size() == 4);
  CHECK(nlohmann::json::parse(w.dump_json(""))["comms"][0]["entered"] == 12);
  w.stop();
}

TEST_CASE("flight recorder: asynchronous errors and, without a liveness service, a peer's marker", "[parallel]") {
  const RunDir rd("fr-trips");
  const std::string dir = rd;
  Watchdog w;
  w.configure(options(dir, 1, 3));
  std::string err;
  w.add_comm(comm("dp", "coll", {0, 1}, 1, &err));
  const double now = wall_now();
  CHECK(w.check(now).reason.empty());
  err = "ncclRemoteError (a peer failed or a connection broke)";
  Watchdog::Trip t = w.check(now);
  CHECK(t.origin);
  CHECK(t.reason ==
        "NCCL asynchronous error ncclRemoteError (a peer failed or a connection broke) on group dp (coll "
        "channel, ranks 0,1)");
  err.clear();
  // Another rank tripped first: its marker says why, and this rank follows.
  std::ofstream(dir + "/flight_recorder/abort_t1") << "0: timeout: operation #7";
  t = w.check(now);
  CHECK_FALSE(t.origin);
  CHECK(t.reason == "rank 0: timeout: operation #7");
  // An earlier run's marker (another token) is not this run's.
  fs::remove(dir + "/flight_recorder/abort_t1");
  std::ofstream(dir + "/flight_recorder/abort_t0") << "0: old";
  CHECK(w.check(now).reason.empty());
  w.stop();
}

TEST_CASE("flight recorder: captured collectives are recorded at each replay", "[parallel]") {
  const RunDir rd("fr-graphs");
  const std::string dir = rd;
  Watchdog w;
  w.configure(options(dir, 0, 2));
  const int tp = w.add_comm(comm("tp", "coll", {0, 1}, 0));
  std::shared_ptr<FakeProbe> last;
  Watchdog::ProbeFactory f;
  int ended = 0;
  f.begin = [&](void*) {
    last = std::make_shared<FakeProbe>();
    return last;
  };
  f.end = [&](OpProbe&, void*) { ++ended; };
  w.set_probe_factory(f);
  w.note_captured(tp, "all_reduce", -1, 128, DType::bf16);
  w.note_captured(tp, "all_reduce", -1, 128, DType::bf16);
  const std::vector<CapturedOp> ops = w.take_captured();
  CHECK(ops.size() == 2);
  CHECK(w.take_captured().empty());
  int launches = 0;
  w.replay(ops, nullptr, [&] { ++launches; });
  w.replay(ops, nullptr, [&] { ++launches; });
  CHECK(launches == 2);
  CHECK(ended == 2);
  auto j = nlohmann::json::parse(w.dump_json(""));
  REQUIRE(j["ops"].size() == 4);
  CHECK(j["ops"][3]["seq"] == 4);  // each replay enters the captured collectives again
  CHECK(j["ops"][3]["replay"] == true);
  last->state = OpState::completed;  // the second launch's probe: its two rows complete together
  w.check(wall_now());
  j = nlohmann::json::parse(w.dump_json(""));
  CHECK(j["ops"][1]["state"] == "enqueued");
  CHECK(j["ops"][2]["state"] == "completed");
  CHECK(j["ops"][3]["state"] == "completed");
  w.stop();
}

TEST_CASE("flight recorder: the verdict names the rank the others wait for", "[parallel]") {
  // Four ranks: tp groups {0,1} and {2,3}, pipeline pairs {0,2} and {1,3} (stage 0 sends
  // activations up, receives gradients down). At iteration 3 rank 3 stops entering: rank
  // 2 waits for it in their third tp all-reduce, rank 1 for the gradient rank 3 never
  // sends, rank 0 for the gradient rank 2 (stuck itself) never sends. The root is rank 3.
  const RunDir rd("fr-verdict");
  const std::string dir = rd;
  std::vector<std::unique_ptr<Watchdog>> w;
  std::vector<std::shared_ptr<FakeProbe>> keep;
  auto probe = [&](bool completed) {
    auto p = std::make_shared<FakeProbe>();
    if (completed) p->state = OpState::completed;
    keep.push_back(p);
    return p;
  };
  std::vector<int> tp(4), up(4), down(4);
  for (int r = 0; r < 4; ++r) {
    w.push_back(std::make_unique<Watchdog>());
    w[r]->configure(options(dir, r, 4));
    tp[r] = w[r]->add_comm(comm("tp", "coll", r < 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{2, 3}, r % 2));
    const std::vector<int64_t> pp = r % 2 == 0 ? std::vector<int64_t>{0, 2} : std::vector<int64_t>{1, 3};
    up[r] = w[r]->add_comm(comm("pp", "up", pp, r / 2));
    down[r] = w[r]->add_comm(comm("pp", "down", pp, r / 2));
    w[r]->set_iteration(3);
    w[r]->set_phase(0, 0, "forward");
    for (int k = 0; k < 2; ++k) w[r]->record(tp[r], "all_reduce", -1, 1024, DType::f32, probe(true));
  }
  for (int r : {0, 1}) {  // stage 0 finishes its forward and sends it up
    w[r]->record(tp[r], "all_reduce", -1, 1024, DType::f32, probe(true));
    w[r]->record(up[r], "send", 1, 2048, DType::f32, probe(true));
  }
  for (int r : {2, 3}) w[r]->record(up[r], "recv", 0, 2048, DType::f32, probe(true));
  w[2]->record(tp[2], "all_reduce", -1, 1024, DType::f32, probe(false));  // rank 3 never joins
  for (int r : {0, 1}) {
    w[r]->set_phase(0, 0, "recv_backward");
    w[r]->record(down[r], "recv", 1, 2048, DType::f32, probe(false));  // never sent
  }
  std::vector<std::string> dumps;
  for (int r = 0; r < 4; ++r) {
    CHECK(w[r]->check(wall_now()).reason.empty());  // the probes polled: completed rows become so
    dumps.push_back(w[r]->dump_json(r == 2 ? "timeout: operation #3 all_reduce" : "rank 2: timeout"));
  }
  HangVerdict v = explain_hang_dumps(dumps);
  CHECK(v.found);
  CHECK(v.culprit == 3);
  CHECK(v.group == "tp");
  CHECK(v.op == "all_reduce");
  CHECK(v.seq == 3);
  CHECK(v.members == std::vector<int64_t>{2, 3});
  CHECK(v.waiting == std::vector<int64_t>{2});
  CHECK(v.origin_rank == 2);
  CHECK(v.culprit_context == "iteration 3, stage 1 (chunk 0), micro batch 0, forward");
  CHECK_THAT(v.text,
             Catch::StartsWith("rank 3 (r3) is the culprit: rank 2 waits for it in all_reduce #3 (1024 bytes f32) on "
                               "group tp (ranks 2,3, coll channel), which rank 3 never entered (it entered 2 there)"));
  CHECK_THAT(v.text, Catch::Contains("rank 1 waits for it too, in other operations"));
  CHECK_THAT(v.text, Catch::Contains("Dumps from 4 of 4 ranks."));

  // Rank 3 left no dump (it died): it is still the one waited for, and named missing.
  dumps.pop_back();
  v = explain_hang_dumps(dumps);
  CHECK(v.culprit == 3);
  CHECK(v.missing == std::vector<int64_t>{3});
  CHECK_THAT(v.text, Catch::Contains("it left no flight record (the process died or was stopped)"));
  CHECK_THAT(v.text, Catch::Contains("(none from rank 3)"));

  // The files: explain_hang reads RUN_DIR/flight_recorder/rank*.json.
  for (int r = 0; r < 4; ++r) w[r]->dump(r == 2 ? "timeout: operation #3 all_reduce" : "rank 2: timeout");
  CHECK(explain_hang(dir).culprit == 3);
  for (auto& x : w) x->stop();
}

TEST_CASE("flight recorder: an asynchronous error with nobody behind names its rank", "[parallel]") {
  const RunDir rd("fr-async");
  const std::string dir = rd;
  std::vector<std::string> dumps;
  for (int r = 0; r < 2; ++r) {
    Watchdog w;
    w.configure(options(dir, r, 2));
    const int dp = w.add_comm(comm("dp", "coll", {0, 1}, r));
    w.set_iteration(2);
    auto p = std::make_shared<FakeProbe>();
    w.record(dp, "all_reduce", -1, 8, DType::f32, p);  // both entered, neither completes
    dumps.push_back(w.dump_json(r == 1 ? "NCCL asynchronous error ncclSystemError on group dp" : "rank 1: NCCL ..."));
    w.stop();
  }
  const HangVerdict v = explain_hang_dumps(dumps);
  CHECK(v.culprit == 1);
  CHECK_THAT(v.text, Catch::StartsWith("rank 1 (r1) failed on its own: NCCL asynchronous error ncclSystemError"));
}

TEST_CASE("flight recorder: a dead peer is named from the survivors' dumps", "[parallel]") {
  const RunDir rd("fr-dead");
  const std::string dir = rd;
  std::vector<std::string> dumps;
  for (int r = 0; r < 3; ++r) {  // rank 3 of 4 died: no dump
    Watchdog w;
    w.configure(options(dir, r, 4));
    w.add_comm(comm("dp", "coll", {0, 1, 2, 3}, r));
    dumps.push_back(w.dump_json(r == 0 ? "dead peer: rank 3 (tp=1,pp=0,dp=1) ended: its connection to the run's "
                                         "liveness service closed without a goodbye (the process exited or was killed)"
                                       : "rank 0: dead peer: rank 3 ..."));
    w.stop();
  }
  const HangVerdict v = explain_hang_dumps(dumps);
  CHECK(v.culprit == 3);
  CHECK(v.missing == std::vector<int64_t>{3});
  CHECK_THAT(v.text, Catch::StartsWith("rank 3 died (rank 3 (tp=1,pp=0,dp=1) ended: its connection"));
  CHECK_THAT(v.text, Catch::EndsWith("Dumps from 3 of 4 ranks (none from rank 3)."));
}

TEST_CASE("flight recorder: bad dumps are input errors", "[parallel]") {
  CHECK_THROWS_AS(explain_hang_dumps({"{not json"}), InputError);
  const RunDir rd("fr-none");
  const std::string dir = rd;
  CHECK_THROWS_WITH(explain_hang(dir), Catch::Contains("no flight recorder dumps"));
}

namespace {
// Hand-made dumps of `n` ranks in one data-parallel group {0..n-1}: each rank entered
// `entered[r]` all-reduces, the last of them in state `last[r]` (the others completed).
std::vector<std::string> dp_dumps(const std::string& dir, const std::vector<int>& entered,
                                  const std::vector<OpState>& last, int origin) {
  const int n = static_cast<int>(entered.size());
  std::vector<int64_t> members;
  for (int r = 0; r < n; ++r) members.push_back(r);
  std::vector<std::string> dumps;
  for (int r = 0; r < n; ++r) {
    Watchdog w;
    w.configure(options(dir, r, n));
    const int dp = w.add_comm(comm("dp", "coll", members, r));
    w.set_iteration(7);
    w.set_phase(-1, -1, "gradient reduction");
    for (int k = 0; k < entered[r]; ++k) {
      auto p = std::make_shared<FakeProbe>();
      p->state = k + 1 < entered[r] ? OpState::completed : last[r];
      w.record(dp, "all_reduce", -1, 4096, DType::f32, p);
    }
    CHECK(w.check(wall_now()).reason.empty());  // the probes polled into the rows
    dumps.push_back(w.dump_json(r == origin ? "timeout: operation #5 all_reduce on group dp"
                                            : fmt::format("rank {}: timeout", origin)));
    w.stop();
  }
  return dumps;
}
}  // namespace

TEST_CASE("flight recorder: the verdict tells an operation never started from one stuck in the collective",
          "[parallel]") {
  const RunDir rd("fr-started");
  const std::string dir = rd;
  using S = OpState;
  SECTION("entered but never started: the culprit's stream is busy with earlier work") {
    // Ranks 0, 1, 3 started all-reduce #5 and wait in it; rank 2 enqueued it too, but its
    // stream never reached it (a kernel before it never finished).
    const HangVerdict v =
        explain_hang_dumps(dp_dumps(dir, {5, 5, 5, 5}, {S::started, S::started, S::enqueued, S::started}, 0));
    CHECK(v.culprit == 2);
    CHECK(v.not_started);
    CHECK(v.op == "all_reduce");
    CHECK(v.seq == 5);
    CHECK(v.waiting == std::vector<int64_t>{0, 1, 3});
    CHECK_THAT(v.text,
               Catch::StartsWith("rank 2 (r2) is the culprit: ranks 0, 1, 3 wait for it in all_reduce #5 (4096 bytes "
                                 "f32) on group dp (ranks 0,1,2,3, coll channel), which rank 2 enqueued but never "
                                 "started: its stream is still busy with earlier work"));
    CHECK_THAT(v.text,
               Catch::Contains("ranks 0, 1, 3 started their operations and are stuck in them, waiting for a peer"));
  }
  SECTION("never entered, waiters started or still queued behind their own stream") {
    // Rank 3 entered only 4; ranks 0 and 1 started #5 (in the collective, waiting for
    // rank 3), rank 2 enqueued it without starting it (its own stream is behind).
    const HangVerdict v =
        explain_hang_dumps(dp_dumps(dir, {5, 5, 5, 4}, {S::started, S::started, S::enqueued, S::completed}, 0));
    CHECK(v.culprit == 3);
    CHECK_FALSE(v.not_started);
    CHECK(v.waiting == std::vector<int64_t>{0, 1, 2});
    CHECK_THAT(v.text, Catch::Contains("which rank 3 never entered (it entered 4 there)"));
    CHECK_THAT(v.text,
               Catch::Contains("ranks 0, 1 started their operations and are stuck in them, waiting for a peer"));
    CHECK_THAT(v.text,
               Catch::Contains(
                   "rank 2 enqueued its operation but has not started it (a stream still busy with earlier work)"));
    CHECK_THAT(v.text, Catch::Contains("no NCCL operation of it pending: it stopped before entering the next one"));
  }
  SECTION("the culprit's own pending operation, not started") {
    // Rank 1 never entered #5 and its #4 is still queued, never started (its stream is
    // busy with compute); a hand-made state: the verdict reads each rank's rows as given.
    const HangVerdict v = explain_hang_dumps(dp_dumps(dir, {5, 4}, {S::started, S::enqueued}, 0));
    CHECK(v.culprit == 1);
    CHECK_THAT(v.text, Catch::Contains("which rank 1 never entered (it entered 4 there)"));
    CHECK_THAT(v.text,
               Catch::Contains("its oldest pending operation: all_reduce #4 on group dp, enqueued but never started: "
                               "its stream is still busy with earlier work"));
  }
  SECTION("a rank whose own row is not started says nothing about its peers") {
    // Both entered all-reduce #3 and neither stream reached it: neither waits in it for
    // the other, so neither is named for not starting it.
    const HangVerdict v = explain_hang_dumps(dp_dumps(dir, {3, 3}, {S::enqueued, S::enqueued}, 0));
    CHECK_FALSE(v.not_started);
    CHECK(v.text.find("never started") == std::string::npos);
    CHECK_THAT(v.text, Catch::StartsWith("rank 0 (r0) failed on its own: timeout"));
  }
  SECTION("every member started it and none completed: the collective itself is stuck") {
    const HangVerdict v = explain_hang_dumps(dp_dumps(dir, {5, 5, 5}, {S::started, S::started, S::started}, 1));
    CHECK(v.culprit == -1);
    CHECK(v.group == "dp");
    CHECK(v.seq == 5);
    CHECK_THAT(v.text,
               Catch::StartsWith("no rank is behind: every member of group dp (ranks 0,1,2, coll channel) entered and "
                                 "started all_reduce #5 and none completed it: the collective itself is stuck"));
    CHECK_THAT(v.text, Catch::Contains("they were at iteration 7, stage 0, gradient reduction"));
  }
}
