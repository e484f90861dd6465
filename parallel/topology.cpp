// Rank <-> coordinate arithmetic and group lists (see topology.hpp for the order).
#include "parallel/topology.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace mtnlg::parallel {

Topology::Topology(int64_t tp, int64_t pp, int64_t dp, int64_t cp) : tp_(tp), pp_(pp), dp_(dp), cp_(cp) {
  if (tp < 1 || pp < 1 || dp < 1 || cp < 1)
    throw_input("parallel layout tp={} pp={} dp={} cp={}: every size must be at least 1", tp, pp, dp, cp);
}

Topology Topology::from_world(int64_t world, int64_t tp, int64_t pp, int64_t cp) {
  if (world < 1) throw_input("world size {} must be at least 1", world);
  if (tp < 1 || pp < 1 || cp < 1)
    throw_input(
        "tensor_model_parallel_size ({}), pipeline_model_parallel_size ({}) and context_parallel_size ({}) must be at "
        "least 1",
        tp, pp, cp);
  if (world % (tp * pp * cp) != 0) {
    if (cp == 1)
      throw_input(
          "world size {} is not divisible by tensor_model_parallel_size x pipeline_model_parallel_size = {} x {}",
          world, tp, pp);
    throw_input(
        "world size {} is not divisible by tensor_model_parallel_size x context_parallel_size x "
        "pipeline_model_parallel_size = {} x {} x {}",
        world, tp, cp, pp);
  }
  return Topology(tp, pp, world / (tp * pp * cp), cp);
}

Coord Topology::coord(int64_t r) const {
  if (r < 0 || r >= world()) throw_runtime("rank {} is outside the world of {} ranks ({})", r, world(), to_string());
  return Coord{r % tp_, r / (tp_ * cp_ * dp_), (r / (tp_ * cp_)) % dp_, (r / tp_) % cp_};
}

int64_t Topology::rank(Coord c) const {
  if (c.tp < 0 || c.tp >= tp_ || c.pp < 0 || c.pp >= pp_ || c.dp < 0 || c.dp >= dp_ || c.cp < 0 || c.cp >= cp_)
    throw_runtime("coordinate (tp={}, pp={}, dp={}, cp={}) is outside the grid {}", c.tp, c.pp, c.dp, c.cp,
                  to_string());
  return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp));
}

namespace {
// The ranks that differ from rank r's coordinate only along `axis` (of size n), by it.
std::vector<int64_t> along(const Topology& t, int64_t r, int64_t Coord::*axis, int64_t n) {
  Coord c = t.coord(r);
  std::vector<int64_t> g;
  for (c.*axis = 0; c.*axis < n; ++(c.*axis)) g.push_back(t.rank(c));
  return g;
}
}  // namespace

std::vector<int64_t> Topology::tp_group(int64_t r) const { return along(*this, r, &Coord::tp, tp_); }
std::vector<int64_t> Topology::pp_group(int64_t r) const { return along(*this, r, &Coord::pp, pp_); }
std::vector<int64_t> Topology::dp_group(int64_t r) const { return along(*this, r, &Coord::dp, dp_); }
std::vector<int64_t> Topology::cp_group(int64_t r) const { return along(*this, r, &Coord::cp, cp_); }

std::vector<int64_t> Topology::dp_cp_group(int64_t r) const {
  Coord c = coord(r);
  std::vector<int64_t> g;
  // dp outer, cp inner: ascending rank order.
  for (int64_t d = 0; d < dp_; ++d)
    for (int64_t k = 0; k < cp_; ++k) g.push_back(rank(Coord{c.tp, c.pp, d, k}));
  return g;
}

std::vector<int64_t> Topology::embedding_group(int64_t r) const {
  auto g = pp_group(r);
  if (pp_ == 1) return {g.front()};
  return {g.front(), g.back()};
}

std::vector<int64_t> Topology::mp_group(int64_t r) const {
  Coord c = coord(r);
  std::vector<int64_t> g;
  // pp outer, tp inner: ascending rank order.
  for (int64_t p = 0; p < pp_; ++p)
    for (int64_t t = 0; t < tp_; ++t) g.push_back(rank(Coord{t, p, c.dp, c.cp}));
  return g;
}

std::string Topology::to_string() const {
  if (cp_ > 1) return fmt::format("tp={} cp={} pp={} dp={} (world {})", tp_, cp_, pp_, dp_, world());
  return fmt::format("tp={} pp={} dp={} (world {})", tp_, pp_, dp_, world());
}

ExpertGrid::ExpertGrid(const Topology& topo, int64_t ep, int64_t etp)
    : topo_(topo), ep_(ep), etp_(etp), stage_size_(topo.world() / topo.pp()) {
  if (ep < 1 || etp < 1 || stage_size_ % (ep * etp) != 0)
    throw_input(
        "expert_model_parallel_size {} x expert_tensor_parallel_size {} does not divide the {} ranks of a pipeline "
        "stage ({})",
        ep, etp, stage_size_, topo.to_string());
  edp_ = stage_size_ / (ep * etp);
}

ExpertCoord ExpertGrid::coord(int64_t rank) const {
  const int64_t l = topo_.rank(topo_.coord(rank)) % stage_size_;  // checks the rank
  return ExpertCoord{l % etp_, (l / etp_) % ep_, l / (etp_ * ep_)};
}

int64_t ExpertGrid::rank_of(int64_t stage, ExpertCoord c) const {
  return stage * stage_size_ + c.etp + etp_ * (c.ep + ep_ * c.edp);
}

// The ranks of `rank`'s stage that differ from its expert coordinate only along `axis`
// (of size n), by it.
std::vector<int64_t> ExpertGrid::along(int64_t rank, int64_t ExpertCoord::*axis, int64_t n) const {
  ExpertCoord c = coord(rank);
  const int64_t stage = topo_.coord(rank).pp;
  std::vector<int64_t> g;
  for (c.*axis = 0; c.*axis < n; ++(c.*axis)) g.push_back(rank_of(stage, c));
  return g;
}

std::vector<int64_t> ExpertGrid::etp_group(int64_t rank) const { return along(rank, &ExpertCoord::etp, etp_); }
std::vector<int64_t> ExpertGrid::ep_group(int64_t rank) const { return along(rank, &ExpertCoord::ep, ep_); }
std::vector<int64_t> ExpertGrid::edp_group(int64_t rank) const { return along(rank, &ExpertCoord::edp, edp_); }

std::vector<int64_t> ExpertGrid::emp_group(int64_t rank) const {
  const int64_t edp = coord(rank).edp;
  std::vector<int64_t> g;
  for (int64_t s = 0; s < topo_.pp(); ++s)
    for (int64_t e = 0; e < ep_; ++e)
      for (int64_t t = 0; t < etp_; ++t) g.push_back(rank_of(s, ExpertCoord{t, e, edp}));
  return g;
}

}  // namespace mtnlg::parallel
