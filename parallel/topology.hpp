// Process topology: world = tp x cp x dp x pp, rank <-> (tp, pp, dp, cp) coordinates and
// the rank lists of every group kind. Pure arithmetic, no communication.
//
// Rank order is Megatron's default ("tp-cp-dp-pp"): tp varies fastest, then the context-
// parallel index, then dp, then pp:
//     rank = tp + tp_size * (cp + cp_size * (dp + dp_size * pp))
// so a tensor-parallel group is tp_size consecutive ranks (one node when tp <= GPUs
// per node), context-parallel peers are tp_size apart, data-parallel peers tp_size x
// cp_size apart, and a pipeline stage is a block of tp_size * cp_size * dp_size
// consecutive ranks. Without context parallelism (cp_size 1) this is "tp-dp-pp".
// Example tp=2, pp=2, dp=2 (8 ranks):
//   tp groups [0,1] [2,3] [4,5] [6,7]; dp groups [0,2] [1,3] [4,6] [5,7];
//   pp groups [0,4] [1,5] [2,6] [3,7]; mp (tp x pp) groups [0,1,4,5] [2,3,6,7].
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mtnlg::parallel {

struct Coord {
  int64_t tp = 0, pp = 0, dp = 0, cp = 0;
  bool operator==(const Coord&) const = default;
};

class Topology {
 public:
  // Throws InputError for sizes < 1.
  Topology(int64_t tp, int64_t pp, int64_t dp, int64_t cp = 1);
  // dp = world / (tp * cp * pp); InputError when world is not divisible by tp * cp * pp.
  static Topology from_world(int64_t world, int64_t tp, int64_t pp, int64_t cp = 1);

  int64_t world() const { return tp_ * cp_ * pp_ * dp_; }
  int64_t tp() const { return tp_; }
  int64_t pp() const { return pp_; }
  int64_t dp() const { return dp_; }
  int64_t cp() const { return cp_; }

  Coord coord(int64_t rank) const;  // RuntimeError when rank is outside [0, world)
  int64_t rank(Coord c) const;      // RuntimeError when c is outside the grid

  // Every list is sorted by the coordinate that varies inside it, which here is also
  // ascending rank order; this rank's index in the list is its rank in that group.
  std::vector<int64_t> tp_group(int64_t rank) const;  // same pp, dp; by tp
  std::vector<int64_t> pp_group(int64_t rank) const;  // same tp, dp; by pp stage
  std::vector<int64_t> dp_group(int64_t rank) const;  // same tp, pp, cp; by dp
  std::vector<int64_t> cp_group(int64_t rank) const;  // same tp, pp, dp; by cp
  // The ranks that hold the same parameters and reduce their gradients (ZeRO-1 shards
  // over it): same tp, pp; by (dp, cp) in rank order. The dp group when cp is 1.
  std::vector<int64_t> dp_cp_group(int64_t rank) const;
  // First and last stage of this rank's pipeline group ({first} when pp == 1): the ranks
  // that hold the tied word embedding and all-reduce its gradient.
  std::vector<int64_t> embedding_group(int64_t rank) const;
  // Megatron's model-parallel group (all tp x pp ranks with this dp and cp index), over which
  // the squared gradient norm is summed.
  std::vector<int64_t> mp_group(int64_t rank) const;

  std::string to_string() const;  // "tp=2 pp=4 dp=8 (world 64)", "tp=2 cp=2 pp=4 dp=4 (world 64)"

  bool operator==(const Topology&) const = default;

 private:
  int64_t tp_, pp_, dp_, cp_;
};

// The expert grid of a mixture-of-experts model (Megatron-Core's): the routed experts'
// parameters are laid out over the ranks of each pipeline stage in their own order,
// etp-ep-edp, independent of the attention grid's tp-cp-dp:
//     stage index = rank - pp * (ranks per stage) = etp + etp_size * (ep + ep_size * edp)
// An expert-parallel group (same etp, edp) splits the experts, E / ep each, and exchanges
// tokens with all-to-all; an expert-tensor-parallel group (same ep, edp) splits each
// expert's width, its ranks computing their slice for all of the group's tokens; an expert-data-parallel group (same etp, ep) holds the same
// experts and reduces their gradients (ZeRO-1 shards over it); the expert model-parallel
// group (same edp, every etp, ep and stage) sums the experts' squared gradient norm.
// Example tp=2, dp=2, ep=2, etp=1 (4 ranks, one stage): ep groups [0,1] [2,3] (the tp
// groups), edp groups [0,2] [1,3].
struct ExpertCoord {
  int64_t etp = 0, ep = 0, edp = 0;
};

class ExpertGrid {
 public:
  // InputError when etp x ep does not divide the ranks of a stage.
  ExpertGrid(const Topology& topo, int64_t ep, int64_t etp = 1);
  int64_t ep() const { return ep_; }
  int64_t etp() const { return etp_; }
  int64_t edp() const { return edp_; }
  ExpertCoord coord(int64_t rank) const;
  std::vector<int64_t> etp_group(int64_t rank) const;  // same stage, ep, edp; by etp (consecutive ranks)
  std::vector<int64_t> ep_group(int64_t rank) const;   // same stage, etp, edp; by ep
  std::vector<int64_t> edp_group(int64_t rank) const;  // same stage, etp, ep; by edp
  std::vector<int64_t> emp_group(int64_t rank) const;  // same edp: every stage, etp and ep, by rank

 private:
  int64_t rank_of(int64_t stage, ExpertCoord c) const;
  std::vector<int64_t> along(int64_t rank, int64_t ExpertCoord::*axis, int64_t n) const;
  Topology topo_;
  int64_t ep_, etp_, edp_, stage_size_;
};

}  // namespace mtnlg::parallel
