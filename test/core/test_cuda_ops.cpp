// Every CUDA op against its CPU reference (docs/ARCHITECTURE.md "Invariants") on fresh random
// inputs, at several shapes including odd sizes and every launch branch, in fp32
// (rtol 1e-5) and bf16/fp16 storage (rtol 1e-2); metric and helpers in
// cuda_test_util.hpp. Outputs are NaN-poisoned before each run; accumulated outputs
// start from the same random values on both devices. Cases are tagged [gpu] (ctest
// label gpu); without a device they WARN and return unless MTNLG_REQUIRE_GPU=1.
// The whole file compiles to nothing in CPU-only builds.
#ifdef MTNLG_HAVE_CUDA
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/cuda_check.hpp"
#include "core/cuda/device.hpp"
#include "core/cuda/ops_cuda.hpp"
#include "core/error.hpp"
#include "core/ops.hpp"
#include "test/core/cuda_test_util.hpp"

using namespace mtnlg;
using namespace mtnlg::test;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

Tensor i32_cpu(const Shape& s, std::mt19937_64& g, int lo, int hi) {
  Tensor t = Tensor::empty(s, DType::i32);
  std::uniform_int_distribution<int> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = d(g);
  return t;
}

Tensor cpu_zeros(const Shape& s) { return Tensor::zeros(s, DType::f32); }

}  // namespace

// ---- allocator (the size-class arithmetic needs no device) ------------------------------

TEST_CASE("cuda allocator: size classes", "[cuda]") {
  CHECK(cuda::allocation_size_class(0) == 512);
  CHECK(cuda::allocation_size_class(1) == 512);
  CHECK(cuda::allocation_size_class(512) == 512);
  CHECK(cuda::allocation_size_class(513) == 1024);
  CHECK(cuda::allocation_size_class(1 << 20) == (1 << 20));
  CHECK(cuda::allocation_size_class((1 << 20) + 1) == (2 << 20));
  CHECK(cuda::allocation_size_class((5 << 20) + 7) == (6 << 20));
}

TEST_CASE("cuda allocator: accounting, peak and reuse", "[gpu]") {
  if (!gpu_ready()) return;
  // Size classes round 4000 B up to 4096; exact mode (the emulator's default,
  // MTNLG_CUDA_EXACT_ALLOC=1 on a GPU) keeps every block its requested size.
  const bool exact = cuda::exact_allocations();
  const int64_t a_bytes = exact ? 4000 : 4096;
  cuda::synchronize();
  cuda::empty_cache();
  const auto base = cuda::memory_stats();
  cuda::reset_peak_memory();
  {
    Tensor a = Tensor::empty({1000}, DType::f32, Device::cuda);  // 4000 B
    ops::fill(a, 1.0);
    Tensor b = Tensor::empty({3 << 20}, DType::bf16, Device::cuda);  // 6 MiB
    auto s = cuda::memory_stats();
    CHECK(s.current_bytes - base.current_bytes == a_bytes + (6 << 20));
    CHECK(s.peak_bytes >= s.current_bytes);
  }
  auto after = cuda::memory_stats();
  CHECK(after.current_bytes == base.current_bytes);
  CHECK(after.peak_bytes - base.current_bytes == a_bytes + (6 << 20));
  CHECK(after.reserved_bytes >= base.reserved_bytes + a_bytes + (6 << 20));
  const int64_t hits = after.cache_hits, mallocs = after.device_allocs;
  {
    // the same class as `a` (exact mode: the same size): served from the cache
    Tensor c = Tensor::empty({exact ? 1000 : 1024}, DType::f32, Device::cuda);
    if (exact) {  // a freed block is poisoned before reuse: `a`'s ones do not leak into `c`
      Tensor h = c.to(Device::cpu);
      CHECK(std::isnan(h.data<float>()[0]));
      CHECK(std::isnan(h.data<float>()[999]));
    }
  }
  CHECK(cuda::memory_stats().cache_hits == hits + 1);
  CHECK(cuda::memory_stats().device_allocs == mallocs);
  cuda::empty_cache();
  CHECK(cuda::memory_stats().reserved_bytes == cuda::memory_stats().current_bytes);
}

namespace {
// Holds a stream at a host callback until release(): deterministic "side-stream work
// still in flight" for the allocator tests.
struct StreamGate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  static void CUDART_CB hold(void* self) {
    auto* g = static_cast<StreamGate*>(self);
    std::unique_lock<std::mutex> lock(g->mu);
    g->cv.wait(lock, [g] { return g->open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};
}  // namespace

TEST_CASE("cuda allocator: a block used on a side stream is not reused before that work is done", "[gpu]") {
  if (!gpu_ready()) return;
  cuda::synchronize();
  cuda::CudaStream side;
  StreamGate gate;
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({777}, DType::f32, Device::cuda);
    first = t.raw();
    CUDA_CHECK(cudaLaunchHostFunc(side.get(), StreamGate::hold, &gate));  // side-stream work "reading" t
    cuda::record_stream(static_cast<char*>(t.raw()) + 64, side.get());     // an interior pointer counts too
  }  // t freed while the side stream is still held
  CHECK(cuda::memory_stats().pending_blocks >= 1);
  {
    Tensor u = Tensor::empty({777}, DType::f32, Device::cuda);  // same size class
    CHECK(u.raw() != first);  // the pending block was not handed out
  }
  gate.release();
  side.synchronize();
  // Now the block is free again: an allocation of its class may get it back.
  bool reused = false;
  std::vector<Tensor> keep;
  for (int i = 0; i < 4 && !reused; ++i) {
    keep.push_back(Tensor::empty({777}, DType::f32, Device::cuda));
    reused = keep.back().raw() == first;
  }
  CHECK(reused);
  CHECK(cuda::memory_stats().pending_blocks == 0);
}

// Out of memory: outside a step the cache is released and the request retried; inside
// one (DeviceStepScope) the request fails at once with the cache untouched, since the
// release waits for the whole device. The emulator's device size makes it reachable.
TEST_CASE("cuda allocator: out of memory releases the cache only outside a training step", "[gpu]") {
  if (!gpu_ready() || !emulated_device()) return;
  cuda::empty_cache();
  size_t free_b = 0, total_b = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  const int64_t in_use = static_cast<int64_t>(total_b - free_b), mib = 1 << 20;
  const char* old = std::getenv("MTNLG_EMU_MEMORY_BYTES");
  const std::string restore = old ? old : "";
  setenv("MTNLG_EMU_MEMORY_BYTES", std::to_string(in_use + 5 * mib).c_str(), 1);
  { Tensor a = Tensor::empty({3 * mib / 4}, DType::f32, Device::cuda); }  // 3 MiB, now cached
  REQUIRE(cuda::memory_stats().reserved_bytes >= 3 * mib);
  {
    const DeviceStepScope step;
    // 4 MiB fits only if the cached 3 MiB goes back to the device: not inside a step.
    CHECK_THROWS_WITH(Tensor::empty({mib}, DType::f32, Device::cuda),
                      Catch::Matchers::Contains("during a training step") && Catch::Matchers::Contains("micro_batch_size"));
    CHECK(cuda::memory_stats().reserved_bytes >= 3 * mib);  // cache kept
  }
  { Tensor b = Tensor::empty({mib}, DType::f32, Device::cuda); }  // outside: release, retry, served
  cuda::empty_cache();
  if (old)
    setenv("MTNLG_EMU_MEMORY_BYTES", restore.c_str(), 1);
  else
    unsetenv("MTNLG_EMU_MEMORY_BYTES");
}

TEST_CASE("cuda uploads: small host-to-device copies are staged and asynchronous, and exact", "[gpu]") {
  if (!gpu_ready()) return;
  const int64_t before = cuda::async_uploads();
  std::vector<Tensor> devs;
  std::vector<std::vector<int32_t>> want;
  for (int k = 0; k < 9; ++k) {  // more uploads than staging slots: slots are reused in order
    Tensor h = Tensor::empty({5000 + k}, DType::i32, Device::cpu);
    std::vector<int32_t> w(static_cast<size_t>(h.numel()));
    for (int64_t i = 0; i < h.numel(); ++i) w[i] = h.data<int32_t>()[i] = static_cast<int32_t>(i * 7 + k);
    devs.push_back(h.to(Device::cuda));
    for (int64_t i = 0; i < h.numel(); ++i) h.data<int32_t>()[i] = -1;  // the source may be reused at once
    want.push_back(std::move(w));
  }
  CHECK(cuda::async_uploads() - before == 9);
  for (size_t k = 0; k < devs.size(); ++k) {
    Tensor back = devs[k].to(Device::cpu);
    bool same = true;
    for (int64_t i = 0; i < back.numel(); ++i) same = same && back.data<int32_t>()[i] == want[k][i];
    CHECK(same);
  }
  // A large upload (a checkpoint) takes the synchronous path.
  const int64_t mid = cuda::async_uploads();
  Tensor big = Tensor::empty({(8 << 20) / 4}, DType::f32, Device::cpu);
  for (int64_t i = 0; i < big.numel(); ++i) big.data<float>()[i] = static_cast<float>(i % 1000);
  Tensor bigd = big.to(Device::cuda);
  CHECK(cuda::async_uploads() == mid);
  CHECK(ops::sum_squares(bigd) == Approx(ops::sum_squares(big)));
}

TEST_CASE("cuda pinned host tensors: device-to-host copies into them, cached by size", "[gpu]") {
  if (!gpu_ready()) return;
  Tensor h = Tensor::empty({3 << 20}, DType::f32, Device::cpu);
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = static_cast<float>(i % 4099);
  Tensor d = h.to(Device::cuda);
  const int64_t pinned_before = cuda::pinned_host_bytes();
  void* first = nullptr;
  {
    Tensor p = Tensor::empty_pinned(h.shape(), DType::f32);
    first = p.raw();
    p.copy_from(d);
    CHECK(std::memcmp(p.raw(), h.raw(), static_cast<size_t>(h.nbytes())) == 0);
    cudaPointerAttributes attr{};
    CUDA_CHECK(cudaPointerGetAttributes(&attr, p.raw()));
    CHECK(attr.type == cudaMemoryTypeHost);  // page-locked, not pageable
  }
  const int64_t pinned_after = cuda::pinned_host_bytes();
  CHECK(pinned_after >= pinned_before);
  Tensor again = Tensor::empty_pinned(h.shape(), DType::f32);  // the next checkpoint: same size, same buffer
  CHECK(again.raw() == first);
  CHECK(cuda::pinned_host_bytes() == pinned_after);
}

// ---- utility ops -----------------------------------------------------------------------

TEST_CASE("cuda fill, copy, add, scale, convert, sum_squares, all_finite", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(1);
  for (int64_t n : {1, 7, 1000, 300001}) {
    INFO("n = " << n);
    Tensor a = randn({n}, g), b = randn({n}, g);
    for (DType dt : kTypes) {
      INFO("dtype " << to_string(dt));
      Tensor ar = rounded(a, dt), br = rounded(b, dt);
      Tensor ga = to_gpu(a, dt), gb = to_gpu(b, dt);
      Tensor out = poisoned({n}, dt);
      ops::add(out, ga, gb);
      Tensor ref = cpu_zeros({n});
      ops::add(ref, ar, br);
      check_close("add", out, ref, rtol_for(dt));
      ops::scale(out, -0.5);
      ops::scale(ref, -0.5);
      check_close("scale", out, ref, rtol_for(dt));
      Tensor cp = poisoned({n}, dt);
      ops::copy(cp, ga);
      check_close("copy", cp, ar, 0.0 + 1e-12);
      const double ss = ops::sum_squares(ga), ss_ref = ops::sum_squares(ar);
      CHECK(std::fabs(ss - ss_ref) <= 1e-9 * ss_ref);
      CHECK(ops::all_finite(ga));
    }
    Tensor f = poisoned({n}, DType::f32);
    ops::fill(f, 2.5);
    Tensor fr = Tensor::empty({n});
    ops::fill(fr, 2.5);
    check_close("fill", f, fr, 1e-12);
  }
  // conversions: every pair, exact on values representable in the target
  Tensor x = randn({4097}, g);
  for (DType from : kTypes)
    for (DType to : kTypes) {
      INFO(to_string(from) << " -> " << to_string(to));
      Tensor src = to_gpu(x, from);
      Tensor dst = poisoned({4097}, to);
      ops::convert(dst, src);
      check_close("convert", dst, rounded(rounded(x, from), to), 1e-12);
    }
  // non-finite detection
  Tensor y = randn({1 << 16}, g);
  y.data<float>()[12345] = INFINITY;
  CHECK_FALSE(ops::all_finite(to_gpu(y)));
  y.data<float>()[12345] = std::nan("");
  CHECK_FALSE(ops::all_finite(to_gpu(y, DType::bf16)));
  // sum_squares is deterministic: same bits twice
  Tensor z = to_gpu(randn({1 << 20}, g));
  const double s1 = ops::sum_squares(z), s2 = ops::sum_squares(z);
  CHECK(std::memcmp(&s1, &s2, sizeof s1) == 0);
  // i32 fill (tokens)
  Tensor ti = Tensor::empty({33}, DType::i32, Device::cuda);
  ops::fill(ti, 7);
  Tensor tc = ti.to(Device::cpu);
  for (int64_t i = 0; i < 33; ++i) CHECK(tc.data<int32_t>()[i] == 7);
}

// ---- matmul ------------------------------------------------------------------------------

TEST_CASE("cuda matmul forward/backward vs CPU (all three shapes; cuBLASLt with and without the bias epilogue, and the cublasGemmEx fallback)", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(2);
  struct S {
    int64_t N, C, OC;
  };
  for (S s : {S{1, 1, 1}, S{7, 13, 5}, S{64, 96, 160}, S{129, 257, 33}}) {
    for (DType dt : kTypes) {
      for (int mode : {0, 1, 2}) {  // 0 cuBLASLt + bias epilogue, 1 cuBLASLt, 2 cublasGemmEx
        const bool epilogue = mode == 0;
        INFO("N " << s.N << " C " << s.C << " OC " << s.OC << " dtype " << to_string(dt) << " mode " << mode);
        const bool old = cuda::set_gemm_bias_epilogue(epilogue);
        const bool old_lt = cuda::set_gemm_lt(mode != 2);
        const int64_t fallbacks = cuda::gemm_fallbacks();
        Tensor inp = randn({s.N, s.C}, g), w = randn({s.OC, s.C}, g, 0.2), bias = randn({s.OC}, g);
        Tensor dout = randn({s.N, s.OC}, g), dinp0 = randn({s.N, s.C}, g), dw0 = randn({s.OC, s.C}, g),
               db0 = randn({s.OC}, g);
        Tensor ri = rounded(inp, dt), rw = rounded(w, dt), rb = rounded(bias, dt), rd = rounded(dout, dt),
               rdi0 = rounded(dinp0, dt);
        // forward with and without bias
        Tensor ref = cpu_zeros({s.N, s.OC});
        ops::matmul_forward(ref, ri, rw, &rb);
        Tensor gi = to_gpu(inp, dt), gw = to_gpu(w, dt), gb = to_gpu(bias, dt), gd = to_gpu(dout, dt);
        Tensor out = poisoned({s.N, s.OC}, dt);
        ops::matmul_forward(out, gi, gw, &gb);
        check_close("forward+bias", out, ref, rtol_for(dt));
        ops::matmul_forward(ref, ri, rw, nullptr);
        out = poisoned({s.N, s.OC}, dt);
        ops::matmul_forward(out, gi, gw, nullptr);
        check_close("forward", out, ref, rtol_for(dt));
        // backward: dinp written, dw and dbias accumulated (fp32)
        for (bool acc : {false, true}) {
          INFO("accumulate dinp " << acc);
          Tensor rdinp = rdi0.clone(), rdw = dw0.clone(), rdb = db0.clone();
          ops::matmul_backward(&rdinp, &rdw, &rdb, rd, ri, rw, acc);
          Tensor gdinp = acc ? to_gpu(dinp0, dt) : poisoned({s.N, s.C}, dt);
          Tensor gdw = to_gpu(dw0), gdb = to_gpu(db0);
          ops::matmul_backward(&gdinp, &gdw, &gdb, gd, gi, gw, acc);
          check_close("dinp", gdinp, rdinp, rtol_for(dt));
          check_close("dw", gdw, rdw, rtol_for(dt));
          check_close("dbias", gdb, rdb, rtol_for(dt));
        }
        if (mode == 2) CHECK(cuda::gemm_fallbacks() > fallbacks);  // the fallback really ran
        cuda::set_gemm_bias_epilogue(old);
        cuda::set_gemm_lt(old_lt);
      }
    }
  }
}

// The MLP's fused first half and its backward (GELU_AUX_BIAS / DGELU_BGRAD epilogues), and
// the same ops with the epilogues off (the GEMM, then the GELU and bias-gradient kernels);
// OC or C not a multiple of 8 takes the unfused path whatever the switch. pre, out, dpre
// within the dtype's bound of the CPU (chained GEMM + GELU: 2 x in low precision); the
// bias gradient accumulates onto a random start.
TEST_CASE("cuda matmul + bias + GELU fused forward and its dGELU/bias-gradient backward vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(21);
  struct S {
    int64_t N, C, OC;
  };
  for (S s : {S{5, 16, 64}, S{33, 40, 24}, S{7, 13, 20}, S{64, 96, 160}}) {
    for (DType dt : kTypes) {
      for (bool epilogue : {true, false}) {
        INFO("N " << s.N << " C " << s.C << " OC " << s.OC << " " << to_string(dt) << " epilogue " << epilogue);
        const bool old = cuda::set_gemm_gelu_epilogue(epilogue);
        const int64_t fused0 = cuda::gemm_gelu_fused();
        Tensor inp = randn({s.N, s.C}, g), w = randn({s.OC, s.C}, g, 0.3), bias = randn({s.OC}, g, 0.5);
        Tensor pre = cpu_zeros({s.N, s.OC}), out = cpu_zeros({s.N, s.OC});
        Tensor ri = rounded(inp, dt), rw = rounded(w, dt), rb = rounded(bias, dt);
        ops::matmul_bias_gelu_forward(out, pre, ri, rw, rb);
        Tensor gpre = poisoned({s.N, s.OC}, dt), gout = poisoned({s.N, s.OC}, dt);
        ops::matmul_bias_gelu_forward(gout, gpre, to_gpu(inp, dt), to_gpu(w, dt), to_gpu(bias, dt));
        const double low = dt == DType::f32 ? kRtolF32 : 2 * kRtolLow;
        check_close("pre", gpre, pre, rtol_for(dt));
        check_close("out", gout, out, low);
        // backward through a next layer w2 [C2, OC]: dpre = (dout @ w2) * gelu'(pre)
        const int64_t C2 = s.C + 3;
        Tensor w2 = randn({C2, s.OC}, g, 0.3), dout = randn({s.N, C2}, g), db0 = randn({s.OC}, g);
        Tensor rpre = rounded(pre, dt), rw2 = rounded(w2, dt), rd = rounded(dout, dt);
        Tensor dpre = cpu_zeros({s.N, s.OC}), db = db0.clone();
        ops::matmul_dgelu_backward(dpre, db, rd, rw2, rpre);
        Tensor gdpre = poisoned({s.N, s.OC}, dt), gdb = to_gpu(db0);
        ops::matmul_dgelu_backward(gdpre, gdb, to_gpu(dout, dt), to_gpu(w2, dt), to_gpu(rpre, dt));
        check_close("dpre", gdpre, dpre, low);
        check_close("dbias", gdb, db, low);
        // both GEMMs fused exactly when the switch is on and OC is a multiple of 8 (the
        // emulated cuBLASLt offers the epilogues, unless MTNLG_EMU_LT_FAIL makes every
        // candidate fail; a GPU may decline and fall back)
        const bool lt_fails = std::getenv("MTNLG_EMU_LT_FAIL") != nullptr;
        if (emulated_device())
          CHECK(cuda::gemm_gelu_fused() - fused0 == (epilogue && s.OC % 8 == 0 && !lt_fails ? 2 : 0));
        cuda::set_gemm_gelu_epilogue(old);
      }
    }
  }
}

// Without the bias epilogue a bf16/fp16 output is still rounded once: the product stays
// fp32 until the bias is added. On the emulated backend both paths then give the same bits
// (a GPU's epilogue algorithm may sum in another order).
TEST_CASE("cuda matmul bias without the epilogue rounds once, as the epilogue does", "[gpu]") {
  if (!gpu_ready() || !emulated_device()) return;
  std::mt19937_64 g(22);
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(to_string(dt));
    Tensor inp = to_gpu(randn({37, 48}, g), dt), w = to_gpu(randn({40, 48}, g, 0.3), dt), b = to_gpu(randn({40}, g), dt);
    Tensor fused = poisoned({37, 40}, dt), plain = poisoned({37, 40}, dt);
    const bool old = cuda::set_gemm_bias_epilogue(true);
    ops::matmul_forward(fused, inp, w, &b);
    cuda::set_gemm_bias_epilogue(false);
    ops::matmul_forward(plain, inp, w, &b);
    cuda::set_gemm_bias_epilogue(old);
    Tensor x = fused.to(Device::cpu), y = plain.to(Device::cpu);
    CHECK(std::memcmp(x.raw(), y.raw(), static_cast<size_t>(x.nbytes())) == 0);
  }
}

TEST_CASE("cuda matmul on unaligned views (odd element offsets)", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(3);
  const int64_t N = 9, C = 11, OC = 7;
  for (DType dt : kTypes) {
    INFO(to_string(dt));
    Tensor inp = randn({N * C + 1}, g), w = randn({OC * C + 3}, g), bias = randn({OC + 1}, g);
    Tensor ri = rounded(inp, dt).flat(1, N * C).view({N, C}), rw = rounded(w, dt).flat(3, OC * C).view({OC, C}),
           rb = rounded(bias, dt).flat(1, OC);
    Tensor ref = cpu_zeros({N, OC});
    ops::matmul_forward(ref, ri, rw, &rb);
    Tensor gi = to_gpu(inp, dt).flat(1, N * C).view({N, C}), gw = to_gpu(w, dt).flat(3, OC * C).view({OC, C}),
           gb = to_gpu(bias, dt).flat(1, OC);
    Tensor outbuf = poisoned({N * OC + 1}, dt);
    Tensor out = outbuf.flat(1, N * OC).view({N, OC});
    ops::matmul_forward(out, gi, gw, &gb);
    check_close("forward on views", out, ref, rtol_for(dt));
  }
}

// ---- layernorm, gelu, dropout -----------------------------------------------------------------

TEST_CASE("cuda layernorm forward/backward vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(4);
  struct S {
    int64_t N, C;
  };
  for (S s : {S{1, 1}, S{5, 7}, S{33, 768}, S{300, 1000}}) {  // N > 256: several dw/db chunks
    for (DType dt : kTypes) {
      for (bool acc : {false, true}) {
        INFO("N " << s.N << " C " << s.C << " " << to_string(dt) << " accumulate " << acc);
        Tensor x = randn({s.N, s.C}, g, 2.0), w = randn({s.C}, g), b = randn({s.C}, g), dy = randn({s.N, s.C}, g);
        Tensor dx0 = randn({s.N, s.C}, g), dw0 = randn({s.C}, g), db0 = randn({s.C}, g);
        Tensor rx = rounded(x, dt), rw = rounded(w, dt), rb = rounded(b, dt), rdy = rounded(dy, dt);
        Tensor out = cpu_zeros({s.N, s.C}), mean = cpu_zeros({s.N}), rstd = cpu_zeros({s.N});
        ops::layernorm_forward(out, mean, rstd, rx, rw, rb, 1e-5);
        Tensor gx = to_gpu(x, dt), gw = to_gpu(w, dt), gb = to_gpu(b, dt), gdy = to_gpu(dy, dt);
        Tensor gout = poisoned({s.N, s.C}, dt), gmean = poisoned({s.N}, DType::f32), grstd = poisoned({s.N}, DType::f32);
        ops::layernorm_forward(gout, gmean, grstd, gx, gw, gb, 1e-5);
        check_close("out", gout, out, rtol_for(dt));
        check_close("mean", gmean, mean, kRtolF32);
        check_close("rstd", grstd, rstd, kRtolF32);
        Tensor rdx = rounded(dx0, dt), rdw = dw0.clone(), rdb = db0.clone();
        ops::layernorm_backward(rdx, rdw, rdb, rdy, rx, rw, mean, rstd, acc);
        Tensor gdx = acc ? to_gpu(dx0, dt) : poisoned({s.N, s.C}, dt), gdw = to_gpu(dw0), gdb = to_gpu(db0);
        ops::layernorm_backward(gdx, gdw, gdb, gdy, gx, gw, gmean, grstd, acc);
        check_close("dinp", gdx, rdx, rtol_for(dt));
        check_close("dw", gdw, rdw, rtol_for(dt));
        check_close("db", gdb, rdb, rtol_for(dt));
      }
    }
  }
}

// The residual add fused into the LayerNorm: against the CPU (within the dtype's bound)
// and bit for bit against add() then layernorm_forward() on the device.
TEST_CASE("cuda residual add + layernorm forward vs CPU and vs the two ops", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(23);
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {129, 256}}) {
    for (DType dt : kTypes) {
      INFO("N " << N << " C " << C << " " << to_string(dt));
      Tensor a = randn({N, C}, g), b = randn({N, C}, g), w = randn({C}, g), bias = randn({C}, g);
      Tensor ra = rounded(a, dt), rb = rounded(b, dt), rw = rounded(w, dt), rbias = rounded(bias, dt);
      Tensor sum = cpu_zeros({N, C}), out = cpu_zeros({N, C}), mean = cpu_zeros({N}), rstd = cpu_zeros({N});
      ops::add_layernorm_forward(sum, out, mean, rstd, ra, rb, rw, rbias, 1e-5);
      Tensor ga = to_gpu(a, dt), gb = to_gpu(b, dt), gw = to_gpu(w, dt), gbias = to_gpu(bias, dt);
      Tensor gsum = poisoned({N, C}, dt), gout = poisoned({N, C}, dt), gmean = poisoned({N}, DType::f32),
             grstd = poisoned({N}, DType::f32);
      ops::add_layernorm_forward(gsum, gout, gmean, grstd, ga, gb, gw, gbias, 1e-5);
      check_close("sum", gsum, sum, rtol_for(dt));
      check_close("out", gout, out, rtol_for(dt));
      check_close("mean", gmean, mean, rtol_for(dt));
      check_close("rstd", grstd, rstd, rtol_for(dt));
      Tensor s2 = poisoned({N, C}, dt), o2 = poisoned({N, C}, dt), m2 = poisoned({N}, DType::f32),
             r2 = poisoned({N}, DType::f32);
      ops::add(s2, ga, gb);
      ops::layernorm_forward(o2, m2, r2, s2, gw, gbias, 1e-5);
      for (auto [x, y] : {std::pair<Tensor*, Tensor*>{&gsum, &s2}, {&gout, &o2}, {&gmean, &m2}, {&grstd, &r2}}) {
        Tensor hx = x->to(Device::cpu), hy = y->to(Device::cpu);
        CHECK(std::memcmp(hx.raw(), hy.raw(), static_cast<size_t>(hx.nbytes())) == 0);
      }
    }
  }
}

// add, GELU and dropout move 16-byte packs when every pointer is 16-byte aligned and go
// element by element otherwise: both paths (aligned buffers; views one element in) and a
// tail past the last whole pack (n = 1003) give the CPU's values, dropout its exact mask.
TEST_CASE("cuda elementwise ops on packed and unpacked paths vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(24);
  const int64_t n = 1003;
  for (DType dt : kTypes) {
    for (int64_t off : {0, 1}) {
      INFO(to_string(dt) << " offset " << off);
      Tensor a = randn({n}, g), b = randn({n}, g);
      Tensor ra = rounded(a, dt), rb = rounded(b, dt);
      Tensor ga_buf = to_gpu(randn({n + 1}, g), dt), gb_buf = to_gpu(randn({n + 1}, g), dt);
      Tensor ga = ga_buf.flat(off, n), gb = gb_buf.flat(off, n);
      ga.copy_from(to_gpu(a, dt));
      gb.copy_from(to_gpu(b, dt));
      Tensor out_buf = poisoned({n + 1}, dt);
      Tensor gout = out_buf.flat(off, n);
      Tensor ref = cpu_zeros({n});
      ops::add(ref, ra, rb);
      ops::add(gout, ga, gb);
      check_close("add", gout, ref, rtol_for(dt));
      ops::gelu_forward(ref, ra);
      ops::gelu_forward(gout, ga);
      check_close("gelu", gout, ref, rtol_for(dt));
      ops::gelu_backward(ref, ra, rb);
      ops::gelu_backward(gout, ga, gb);
      check_close("gelu_backward", gout, ref, rtol_for(dt));
      ops::dropout_forward(ref, ra, 0.3, 99, 17);
      ops::dropout_forward(gout, ga, 0.3, 99, 17);
      check_close("dropout", gout, ref, rtol_for(dt));
      Tensor back = to_cpu_f32(gout);
      for (int64_t i = 0; i < n; ++i) CHECK((back.data<float>()[i] == 0) == (ref.data<float>()[i] == 0));
    }
  }
}

TEST_CASE("cuda gelu forward/backward vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(5);
  for (int64_t n : {1, 31, 100003}) {
    for (DType dt : kTypes) {
      INFO("n " << n << " " << to_string(dt));
      Tensor x = randn({n}, g, 3.0), dy = randn({n}, g);
      Tensor rx = rounded(x, dt), rdy = rounded(dy, dt);
      Tensor out = cpu_zeros({n}), dx = cpu_zeros({n});
      ops::gelu_forward(out, rx);
      ops::gelu_backward(dx, rx, rdy);
      Tensor gout = poisoned({n}, dt), gdx = poisoned({n}, dt);
      ops::gelu_forward(gout, to_gpu(x, dt));
      ops::gelu_backward(gdx, to_gpu(x, dt), to_gpu(dy, dt));
      check_close("gelu", gout, out, rtol_for(dt));
      check_close("gelu'", gdx, dx, rtol_for(dt));
    }
  }
}

TEST_CASE("cuda dropout masks are bit-identical to the CPU's", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(6);
  for (int64_t n : {1, 5, 4099, 1 << 18}) {
    for (double p : {0.0, 0.1, 0.5}) {
      for (uint64_t base : {uint64_t{0}, uint64_t{3}, uint64_t{1} << 40}) {
        INFO("n " << n << " p " << p << " base " << base);
        Tensor x = randn({n}, g);
        Tensor ref = cpu_zeros({n});
        ops::dropout_forward(ref, x, p, 0xfeedbeefull, base);
        Tensor gx = to_gpu(x);
        Tensor out = poisoned({n}, DType::f32);
        ops::dropout_forward(out, gx, p, 0xfeedbeefull, base);
        Tensor back = out.to(Device::cpu);
        CHECK(std::memcmp(back.raw(), ref.raw(), static_cast<size_t>(ref.nbytes())) == 0);
        ops::dropout_backward(gx, gx, p, 0xfeedbeefull, base);  // in place, as the model calls it
        Tensor back2 = gx.to(Device::cpu);
        CHECK(std::memcmp(back2.raw(), ref.raw(), static_cast<size_t>(ref.nbytes())) == 0);
      }
    }
  }
  // low precision: same mask (zeros where the CPU has zeros), values within rounding
  Tensor x = randn({4096}, g);
  Tensor ref = cpu_zeros({4096});
  ops::dropout_forward(ref, rounded(x, DType::bf16), 0.3, 99, 17);
  Tensor out = poisoned({4096}, DType::bf16);
  ops::dropout_forward(out, to_gpu(x, DType::bf16), 0.3, 99, 17);
  Tensor o = to_cpu_f32(out);
  for (int64_t i = 0; i < 4096; ++i) CHECK((o.data<float>()[i] == 0) == (ref.data<float>()[i] == 0));
  check_close("bf16 dropout", out, ref, kRtolLow);
}

// ---- attention -----------------------------------------------------------------------------

// dqkv bound: two chained low-precision ops (2 x kRtolLow); with dropout, 4 x. The GPU
// backward takes D = rowsum(dout * out) from the STORED out (bf16/f16), the CPU reference
// rowsum(P * dP) exactly. Without dropout a one-hot row's out is a stored v, exact; with
// it, out = v / (1 - p) is rounded, and for such a row dq = scale * (dP - D) * k carries
// that rounding whole (measured on the emulated backend: 1.6 x the 2 x kRtolLow bound at
// p 0.2, on query 0 of every head). An inherent property of the flash backward.
static double dqkv_rtol(DType dt, double p) { return dt == DType::f32 ? kRtolF32 : (p > 0 ? 4 : 2) * kRtolLow; }

// Both attention forms against the CPU, one case table: the flash form (lse saved) on
// odd T (partial tiles), T > 32 (several key/query tiles), D = 1, D not a multiple of 32,
// D > 128 (more than 4 columns per lane) and the limit 256; the unfused form (probs saved,
// batched GEMMs over the packed qkv rows around the softmax kernel) on head sizes 64 and
// 128 (the real ones), an odd one and one above the flash kernels' limit. Dropout on and
// off; heads offset as a tp = 2 rank would pass them. Each side's backward starts from its
// own forward (the CPU's outputs rounded to the storage type, as the GPU stores them).
// Unfused bounds: probs and out are one low-precision op past the rounded scores
// (2 x kRtolLow: the scores are stored in the activation dtype before the softmax, as
// Megatron does); dqkv chains two more.
namespace {
struct AttentionForm {
  const char* name;
  bool unfused;
  std::vector<std::array<int64_t, 4>> shapes;  // B, T, H, D
};
}  // namespace

TEST_CASE("cuda attention, flash (lse) and unfused (probs) forms, vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(7);
  const AttentionForm forms[] = {
      {"flash", false, {{1, 1, 1, 1}, {2, 17, 3, 8}, {1, 64, 2, 64}, {2, 45, 2, 160}, {1, 33, 1, 256}}},
      {"unfused", true, {{1, 1, 1, 8}, {2, 17, 3, 64}, {1, 33, 2, 128}, {2, 9, 2, 24}, {1, 5, 1, 264}}},
  };
  for (const AttentionForm& form : forms)
    for (const auto& [B, T, H, D] : form.shapes)
      for (double p : {0.0, 0.2})
        for (DType dt : kTypes) {
          INFO(form.name << " B " << B << " T " << T << " H " << H << " D " << D << " p " << p << " " << to_string(dt));
          const ops::AttentionDropout drop{p, 0x1234ull, 3, H, 2 * H};
          Tensor qkv = randn({B, T, 3 * H * D}, g), dout = randn({B, T, H * D}, g);
          Tensor rq = rounded(qkv, dt), rdo = rounded(dout, dt), gq = to_gpu(qkv, dt), gdo = to_gpu(dout, dt);
          const Shape stat_shape = form.unfused ? Shape{B, H, T, T} : Shape{B, H, T};
          const DType stat_dt = form.unfused ? dt : DType::f32;
          Tensor out = cpu_zeros({B, T, H * D}), stat = cpu_zeros(stat_shape);
          Tensor gout = poisoned({B, T, H * D}, dt), gstat = poisoned(stat_shape, stat_dt);
          Tensor dqkv = cpu_zeros(qkv.shape()), gdqkv = poisoned(qkv.shape(), dt);
          if (form.unfused) {
            ops::attention_forward(out, stat, rq, H, drop);
            ops::attention_forward(gout, gstat, gq, H, drop);
            ops::attention_backward(dqkv, rdo, rq, rounded(stat, dt), H, drop);
            ops::attention_backward(gdqkv, gdo, gq, gstat, H, drop);
          } else {
            ops::attention_forward_lse(out, stat, rq, H, drop);
            ops::attention_forward_lse(gout, gstat, gq, H, drop);
            ops::attention_backward_lse(dqkv, rdo, rq, rounded(out, dt), stat, H, drop);
            ops::attention_backward_lse(gdqkv, gdo, gq, gout, gstat, H, drop);
          }
          const double low = dt == DType::f32 ? kRtolF32 : (form.unfused ? 2 * kRtolLow : kRtolLow);
          check_close("out", gout, out, low);
          check_close(form.unfused ? "probs" : "lse", gstat, stat, low);
          check_close("dqkv", gdqkv, dqkv, form.unfused ? (dt == DType::f32 ? kRtolF32 : 4 * kRtolLow) : dqkv_rtol(dt, p));
        }
}

// Both forms compute the same function: the unfused form's out and dqkv equal the
// flash form's on the device (fp32), dropout included (the same mask).
TEST_CASE("cuda unfused and flash attention agree", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(12);
  const int64_t B = 2, T = 23, H = 2, D = 64;
  for (double p : {0.0, 0.1}) {
    INFO("p " << p);
    ops::AttentionDropout drop{p, 0x77ull, 0, 0, H};
    Tensor gq = to_gpu(randn({B, T, 3 * H * D}, g)), gdo = to_gpu(randn({B, T, H * D}, g));
    Tensor o1 = poisoned({B, T, H * D}, DType::f32), probs = poisoned({B, H, T, T}, DType::f32);
    Tensor o2 = poisoned({B, T, H * D}, DType::f32), lse = poisoned({B, H, T}, DType::f32);
    ops::attention_forward(o1, probs, gq, H, drop);
    ops::attention_forward_lse(o2, lse, gq, H, drop);
    check_close("out", o1, to_cpu_f32(o2), kRtolF32);
    Tensor d1 = poisoned(gq.shape(), DType::f32), d2 = poisoned(gq.shape(), DType::f32);
    ops::attention_backward(d1, gdo, gq, probs, H, drop);
    ops::attention_backward_lse(d2, gdo, gq, o2, lse, H, drop);
    check_close("dqkv", d1, to_cpu_f32(d2), kRtolF32);
  }
}

// The shapes real runs use, where launch limits and long reductions bite: sequence 1024
// and 2048, micro-batch x local heads above 400 and above the 65535 of a grid's y.
TEST_CASE("cuda fused attention at real shapes (T 1024 and 2048, B x H 416 and 66000) vs CPU", "[gpu][large]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(17);
  struct S {
    int64_t B, T, H, D;
    DType dt;
    double p;
  };
  // On the emulator, the same properties at a CPU's scale: several key/query tiles with a
  // partial last one, and micro-batch x heads above the 65535 of a grid's y.
  const std::vector<S> shapes =
      emulated_device()
          ? std::vector<S>{S{2, 203, 3, 64, DType::bf16, 0.1}, S{1, 160, 2, 128, DType::f32, 0.0},
                           S{1100, 2, 60, 4, DType::f32, 0.1}}
          : std::vector<S>{S{4, 1024, 104, 64, DType::bf16, 0.1}, S{1, 2048, 8, 128, DType::f32, 0.0},
                           S{1100, 20, 60, 16, DType::f32, 0.1}};
  for (S s : shapes) {
    INFO("B " << s.B << " T " << s.T << " H " << s.H << " D " << s.D << " " << to_string(s.dt) << " p " << s.p);
    ops::AttentionDropout drop{s.p, 0x5151ull, 0, 0, s.H};
    Tensor qkv = randn({s.B, s.T, 3 * s.H * s.D}, g), dout = randn({s.B, s.T, s.H * s.D}, g);
    Tensor rq = rounded(qkv, s.dt), rdo = rounded(dout, s.dt);
    Tensor out = cpu_zeros({s.B, s.T, s.H * s.D}), lse = cpu_zeros({s.B, s.H, s.T});
    ops::attention_forward_lse(out, lse, rq, s.H, drop);
    Tensor gq = to_gpu(qkv, s.dt), gdo = to_gpu(dout, s.dt);
    Tensor gout = poisoned({s.B, s.T, s.H * s.D}, s.dt), glse = poisoned({s.B, s.H, s.T}, DType::f32);
    ops::attention_forward_lse(gout, glse, gq, s.H, drop);
    check_close("out", gout, out, rtol_for(s.dt));
    check_close("lse", glse, lse, rtol_for(s.dt));
    Tensor dqkv = cpu_zeros(qkv.shape());
    ops::attention_backward_lse(dqkv, rdo, rq, rounded(out, s.dt), lse, s.H, drop);
    Tensor gdqkv = poisoned(qkv.shape(), s.dt);
    ops::attention_backward_lse(gdqkv, gdo, gq, gout, glse, s.H, drop);
    check_close("dqkv", gdqkv, dqkv, dqkv_rtol(s.dt, s.p));
  }
}

TEST_CASE("cuda cross-entropy at a real shape (vocab 50304 x 16384 tokens, bf16) vs CPU", "[gpu][large]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(19);
  // On the emulator: the real vocabulary row (grid-stride over 50304), 48 tokens.
  const int64_t N = emulated_device() ? 48 : 16384, V = 50304, valid = 50257;
  Tensor logits = randn({N, V}, g, 3.0);
  Tensor targets = i32_cpu({N}, g, 0, static_cast<int>(valid));
  Tensor dloss = randn({N}, g);
  Tensor rl = rounded(logits, DType::bf16);
  Tensor rmax = cpu_zeros({N}), sumexp = cpu_zeros({N}), tl = cpu_zeros({N});
  ops::xent_rowmax(rmax, rl, valid);
  ops::xent_sumexp_target(sumexp, tl, rl, targets, rmax, 0, valid);
  Tensor gl = to_gpu(logits, DType::bf16), gt = targets.to(Device::cuda);
  Tensor grmax = poisoned({N}, DType::f32), gsum = poisoned({N}, DType::f32), gtl = poisoned({N}, DType::f32);
  ops::xent_rowmax(grmax, gl, valid);
  check_close("rowmax", grmax, rmax, 1e-12);
  ops::xent_sumexp_target(gsum, gtl, gl, gt, grmax, 0, valid);
  check_close("sumexp", gsum, sumexp, kRtolF32);
  check_close("target logit", gtl, tl, 1e-12);
  Tensor dl = cpu_zeros({N, V});
  ops::xent_backward(dl, rl, targets, rmax, sumexp, dloss, 0, valid);
  ops::xent_backward(gl, gl, gt, grmax, gsum, to_gpu(dloss), 0, valid);
  check_close("dlogits", gl, dl, kRtolLow);
}

TEST_CASE("cuda KV-cache attention (prefill, one-token steps, a chunk) vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(23);
  struct S {
    int64_t B, H, D, cap;
  };
  for (S s : {S{1, 1, 8, 8}, S{3, 4, 64, 80}, S{2, 2, 256, 40}}) {
    for (DType dt : kTypes) {
      INFO("B " << s.B << " H " << s.H << " D " << s.D << " capacity " << s.cap << " " << to_string(dt));
      Tensor kc = cpu_zeros({s.B, s.H, s.cap, s.D}), vc = cpu_zeros({s.B, s.H, s.cap, s.D});
      Tensor gk = to_gpu(kc, dt), gv = to_gpu(kc, dt);
      int64_t past = 0;
      for (int64_t T : {std::min<int64_t>(5, s.cap), int64_t{1}, int64_t{1}, std::min<int64_t>(3, s.cap - 7)}) {
        if (T <= 0 || past + T > s.cap) break;
        INFO("past " << past << " T " << T);
        Tensor qkv = randn({s.B, T, 3 * s.H * s.D}, g);
        Tensor rq = rounded(qkv, dt);
        Tensor out = cpu_zeros({s.B, T, s.H * s.D});
        // The CPU op on the rounded inputs and the rounded cache the GPU holds.
        Tensor rk = to_cpu_f32(gk), rv = to_cpu_f32(gv);
        ops::attention_cached_forward(out, rk, rv, rq, s.H, past);
        Tensor gout = poisoned({s.B, T, s.H * s.D}, dt);
        ops::attention_cached_forward(gout, gk, gv, to_gpu(qkv, dt), s.H, past);
        check_close("out", gout, out, rtol_for(dt));
        check_close("k cache", gk, rk, rtol_for(dt));
        check_close("v cache", gv, rv, rtol_for(dt));
        past += T;
      }
    }
  }
}

TEST_CASE("cuda attention rejects what it cannot run", "[gpu]") {
  if (!gpu_ready()) return;
  Tensor qkv = Tensor::empty({1, 4, 3 * 264}, DType::f32, Device::cuda), out = Tensor::empty({1, 4, 264}, DType::f32, Device::cuda);
  Tensor lse = Tensor::empty({1, 1, 4}, DType::f32, Device::cuda);
  CHECK_THROWS_AS(ops::attention_forward_lse(out, lse, qkv, 1, {}), RuntimeError);  // D = 264 > 256
  Tensor qb = Tensor::empty({1, 4, 3 * 8}, DType::bf16, Device::cuda), ob = Tensor::empty({1, 4, 8}, DType::bf16, Device::cuda);
  Tensor lb = Tensor::empty({1, 1, 4}, DType::bf16, Device::cuda);
  CHECK_THROWS_WITH(ops::attention_forward_lse(ob, lb, qb, 1, {}), Catch::Matchers::Contains("f32"));
}

// ---- embeddings, positions, biases ---------------------------------------------------------

TEST_CASE("cuda embedding, position and bias ops vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(8);
  struct S {
    int64_t N, C, V;
  };
  for (S s : {S{1, 1, 1}, S{37, 19, 11}, S{600, 300, 50}}) {
    for (DType dt : kTypes) {
      INFO("N " << s.N << " C " << s.C << " V " << s.V << " " << to_string(dt));
      const int64_t vstart = 5;
      Tensor tok = i32_cpu({s.N}, g, 0, static_cast<int>(vstart + s.V + 3));  // some ids outside this shard
      Tensor table = randn({s.V, s.C}, g), dout = randn({s.N, s.C}, g), dt0 = randn({s.V, s.C}, g);
      Tensor rt = rounded(table, dt), rdo = rounded(dout, dt);
      Tensor out = cpu_zeros({s.N, s.C});
      ops::embedding_forward(out, tok, rt, vstart);
      Tensor gout = poisoned({s.N, s.C}, dt), gtok = tok.to(Device::cuda);
      ops::embedding_forward(gout, gtok, to_gpu(table, dt), vstart);
      check_close("embedding", gout, out, 1e-12);
      Tensor dtab = dt0.clone(), gdtab = to_gpu(dt0);
      ops::embedding_backward(dtab, tok, rdo, vstart);
      ops::embedding_backward(gdtab, gtok, to_gpu(dout, dt), vstart);
      if (dt == DType::f32) {  // same order, same bits
        Tensor back = gdtab.to(Device::cpu);
        CHECK(std::memcmp(back.raw(), dtab.raw(), static_cast<size_t>(dtab.nbytes())) == 0);
      }
      check_close("dtable", gdtab, dtab, rtol_for(dt));
      // by token runs (the grouping the model uploads with the ids): the same bits as the
      // column walk, for every dtype
      const Tensor host_order = ops::embedding_grad_order(tok.data<int32_t>(), s.N);
      const ops::EmbeddingGradOrder order =
          ops::EmbeddingGradOrder::from(host_order.to(Device::cuda), host_order, s.N);
      Tensor gdtab2 = to_gpu(dt0);
      ops::embedding_backward(gdtab2, gtok, to_gpu(dout, dt), vstart, &order);
      {
        Tensor a = gdtab.to(Device::cpu), b = gdtab2.to(Device::cpu);
        CHECK(std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.nbytes())) == 0);
      }
      // positions: rows start mid-sequence and wrap around several sequences
      const int64_t T = std::max<int64_t>(1, s.N / 3 + 1), row_start = T > 2 ? 2 : 0;
      Tensor pos = randn({T + 2, s.C}, g), dpos0 = randn({T + 2, s.C}, g), x = randn({s.N, s.C}, g);
      Tensor rx = rounded(x, dt);
      ops::position_forward(rx, rounded(pos, dt), row_start, T);
      Tensor gx = to_gpu(x, dt);
      ops::position_forward(gx, to_gpu(pos, dt), row_start, T);
      check_close("position", gx, rx, rtol_for(dt));
      Tensor dpos = dpos0.clone(), gdpos = to_gpu(dpos0);
      ops::position_backward(dpos, rdo, row_start, T);
      ops::position_backward(gdpos, to_gpu(dout, dt), row_start, T);
      check_close("dpos", gdpos, dpos, rtol_for(dt));
      // bias
      Tensor b = randn({s.C}, g), db0 = randn({s.C}, g);
      Tensor rx2 = rounded(x, dt);
      ops::bias_add_forward(rx2, rounded(b, dt));
      Tensor gx2 = to_gpu(x, dt);
      ops::bias_add_forward(gx2, to_gpu(b, dt));
      check_close("bias", gx2, rx2, rtol_for(dt));
      Tensor db = db0.clone(), gdb = to_gpu(db0);
      ops::bias_add_backward(db, rdo);
      ops::bias_add_backward(gdb, to_gpu(dout, dt));
      check_close("dbias", gdb, db, rtol_for(dt));
    }
  }
}

// ---- cross-entropy -----------------------------------------------------------------------

TEST_CASE("cuda vocab-parallel cross-entropy pieces vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(9);
  struct S {
    int64_t N, V, valid;
  };
  for (S s : {S{1, 1, 1}, S{13, 50, 47}, S{64, 2053, 2048}, S{3, 40000, 40000}}) {
    for (DType dt : kTypes) {
      INFO("N " << s.N << " V " << s.V << " valid " << s.valid << " " << to_string(dt));
      const int64_t vstart = 100;
      Tensor logits = randn({s.N, s.V}, g, 3.0);
      Tensor targets = i32_cpu({s.N}, g, 90, static_cast<int>(vstart + s.valid + 5));
      Tensor dloss = randn({s.N}, g);
      Tensor rl = rounded(logits, dt);
      Tensor rmax = cpu_zeros({s.N}), sumexp = cpu_zeros({s.N}), tl = cpu_zeros({s.N});
      ops::xent_rowmax(rmax, rl, s.valid);
      ops::xent_sumexp_target(sumexp, tl, rl, targets, rmax, vstart, s.valid);
      Tensor dl = cpu_zeros({s.N, s.V});
      ops::xent_backward(dl, rl, targets, rmax, sumexp, dloss, vstart, s.valid);
      Tensor gl = to_gpu(logits, dt), gt = targets.to(Device::cuda);
      Tensor grmax = poisoned({s.N}, DType::f32), gsum = poisoned({s.N}, DType::f32), gtl = poisoned({s.N}, DType::f32);
      ops::xent_rowmax(grmax, gl, s.valid);
      check_close("rowmax", grmax, rmax, 1e-12);
      ops::xent_sumexp_target(gsum, gtl, gl, gt, grmax, vstart, s.valid);
      check_close("sumexp", gsum, sumexp, kRtolF32);
      check_close("target logit", gtl, tl, 1e-12);
      // in place (dlogits aliases logits), as the model does
      ops::xent_backward(gl, gl, gt, grmax, gsum, to_gpu(dloss), vstart, s.valid);
      check_close("dlogits", gl, dl, rtol_for(dt));
    }
  }
}

TEST_CASE("cuda step statistics: loss and squared-norm accumulators stay on the device and match the CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(21);
  for (int64_t N : {1, 7, 1000, 16384 * 4}) {
    INFO("N " << N);
    Tensor mx = randn({N}, g), tl = randn({N}, g), se = randn({N}, g), mask = randn({N}, g);
    for (int64_t i = 0; i < N; ++i) {
      se.data<float>()[i] = 1.0f + std::fabs(se.data<float>()[i]) * 100.0f;
      mask.data<float>()[i] = mask.data<float>()[i] > 0 ? 1.0f : 0.0f;
    }
    Tensor acc = Tensor::zeros({2}, DType::f64, Device::cpu);
    ops::xent_loss_accumulate(acc, mx, se, tl, nullptr);
    ops::xent_loss_accumulate(acc, mx, se, tl, &mask);
    Tensor gacc = Tensor::empty({2}, DType::f64, Device::cuda);
    ops::fill(gacc, 0.0);
    Tensor gmask = mask.to(Device::cuda);
    ops::xent_loss_accumulate(gacc, mx.to(Device::cuda), se.to(Device::cuda), tl.to(Device::cuda), nullptr);
    ops::xent_loss_accumulate(gacc, mx.to(Device::cuda), se.to(Device::cuda), tl.to(Device::cuda), &gmask);
    const Tensor back = gacc.to(Device::cpu);
    CHECK(back.data<double>()[0] == Approx(acc.data<double>()[0]).epsilon(1e-12));
    CHECK(back.data<double>()[1] == acc.data<double>()[1]);
    for (DType dt : kTypes) {
      Tensor x = randn({N}, g);
      Tensor sq = Tensor::empty({1}, DType::f64, Device::cuda);
      ops::fill(sq, 0.0);
      const Tensor gx = to_gpu(x, dt);
      ops::sum_squares_accumulate(sq, gx);
      ops::sum_squares_accumulate(sq, gx);
      CHECK(sq.to(Device::cpu).data<double>()[0] == Approx(2 * ops::sum_squares(rounded(x, dt))).epsilon(1e-12));
    }
  }
}

// ---- optimizer and mixed precision ------------------------------------------------------------

TEST_CASE("cuda AdamW: per-op step and the flat multi-segment kernel vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(10);
  const int64_t n = 10007;
  Tensor p = randn({n}, g), gr = randn({n}, g), m = randn({n}, g, 0.1), v = randn({n}, g, 0.1);
  for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::fabs(v.data<float>()[i]);
  ops::AdamWParams ap{1e-3, 0.9, 0.95, 1e-8, 0.1, 7, 0.5};
  {  // ops::adamw_step (one segment, decay on)
    Tensor rp = p.clone(), rm = m.clone(), rv = v.clone();
    ops::adamw_step(rp, gr, rm, rv, ap);
    Tensor gp = to_gpu(p), gm = to_gpu(m), gv = to_gpu(v);
    ops::adamw_step(gp, to_gpu(gr), gm, gv, ap);
    check_close("param", gp, rp, kRtolF32);
    check_close("m", gm, rm, kRtolF32);
    check_close("v", gv, rv, kRtolF32);
  }
  // flat: three segments (decay, no decay, decay) with a gap that must stay untouched
  std::vector<ops::AdamWSegment> segs{{0, 4000, true}, {4000, 1000, false}, {6000, 4007, true}};
  Tensor rp = p.clone(), rm = m.clone(), rv = v.clone();
  for (auto& s : segs) {
    ops::AdamWParams a = ap;
    a.weight_decay = s.weight_decay ? ap.weight_decay : 0.0;
    Tensor pp = rp.flat(s.offset, s.numel), mm = rm.flat(s.offset, s.numel), vv = rv.flat(s.offset, s.numel);
    ops::adamw_step(pp, gr.flat(s.offset, s.numel), mm, vv, a);
  }
  for (DType copy_dt : {DType::bf16, DType::f16}) {
    INFO("copy-out " << to_string(copy_dt));
    Tensor gp = to_gpu(p), gm = to_gpu(m), gv = to_gpu(v);
    Tensor copy = poisoned({n}, copy_dt);
    ops::adamw_flat(gp, to_gpu(gr), gm, gv, ap, segs, &copy);
    check_close("param", gp, rp, kRtolF32);
    check_close("m", gm, rm, kRtolF32);
    check_close("v", gv, rv, kRtolF32);
    Tensor cp = to_cpu_f32(copy), pc = gp.to(Device::cpu);
    for (int64_t i = 0; i < n; ++i) {
      const bool in_gap = i >= 5000 && i < 6000;
      if (in_gap) {
        CHECK(pc.data<float>()[i] == p.data<float>()[i]);
        CHECK(std::isnan(cp.data<float>()[i]));  // not written
      }
    }
    Tensor cref = rounded(rp, copy_dt);
    Tensor cref_seg = cref.flat(0, 5000), cgpu_seg = copy.flat(0, 5000);
    check_close("copy-out", cgpu_seg, cref_seg, kRtolLow);
  }
  Tensor gp = to_gpu(p), gm = to_gpu(m), gv = to_gpu(v);
  CHECK_THROWS_AS(ops::adamw_flat(gp, to_gpu(gr), gm, gv, ap, {{0, 5000, true}, {4000, 10, true}}, nullptr),
                  RuntimeError);  // overlapping segments
}

TEST_CASE("cuda mixed precision: bf16 weights from the fp32 master buffer, fp32 weight grads", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(11);
  const int64_t N = 48, C = 80, OC = 72;
  // One flat fp32 master buffer holding w then b, and its single converted bf16 copy.
  Tensor master = randn({OC * C + OC}, g, 0.1);
  Tensor gmaster = to_gpu(master);
  Tensor half = poisoned({OC * C + OC}, DType::bf16);
  ops::convert(half, gmaster);
  Tensor w16 = half.flat(0, OC * C).view({OC, C}), b16 = half.flat(OC * C, OC);
  Tensor inp = randn({N, C}, g), dout = randn({N, OC}, g);
  Tensor gi = to_gpu(inp, DType::bf16), gd = to_gpu(dout, DType::bf16);
  Tensor out = poisoned({N, OC}, DType::bf16);
  ops::matmul_forward(out, gi, w16, &b16);
  Tensor grads = Tensor::zeros({OC * C + OC});
  Tensor ggrads = to_gpu(grads);
  Tensor gdw = ggrads.flat(0, OC * C).view({OC, C}), gdb = ggrads.flat(OC * C, OC);
  for (int micro = 0; micro < 2; ++micro) ops::matmul_backward(nullptr, &gdw, &gdb, gd, gi, w16);  // += twice
  Tensor rm = rounded(master, DType::bf16);
  Tensor rw = rm.flat(0, OC * C).view({OC, C}), rb = rm.flat(OC * C, OC);
  Tensor ri = rounded(inp, DType::bf16), rd = rounded(dout, DType::bf16);
  Tensor ref = cpu_zeros({N, OC});
  ops::matmul_forward(ref, ri, rw, &rb);
  check_close("bf16 forward", out, ref, kRtolLow);
  Tensor rdw = Tensor::zeros({OC, C}), rdb = Tensor::zeros({OC});
  for (int micro = 0; micro < 2; ++micro) ops::matmul_backward(nullptr, &rdw, &rdb, rd, ri, rw);
  // fp32 accumulation of bf16 products: fp32 tolerance on the rounded inputs
  check_close("fp32 dw from bf16", gdw, rdw, kRtolF32);
  check_close("fp32 db from bf16", gdb, rdb, kRtolF32);
  // a bf16 gradient tensor is refused (fp32 gradient accumulation)
  Tensor bad = Tensor::empty({OC, C}, DType::bf16, Device::cuda);
  CHECK_THROWS_WITH(ops::matmul_backward(nullptr, &bad, nullptr, gd, gi, w16), Catch::Matchers::Contains("f32"));
}

#endif  // MTNLG_HAVE_CUDA
