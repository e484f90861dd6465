// Attention micro-benchmark: mtnlg's causal attention op alone, forward and forward +
// backward, in both forms of model.attention_backend (the ops the GPT chunk calls):
//   unfused  ops::attention_forward / attention_backward (probs[B,H,T,T] kept)
//   flash    ops::attention_forward_lse / attention_backward_lse (lse[B,H,T] kept)
//
//   attn_bench B T H D WARMUP ITERS [cpu|cuda] [f32|bf16|f16]
//
// qkv[B,T,H*3*D] holds uniform values in [-1, 1), the backward's dout likewise; no
// dropout. Each timed iteration ends with a device synchronisation. Prints one JSON line
// per form: {"backend":..., "fwd_ms":..., "fwd_bwd_ms":...} (medians of ITERS after WARMUP).
// scripts/bench/gpu_bench.sh runs it beside PyTorch's scaled_dot_product_attention.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/blas_core.hpp"
#include "core/switches.hpp"
#include "core/ops.hpp"
#include "core/tensor.hpp"
#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/device.hpp"
#endif

using namespace mtnlg;

namespace {

void sync(Device dev) {
#ifdef MTNLG_HAVE_CUDA
  if (dev == Device::cuda) cuda::synchronize();
#else
  (void)dev;
#endif
}

double median_ms(const std::function<void()>& fn, Device dev, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  sync(dev);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync(dev);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor uniform(const Shape& shape, DType dt, Device dev, uint32_t seed) {
  Tensor host = Tensor::empty(shape, DType::f32, Device::cpu);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = u(gen);
  Tensor conv = Tensor::empty(shape, dt, Device::cpu);
  ops::convert(conv, host);
  return conv.to(dev);
}

}  // namespace

int run(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: attn_bench B T H D WARMUP ITERS [cpu|cuda] [f32|bf16|f16]\n");
    return 2;
  }
  const int64_t B = std::atoll(argv[1]), T = std::atoll(argv[2]), H = std::atoll(argv[3]), D = std::atoll(argv[4]);
  const int warmup = std::atoi(argv[5]), iters = std::max(1, std::atoi(argv[6]));
  const std::string dev_name = argc > 7 ? argv[7] : "cpu", dt_name = argc > 8 ? argv[8] : "f32";
  const DType dt = dt_name == "bf16" ? DType::bf16 : dt_name == "f16" ? DType::f16 : DType::f32;
  Device dev = Device::cpu;
  if (dev_name == "cuda") {
#ifdef MTNLG_HAVE_CUDA
    cuda::init_backend(0);
    dev = Device::cuda;
#else
    std::fprintf(stderr, "attn_bench: built without the CUDA backend\n");
    return 2;
#endif
  }
  const Tensor qkv = uniform({B, T, H * 3 * D}, dt, dev, 1);
  const Tensor dout = uniform({B, T, H * D}, dt, dev, 2);
  Tensor out = Tensor::empty({B, T, H * D}, dt, dev);
  Tensor dqkv = Tensor::empty(qkv.shape(), dt, dev);
  const ops::AttentionDropout none{};

  Tensor probs = Tensor::empty({B, H, T, T}, dt, dev);
  const auto unfused_fwd = [&] { ops::attention_forward(out, probs, qkv, H, none); };
  const auto unfused_both = [&] {
    unfused_fwd();
    ops::attention_backward(dqkv, dout, qkv, probs, H, none);
  };
  const double uf = median_ms(unfused_fwd, dev, warmup, iters), ub = median_ms(unfused_both, dev, warmup, iters);
  probs = Tensor();

  Tensor lse = Tensor::empty({B, H, T}, DType::f32, dev);
  const auto flash_fwd = [&] { ops::attention_forward_lse(out, lse, qkv, H, none); };
  const auto flash_both = [&] {
    flash_fwd();
    ops::attention_backward_lse(dqkv, dout, qkv, out, lse, H, none);
  };
  const double ff = median_ms(flash_fwd, dev, warmup, iters), fb = median_ms(flash_both, dev, warmup, iters);

  for (const auto& [name, f, fb_ms] : {std::tuple{"unfused", uf, ub}, std::tuple{"flash", ff, fb}})
    std::printf(
        "{\"backend\": \"%s\", \"B\": %lld, \"T\": %lld, \"H\": %lld, \"D\": %lld, \"device\": \"%s\", \"dtype\": "
        "\"%s\", "
        "\"fwd_ms\": %.6f, \"fwd_bwd_ms\": %.6f}\n",
        name, static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
        static_cast<long long>(D), dev_name.c_str(), dt_name.c_str(), f, fb_ms);
  return 0;
}

int main(int argc, char** argv) {
  mtnlg::start_process(argv);  // the switches checked, the kernels mtnlg itself would use
  std::fprintf(stderr, "attn_bench: CPU matmul: %s\n", mtnlg::blas_description().c_str());
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_bench: %s\n", e.what());
    return 1;
  }
}
