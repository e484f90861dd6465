// Topology: every factorisation of world sizes 1..64 — coordinates round-trip, each
// group kind partitions the world, groups are ordered by their varying coordinate,
// tp groups are runs of consecutive ranks.
#include <catch2/catch.hpp>
#include <algorithm>
#include <map>
#include <set>

#include "core/error.hpp"
#include "parallel/topology.hpp"

using namespace mtnlg;
using namespace mtnlg::parallel;
using Catch::Matchers::Contains;

namespace {
using GroupFn = std::vector<int64_t> (Topology::*)(int64_t) const;

// Every rank is in exactly one group of this kind, and a rank's group is the same
// list seen from each of its members.
void check_partition(const Topology& t, GroupFn fn, int64_t expected_size) {
  std::vector<int> seen(t.world(), 0);
  std::set<std::vector<int64_t>> groups;
  for (int64_t r = 0; r < t.world(); ++r) {
    auto g = (t.*fn)(r);
    REQUIRE(static_cast<int64_t>(g.size()) == expected_size);
    REQUIRE(std::find(g.begin(), g.end(), r) != g.end());
    REQUIRE(std::is_sorted(g.begin(), g.end()));
    for (int64_t m : g) REQUIRE((t.*fn)(m) == g);
    groups.insert(g);
  }
  for (auto& g : groups)
    for (int64_t m : g) ++seen[m];
  for (int64_t r = 0; r < t.world(); ++r) REQUIRE(seen[r] == 1);
  REQUIRE(static_cast<int64_t>(groups.size()) == t.world() / expected_size);
}
}  // namespace

TEST_CASE("topology: every factorisation of 1..64", "[parallel][topology]") {
  int64_t layouts = 0;
  for (int64_t world = 1; world <= 64; ++world) {
    for (int64_t tp = 1; tp <= world; ++tp) {
      if (world % tp) continue;
      for (int64_t pp = 1; pp * tp <= world; ++pp) {
        if (world % (tp * pp)) continue;
        ++layouts;
        Topology t = Topology::from_world(world, tp, pp);
        INFO(t.to_string());
        REQUIRE(t.world() == world);
        REQUIRE(t.dp() == world / (tp * pp));
        for (int64_t r = 0; r < world; ++r) {
          Coord c = t.coord(r);
          REQUIRE(t.rank(c) == r);
          REQUIRE(r == c.tp + tp * (c.dp + t.dp() * c.pp));  // Megatron's tp-dp-pp order
          auto tg = t.tp_group(r), pg = t.pp_group(r), dg = t.dp_group(r), mg = t.mp_group(r);
          // Group index == the coordinate that varies in the group.
          REQUIRE(tg[c.tp] == r);
          REQUIRE(pg[c.pp] == r);
          REQUIRE(dg[c.dp] == r);
          for (int64_t i = 0; i < tp; ++i) REQUIRE(t.coord(tg[i]) == Coord{i, c.pp, c.dp});
          for (int64_t i = 0; i < pp; ++i) REQUIRE(t.coord(pg[i]) == Coord{c.tp, i, c.dp});
          for (int64_t i = 0; i < t.dp(); ++i) REQUIRE(t.coord(dg[i]) == Coord{c.tp, c.pp, i});
          // tp groups are contiguous ranks (share a node).
          for (int64_t i = 1; i < tp; ++i) REQUIRE(tg[i] == tg[0] + i);
          REQUIRE(tg[0] % tp == 0);
          for (int64_t m : mg) REQUIRE(t.coord(m).dp == c.dp);
          auto eg = t.embedding_group(r);
          if (pp == 1) {
            REQUIRE(eg == std::vector<int64_t>{r});
          } else {
            REQUIRE(eg == std::vector<int64_t>{pg.front(), pg.back()});
          }
        }
        check_partition(t, &Topology::tp_group, tp);
        check_partition(t, &Topology::pp_group, pp);
        check_partition(t, &Topology::dp_group, t.dp());
        check_partition(t, &Topology::mp_group, tp * pp);
      }
    }
  }
  CHECK(layouts > 300);
}

TEST_CASE("topology: worked example tp=2 pp=2 dp=2", "[parallel][topology]") {
  Topology t(2, 2, 2);
  using V = std::vector<int64_t>;
  CHECK(t.tp_group(3) == V{2, 3});
  CHECK(t.dp_group(1) == V{1, 3});
  CHECK(t.pp_group(2) == V{2, 6});
  CHECK(t.mp_group(6) == V{2, 3, 6, 7});
  CHECK(t.embedding_group(5) == V{1, 5});
  CHECK(t.coord(6) == Coord{0, 1, 1});
}

TEST_CASE("topology: context parallelism, tp-cp-dp-pp, every factorisation of 1..48", "[parallel][topology]") {
  int64_t layouts = 0;
  for (int64_t world = 1; world <= 48; ++world)
    for (int64_t tp = 1; tp <= world; ++tp)
      for (int64_t cp = 2; tp * cp <= world; ++cp)
        for (int64_t pp = 1; tp * cp * pp <= world; ++pp) {
          if (world % (tp * cp * pp)) continue;
          ++layouts;
          Topology t = Topology::from_world(world, tp, pp, cp);
          INFO(t.to_string());
          REQUIRE(t.cp() == cp);
          REQUIRE(t.dp() == world / (tp * cp * pp));
          for (int64_t r = 0; r < world; ++r) {
            const Coord c = t.coord(r);
            REQUIRE(t.rank(c) == r);
            REQUIRE(r == c.tp + tp * (c.cp + cp * (c.dp + t.dp() * c.pp)));  // Megatron's tp-cp-dp-pp order
            const auto cg = t.cp_group(r), dcg = t.dp_cp_group(r);
            REQUIRE(cg[c.cp] == r);
            for (int64_t i = 0; i < cp; ++i) REQUIRE(t.coord(cg[i]) == Coord{c.tp, c.pp, c.dp, i});
            REQUIRE(dcg[c.dp * cp + c.cp] == r);  // the gradient group: same tp and pp
            for (int64_t m : dcg) REQUIRE((t.coord(m).tp == c.tp && t.coord(m).pp == c.pp));
            for (int64_t m : t.dp_group(r)) REQUIRE(t.coord(m).cp == c.cp);
            for (int64_t m : t.tp_group(r)) REQUIRE(t.coord(m).cp == c.cp);
            for (int64_t m : t.mp_group(r)) REQUIRE((t.coord(m).cp == c.cp && t.coord(m).dp == c.dp));
          }
          check_partition(t, &Topology::cp_group, cp);
          check_partition(t, &Topology::dp_cp_group, t.dp() * cp);
          check_partition(t, &Topology::tp_group, tp);
          check_partition(t, &Topology::pp_group, pp);
          check_partition(t, &Topology::dp_group, t.dp());
          check_partition(t, &Topology::mp_group, tp * pp);
        }
  CHECK(layouts > 100);
  // tp=2 cp=2 dp=2: cp peers are tp apart, dp peers tp x cp apart
  Topology t(2, 1, 2, 2);
  using V = std::vector<int64_t>;
  CHECK(t.cp_group(1) == V{1, 3});
  CHECK(t.dp_group(1) == V{1, 5});
  CHECK(t.dp_cp_group(1) == V{1, 3, 5, 7});
  CHECK(t.to_string() == "tp=2 cp=2 pp=1 dp=2 (world 8)");
  CHECK_THROWS_WITH(Topology::from_world(12, 2, 1, 4), Contains("context_parallel_size"));
}

// The expert grid: inside each stage etp-ep-edp over the stage's ranks; every group kind
// partitions the world, the ep and edp groups stay within a stage, and the expert
// model-parallel group holds one rank of each (stage, ep, etp) position.
TEST_CASE("topology: the expert grid, every factorisation of 1..32", "[parallel][topology]") {
  int64_t layouts = 0;
  for (int64_t world = 1; world <= 32; ++world)
    for (int64_t tp = 1; tp <= world; ++tp)
      for (int64_t pp = 1; tp * pp <= world; ++pp) {
        if (world % (tp * pp)) continue;
        const Topology t = Topology::from_world(world, tp, pp);
        const int64_t stage = world / pp;
        for (int64_t ep = 1; ep <= stage; ++ep)
          for (int64_t etp = 1; ep * etp <= stage; ++etp) {
            if (stage % (ep * etp)) continue;
            ++layouts;
            const ExpertGrid x(t, ep, etp);
            INFO(t.to_string() << " ep=" << ep << " etp=" << etp);
            REQUIRE(x.edp() == stage / (ep * etp));
            std::map<std::vector<int64_t>, int> ep_groups, edp_groups, emp_groups;
            for (int64_t r = 0; r < world; ++r) {
              const ExpertCoord c = x.coord(r);
              REQUIRE(r % stage == c.etp + etp * (c.ep + ep * c.edp));
              const auto g = x.ep_group(r), d = x.edp_group(r), m = x.emp_group(r), tg = x.etp_group(r);
              REQUIRE(static_cast<int64_t>(tg.size()) == etp);
              for (int64_t i = 0; i < etp; ++i) REQUIRE(tg[i] == r - c.etp + i);  // consecutive ranks
              REQUIRE(static_cast<int64_t>(g.size()) == ep);
              REQUIRE(g[c.ep] == r);
              REQUIRE(d[c.edp] == r);
              REQUIRE(static_cast<int64_t>(m.size()) == etp * ep * pp);
              for (int64_t q : g) REQUIRE((q / stage == r / stage && x.coord(q).edp == c.edp));
              for (int64_t q : d) REQUIRE((q / stage == r / stage && x.coord(q).ep == c.ep));
              for (int64_t q : m) REQUIRE(x.coord(q).edp == c.edp);
              ++ep_groups[g];
              ++edp_groups[d];
              ++emp_groups[m];
            }
            for (auto* groups : {&ep_groups, &edp_groups, &emp_groups})
              for (const auto& [members, count] : *groups) REQUIRE(count == static_cast<int>(members.size()));
          }
      }
  CHECK(layouts > 100);
  // tp=2 dp=2 ep=2: the ep groups are the tp groups, the edp groups the dp groups
  using V = std::vector<int64_t>;
  const ExpertGrid x(Topology(2, 1, 2), 2, 1);
  CHECK(x.ep_group(1) == V{0, 1});
  CHECK(x.edp_group(1) == V{1, 3});
  CHECK(x.emp_group(2) == V{2, 3});
  CHECK_THROWS_WITH(ExpertGrid(Topology(2, 1, 3), 4, 1), Contains("expert_model_parallel_size 4"));
}

TEST_CASE("topology: bad sizes", "[parallel][topology]") {
  CHECK_THROWS_AS(Topology(0, 1, 1), InputError);
  CHECK_THROWS_AS(Topology(1, -1, 1), InputError);
  CHECK_THROWS_AS(Topology(1, 1, 0), InputError);
  CHECK_THROWS_WITH(Topology::from_world(12, 8, 1), Contains("not divisible"));
  CHECK_THROWS_AS(Topology::from_world(0, 1, 1), InputError);
  Topology t(2, 1, 2);
  CHECK_THROWS_AS(t.coord(4), RuntimeError);
  CHECK_THROWS_AS(t.coord(-1), RuntimeError);
  CHECK_THROWS_AS(t.rank(Coord{2, 0, 0}), RuntimeError);
}
