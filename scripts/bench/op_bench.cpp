// The op table's speed line (test/core/ops/op_cases.hpp): each case's forward and backward
// (the entry's `exec`) timed on one device, one row per case:
//
//   op_bench [cpu|cuda] [--all] [--op NAME] [--warmup N] [--iters N]
//
// By default the cases marked for the benchmark (mostly each entry's largest shape in f32
// and bf16); --all times every device case, --op one entry. Activations are stored in the
// case's dtype on either device (the op as the trainer runs it). Each timed iteration ends
// with a device synchronisation; the median is printed with GB/s (the bytes of the case's
// tensors once per iteration, a lower bound of the traffic) and, for GEMM-shaped ops,
// GFLOP/s (their multiply-adds, causal attention counted at half). On the emulated CUDA
// backend the times are the emulator's, not a GPU's.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "core/blas_core.hpp"
#include "core/switches.hpp"
#include "test/core/ops/op_cases.hpp"

using namespace mtnlg;
using namespace mtnlg::optable;

int main(int argc, char** argv) {
  start_process(argv);  // the switches checked, the kernels mtnlg itself would use
  std::fprintf(stderr, "op_bench: CPU matmul: %s\n", blas_description().c_str());
  Device dev = Device::cpu;
  bool all = false;
  std::string only;
  int warmup = 2, iters = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "cpu")
      dev = Device::cpu;
    else if (a == "cuda")
      dev = Device::cuda;
    else if (a == "--all")
      all = true;
    else if (a == "--op" && i + 1 < argc)
      only = argv[++i];
    else if (a == "--warmup" && i + 1 < argc)
      warmup = std::max(0, std::atoi(argv[++i]));
    else if (a == "--iters" && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: op_bench [cpu|cuda] [--all] [--op NAME] [--warmup N] [--iters N]\n");
      return 2;
    }
  }
  if (dev == Device::cuda && !cuda_available()) {
    std::fprintf(stderr, "op_bench: no CUDA device (or a CPU-only build)\n");
    return 1;
  }
  const char* dev_name = dev == Device::cuda ? "cuda" : "cpu";
  std::printf("| op | case | device | median us | GB/s | GFLOP/s |\n|---|---|---|---:|---:|---:|\n");
  int rows = 0;
  for (const Entry& e : registry()) {
    if (!e.prepare || (!only.empty() && e.name != only)) continue;
    for (size_t i = 0; i < e.cases.size(); ++i) {
      const Case& k = e.cases[i];
      if (!k.device || !(all || k.bench)) continue;
      try {
        Ctx c(dev, k.dt, k.dt, case_seed(e, i));
        Run r = e.prepare(c, k);
        for (int w = 0; w < warmup; ++w) r.exec();
        synchronize(dev);
        std::vector<double> us;
        for (int it = 0; it < iters; ++it) {
          const auto t0 = std::chrono::steady_clock::now();
          r.exec();
          synchronize(dev);
          us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(us.begin(), us.end());
        const double med = us[us.size() / 2];
        char flops[32] = "-";
        if (r.flops > 0) std::snprintf(flops, sizeof flops, "%.2f", r.flops / med * 1e-3);
        std::printf("| %s | %s | %s | %.1f | %.2f | %s |\n", e.name.c_str(), k.label.c_str(), dev_name, med,
                    c.bytes / med * 1e-3, flops);
      } catch (const std::exception& ex) {
        std::printf("| %s | %s | %s | error: %s | - | - |\n", e.name.c_str(), k.label.c_str(), dev_name, ex.what());
      }
      ++rows;
    }
  }
  if (rows == 0) {
    std::fprintf(stderr, "op_bench: no case selected\n");
    return 1;
  }
  return 0;
}
