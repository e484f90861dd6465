// Pipeline instruction tables (see pipeline_schedule.hpp for the executor contract).
#include "schedules/pipeline_schedule.hpp"

#include <algorithm>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"

namespace mtnlg::schedules {

namespace {

void check_common(int64_t p, int64_t r, int64_t m) {
  if (p < 1) throw_input("pipeline_model_parallel_size ({}) must be at least 1", p);
  if (r < 0 || r >= p) throw_input("pipeline rank {} is outside 0..{}", r, p - 1);
  if (m < 1) throw_input("microbatches per iteration ({}) must be at least 1", m);
}

// Emits compute actions wrapped in the communication they need, for a table where
// rank r of p holds v chunks. `fwd`/`bwd` append one microbatch-chunk each.
class Builder {
 public:
  Builder(int64_t p, int64_t r, int64_t v) : p_(p), r_(r), v_(v) {}

  void forward(int64_t k, int64_t c) {
    const bool first = (r_ == 0 && c == 0);
    const bool last = (r_ == p_ - 1 && c == v_ - 1);
    if (!first) out_.push_back({PipeOp::recv_forward, k, c, (r_ + p_ - 1) % p_});
    out_.push_back({PipeOp::forward, k, c, -1});
    if (!last) out_.push_back({PipeOp::send_forward, k, c, (r_ + 1) % p_});
  }
  void backward(int64_t k, int64_t c) {
    const bool first = (r_ == 0 && c == 0);
    const bool last = (r_ == p_ - 1 && c == v_ - 1);
    if (!last) out_.push_back({PipeOp::recv_backward, k, c, (r_ + 1) % p_});
    out_.push_back({PipeOp::backward, k, c, -1});
    if (!first) out_.push_back({PipeOp::send_backward, k, c, (r_ + p_ - 1) % p_});
  }
  std::vector<PipeAction> take() { return std::move(out_); }

 private:
  int64_t p_, r_, v_;
  std::vector<PipeAction> out_;
};

}  // namespace

std::string to_string(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return "forward";
    case PipeOp::backward: return "backward";
    case PipeOp::send_forward: return "send_forward";
    case PipeOp::recv_forward: return "recv_forward";
    case PipeOp::send_backward: return "send_backward";
    case PipeOp::recv_backward: return "recv_backward";
  }
  return "?";
}

std::string to_string(const PipeAction& a) {
  if (a.peer_stage < 0) return fmt::format("{} mb={} chunk={}", to_string(a.op), a.microbatch, a.chunk);
  return fmt::format("{} mb={} chunk={} peer={}", to_string(a.op), a.microbatch, a.chunk, a.peer_stage);
}

std::vector<PipeAction> schedule_no_pipelining(int64_t m) {
  check_common(1, 0, m);
  Builder b(1, 0, 1);
  for (int64_t k = 0; k < m; ++k) {
    b.forward(k, 0);
    b.backward(k, 0);
  }
  return b.take();
}

std::vector<PipeAction> schedule_gpipe(int64_t p, int64_t r, int64_t m) {
  check_common(p, r, m);
  Builder b(p, r, 1);
  for (int64_t k = 0; k < m; ++k) b.forward(k, 0);
  for (int64_t k = 0; k < m; ++k) b.backward(k, 0);
  return b.take();
}

std::vector<PipeAction> schedule_1f1b(int64_t p, int64_t r, int64_t m) {
  check_common(p, r, m);
  Builder b(p, r, 1);
  const int64_t warmup = std::min(p - r - 1, m);
  const int64_t steady = m - warmup;
  for (int64_t k = 0; k < warmup; ++k) b.forward(k, 0);
  for (int64_t i = 0; i < steady; ++i) {
    b.forward(warmup + i, 0);
    b.backward(i, 0);
  }
  for (int64_t k = steady; k < m; ++k) b.backward(k, 0);
  return b.take();
}

int64_t interleaved_warmup(int64_t p, int64_t r, int64_t m, int64_t v) {
  const int64_t total = m * v;
  if (m == p) return total;  // Megatron: with one group of microbatches, all forwards first
  return std::min(2 * (p - r - 1) + (v - 1) * p, total);
}

std::vector<PipeAction> schedule_interleaved_1f1b(int64_t p, int64_t r, int64_t m, int64_t v) {
  check_common(p, r, m);
  if (v < 1) throw_input("virtual pipeline chunks per rank ({}) must be at least 1", v);
  if (v == 1) return schedule_1f1b(p, r, m);
  if (p < 2)
    throw_input(
        "interleaved pipeline (num_layers_per_virtual_pipeline_stage) needs pipeline_model_parallel_size >= 2, got {}",
        p);
  if (m % p != 0)
    throw_input(
        "interleaved pipeline: microbatches per iteration ({}) must be a multiple of pipeline_model_parallel_size ({})",
        m, p);
  // Virtual index j (0..m*v-1) walks groups of p microbatches through the chunks:
  // within a group of p*v, chunk = (j % (p*v)) / p, microbatch = (j / (p*v)) * p + j % p.
  // Backwards visit the chunks in reverse.
  const int64_t total = m * v;
  auto chunk_of = [&](int64_t j, bool fwd) {
    int64_t c = (j % (p * v)) / p;
    return fwd ? c : v - 1 - c;
  };
  auto mb_of = [&](int64_t j) { return (j / (p * v)) * p + j % p; };

  Builder b(p, r, v);
  const int64_t warmup = interleaved_warmup(p, r, m, v);
  const int64_t steady = total - warmup;
  for (int64_t j = 0; j < warmup; ++j) b.forward(mb_of(j), chunk_of(j, true));
  for (int64_t i = 0; i < steady; ++i) {
    const int64_t jf = warmup + i;
    b.forward(mb_of(jf), chunk_of(jf, true));
    b.backward(mb_of(i), chunk_of(i, false));
  }
  for (int64_t j = steady; j < total; ++j) b.backward(mb_of(j), chunk_of(j, false));
  return b.take();
}

std::vector<PipeAction> schedule_for(int64_t p, int64_t r, int64_t m, int64_t v) {
  if (p == 1 && v == 1) return schedule_no_pipelining(m);
  if (v > 1) return schedule_interleaved_1f1b(p, r, m, v);
  return schedule_1f1b(p, r, m);
}

std::vector<std::vector<int64_t>> send_release_points_all(int64_t p, int64_t m, int64_t v) {
  check_common(p, 0, m);
  std::vector<std::vector<PipeAction>> tables;
  for (int64_t q = 0; q < p; ++q) tables.push_back(schedule_for(p, q, m, v));
  const auto P = static_cast<size_t>(p);
  auto is_send = [](PipeOp op) { return op == PipeOp::send_forward || op == PipeOp::send_backward; };
  auto is_recv = [](PipeOp op) { return op == PipeOp::recv_forward || op == PipeOp::recv_backward; };
  // The k-th send from q to its peer in one direction is the peer's k-th receive from q in
  // that direction: index each rank's receives by (source, direction, count).
  auto channel = [&](int64_t src, int64_t dst, bool fwd) {
    return (static_cast<size_t>(src) * P + static_cast<size_t>(dst)) * 2 + (fwd ? 0 : 1);
  };
  std::vector<std::vector<int64_t>> recv_index(P * P * 2);  // channel -> action indices on dst, in order
  for (int64_t q = 0; q < p; ++q)
    for (size_t i = 0; i < tables[static_cast<size_t>(q)].size(); ++i) {
      const auto& a = tables[static_cast<size_t>(q)][i];
      if (is_recv(a.op))
        recv_index[channel(a.peer_stage, q, a.op == PipeOp::recv_forward)].push_back(static_cast<int64_t>(i));
    }
  // Simulate: sends are posted and never block, receives wait for their message, which
  // carries the sender's vector clock (clock[q][x] = actions of rank x known done by q).
  std::vector<std::vector<int64_t>> clock(P, std::vector<int64_t>(P, 0));
  struct Message {
    std::vector<int64_t> clock;
  };
  std::vector<std::vector<Message>> queue(P * P * 2);
  std::vector<size_t> head(P * P * 2, 0), sent(P * P * 2, 0), pc(P, 0);
  // Rank r's sends not yet due: (action index, peer, peer's matching receive index).
  struct Pending {
    size_t action;
    int64_t peer, peer_recv;
  };
  std::vector<std::vector<Pending>> pending(P);
  std::vector<std::vector<int64_t>> release(P);
  for (size_t q = 0; q < P; ++q) release[q].assign(tables[q].size(), -1);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t q = 0; q < p; ++q) {
      const auto Q = static_cast<size_t>(q);
      auto& t = tables[Q];
      while (pc[Q] < t.size()) {
        const auto& a = t[pc[Q]];
        const bool fwd = a.op == PipeOp::send_forward || a.op == PipeOp::recv_forward;
        if (is_recv(a.op)) {
          const size_t ch = channel(a.peer_stage, q, fwd);
          if (head[ch] == queue[ch].size()) break;  // blocked until the message is sent
          const auto& msg = queue[ch][head[ch]++];
          for (size_t x = 0; x < P; ++x) clock[Q][x] = std::max(clock[Q][x], msg.clock[x]);
        }
        clock[Q][Q] = static_cast<int64_t>(pc[Q]) + 1;
        if (is_send(a.op)) {
          const size_t ch = channel(q, a.peer_stage, fwd);
          queue[ch].push_back({clock[Q]});
          const auto& idx = recv_index[ch];
          MTNLG_CHECK(sent[ch] < idx.size(), "send {} of rank {} has no matching receive", to_string(a), q);
          pending[Q].push_back({pc[Q], a.peer_stage, idx[sent[ch]++]});
        }
        if (is_recv(a.op)) {
          // Due now: the peer's matching receive is among the actions this rank has heard of.
          std::erase_if(pending[Q], [&](const Pending& s) {
            if (clock[Q][static_cast<size_t>(s.peer)] <= s.peer_recv) return false;
            release[Q][s.action] = static_cast<int64_t>(pc[Q]);
            return true;
          });
        }
        ++pc[Q];
        progress = true;
      }
    }
  }
  for (size_t q = 0; q < P; ++q)
    MTNLG_CHECK(pc[q] == tables[q].size(), "pipeline tables (p={}, m={}, v={}) deadlock at rank {}", p, m, v, q);
  for (size_t q = 0; q < P; ++q)
    for (const auto& s : pending[q]) release[q][s.action] = static_cast<int64_t>(tables[q].size());
  return release;
}

std::vector<int64_t> send_release_points(int64_t p, int64_t r, int64_t m, int64_t v) {
  check_common(p, r, m);
  return send_release_points_all(p, m, v)[static_cast<size_t>(r)];
}

int64_t max_in_flight(const std::vector<PipeAction>& actions) {
  std::set<std::pair<int64_t, int64_t>> live;
  int64_t best = 0;
  for (const auto& a : actions) {
    if (a.op == PipeOp::forward) {
      live.insert({a.microbatch, a.chunk});
      best = std::max<int64_t>(best, static_cast<int64_t>(live.size()));
    } else if (a.op == PipeOp::backward) {
      live.erase({a.microbatch, a.chunk});
    }
  }
  return best;
}

}  // namespace mtnlg::schedules
