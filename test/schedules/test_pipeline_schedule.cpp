// Pipeline tables, checked by running all ranks' tables together in a simulator that
// follows the executor contract of pipeline_schedule.hpp (buffered sends, blocking
// recvs, FIFO per (sender, receiver, direction)). Exhaustive for p <= 8, m <= 32,
// v <= 4: no deadlock, every send matched by exactly one recv carrying the expected
// microbatch and chunk, forward before backward, forward of k on a virtual stage only
// after the previous virtual stage's forward of k, in-flight bound, bubble size.
#include <catch2/catch.hpp>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.hpp"
#include "schedules/pipeline_schedule.hpp"

using namespace mtnlg;
using namespace mtnlg::schedules;
using Catch::Matchers::Contains;

namespace {

struct Msg {
  int64_t mb, sender_chunk;
  double time;
};

struct SimResult {
  std::string error;  // empty when everything held
  double makespan = 0;
};

// Runs the tables of ranks 0..p-1 together. Forward of one chunk takes tf, backward tb,
// communication takes no time (a recv waits for the matching send's time).
SimResult simulate(const std::vector<std::vector<PipeAction>>& tables, int64_t p, int64_t m, int64_t v, double tf,
                   double tb) {
  SimResult res;
  std::ostringstream err;
  auto fail = [&](int64_t r, const PipeAction& a, const std::string& why) {
    if (res.error.empty()) res.error = "rank " + std::to_string(r) + " at '" + to_string(a) + "': " + why;
  };
  // channel (src, dst, dir): dir 0 = activations (forward), 1 = gradients (backward)
  std::map<std::tuple<int64_t, int64_t, int>, std::deque<Msg>> ch;
  std::vector<size_t> pc(p, 0);
  std::vector<double> now(p, 0.0);
  std::vector<std::set<std::pair<int64_t, int64_t>>> fwd_done(p), bwd_done(p), got_act(p), got_grad(p);
  int64_t sends = 0, recvs = 0;

  bool progress = true;
  while (progress && res.error.empty()) {
    progress = false;
    for (int64_t r = 0; r < p && res.error.empty(); ++r) {
      while (pc[r] < tables[r].size() && res.error.empty()) {
        const PipeAction& a = tables[r][pc[r]];
        const auto key = std::make_pair(a.microbatch, a.chunk);
        const bool first_vs = r == 0 && a.chunk == 0, last_vs = r == p - 1 && a.chunk == v - 1;
        if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk >= v) {
          fail(r, a, "microbatch or chunk out of range");
          break;
        }
        bool blocked = false;
        switch (a.op) {
          case PipeOp::forward:
            if (!first_vs && !got_act[r].count(key)) fail(r, a, "forward before its input was received");
            if (!fwd_done[r].insert(key).second) fail(r, a, "forward twice");
            now[r] += tf;
            break;
          case PipeOp::backward:
            if (!fwd_done[r].count(key)) fail(r, a, "backward before forward");
            if (!last_vs && !got_grad[r].count(key)) fail(r, a, "backward before its output gradient was received");
            if (!bwd_done[r].insert(key).second) fail(r, a, "backward twice");
            now[r] += tb;
            break;
          case PipeOp::send_forward:
          case PipeOp::send_backward: {
            const bool f = a.op == PipeOp::send_forward;
            if (a.peer_stage < 0 || a.peer_stage >= p || a.peer_stage == r) fail(r, a, "bad peer");
            if (f && !fwd_done[r].count(key)) fail(r, a, "send_forward before the forward");
            if (!f && !bwd_done[r].count(key)) fail(r, a, "send_backward before the backward");
            if (f && last_vs) fail(r, a, "the last virtual stage sends activations");
            if (!f && first_vs) fail(r, a, "the first virtual stage sends gradients");
            ch[{r, a.peer_stage, f ? 0 : 1}].push_back({a.microbatch, a.chunk, now[r]});
            ++sends;
            break;
          }
          case PipeOp::recv_forward:
          case PipeOp::recv_backward: {
            const bool f = a.op == PipeOp::recv_forward;
            auto& q = ch[{a.peer_stage, r, f ? 0 : 1}];
            if (q.empty()) {
              blocked = true;
              break;
            }
            Msg msg = q.front();
            q.pop_front();
            ++recvs;
            // Expected sender: previous (forward) / next (backward) virtual stage.
            const int64_t want_peer = f ? (r + p - 1) % p : (r + 1) % p;
            const int64_t want_chunk = f ? (r == 0 ? a.chunk - 1 : a.chunk) : (r == p - 1 ? a.chunk + 1 : a.chunk);
            if (a.peer_stage != want_peer) fail(r, a, "recv from the wrong stage");
            if (msg.mb != a.microbatch || msg.sender_chunk != want_chunk)
              fail(r, a,
                   "matched a message for mb " + std::to_string(msg.mb) + " chunk " + std::to_string(msg.sender_chunk));
            (f ? got_act : got_grad)[r].insert(key);
            now[r] = std::max(now[r], msg.time);
            break;
          }
        }
        if (blocked) break;
        ++pc[r];
        progress = true;
      }
    }
  }
  if (!res.error.empty()) return res;
  for (int64_t r = 0; r < p; ++r) {
    if (pc[r] != tables[r].size()) {
      res.error = "deadlock: rank " + std::to_string(r) + " stuck at '" + to_string(tables[r][pc[r]]) + "'";
      return res;
    }
    if (static_cast<int64_t>(fwd_done[r].size()) != m * v || static_cast<int64_t>(bwd_done[r].size()) != m * v) {
      res.error = "rank " + std::to_string(r) + " did not run every forward and backward exactly once";
      return res;
    }
    res.makespan = std::max(res.makespan, now[r]);
  }
  for (auto& [k, q] : ch)
    if (!q.empty()) {
      res.error = "unmatched send from rank " + std::to_string(std::get<0>(k));
      return res;
    }
  if (sends != recvs) res.error = "sends and recvs differ in number";
  return res;
}

template <typename F>
std::vector<std::vector<PipeAction>> tables_for(int64_t p, F make) {
  std::vector<std::vector<PipeAction>> t;
  for (int64_t r = 0; r < p; ++r) t.push_back(make(r));
  return t;
}

}  // namespace

TEST_CASE("pipeline: no pipelining", "[schedules][pipeline]") {
  auto t = schedule_no_pipelining(3);
  REQUIRE(t.size() == 6);
  CHECK(t[0] == PipeAction{PipeOp::forward, 0, 0, -1});
  CHECK(t[1] == PipeAction{PipeOp::backward, 0, 0, -1});
  CHECK(max_in_flight(t) == 1);
  auto s = simulate({t}, 1, 3, 1, 1.0, 2.0);
  CHECK(s.error == "");
  CHECK(s.makespan == 9.0);
  CHECK_THROWS_AS(schedule_no_pipelining(0), InputError);
}

TEST_CASE("pipeline: 1F1B and GPipe, exhaustive p<=8 m<=32", "[schedules][pipeline]") {
  for (int64_t p = 1; p <= 8; ++p) {
    for (int64_t m = 1; m <= 32; ++m) {
      INFO("p " << p << " m " << m);
      auto t = tables_for(p, [&](int64_t r) { return schedule_1f1b(p, r, m); });
      for (int64_t r = 0; r < p; ++r) REQUIRE(max_in_flight(t[r]) == std::min(p - r, m));
      // Unit forward 1, backward 2 per stage: 1F1B takes (m + p - 1)(tf + tb), i.e. a
      // bubble of (p - 1)(tf + tb) = (p-1)/m of the ideal m (tf + tb).
      auto s = simulate(t, p, m, 1, 1.0, 2.0);
      REQUIRE(s.error == "");
      REQUIRE(s.makespan == Approx(3.0 * (m + p - 1)));
      auto g = tables_for(p, [&](int64_t r) { return schedule_gpipe(p, r, m); });
      for (int64_t r = 0; r < p; ++r) REQUIRE(max_in_flight(g[r]) == m);
      auto sg = simulate(g, p, m, 1, 1.0, 2.0);
      REQUIRE(sg.error == "");
      REQUIRE(sg.makespan == Approx(3.0 * (m + p - 1)));
    }
  }
}

TEST_CASE("pipeline: 1F1B worked example p=4 r=1 m=4", "[schedules][pipeline]") {
  auto t = schedule_1f1b(4, 1, 4);
  std::vector<std::string> ops;
  for (auto& a : t)
    if (a.op == PipeOp::forward || a.op == PipeOp::backward)
      ops.push_back((a.op == PipeOp::forward ? "F" : "B") + std::to_string(a.microbatch));
  // 2 warmup forwards, then 1F1B, then cooldown.
  CHECK(ops == std::vector<std::string>{"F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"});
  CHECK(t.front() == PipeAction{PipeOp::recv_forward, 0, 0, 0});
  CHECK(t.back() == PipeAction{PipeOp::send_backward, 3, 0, 0});
}

TEST_CASE("pipeline: interleaved 1F1B, exhaustive p<=8 m<=32 v<=4", "[schedules][pipeline]") {
  int64_t configs = 0;
  for (int64_t p = 2; p <= 8; ++p) {
    for (int64_t m = p; m <= 32; m += p) {
      for (int64_t v = 1; v <= 4; ++v) {
        INFO("p " << p << " m " << m << " v " << v);
        ++configs;
        auto t = tables_for(p, [&](int64_t r) { return schedule_interleaved_1f1b(p, r, m, v); });
        for (int64_t r = 0; r < p; ++r) {
          const int64_t bound = v == 1 ? std::min(p - r, m) : std::min(interleaved_warmup(p, r, m, v) + 1, m * v);
          REQUIRE(max_in_flight(t[r]) == bound);
        }
        if (v > 1) {
          // Megatron's warmup: 2(p-r-1) + (v-1)p forwards, all of them when m == p.
          CHECK(interleaved_warmup(p, 0, m, v) == (m == p ? m * v : std::min(2 * (p - 1) + (v - 1) * p, m * v)));
        }
        // Each chunk costs 1/v of a stage (forward 1, backward 2 per stage). The bubble
        // is (p-1)(tf+tb)/v: 1/v of the non-interleaved bubble.
        auto s = simulate(t, p, m, v, 1.0 / v, 2.0 / v);
        REQUIRE(s.error == "");
        const double ideal = 3.0 * m;
        REQUIRE(s.makespan >= ideal + 3.0 * (p - 1) / v - 1e-9);
        if (m > p || v == 1) REQUIRE(s.makespan == Approx(ideal + 3.0 * (p - 1) / v));
      }
    }
  }
  CHECK(configs > 100);
}

TEST_CASE("pipeline: interleaved worked example p=2 m=4 v=2", "[schedules][pipeline]") {
  // Rank 0 holds virtual stages 0 and 2, rank 1 stages 1 and 3. Groups of p=2
  // microbatches go through chunk 0, then chunk 1.
  auto t = schedule_interleaved_1f1b(2, 0, 4, 2);
  std::vector<std::string> ops;
  for (auto& a : t)
    if (a.op == PipeOp::forward || a.op == PipeOp::backward)
      ops.push_back((a.op == PipeOp::forward ? "F" : "B") + std::to_string(a.microbatch) + "." +
                    std::to_string(a.chunk));
  // warmup 2(p-1) + (v-1)p = 4 forwards, then 1F1B; backwards start at chunk 1.
  CHECK(ops == std::vector<std::string>{"F0.0", "F1.0", "F0.1", "F1.1", "F2.0", "B0.1", "F3.0", "B1.1", "F2.1", "B0.0",
                                        "F3.1", "B1.0", "B2.1", "B3.1", "B2.0", "B3.0"});
  // Rank 0's chunk 1 receives from rank 1 (chunk 0): the wrap-around edge.
  CHECK(std::find(t.begin(), t.end(), PipeAction{PipeOp::recv_forward, 0, 1, 1}) != t.end());
}

TEST_CASE("pipeline: invalid layouts", "[schedules][pipeline]") {
  CHECK_THROWS_WITH(schedule_interleaved_1f1b(4, 0, 6, 2), Contains("multiple of pipeline_model_parallel_size"));
  CHECK_THROWS_WITH(schedule_interleaved_1f1b(1, 0, 4, 2), Contains(">= 2"));
  CHECK_THROWS_AS(schedule_interleaved_1f1b(4, 0, 8, 0), InputError);
  CHECK_THROWS_AS(schedule_1f1b(4, 4, 8), InputError);
  CHECK_THROWS_AS(schedule_1f1b(0, 0, 8), InputError);
  CHECK_THROWS_AS(schedule_gpipe(2, 0, 0), InputError);
  CHECK(schedule_interleaved_1f1b(4, 1, 6, 1) == schedule_1f1b(4, 1, 6));  // v = 1
}

TEST_CASE("pipeline: to_string", "[schedules][pipeline]") {
  CHECK(to_string(PipeAction{PipeOp::send_forward, 3, 1, 2}) == "send_forward mb=3 chunk=1 peer=2");
  CHECK(to_string(PipeAction{PipeOp::backward, 0, 0, -1}) == "backward mb=0 chunk=0");
}

TEST_CASE("pipeline: the simulator catches broken tables", "[schedules][pipeline]") {
  // Rank 0 waits for a gradient before producing the activation rank 1 waits for.
  std::vector<PipeAction> r0 = {{PipeOp::recv_backward, 0, 0, 1},
                                {PipeOp::forward, 0, 0, -1},
                                {PipeOp::send_forward, 0, 0, 1},
                                {PipeOp::backward, 0, 0, -1}};
  auto s = simulate({r0, schedule_1f1b(2, 1, 1)}, 2, 1, 1, 1.0, 1.0);
  CHECK_THAT(s.error, Contains("deadlock"));
  // Microbatches swapped on the receiving side: messages are matched in order.
  auto r1 = schedule_1f1b(2, 1, 2);
  std::swap(r1[0], r1[4]);  // recv_forward mb 0 <-> recv_forward mb 1
  REQUIRE(r1[0].op == PipeOp::recv_forward);
  s = simulate({schedule_1f1b(2, 0, 2), r1}, 2, 2, 1, 1.0, 1.0);
  CHECK_THAT(s.error, Contains("matched a message"));
  // A send nobody receives.
  auto r0b = schedule_1f1b(2, 0, 1);
  r0b.push_back({PipeOp::send_forward, 0, 0, 1});
  s = simulate({r0b, schedule_1f1b(2, 1, 1)}, 2, 1, 1, 1.0, 1.0);
  CHECK_THAT(s.error, Contains("unmatched"));
}

namespace {

// Runs all ranks' tables with the executor's waits: a send posted at index i must be
// waited for after action release[r][i], and that wait blocks until the peer has
// started (here: executed) the matching receive -- a rendezvous send, the strictest MPI
// may be. The ranks are stepped in the order `order` (each round), so that release
// points that are right only for one interleaving would show as a deadlock. Returns ""
// or what went wrong; `held` gets each rank's most sends outstanding at once.
std::string run_with_waits(int64_t p, int64_t m, int64_t v, const std::vector<int64_t>& order,
                           std::vector<int64_t>& held) {
  std::vector<std::vector<PipeAction>> t;
  for (int64_t r = 0; r < p; ++r) t.push_back(schedule_for(p, r, m, v));
  const auto release = send_release_points_all(p, m, v);
  // channel (src, dst, dir) -> queue of (sender, send index); recv_done[(sender, index)]
  std::map<std::tuple<int64_t, int64_t, int>, std::deque<std::pair<int64_t, size_t>>> ch;
  std::set<std::pair<int64_t, size_t>> received;
  std::vector<size_t> pc(p, 0);
  std::vector<std::vector<size_t>> waiting(p);  // sends due, not yet known received
  std::vector<int64_t> outstanding(p, 0);
  held.assign(p, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t r : order) {
      for (;;) {
        // Finish the waits due after the previous action first.
        auto& w = waiting[r];
        while (!w.empty() && received.count({r, w.back()})) {
          w.pop_back();
          --outstanding[r];
          progress = true;
        }
        if (!w.empty() || pc[r] >= t[r].size()) break;
        const auto& a = t[r][pc[r]];
        const size_t i = pc[r];
        if (a.op == PipeOp::send_forward || a.op == PipeOp::send_backward) {
          if (release[r][i] <= static_cast<int64_t>(i))
            return "rank " + std::to_string(r) + ": send released before it is posted";
          if (release[r][i] < static_cast<int64_t>(t[r].size())) {
            const auto& at = t[r][static_cast<size_t>(release[r][i])];
            if (at.op != PipeOp::recv_forward && at.op != PipeOp::recv_backward)
              return "rank " + std::to_string(r) + ": a send is due after an action that is not a receive";
          }
          ch[{r, a.peer_stage, a.op == PipeOp::send_forward ? 0 : 1}].push_back({r, i});
          held[r] = std::max(held[r], ++outstanding[r]);
        } else if (a.op == PipeOp::recv_forward || a.op == PipeOp::recv_backward) {
          auto& q = ch[{a.peer_stage, r, a.op == PipeOp::recv_forward ? 0 : 1}];
          if (q.empty()) break;
          received.insert(q.front());
          q.pop_front();
        }
        for (size_t s = 0; s < release[r].size(); ++s)
          if (release[r][s] == static_cast<int64_t>(i)) waiting[r].push_back(s);
        ++pc[r];
        progress = true;
        if (pc[r] == t[r].size())  // the end of the step waits for every remaining send
          for (size_t s = 0; s < release[r].size(); ++s)
            if (release[r][s] == static_cast<int64_t>(t[r].size())) waiting[r].push_back(s);
      }
    }
  }
  for (int64_t r = 0; r < p; ++r)
    if (pc[r] != t[r].size() || !waiting[r].empty())
      return "deadlock: rank " + std::to_string(r) + " stopped at action " + std::to_string(pc[r]) +
             (waiting[r].empty() ? "" : " waiting for a send");
  return "";
}

}  // namespace

TEST_CASE("pipeline: sends waited for at their release points never deadlock, and free their buffers early",
          "[schedules][pipeline]") {
  int configs = 0;
  for (int64_t p = 2; p <= 8; ++p) {
    for (int64_t v = 1; v <= 4; ++v) {
      for (int64_t m = 1; m <= 32; ++m) {
        if (v > 1 && m % p != 0) continue;
        ++configs;
        std::vector<int64_t> up(p), down(p), odd;
        for (int64_t r = 0; r < p; ++r) up[r] = r, down[r] = p - 1 - r;
        for (int64_t r = 1; r < p; r += 2) odd.push_back(r);
        for (int64_t r = 0; r < p; r += 2) odd.push_back(r);
        for (const auto& order : {up, down, odd}) {
          std::vector<int64_t> held;
          INFO("p=" << p << " m=" << m << " v=" << v);
          REQUIRE(run_with_waits(p, m, v, order, held) == "");
          // A rank holds at most the sends of its in-flight window plus one: the
          // activations whose gradient has not come back, and one gradient -- not all m*v
          // (1F1B: min(p - r, m) + 1).
          for (int64_t r = 0; r < p; ++r) {
            CHECK(held[r] <= max_in_flight(schedule_for(p, r, m, v)) + 1);
            if (v == 1) CHECK(held[r] <= std::min(p - r, m) + 1);
          }
        }
      }
    }
  }
  CHECK(configs > 100);
  // The release points do not depend on which ranks are simulated first, and rank r's
  // entry is its table's: -1 exactly at the actions that are not sends.
  const auto all = send_release_points_all(4, 8, 2);
  for (int64_t r = 0; r < 4; ++r) {
    const auto t = schedule_for(4, r, 8, 2);
    REQUIRE(all[r].size() == t.size());
    CHECK(send_release_points(4, r, 8, 2) == all[r]);
    for (size_t i = 0; i < t.size(); ++i)
      CHECK((all[r][i] >= 0) == (t[i].op == PipeOp::send_forward || t[i].op == PipeOp::send_backward));
  }
}
