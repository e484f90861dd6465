// The NCCL watchdog's cost per operation (parallel/flight_recorder.hpp), without the noise
// of a whole training step: N small all-reduces on a one-rank NCCL group (the real NCCL on
// a GPU build, the emulated one in the -emu twin), enqueued back to back and then
// synchronised, with the device watchdog off and on (two CUDA events, a probe and a
// recorder row per operation), alternating ROUNDS times; and one polling pass of the
// watchdog thread's check over the ring (2048 rows) once they have completed.
//   usage: nccl_watchdog_op_bench [N] [ROUNDS]      (default 20000, 5)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/switches.hpp"
#include "core/tensor.hpp"

#ifdef MTNLG_HAVE_NCCL
#include "core/cuda/device.hpp"
#include "parallel/communicator.hpp"
#include "parallel/flight_recorder.hpp"
#include "parallel/nccl_communicator.hpp"
#endif

int main(int argc, char** argv) {
  mtnlg::start_process(argv);
#ifndef MTNLG_HAVE_NCCL
  (void)argc;
  std::printf("nccl_watchdog_op_bench: this build has no NCCL\n");
  return 0;
#else
  using namespace mtnlg;
  using clk = std::chrono::steady_clock;
  const int n = argc > 1 ? std::atoi(argv[1]) : 20000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  cuda::init_backend(0);
  parallel::LocalCommunicator boot("world");
  auto c = parallel::make_nccl_communicator(boot, "dp", /*even_for_one=*/true, /*world_rank=*/0);
  Tensor x = Tensor::zeros({256}).to(Device::cuda);
  auto* p = static_cast<float*>(x.raw());
  const std::string dir = (std::filesystem::temp_directory_path() / "nccl_watchdog_op_bench").string();
  parallel::Watchdog& w = parallel::device_watchdog();
  auto per_op_us = [&](bool on) {
    if (on) {
      parallel::WatchdogOptions o;
      o.run_dir = dir;
      o.token = "bench";
      w.configure(o);
    }
    const auto t0 = clk::now();
    for (int i = 0; i < n; ++i) c->all_reduce(p, 256, parallel::ReduceOp::sum);
    cuda::synchronize();
    const double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / n;
    double check_us = 0;
    if (on) {
      const auto t1 = clk::now();
      w.check(parallel::wall_now());  // completes every row (the events have passed)
      const auto t2 = clk::now();
      w.check(parallel::wall_now());  // a pass over a ring of completed rows
      check_us = std::chrono::duration<double, std::micro>(clk::now() - t2).count();
      (void)t1;
      w.stop();
    }
    return std::pair<double, double>(us, check_us);
  };
  per_op_us(false);  // warm-up
  per_op_us(true);
  std::vector<double> on, off, pass;
  for (int r = 0; r < rounds; ++r) {
    off.push_back(per_op_us(false).first);
    const auto [u, ck] = per_op_us(true);
    on.push_back(u);
    pass.push_back(ck);
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("%-34s %12s %12s %8s %14s %16s\n", "operation (one-rank NCCL group)", "off (us/op)", "on (us/op)",
              "on/off", "extra (us/op)", "check pass (us)");
  std::printf("%-34s %12.2f %12.2f %8.3f %14.2f %16.1f\n", "all_reduce 256 f32, back to back", med(off), med(on),
              med(on) / med(off), med(on) - med(off), med(pass));
  std::filesystem::remove_all(dir);
  return 0;
#endif
}
