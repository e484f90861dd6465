// NcclCommunicator (parallel/nccl_communicator.hpp) on one GPU: a size-1 NCCL group
// bootstrapped through a LocalCommunicator. Checks the collectives on device buffers
// (identities for one rank, in place and out of place), split, the peer checks, and
// iall_reduce's stream-ordered wait. Multi-GPU behaviour needs several ranks with a
// GPU each (not in this test). Tagged [gpu]; compiled only with NCCL.
#ifdef MTNLG_HAVE_NCCL
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <vector>

#include "core/cuda/device.hpp"
#include "core/error.hpp"
#include "core/ops.hpp"
#include "parallel/communicator.hpp"
#include "parallel/flight_recorder.hpp"
#include "parallel/nccl_communicator.hpp"
#include "test/core/cuda/cuda_test_util.hpp"
#include "test/support/process_groups.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using namespace mtnlg::parallel;

namespace {
float* dev(const Tensor& t) { return static_cast<float*>(t.raw()); }  // device pointer for NCCL
Tensor seq_tensor(int64_t n, float base) {
  Tensor t = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = base + static_cast<float>(i);
  return t;
}
}  // namespace

TEST_CASE("nccl communicator: size-1 group on one GPU", "[gpu]") {
  if (!test::gpu_ready()) return;
  REQUIRE(have_nccl());
  LocalCommunicator boot("world");
  auto c = make_nccl_communicator(boot, "dp", /*even_for_one=*/true);
  CHECK(std::string(c->backend()) == "nccl");
  CHECK(c->rank() == 0);
  CHECK(c->size() == 1);
  CHECK(c->name() == "dp");

  Tensor x = seq_tensor(1000, 1.0f).to(Device::cuda);
  c->all_reduce(dev(x), 1000, ReduceOp::sum);
  test::check_close("all_reduce", x, seq_tensor(1000, 1.0f), 0.0 + 1e-12);
  auto req = c->iall_reduce(dev(x), 1000, ReduceOp::max);
  req->wait();
  test::check_close("iall_reduce", x, seq_tensor(1000, 1.0f), 1e-12);
  c->broadcast(dev(x), 1000, 0);
  Tensor y = Tensor::empty({1000}, DType::f32, Device::cuda);
  ops::fill(y, 0.0);
  c->reduce_scatter(dev(x), dev(y), 1000);
  test::check_close("reduce_scatter", y, seq_tensor(1000, 1.0f), 1e-12);
  ops::fill(y, 0.0);
  c->all_gather(dev(x), dev(y), 1000);
  test::check_close("all_gather", y, seq_tensor(1000, 1.0f), 1e-12);
  ops::fill(y, 0.0);
  c->all_to_all_v(dev(x), {1000}, dev(y), {1000}, DType::f32);  // its one block, copied on the stream
  test::check_close("all_to_all_v", y, seq_tensor(1000, 1.0f), 1e-12);
  c->barrier();

  CHECK_THROWS_AS(c->send(dev(x), 1, 0, 0), RuntimeError);  // no peer but itself
  CHECK_THROWS_AS(c->recv(dev(x), 1, 1, 0), RuntimeError);
  CHECK_THROWS_AS(c->broadcast(dev(x), 1, 1), RuntimeError);

  auto sub = c->split(0, 0, "tp");
  REQUIRE(sub);
  CHECK(sub->name() == "tp");
  CHECK(sub->size() == 1);
  CHECK(c->split(-1, 0, "none") == nullptr);
  CHECK(c->bytes_sent() == 0);  // size-1 groups move nothing
}

// A training run on one GPU sets up no NCCL at all: every group of one placed on the GPU
// is a local group whose out-of-place copies are device copies (on the emulator a host
// copy of device memory would be caught as a host read).
TEST_CASE("nccl communicator: a group of one on the GPU is local, with device copies", "[gpu]") {
  if (!test::gpu_ready()) return;
  LocalCommunicator boot("world");
  auto c = make_nccl_communicator(boot, "dp");
  CHECK(std::string(c->backend()) == "local");
  CHECK(c->name() == "dp");
  Tensor x = seq_tensor(333, 2.0f).to(Device::cuda);
  Tensor y = Tensor::empty({333}, DType::f32, Device::cuda);
  ops::fill(y, 0.0);
  c->reduce_scatter(dev(x), dev(y), 333);
  test::check_close("reduce_scatter", y, seq_tensor(333, 2.0f), 1e-12);
  ops::fill(y, 0.0);
  c->all_gather(dev(x), dev(y), 333);
  test::check_close("all_gather", y, seq_tensor(333, 2.0f), 1e-12);
  auto sub = c->split(0, 0, "tp");
  REQUIRE(sub);
  ops::fill(y, 0.0);
  sub->all_gather(dev(x), dev(y), 333);
  test::check_close("all_gather after split", y, seq_tensor(333, 2.0f), 1e-12);

  const ProcessGroups placed = place_groups(test::single_process_groups(), Device::cuda);
  for (const auto& grp : {placed.tp, placed.pp, placed.dp, placed.embedding, placed.mp}) {
    REQUIRE(grp);
    INFO(grp->name());
    CHECK(std::string(grp->backend()) == "local");
  }
}

// The device watchdog on a real (one-rank) NCCL group: every operation gets a row with CUDA
// events around it, the rows complete once the stream has run, the group's three NCCL
// communicators are registered under its name with the members' world ranks, and the
// destroyed group stops being polled.
TEST_CASE("nccl communicator: operations recorded by the device watchdog", "[gpu]") {
  if (!test::gpu_ready()) return;
  test::TempDir dir("nccl-watchdog");
  Watchdog& w = device_watchdog();
  WatchdogOptions o;
  o.run_dir = dir.str();
  o.token = "gpu";
  o.timeout_s = 600;
  w.configure(o);
  {
    LocalCommunicator boot("world");
    auto c = make_nccl_communicator(boot, "dp", /*even_for_one=*/true, /*world_rank=*/0);
    Tensor x = seq_tensor(100, 1.0f).to(Device::cuda);
    c->all_reduce(dev(x), 100, ReduceOp::sum);
    c->broadcast(dev(x), 100, 0);
    nlohmann::json j = nlohmann::json::parse(w.dump_json(""));
    const size_t n = j["ops"].size();
    REQUIRE(n >= 2);
    CHECK(j["ops"][n - 2]["op"] == "all_reduce");
    CHECK(j["ops"][n - 1]["op"] == "broadcast");
    CHECK(j["ops"][n - 1]["bytes"] == 400);
    cuda::synchronize();
    w.check(wall_now());
    j = nlohmann::json::parse(w.dump_json(""));
    CHECK(j["ops"][n - 2]["state"] == "completed");
    CHECK(j["ops"][n - 1]["state"] == "completed");
    const auto& comm = j["comms"][j["ops"][n - 1]["comm"].get<size_t>()];
    CHECK(comm["group"] == "dp");
    CHECK(comm["channel"] == "coll");
    CHECK(comm["members"] == std::vector<int64_t>{0});
    CHECK(w.check(wall_now()).reason.empty());  // no asynchronous error
  }
  CHECK(w.check(wall_now()).reason.empty());  // the destroyed group is no longer polled
  w.stop();
}
#endif  // MTNLG_HAVE_NCCL
