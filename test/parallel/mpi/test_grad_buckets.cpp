// Multi-rank tests of the nonblocking all-reduce and the data-parallel GradBucketer
// (parallel/grad_buckets.hpp), run for np = 1..4: bucket layout in reverse parameter
// order, buckets started as soon as their parameters are ready (interleaved with other
// collectives, as the pipeline's backward does), the final sums, byte accounting and
// misuse errors. Small-integer values keep float sums exact in any order.
#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "parallel/grad_buckets.hpp"
#include "test/support/mpi/mpi_test_world.hpp"

using namespace mtnlg;
using namespace mtnlg::parallel;

namespace {
Communicator& world() { return *mtnlg::test::mpi_test_world(); }
double value(int64_t r, int64_t i) { return static_cast<double>((r * 5 + i * 3) % 13) - 6.0; }
std::vector<GradRange> tiles(const std::vector<int64_t>& sizes) {
  std::vector<GradRange> out;
  int64_t off = 0;
  for (auto n : sizes) out.push_back({off, n}), off += n;
  return out;
}
}  // namespace

TEST_CASE("mpi: iall_reduce sums in place and counts all-reduce bytes", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  std::vector<float> a(100), b(3);
  for (int64_t i = 0; i < 100; ++i) a[i] = static_cast<float>(value(me, i));
  for (int64_t i = 0; i < 3; ++i) b[i] = static_cast<float>(value(me, i + 7));
  world().reset_bytes();
  auto ra = world().iall_reduce(a.data(), 100, ReduceOp::sum);
  auto rb = world().iall_reduce(b.data(), 3, ReduceOp::max);
  double x = 1;
  world().all_reduce(&x, 1, ReduceOp::sum);  // another collective while both are in flight
  rb->wait();
  ra->wait();
  CHECK(x == static_cast<double>(g));
  for (int64_t i = 0; i < 100; ++i) {
    double s = 0;
    for (int64_t r = 0; r < g; ++r) s += value(r, i);
    REQUIRE(a[i] == static_cast<float>(s));
  }
  for (int64_t i = 0; i < 3; ++i) {
    double mx = -1e9;
    for (int64_t r = 0; r < g; ++r) mx = std::max(mx, value(r, i + 7));
    REQUIRE(b[i] == static_cast<float>(mx));
  }
  const double want = g > 1 ? 2.0 * double(g - 1) / double(g) * (400 + 12 + 8) : 0.0;
  CHECK(std::abs(double(world().bytes_sent()) - want) <= 1.0);
}

TEST_CASE("mpi: GradBucketer forms buckets of whole parameters in reverse order", "[mpi]") {
  // params of 10, 30, 5, 20, 40 elements; bucket_size 25: walking back from the end,
  // {40} closes at 40, {20, 5} at 25, {30} at 30, {10} is the rest.
  GradBucketer gb(tiles({10, 30, 5, 20, 40}), mtnlg::test::mpi_test_world(), 25);
  REQUIRE(gb.num_buckets() == 4);
  CHECK(gb.buckets()[0].offset == 65);
  CHECK(gb.buckets()[0].numel == 40);
  CHECK(gb.buckets()[1].offset == 40);
  CHECK(gb.buckets()[1].numel == 25);
  CHECK(gb.buckets()[2].offset == 10);
  CHECK(gb.buckets()[2].numel == 30);
  CHECK(gb.buckets()[3].offset == 0);
  CHECK(gb.buckets()[3].numel == 10);
  GradBucketer one(tiles({10, 30, 5}), mtnlg::test::mpi_test_world(), 0);
  CHECK(one.num_buckets() == 1);
  CHECK_THROWS_AS(GradBucketer({{0, 10}, {12, 5}}, mtnlg::test::mpi_test_world(), 4), RuntimeError);
}

TEST_CASE("mpi: GradBucketer starts ready buckets at once and sums every gradient", "[mpi]") {
  const int64_t g = world().size(), me = world().rank();
  const std::vector<int64_t> sizes = {10, 30, 5, 20, 40};
  GradBucketer gb(tiles(sizes), mtnlg::test::mpi_test_world(), 25);
  std::vector<float> grads(105);
  for (int step = 0; step < 2; ++step) {  // reusable across steps
    for (int64_t i = 0; i < 105; ++i) grads[i] = static_cast<float>(value(me, i + step));
    world().reset_bytes();
    gb.begin(grads.data());
    gb.mark_ready(65, 40);  // last parameter: bucket 0 complete
    CHECK(gb.started_early() == 1);
    double x = 1;
    world().all_reduce(&x, 1, ReduceOp::sum);  // "backward" collectives in between
    gb.mark_ready(45, 20);                     // bucket 1 still misses the 5-element parameter
    CHECK(gb.started_early() == 1);
    gb.mark_ready(10, 35);  // params 30 and 5: buckets 1 and 2 complete
    CHECK(gb.started_early() == 3);
    CHECK_THROWS_AS(gb.mark_ready(10, 30), RuntimeError);  // twice in one step
    CHECK_THROWS_AS(gb.mark_ready(3, 5), RuntimeError);    // not a parameter start
    gb.finish();                                           // the first parameter was never marked: finish starts it
    for (int64_t i = 0; i < 105; ++i) {
      double s = 0;
      for (int64_t r = 0; r < g; ++r) s += value(r, i + step);
      INFO("step " << step << " element " << i);
      REQUIRE(grads[i] == static_cast<float>(s));
    }
    // Same bytes as one all-reduce of the whole buffer, plus the 8-byte double.
    const double want = g > 1 ? 2.0 * double(g - 1) / double(g) * (105 * 4 + 8) : 0.0;
    CHECK(std::abs(double(world().bytes_sent()) - want) <= 1.0);
  }
}
