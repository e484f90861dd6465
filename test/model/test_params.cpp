// ParamStore's split geometry (model/params.hpp): a split dimension made of parts, each
// split over the ranks on its own (a SwiGLU expert's [gate; up] under expert tensor
// parallelism), maps every local element to its global one and back, and the shards of
// all ranks tile the whole parameter exactly once; routed experts sit after every other
// parameter in the flat buffers.
#include <catch2/catch.hpp>
#include <set>

#include "model/params.hpp"

using namespace mtnlg;
using namespace mtnlg::model;

TEST_CASE("params: a split of parts maps local to global and back, the shards tiling the whole", "[params]") {
  for (int64_t parts : {1, 2, 3})
    for (int64_t count : {1, 2, 4}) {
      const int64_t part_local = 3, rows = parts * part_local * count, cols = 5;
      std::set<int64_t> seen;
      for (int64_t rank = 0; rank < count; ++rank) {
        ParamInfo p;
        p.name = "w";
        p.global_shape = {rows, cols};
        p.shape = {rows / count, cols};
        p.split_dim = 0;
        p.split_rank = rank;
        p.split_count = count;
        p.split_parts = parts;
        for (int64_t r = 0; r < p.shape[0]; ++r) {
          const int64_t g = split_global_coord(r, p.shape[0], rank, count, parts);
          INFO("parts " << parts << " count " << count << " rank " << rank << " row " << r);
          // each part's rows of this rank lie inside that part of the whole
          CHECK(g / (part_local * count) == r / part_local);
          CHECK(split_local_coord(g, p.shape[0], rank, count, parts) == r);
          CHECK(split_local_coord(g, p.shape[0], (rank + 1) % count, count, parts) == (count == 1 ? r : -1));
          for (int64_t c = 0; c < cols; ++c) seen.insert(ParamStore::global_index(p, r * cols + c));
        }
      }
      CHECK(static_cast<int64_t>(seen.size()) == rows * cols);
      CHECK(*seen.rbegin() == rows * cols - 1);
    }
}

TEST_CASE("params: routed experts follow every other parameter in the flat buffers", "[params]") {
  ParamStore s;
  auto add = [&](const char* name, bool expert) {
    ParamInfo p;
    p.name = name;
    p.global_shape = p.shape = {2, 3};
    p.expert = expert;
    s.add(p);
  };
  add("a", false);
  add("e0", true);
  add("b", false);
  add("e1", true);
  s.finalize();
  CHECK(s.expert_offset() == 12);
  CHECK(s.info("a").offset == 0);
  CHECK(s.info("b").offset == 6);
  CHECK(s.info("e0").offset == 12);
  CHECK(s.info("e1").offset == 18);
  ParamStore dense;
  ParamInfo p;
  p.name = "w";
  p.global_shape = p.shape = {4};
  dense.add(p);
  dense.finalize();
  CHECK(dense.expert_offset() == dense.numel());
}
