// `mtnlg plan --search`: enumerate every layout of a GPU count, reject the ones that
// cannot exist or do not fit (counted per reason), rank the rest by predicted
// throughput. Each candidate costs one estimate() without the run walk (microseconds),
// so 4096 GPUs with the 530B recipe take well under a second.
#include <algorithm>

#include "planner/cost_model.hpp"

namespace mtnlg::cost {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      v.push_back(i);
      if (i != n / i) v.push_back(n / i);
    }
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

SearchResult search(const Recipe& r, int64_t gpus, const Cluster& c, size_t keep) {
  SearchResult res;
  const int64_t L = r.model.num_layers;
  const int64_t B = r.training.global_batch_size;
  const RecomputeGranularity rcs[] = {RecomputeGranularity::none, RecomputeGranularity::selective,
                                      RecomputeGranularity::full};
  // Context parallelism: powers of two that leave each rank at least kMinCpTokens of a
  // sequence (below that its attention blocks are too small to hide the exchange), with
  // the recipe's communication type.
  constexpr int64_t kMinCpTokens = 1024;
  std::vector<int64_t> cps = {1};
  for (int64_t cp = 2; r.model.seq_length / cp >= kMinCpTokens; cp *= 2) cps.push_back(cp);
  // Expert parallelism (MoE models): powers of two dividing the experts, etp 1.
  std::vector<int64_t> eps = {1};
  for (int64_t ep = 2; r.model.moe.enabled() && r.model.moe.num_experts % ep == 0; ep *= 2) eps.push_back(ep);
  for (int64_t tp : divisors(gpus)) {
    if (tp > r.model.num_attention_heads) break;
    for (int64_t cp : cps) {
      if ((gpus / tp) % cp != 0) continue;
      for (int64_t pp : divisors(gpus / (tp * cp))) {
        if (pp > L) break;
        const int64_t dp = gpus / (tp * cp * pp);
        std::vector<int64_t> split(static_cast<size_t>(pp), L / pp);
        for (int64_t i = 0; i < L % pp; ++i) split[static_cast<size_t>(i)] += 1;
        std::vector<int64_t> vps = {1};
        if (L % pp == 0 && pp > 1 && c.software.interleaved_schedule)
          for (int64_t v : divisors(L / pp))
            if (v > 1) vps.push_back(v);
        for (int64_t mb = 1; mb <= std::max<int64_t>(1, B / dp); mb *= 2) {
          for (int64_t vp : vps)
            for (auto rc : rcs)
              for (int sp = 0; sp < (tp > 1 ? 2 : 1); ++sp)
                for (int zero = 0; zero < (dp * cp > 1 ? 2 : 1); ++zero)
                  for (int64_t ep : eps) {
                    Layout l;
                    l.ep = ep;
                    l.tp = tp;
                    l.pp = pp;
                    l.dp = dp;
                    l.cp = cp;
                    l.cp_comm = r.parallel.cp_comm_type;
                    l.cp_a2a = cp_a2a_of(r);
                    l.vp = vp;
                    l.micro_batch = mb;
                    l.recompute = rc;
                    l.sequence_parallel = sp != 0;
                    l.distributed_optimizer = zero != 0;
                    l.stage_layers = split;
                    ++res.considered;
                    std::string why = layout_problem(r, l);
                    if (why.empty() && !ramp_problem(r, l).empty())
                      why = "batch ramp steps not divisible by micro_batch x dp";
                    if (!why.empty()) {
                      ++res.rejected[why];
                      continue;
                    }
                    EstimateOptions o;
                    o.with_run = false;
                    Estimate e = estimate(r, l, c, o);
                    if (!e.fits) {
                      ++res.rejected["does not fit in GPU memory"];
                      continue;
                    }
                    ++res.feasible;
                    // Keep the `keep` fastest (by tokens/s; ties: less memory).
                    auto better = [](const Estimate& a, const Estimate& b) {
                      if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
                      return a.peak_memory < b.peak_memory;
                    };
                    if (res.best.size() < keep || better(e, res.best.back())) {
                      res.best.insert(std::upper_bound(res.best.begin(), res.best.end(), e, better), std::move(e));
                      if (res.best.size() > keep) res.best.pop_back();
                    }
                  }
        }
      }
    }
  }
  return res;
}

}  // namespace mtnlg::cost
