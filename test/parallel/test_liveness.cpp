// The run's liveness service (parallel/liveness.hpp) in one process, and in forked
// processes that are stopped, continued and killed for real: a stopped peer is silent,
// not dead; a killed one is dead at once; the first abort wins; a pause of the watchdog's
// own process gives its pending operations a fresh timeout.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "parallel/flight_recorder.hpp"
#include "parallel/liveness.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::parallel;
using K = LivenessEvent::Kind;

namespace {

// Polls `c` for up to `limit_s` until an event of kind `k` arrives; returns it (rank -2:
// none came). Events of other kinds are kept in `seen`.
LivenessEvent wait_for(LivenessClient& c, K k, double limit_s, std::vector<LivenessEvent>* seen = nullptr) {
  const double t0 = monotonic_now();
  while (monotonic_now() - t0 < limit_s) {
    for (const LivenessEvent& e : c.poll()) {
      if (e.kind == k) return e;
      if (seen) seen->push_back(e);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return {k, -2, 0, ""};
}

// Events that arrive within `limit_s`.
std::vector<LivenessEvent> drain(LivenessClient& c, double limit_s) {
  std::vector<LivenessEvent> all;
  const double t0 = monotonic_now();
  while (monotonic_now() - t0 < limit_s) {
    for (const LivenessEvent& e : c.poll()) all.push_back(e);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return all;
}

struct FakeProbe final : OpProbe {
  OpState state = OpState::enqueued;
  OpState poll() override { return state; }
};

}  // namespace

TEST_CASE("liveness: the pause clock tells a stopped process from a running one", "[parallel]") {
  PauseClock p(3.0);
  CHECK(p.tick(100.0) == 0);
  CHECK(p.tick(100.05) == 0);
  CHECK(p.tick(102.9) == 0);  // late, but within the limit
  CHECK(p.tick(140.0) == Approx(37.1));
  CHECK(p.tick(140.05) == 0);
  CHECK(p.paused_total() == Approx(37.1));
}

TEST_CASE("liveness: goodbye, death, the first abort, trip steps, a late hello, closing", "[parallel]") {
  auto server = std::make_unique<LivenessServer>(4, 0);
  const std::string host = "127.0.0.1";
  LivenessClient c0(host, server->port(), 0, 5);
  {
    LivenessClient c1(host, server->port(), 1, 5);
    wait_for(c0, K::closing, 0.2);
  }  // c1 says bye: it ended normally, nobody hears of it
  CHECK(drain(c0, 0.3).empty());
  auto c2 = std::make_unique<LivenessClient>(host, server->port(), 2, 5);
  wait_for(c0, K::closing, 0.2);
  c2->drop();  // closes without bye: its process ended
  const LivenessEvent dead = wait_for(c0, K::dead, 2);
  CHECK(dead.rank == 2);
  CHECK(dead.seconds > 1e9);  // rank 0's wall clock

  LivenessClient c3(host, server->port(), 3, 5);
  c3.send("abort timeout: operation #7");
  const LivenessEvent a = wait_for(c0, K::abort, 2);
  CHECK(a.rank == 3);
  CHECK(a.text == "timeout: operation #7");
  c0.send("abort timeout: operation #9");  // later: dropped
  c3.send("state dumped");
  std::vector<LivenessEvent> other;
  const LivenessEvent st = wait_for(c0, K::state, 2, &other);
  CHECK(st.rank == 3);
  CHECK(st.text == "dumped");
  for (const auto& e : other) CHECK(e.kind != K::abort);  // one abort only

  // A rank that says hello late hears what happened before.
  LivenessClient c4(host, server->port(), 4, 5);
  const auto heard = drain(c4, 0.5);
  REQUIRE(heard.size() == 3);
  CHECK((heard[0].kind == K::dead && heard[0].rank == 2));
  CHECK((heard[1].kind == K::abort && heard[1].rank == 3));
  CHECK((heard[2].kind == K::state && heard[2].text == "dumped"));

  server.reset();  // rank 0 ended normally: closing, not lost
  CHECK(wait_for(c0, K::closing, 2).rank == -1);
  CHECK_FALSE(c0.open());
  CHECK(c0.stats().sent >= 2);
}

TEST_CASE("liveness: a silent client is reported once after the heartbeat timeout; a beating one never", "[parallel]") {
  LivenessServer server(3, 0.6);
  LivenessClient watcher("127.0.0.1", server.port(), 0, 5), quiet("127.0.0.1", server.port(), 1, 5);
  std::vector<LivenessEvent> all;
  const double t0 = monotonic_now();
  while (monotonic_now() - t0 < 1.5) {
    watcher.beat(monotonic_now() + 10);  // beats every pass (a clock ahead: never "too soon")
    for (const auto& e : watcher.poll()) all.push_back(e);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(all.size() == 1);
  CHECK(all[0].kind == K::silent);
  CHECK(all[0].rank == 1);
  CHECK(all[0].seconds >= 0.6);
}

TEST_CASE("liveness: a stopped process is not dead; a killed one is, within a second", "[parallel][signals]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();  // before this test starts a thread: the child only connects
  REQUIRE(child >= 0);
  if (child == 0) {  // rank 1: connects, beats, never says bye
    int port = 0;
    if (::read(fds[0], &port, sizeof port) != sizeof port) ::_exit(1);
    LivenessClient c("127.0.0.1", port, 1, 5);
    for (;;) {
      c.beat(monotonic_now());
      ::usleep(50000);
    }
  }
  LivenessServer server(2, 0);
  LivenessClient watcher("127.0.0.1", server.port(), 0, 5);
  const int port = server.port();
  REQUIRE(::write(fds[1], &port, sizeof port) == sizeof port);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(child, SIGSTOP);
  CHECK(drain(watcher, 2.0).empty());  // stopped for 2 s: no news
  ::kill(child, SIGCONT);
  CHECK(drain(watcher, 0.3).empty());
  const double t_kill = monotonic_now();
  ::kill(child, SIGKILL);
  const LivenessEvent e = wait_for(watcher, K::dead, 5);
  CHECK(e.rank == 1);
  CHECK(monotonic_now() - t_kill < 1.0);
  ::waitpid(child, nullptr, 0);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("liveness: a client whose server process died hears it as lost", "[parallel][signals]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // rank 0's process: serves, tells its port, waits to be killed
    LivenessServer s(2, 0);
    const int port = s.port();
    [[maybe_unused]] ssize_t n = ::write(fds[1], &port, sizeof port);
    for (;;) ::pause();
  }
  int port = 0;
  REQUIRE(::read(fds[0], &port, sizeof port) == sizeof port);
  LivenessClient c("127.0.0.1", port, 1, 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK(wait_for(c, K::lost, 3).rank == 0);
  CHECK_FALSE(c.open());
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("liveness: the watchdog trips on a dead peer and follows another rank's abort", "[parallel]") {
  const test::TempDir dir("liveness-wd");
  LivenessServer server(3, 0);
  Watchdog w;
  WatchdogOptions o;
  o.timeout_s = 30;
  o.run_dir = dir.str();
  o.token = "t1";
  o.rank = 0;
  o.world = 3;
  o.liveness_host = "127.0.0.1";
  o.liveness_port = server.port();
  w.configure(o);
  LivenessClient peer1("127.0.0.1", server.port(), 1, 5), peer2("127.0.0.1", server.port(), 2, 5);
  const auto first_trip = [&] {
    for (int i = 0; i < 200; ++i) {
      Watchdog::Trip t = w.check(wall_now());
      if (!t.reason.empty()) return t;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Watchdog::Trip{};
  };
  peer2.drop();
  Watchdog::Trip t = first_trip();
  CHECK(t.origin);
  CHECK_THAT(t.reason, Catch::StartsWith("dead peer: rank 2"));
  CHECK_THAT(t.reason, Catch::Contains("closed without a goodbye"));
  peer1.send("abort timeout: operation #3 all_reduce");
  t = first_trip();
  CHECK_FALSE(t.origin);
  CHECK(t.reason == "rank 1: timeout: operation #3 all_reduce");
  CHECK(w.peer_gone(2));
  CHECK_FALSE(w.peer_gone(1));
  CHECK(w.stats().fs_calls == 0);
  CHECK(w.stats().sent >= 1);  // its hello
  w.stop();
}

TEST_CASE("liveness: a pause of the watchdog's own process restarts its pending operations' timeout", "[parallel]") {
  const test::TempDir dir("liveness-pause");
  Watchdog w;
  WatchdogOptions o;
  o.timeout_s = 10;
  o.run_dir = dir.str();
  o.token = "t1";
  w.configure(o);
  const int tp = w.add_comm(WatchedComm{"tp", "coll", {0, 1}, 0, nullptr, nullptr});
  auto p = std::make_shared<FakeProbe>();
  w.record(tp, "all_reduce", -1, 64, DType::f32, p);
  // The wall clock and the monotonic one advance together; only their gaps matter.
  double now = wall_now(), mono = 1000;
  const auto pass = [&](double dt) { return w.check(now += dt, mono += dt); };
  for (int i = 0; i < 8; ++i) CHECK(pass(1).reason.empty());  // 8 s pending
  CHECK(pass(60).reason.empty());                             // stopped for a minute (every rank was: a suspended job)
  for (int i = 0; i < 9; ++i) CHECK(pass(1).reason.empty());  // 9 s since waking
  const Watchdog::Trip t = pass(1.5);                         // 10.5 s since waking: a hang after all
  CHECK_THAT(t.reason, Catch::StartsWith("timeout: operation #1 all_reduce"));
  CHECK_THAT(t.reason, Catch::Contains("after 10.5 s"));
  CHECK(w.stats().paused_s == Approx(60).margin(1.1));
  w.stop();
}

TEST_CASE("liveness: the verdict tells a culprit that died from one alive but silent", "[parallel]") {
  const test::TempDir dir("liveness-verdict");
  LivenessServer server(3, 0);
  // Ranks 0 and 1 wait in all_reduce #1 of dp (ranks 0,1,2); rank 2 left no dump.
  const auto dumps_with = [&](bool kill_rank2) {
    LivenessClient rank2("127.0.0.1", server.port(), 2, 5);
    std::vector<std::unique_ptr<Watchdog>> w;
    for (int64_t r = 0; r < 2; ++r) {
      WatchdogOptions o;
      o.timeout_s = 30;
      o.run_dir = dir.str();
      o.token = kill_rank2 ? "t2" : "t1";
      o.rank = r;
      o.world = 3;
      o.coord = fmt::format("dp={}", r);
      o.liveness_host = "127.0.0.1";
      o.liveness_port = server.port();
      w.push_back(std::make_unique<Watchdog>());
      w.back()->configure(o);
      const int dp = w.back()->add_comm(WatchedComm{"dp", "coll", {0, 1, 2}, r, nullptr, nullptr});
      w.back()->record(dp, "all_reduce", -1, 64, DType::f32, std::make_shared<FakeProbe>());
    }
    if (kill_rank2) {
      rank2.drop();
      for (int i = 0; i < 100 && !(w[0]->peer_gone(2) && w[1]->peer_gone(2)); ++i) {
        for (auto& x : w) x->check(wall_now());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    std::vector<std::string> dumps;
    for (auto& x : w) dumps.push_back(x->dump_json("timeout: operation #1 all_reduce"));
    for (auto& x : w) x->stop();
    return dumps;
  };
  const HangVerdict alive = explain_hang_dumps(dumps_with(false));
  CHECK(alive.culprit == 2);
  CHECK_THAT(alive.text, Catch::Contains("its process is alive (still connected to the liveness service) but did not "
                                         "answer: stopped (SIGSTOP, a debugger) or wedged"));
  const HangVerdict dead = explain_hang_dumps(dumps_with(true));
  CHECK(dead.culprit == 2);
  CHECK_THAT(dead.text, Catch::Contains("the process died: its connection to the liveness service closed"));
}
