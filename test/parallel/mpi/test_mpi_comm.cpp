// Multi-rank tests of the MPI communicator, run for np = 1..4: every collective
// against the serial result, in-place variants, point-to-point, byte accounting,
// group construction for every factorisation of np, and error reporting.
// Values are small integers so float sums are exact in any reduction order.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "core/half.hpp"
#include "parallel/communicator.hpp"
#include "test/support/mpi/mpi_test_world.hpp"

using namespace mtnlg;
using namespace mtnlg::parallel;
using Catch::Matchers::Contains;

namespace {
Communicator& world() { return *mtnlg::test::mpi_test_world(); }
// The value rank r contributes at index i.
double value(int64_t r, int64_t i) { return static_cast<double>((r * 7 + i * 3) % 11) - 5.0; }
}  // namespace

TEST_CASE("mpi: world matches the launcher", "[mpi]") {
  auto info = detect_launch();
  CHECK(info.launcher == "mpirun");
  CHECK(world().size() == info.world_size);
  CHECK(world().rank() == info.rank);
  CHECK(world().name() == "world");
}

TEST_CASE("mpi: all_reduce sum and max, float, double, int64", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  for (int64_t n : {0, 1, 7, 1000}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      std::vector<float> f(n);
      std::vector<double> d(n);
      std::vector<int64_t> k(n);
      for (int64_t i = 0; i < n; ++i)
        f[i] = static_cast<float>(value(me, i)), d[i] = value(me, i) * 0.5,
        k[i] = static_cast<int64_t>(value(me, i)) * (int64_t{1} << 40);
      world().all_reduce(f.data(), n, op);
      world().all_reduce(d.data(), n, op);
      world().all_reduce(k.data(), n, op);
      for (int64_t i = 0; i < n; ++i) {
        double s = 0, mx = -1e300;
        for (int64_t r = 0; r < g; ++r) s += value(r, i), mx = std::max(mx, value(r, i));
        double want = op == ReduceOp::sum ? s : mx;
        INFO("n " << n << " i " << i);
        REQUIRE(f[i] == static_cast<float>(want));
        REQUIRE(d[i] == want * 0.5);
        REQUIRE(k[i] == static_cast<int64_t>(want) * (int64_t{1} << 40));
      }
    }
  }
}

TEST_CASE("mpi: reduce_scatter and all_gather, out of place and in place", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  for (int64_t n : {1, 5, 333}) {
    std::vector<float> in(n * g);
    for (int64_t i = 0; i < n * g; ++i) in[i] = static_cast<float>(value(me, i));
    std::vector<float> want(n);
    for (int64_t k = 0; k < n; ++k)
      for (int64_t r = 0; r < g; ++r) want[k] += static_cast<float>(value(r, me * n + k));
    std::vector<float> out(n);
    world().reduce_scatter(in.data(), out.data(), n);
    CHECK(out == want);
    // In place: the shard lands in this rank's block of the input buffer.
    std::vector<float> buf = in;
    world().reduce_scatter(buf.data(), buf.data() + me * n, n);
    CHECK(std::vector<float>(buf.begin() + me * n, buf.begin() + (me + 1) * n) == want);

    std::vector<float> mine(n), all(n * g);
    for (int64_t k = 0; k < n; ++k) mine[k] = static_cast<float>(value(me, k) + 100 * me);
    world().all_gather(mine.data(), all.data(), n);
    for (int64_t r = 0; r < g; ++r)
      for (int64_t k = 0; k < n; ++k) REQUIRE(all[r * n + k] == static_cast<float>(value(r, k) + 100 * r));
    std::vector<float> all2(n * g, -1.f);
    std::copy(mine.begin(), mine.end(), all2.begin() + me * n);
    world().all_gather(all2.data() + me * n, all2.data(), n);
    CHECK(all2 == all);
  }
}

TEST_CASE("mpi: broadcast from every root", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  for (int64_t root = 0; root < g; ++root) {
    std::vector<float> v(17);
    for (int64_t i = 0; i < 17; ++i) v[i] = static_cast<float>(me == root ? value(root, i) : 99);
    world().broadcast(v.data(), 17, root);
    for (int64_t i = 0; i < 17; ++i) REQUIRE(v[i] == static_cast<float>(value(root, i)));
  }
  float x = 0;
  CHECK_THROWS_WITH(world().broadcast(&x, 1, g), Contains("rank"));
}

// Rank r sends (r + j) % 3 elements to rank j (some blocks empty), its own block too;
// every element says who sent it for whom; i32 and f32; bytes = what left the rank.
TEST_CASE("mpi: all_to_all_v with uneven and empty blocks", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  auto count = [](int64_t from, int64_t to) { return (from + to) % 3; };
  std::vector<int64_t> sc, rc;
  std::vector<int32_t> in;
  for (int64_t j = 0; j < g; ++j) {
    sc.push_back(count(me, j));
    rc.push_back(count(j, me));
    for (int64_t i = 0; i < count(me, j); ++i) in.push_back(static_cast<int32_t>(me * 1000 + j * 10 + i));
  }
  std::vector<int32_t> out(static_cast<size_t>(std::accumulate(rc.begin(), rc.end(), int64_t{0})), -1);
  world().reset_bytes();
  world().all_to_all_v(in.data(), sc, out.data(), rc, DType::i32);
  std::vector<int32_t> want;
  for (int64_t j = 0; j < g; ++j)
    for (int64_t i = 0; i < count(j, me); ++i) want.push_back(static_cast<int32_t>(j * 1000 + me * 10 + i));
  CHECK(out == want);
  int64_t sent = 0;
  for (int64_t j = 0; j < g; ++j)
    if (j != me) sent += count(me, j) * 4;
  CHECK(world().bytes_sent() == sent);
  std::vector<float> fin(in.begin(), in.end()), fout(out.size(), 0);
  world().all_to_all_v(fin.data(), sc, fout.data(), rc, DType::f32);
  CHECK(std::vector<float>(want.begin(), want.end()) == fout);
}

// The expert grid's groups on this world: their members are ExpertGrid's lists.
TEST_CASE("mpi: expert groups follow the expert grid", "[mpi]") {
  const int64_t g = world().size();
  auto w = mtnlg::test::mpi_test_world();
  for (int64_t ep = 1; ep <= g; ++ep) {
    if (g % ep) continue;
    ProcessGroups pg = make_groups(w, Topology::from_world(g, 1, 1));
    add_expert_groups(pg, ep, 1);
    const ExpertGrid x(pg.topo, ep, 1);
    INFO("ep " << ep);
    CHECK(pg.ep_size == ep);
    CHECK(pg.ecoord.ep == x.coord(pg.rank).ep);
    CHECK((ep == 1 ? pg.ep == nullptr : pg.ep->size() == ep && pg.ep->rank() == pg.ecoord.ep));
    CHECK(pg.edp->size() == g / ep);
    CHECK(pg.edp->rank() == pg.ecoord.edp);
    CHECK(pg.emp->size() == ep);
  }
}

TEST_CASE("mpi: send/recv around a ring", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  float x = 1;
  CHECK_THROWS_AS(world().send(&x, 1, me, 0), RuntimeError);  // to oneself
  CHECK_THROWS_WITH(world().recv(&x, 1, g + 3, 0), Contains("peer"));
  if (g == 1) return;
  const int64_t next = (me + 1) % g, prev = (me + g - 1) % g;
  std::vector<float> out(1000), in(1000);
  for (int64_t i = 0; i < 1000; ++i) out[i] = static_cast<float>(value(me, i));
  // Even ranks send first, odd ranks receive first: no cycle of blocked sends.
  if (me % 2 == 0) {
    world().send(out.data(), 1000, next, 7);
    world().recv(in.data(), 1000, prev, 7);
  } else {
    world().recv(in.data(), 1000, prev, 7);
    world().send(out.data(), 1000, next, 7);
  }
  for (int64_t i = 0; i < 1000; ++i) REQUIRE(in[i] == static_cast<float>(value(prev, i)));
}

TEST_CASE("mpi: bytes follow the ring model", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  auto ring = [&](double factor, int64_t bytes) { return static_cast<int64_t>(factor * (g - 1) / g * bytes + 0.5); };
  std::vector<float> f(1000 * g), o(1000 * g);
  std::vector<double> d(1000);
  world().reset_bytes();
  world().all_reduce(f.data(), 1000, ReduceOp::sum);
  CHECK(world().bytes_sent() == ring(2, 4000));
  world().reset_bytes();
  world().all_reduce(d.data(), 1000, ReduceOp::max);
  CHECK(world().bytes_sent() == ring(2, 8000));
  world().reset_bytes();
  world().reduce_scatter(f.data(), o.data(), 1000);
  CHECK(world().bytes_sent() == (g - 1) * 4000);
  world().reset_bytes();
  world().all_gather(f.data(), o.data(), 1000);
  CHECK(world().bytes_sent() == (g - 1) * 4000);
  world().reset_bytes();
  world().broadcast(f.data(), 1000, 0);
  CHECK(world().bytes_sent() == ring(1, 4000));
  world().reset_bytes();
  world().barrier();
  CHECK(world().bytes_sent() == 0);
  if (g > 1) {
    if (me == 0) world().send(f.data(), 250, 1, 3);
    if (me == 1) world().recv(f.data(), 250, 0, 3);
    CHECK(world().bytes_sent() == (me == 0 ? 1000 : 0));
  }
  world().reset_bytes();
}

TEST_CASE("mpi: process groups for every factorisation of the world", "[mpi]") {
  const int64_t n = world().size(), me = world().rank();
  auto shared_world = mtnlg::test::mpi_test_world();
  for (int64_t tp = 1; tp <= n; ++tp) {
    for (int64_t pp = 1; tp * pp <= n; ++pp) {
      if (n % (tp * pp)) continue;
      Topology topo = Topology::from_world(n, tp, pp);
      INFO(topo.to_string());
      ProcessGroups g = make_groups(shared_world, topo);
      CHECK(g.rank == me);
      CHECK(g.coord == topo.coord(me));
      struct Kind {
        std::shared_ptr<Communicator> c;
        std::vector<int64_t> members;
        const char* name;
      };
      bool in_embedding = g.coord.pp == 0 || g.coord.pp == pp - 1;
      std::vector<Kind> kinds = {{g.tp, topo.tp_group(me), "tp"},
                                 {g.pp, topo.pp_group(me), "pp"},
                                 {g.dp, topo.dp_group(me), "dp"},
                                 {g.mp, topo.mp_group(me), "mp"}};
      if (in_embedding)
        kinds.push_back({g.embedding, topo.embedding_group(me), "embedding"});
      else
        CHECK(g.embedding == nullptr);
      for (auto& k : kinds) {
        REQUIRE(k.c != nullptr);
        CHECK(k.c->name() == k.name);
        CHECK(k.c->size() == static_cast<int64_t>(k.members.size()));
        CHECK(k.members[k.c->rank()] == me);
        // Sum and gather of global ranks over the group == the topology's member list.
        int64_t s = me;
        k.c->all_reduce(&s, 1, ReduceOp::sum);
        CHECK(s == std::accumulate(k.members.begin(), k.members.end(), int64_t{0}));
        std::vector<float> all(k.members.size());
        float mine = static_cast<float>(me);
        k.c->all_gather(&mine, all.data(), 1);
        for (size_t i = 0; i < all.size(); ++i) CHECK(all[i] == static_cast<float>(k.members[i]));
      }
      CHECK(g.tp->rank() == g.coord.tp);
      CHECK(g.pp->rank() == g.coord.pp);
      CHECK(g.dp->rank() == g.coord.dp);
      CHECK(g.mp->rank() == g.coord.pp * tp + g.coord.tp);
      // Bytes are counted per communicator.
      g.tp->reset_bytes();
      g.dp->reset_bytes();
      std::vector<float> v(100);
      g.dp->all_reduce(v.data(), 100, ReduceOp::sum);
      CHECK(g.tp->bytes_sent() == 0);
      CHECK(g.dp->bytes_sent() == static_cast<int64_t>(2.0 * (topo.dp() - 1) / topo.dp() * 400 + 0.5));
    }
  }
  CHECK_THROWS_AS(make_groups(shared_world, Topology(n + 1, 1, 1)), InputError);
}

TEST_CASE("mpi: the named layouts on four ranks", "[mpi]") {
  if (world().size() != 4) return;
  const int64_t me = world().rank();
  using V = std::vector<int64_t>;
  auto w = mtnlg::test::mpi_test_world();
  {
    auto g = make_groups(w, Topology(2, 2, 1));  // tp pairs are stages
    CHECK(g.topo.tp_group(me) == (me < 2 ? V{0, 1} : V{2, 3}));
    CHECK(g.topo.pp_group(me) == (me % 2 == 0 ? V{0, 2} : V{1, 3}));
    CHECK(g.dp->size() == 1);
    CHECK(g.mp->size() == 4);
    CHECK(g.embedding->size() == 2);
  }
  {
    auto g = make_groups(w, Topology(2, 1, 2));
    CHECK(g.topo.dp_group(me) == (me % 2 == 0 ? V{0, 2} : V{1, 3}));
    CHECK(g.pp->size() == 1);
    CHECK(g.embedding->size() == 1);
    CHECK(g.mp->size() == 2);
  }
  {
    auto g = make_groups(w, Topology(1, 2, 2));
    CHECK(g.topo.dp_group(me) == (me < 2 ? V{0, 1} : V{2, 3}));
    CHECK(g.topo.pp_group(me) == (me % 2 == 0 ? V{0, 2} : V{1, 3}));
    CHECK(g.tp->size() == 1);
    CHECK(g.mp->size() == 2);
  }
}

TEST_CASE("mpi: isend is matched by blocking recv in both directions at once", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  if (g == 1) return;
  // Every rank sends a large message to every other rank first, then receives:
  // with blocking sends this pattern could deadlock; with isend it must not.
  const int64_t n = 1 << 18;  // 1 MiB: beyond the eager limit, so a rendezvous send
  std::vector<std::vector<float>> out(g, std::vector<float>(n)), in(g, std::vector<float>(n));
  std::vector<std::unique_ptr<Request>> pending;
  world().reset_bytes();
  for (int64_t peer = 0; peer < g; ++peer) {
    if (peer == me) continue;
    for (int64_t i = 0; i < n; i += 1000) out[peer][i] = static_cast<float>(me * 10 + peer);
    pending.push_back(world().isend(out[peer].data(), n, peer, 5));
  }
  for (int64_t peer = 0; peer < g; ++peer)
    if (peer != me) world().recv(in[peer].data(), n, peer, 5);
  for (auto& r : pending) r->wait();
  for (int64_t peer = 0; peer < g; ++peer)
    if (peer != me) CHECK(in[peer][1000] == static_cast<float>(peer * 10 + me));
  CHECK(world().bytes_sent() == (g - 1) * n * 4);
  world().reset_bytes();
}

// The ring of context parallelism's p2p: two shifts in flight at once (the next K/V and
// a gradient), each an isend and an irecv with one tag; they match in posting order, and
// a receive counts no bytes.
TEST_CASE("mpi: irecv matches in posting order with two shifts in flight", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  if (g == 1) return;
  const int64_t to = (me + 1) % g, from = (me + g - 1) % g, n = 1 << 18;  // past the eager limit
  std::vector<float> a(n, static_cast<float>(me)), b(n, static_cast<float>(100 + me)), ra(n, -1.f), rb(n, -1.f);
  world().reset_bytes();
  std::vector<std::unique_ptr<Request>> reqs;
  reqs.push_back(world().isend(a.data(), n, DType::f32, to, 9));
  reqs.push_back(world().irecv(ra.data(), n, DType::f32, from, 9));
  reqs.push_back(world().isend(b.data(), n, DType::f32, to, 9));
  reqs.push_back(world().irecv(rb.data(), n, DType::f32, from, 9));
  for (auto& r : reqs) r->wait_stream();  // the host path: wait()
  CHECK(ra[n - 1] == static_cast<float>(from));
  CHECK(rb[0] == static_cast<float>(100 + from));
  CHECK(world().bytes_sent() == 2 * n * 4);
  world().reset_bytes();
}

TEST_CASE("mpi: bf16 and fp16 payloads: sums in fp32 rounded to nearest even, gathers and messages bit-exact",
          "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(to_string(dt));
    auto enc = [&](float x) { return dt == DType::bf16 ? half::f32_to_bf16(x) : half::f32_to_f16(x); };
    auto dec = [&](uint16_t h) { return dt == DType::bf16 ? half::bf16_to_f32(h) : half::f16_to_f32(h); };
    const int64_t n = 257;
    // Small integers: every partial sum is exact in bf16/fp16, so any reduction order
    // gives the serial result; plus one element whose sum must round (1 + 2^-9 g).
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      std::vector<uint16_t> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = enc(static_cast<float>(value(me, i)));
      world().all_reduce(x.data(), n, dt, op);
      for (int64_t i = 0; i < n; ++i) {
        double s = 0, mx = -1e300;
        for (int64_t r = 0; r < g; ++r) s += value(r, i), mx = std::max(mx, value(r, i));
        REQUIRE(dec(x[i]) == static_cast<float>(op == ReduceOp::sum ? s : mx));
      }
    }
    // reduce_scatter: rank r keeps block r of the sum
    std::vector<uint16_t> in(n * g), out(n);
    for (int64_t i = 0; i < n * g; ++i) in[i] = enc(static_cast<float>(value(me, i)));
    world().reduce_scatter(in.data(), out.data(), n, dt);
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int64_t r = 0; r < g; ++r) s += value(r, me * n + i);
      REQUIRE(dec(out[i]) == static_cast<float>(s));
    }
    // all_gather and point-to-point move the 16-bit words unchanged
    std::vector<uint16_t> mine(n), all(n * g);
    for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<uint16_t>(me * 1000 + i);
    world().all_gather(mine.data(), all.data(), n, dt);
    for (int64_t r = 0; r < g; ++r)
      for (int64_t i = 0; i < n; ++i) REQUIRE(all[r * n + i] == static_cast<uint16_t>(r * 1000 + i));
    if (g > 1) {
      const int64_t to = (me + 1) % g, from = (me + g - 1) % g;
      std::vector<uint16_t> got(n);
      auto req = world().isend(mine.data(), n, dt, to, 7);
      world().recv(got.data(), n, dt, from, 7);
      req->wait();
      for (int64_t i = 0; i < n; ++i) REQUIRE(got[i] == static_cast<uint16_t>(from * 1000 + i));
    }
    // byte accounting uses the 2-byte element size
    world().reset_bytes();
    std::vector<uint16_t> y(100, enc(1.0f));
    world().all_reduce(y.data(), 100, dt, ReduceOp::sum);
    CHECK(world().bytes_sent() == static_cast<int64_t>(2.0 * (g - 1) / g * 200 + 0.5));
  }
}
