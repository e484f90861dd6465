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
    throw_input("interleaved pipeline (num_layers_per_virtual_pipeline_stage) needs pipeline_model_parallel_size >= 2, got {}",
                p);
  if (m % p != 0)
    throw_input("interleaved pipeline: microbatches per iteration ({}) must be a multiple of pipeline_model_parallel_size ({})",
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
