// CUDA checks beside the op table: each op family's CUDA-vs-CPU cases (shapes, dtypes,
// tolerances) are entries of test/core/ops/op_cases.cpp, driven by test/core/ops/test_op_table.cpp
// ("cuda ops table: <op> vs CPU", [gpu]). Here: the allocator, uploads and pinned memory,
// and what the table cannot express -- the fused GEMM epilogues counted, a bias
// epilogue's single rounding, the two attention forms against each other, real shapes
// ([large]), rejected arguments, the step statistics, the flat AdamW and mixed
// precision. Metric and helpers in cuda_test_util.hpp (rtol 1e-5 for fp32, 1e-2 for
// bf16/fp16 storage); outputs are NaN-poisoned. Cases are tagged [gpu] (ctest label
// gpu); without a device they WARN and return unless MTNLG_REQUIRE_GPU=1. The whole
// file compiles to nothing in CPU-only builds.
#ifdef MTNLG_HAVE_CUDA
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cublas_v2.h>

#include "core/cuda/cuda_check.hpp"
#include "core/cuda/cudnn_attention.hpp"
#include "core/cuda/device.hpp"
#include "core/cuda/ops_cuda.hpp"
#include "core/error.hpp"
#include "core/refused.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "test/core/cuda/cuda_test_util.hpp"
#include "test/core/ops/op_cases.hpp"

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
    cuda::record_stream(static_cast<char*>(t.raw()) + 64, side.get());    // an interior pointer counts too
  }                                                                       // t freed while the side stream is still held
  CHECK(cuda::memory_stats().pending_blocks >= 1);
  {
    Tensor u = Tensor::empty({777}, DType::f32, Device::cuda);  // same size class
    CHECK(u.raw() != first);                                    // the pending block was not handed out
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
  const char* name = switch_spec(Switch::emu_memory_bytes).name;
  const std::optional<std::string> old = switches::raw(Switch::emu_memory_bytes);
  setenv(name, std::to_string(in_use + 5 * mib).c_str(), 1);
  { Tensor a = Tensor::empty({3 * mib / 4}, DType::f32, Device::cuda); }  // 3 MiB, now cached
  REQUIRE(cuda::memory_stats().reserved_bytes >= 3 * mib);
  {
    const DeviceStepScope step;
    // 4 MiB fits only if the cached 3 MiB goes back to the device: not inside a step.
    CHECK_THROWS_WITH(
        Tensor::empty({mib}, DType::f32, Device::cuda),
        Catch::Matchers::Contains("during a training step") && Catch::Matchers::Contains("micro_batch_size"));
    CHECK(cuda::memory_stats().reserved_bytes >= 3 * mib);  // cache kept
  }
  { Tensor b = Tensor::empty({mib}, DType::f32, Device::cuda); }  // outside: release, retry, served
  cuda::empty_cache();
  if (old)
    setenv(name, old->c_str(), 1);
  else
    unsetenv(name);
}

// CUDA graphs (device.hpp: GraphPool, CudaGraph): work captured once and replayed reads its
// inputs where the capture did and allocates nothing; the pool keeps every block the
// capture touched away from other work; a capture that synchronises is refused and leaves
// the allocator as it was.
TEST_CASE("cuda graphs: capture once, replay with new inputs; the pool's blocks stay the graph's", "[gpu]") {
  if (!gpu_ready()) return;
  cuda::synchronize();
  const int64_t n = 1000;
  Tensor x = Tensor::empty({n}, DType::f32, Device::cuda), y = Tensor::empty({n}, DType::f32, Device::cuda);
  Tensor host = Tensor::empty({n}, DType::f32);
  auto set_x = [&](float v) {
    for (int64_t i = 0; i < n; ++i) host.data<float>()[i] = v + static_cast<float>(i);
    x.copy_from(host);
  };
  set_x(1.0f);
  const auto before = cuda::memory_stats();
  const int64_t launches = cuda::graph_launches();
  std::vector<const void*> captured;
  auto pool = std::make_unique<cuda::GraphPool>();
  {
    cuda::CudaGraph g(*pool, [&] {
      CHECK(cuda::capturing());
      Tensor t = Tensor::empty({n}, DType::f32, Device::cuda);  // from the pool
      captured.push_back(t.raw());
      ops::add(t, x, x);  // t = 2x
      Tensor u = Tensor::empty({n}, DType::f32, Device::cuda);
      captured.push_back(u.raw());
      ops::add(u, t, x);  // u = 3x
      ops::copy(y, u);
    });
    CHECK_FALSE(cuda::capturing());
    ops::fill(y, -1.0);
    CHECK(y.to(Device::cpu).data<float>()[5] == -1.0f);  // nothing ran during the capture
    CHECK(pool->bytes() > 0);
    CHECK(pool->live_bytes() == 0);
    CHECK(cuda::memory_stats().graph_pool_bytes - before.graph_pool_bytes == pool->bytes());
    for (float v : {1.0f, 10.0f, -3.0f}) {
      set_x(v);
      const int64_t allocs = cuda::memory_stats().device_allocs;
      g.launch();
      const Tensor got = y.to(Device::cpu);
      CHECK(cuda::memory_stats().device_allocs == allocs);  // a replay allocates nothing
      for (int64_t i : {int64_t{0}, int64_t{7}, n - 1})
        CHECK(got.data<float>()[i] == 3.0f * (v + static_cast<float>(i)));
    }
    // A block of the pool is never handed to other work while the pool lives, even though
    // the capture freed it: the next replay writes it.
    for (int k = 0; k < 4; ++k) {
      Tensor other = Tensor::empty({n}, DType::f32, Device::cuda);
      CHECK(std::find(captured.begin(), captured.end(), other.raw()) == captured.end());
    }
    CHECK(cuda::graph_launches() == launches + 3);
  }
  pool.reset();  // its graph went first; its blocks return to the cache
  CHECK(cuda::memory_stats().graph_pool_bytes == before.graph_pool_bytes);
  CHECK(cuda::memory_stats().current_bytes == before.current_bytes);
}

TEST_CASE("cuda graphs: a capture that synchronises is refused and leaves nothing captured", "[gpu]") {
  if (!gpu_ready()) return;
  Tensor x = Tensor::empty({16}, DType::f32, Device::cuda);
  cuda::GraphPool pool;
  try {
    cuda::CudaGraph g(pool, [&] {
      ops::fill(x, 2.0);
      (void)x.to(Device::cpu);  // a device-to-host read waits for the stream: not during a capture
    });
    FAIL("the capture was not refused");
  } catch (const Refused& e) {
    INFO(e.what());
    CHECK((std::string(e.what()).find("captur") != std::string::npos));
  }
  CHECK_FALSE(cuda::capturing());
  // So is an allocation from the driver outside the pool (this thread's, the capture being
  // thread-local).
  try {
    cuda::CudaGraph g(pool, [&] {
      void* raw = nullptr;
      CUDA_CHECK(cudaMalloc(&raw, 256));
    });
    FAIL("the capture was not refused");
  } catch (const Refused& e) {
    INFO(e.what());
    CHECK((std::string(e.what()).find("captur") != std::string::npos));
  }
  ops::fill(x, 3.0);  // the stream works as before, and the allocator allocates as before
  Tensor z = Tensor::empty({16}, DType::f32, Device::cuda);
  ops::copy(z, x);
  CHECK(z.to(Device::cpu).data<float>()[15] == 3.0f);
}

// What the runtime refuses inside a capture is refused as the runtime would, and becomes a
// Refused (the caller's eager fallback); a failed internal check inside one is a plain
// RuntimeError (it ends the run); what mtnlg itself does in a captured step -- a GEMM on
// classic cuBLAS, kernels under MTNLG_CUDA_SYNC_CHECK -- captures.
TEST_CASE("cuda graphs: cublasCreate, a synchronisation or a host upload inside a capture are refused", "[gpu]") {
  if (!gpu_ready()) return;
  Tensor x = Tensor::empty({16}, DType::f32, Device::cuda);
  cuda::GraphPool pool;
  auto refused = [&](const char* what, const std::function<void()>& work) {
    INFO(what);
    try {
      cuda::CudaGraph g(pool, work);
      FAIL("the capture was not refused");
    } catch (const Refused& e) {
      INFO(e.what());
      CHECK((std::string(e.what()).find("captur") != std::string::npos));
    }
    CHECK_FALSE(cuda::capturing());
  };
  refused("cublasCreate", [&] {
    cublasHandle_t h = nullptr;
    CHECK(cublasCreate(&h) != CUBLAS_STATUS_SUCCESS);  // it allocates device memory
  });
  refused("cudaDeviceSynchronize", [&] {
    ops::fill(x, 1.0);
    CHECK(cudaDeviceSynchronize() != cudaSuccess);
  });
  refused("a small upload (the staging ring)", [&] {
    Tensor h = Tensor::empty({16}, DType::f32, Device::cpu);
    x.copy_from(h);
  });
  // An internal check that fails inside a capture is not a refusal.
  try {
    cuda::CudaGraph g(pool, [&] { MTNLG_CHECK(false, "planted"); });
    FAIL("no error");
  } catch (const Refused&) {
    FAIL("an internal check became a refusal");
  } catch (const RuntimeError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains("internal check failed"));
  }
  CHECK_FALSE(cuda::capturing());
  // The classic cuBLAS fallback inside a capture: the backend's handle, made at start-up
  // with its own workspace, captures and replays.
  ops::fill(x, 2.0);
  Tensor w = Tensor::empty({4, 4}, DType::f32, Device::cuda), in = Tensor::empty({4, 4}, DType::f32, Device::cuda);
  Tensor out = Tensor::empty({4, 4}, DType::f32, Device::cuda);
  ops::fill(w, 1.0);
  ops::fill(in, 3.0);
  const bool lt = cuda::set_gemm_lt(false);
  {
    cuda::CudaGraph g(pool, [&] { ops::matmul_forward(out, in, w, nullptr); });
    ops::fill(out, 0.0);
    g.launch();
  }
  cuda::set_gemm_lt(lt);
  CHECK(out.to(Device::cpu).data<float>()[5] == 12.0f);
}

// With MTNLG_CUDA_SYNC_CHECK=1 (its own ctest entry, emulator.sync-check-capture) every
// launch is followed by a device synchronisation, except inside a capture, which the
// synchronisation would invalidate: captured work still captures under the switch.
TEST_CASE("MTNLG_CUDA_SYNC_CHECK does not synchronise inside a CUDA graph capture", "[.sync-check]") {
  if (!gpu_ready()) return;
  REQUIRE(cuda::sync_check_enabled());
  Tensor x = Tensor::empty({64}, DType::f32, Device::cuda), y = Tensor::empty({64}, DType::f32, Device::cuda);
  cuda::GraphPool pool;
  cuda::CudaGraph g(pool, [&] { ops::add(y, x, x); });
  ops::fill(x, 1.5);
  g.launch();
  CHECK(y.to(Device::cpu).data<float>()[63] == 3.0f);
}

// The allocator serves the capture's pool to the capturing thread only: another thread
// allocating while a capture runs gets ordinary blocks, which never join the pool.
TEST_CASE("cuda graphs: the capture's pool is per thread", "[gpu]") {
  if (!gpu_ready()) return;
  cuda::GraphPool pool;
  int64_t other_bytes = 0;
  bool other_captures = true;
  {
    cuda::CudaGraph g(pool, [&] {
      Tensor mine = Tensor::empty({256}, DType::f32, Device::cuda);
      const int64_t before = pool.bytes();
      std::thread t([&] {
        other_captures = cuda::capturing();
        Tensor theirs = Tensor::empty({1 << 16}, DType::f32, Device::cuda);
        other_bytes = pool.bytes() - before;
      });
      t.join();
      ops::fill(mine, 1.0);
    });
  }
  CHECK_FALSE(other_captures);
  CHECK(other_bytes == 0);
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

TEST_CASE("cuda all_finite finds inf and NaN, sum_squares is deterministic, i32 fill", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(1);
  // (add, scale, copy, fill, sum_squares, all_finite on finite values and the conversions
  // between every pair of float dtypes: the op table's "utility" and "convert" entries,
  // test/core/ops/op_cases.cpp)
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
        // both GEMMs fused exactly when the switch is on, the type is bf16/fp16 (f32 always
        // takes the separate kernels) and OC is a multiple of 8 (the emulated cuBLASLt
        // offers the epilogues, unless MTNLG_EMU_LT_FAIL makes them fail; a GPU may decline
        // and fall back)
        const bool lt_fails = switches::text(Switch::emu_lt_fail) != "0";
        if (emulated_device())
          CHECK(cuda::gemm_gelu_fused() - fused0 ==
                (epilogue && dt != DType::f32 && s.OC % 8 == 0 && !lt_fails ? 2 : 0));
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
    Tensor inp = to_gpu(randn({37, 48}, g), dt), w = to_gpu(randn({40, 48}, g, 0.3), dt),
           b = to_gpu(randn({40}, g), dt);
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

// Dropout keys read on the device (DeviceKey: a CUDA graph's replay takes its micro batch's
// keys from memory): every dropout site gives the bits of the same key passed as arguments.
TEST_CASE("cuda dropout keys from device memory equal the keys passed as arguments", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(31);
  const uint64_t step = 0xABCDEF12345ull, sample = 6, a = 3, b = 2;
  const int64_t N = 24, C = 40, per_sample = 4 * C, add = 2 * C;
  const uint64_t key = mix_key(step, a, b), base = sample * per_sample + add;
  Tensor keys_host = Tensor::empty({4}, DType::i32);
  const uint64_t words[2] = {step, sample};
  std::memcpy(keys_host.raw(), words, sizeof words);
  const Tensor keys = keys_host.to(Device::cuda);
  const DeviceKey dkey{static_cast<const uint64_t*>(keys.raw()), a, b, per_sample, add};
  auto same = [](const Tensor& x, const Tensor& y) {
    const Tensor hx = x.to(Device::cpu), hy = y.to(Device::cpu);
    return std::memcmp(hx.raw(), hy.raw(), static_cast<size_t>(hx.nbytes())) == 0;
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    INFO(to_string(dt));
    const Tensor x = to_gpu(randn({N, C}, g), dt), br = to_gpu(randn({N, C}, g), dt), bias = to_gpu(randn({C}, g), dt);
    const Tensor w = to_gpu(randn({C}, g), dt), lb = to_gpu(randn({C}, g), dt);
    Tensor o1 = poisoned({N, C}, dt), o2 = poisoned({N, C}, dt);
    ops::dropout_forward(o1, x, 0.3, key, base);
    ops::dropout_forward(o2, x, 0.3, 0, 0, dkey);  // the argument values are ignored
    CHECK(same(o1, o2));
    Tensor s1 = poisoned({N, C}, dt), s2 = poisoned({N, C}, dt), n1 = poisoned({N, C}, dt), n2 = poisoned({N, C}, dt);
    Tensor m1 = poisoned({N}, DType::f32), m2 = poisoned({N}, DType::f32), r1 = poisoned({N}, DType::f32),
           r2 = poisoned({N}, DType::f32);
    ops::residual_layernorm_forward(s1, n1, m1, r1, x, br, ops::ResidualBranch{&bias, 0.3, key, base}, w, lb, 1e-5);
    ops::residual_layernorm_forward(s2, n2, m2, r2, x, br, ops::ResidualBranch{&bias, 0.3, 0, 0, dkey}, w, lb, 1e-5);
    CHECK(same(s1, s2));
    CHECK(same(n1, n2));
  }
  // attention: the key and the sample offset; both forms (the flash form is cuDNN's, with
  // its own mask, bf16)
  const int64_t B = 2, T = 16, H = 2, D = 8;
  const DeviceKey akey{static_cast<const uint64_t*>(keys.raw()), a, b, 1, 0};
  const ops::AttentionDropout by_args{0.2, key, static_cast<int64_t>(sample), 0, H};
  const ops::AttentionDropout by_dev{0.2, 0, 0, 0, H, akey};
  const Tensor qkv = to_gpu(randn({B, T, 3 * H * D}, g, 0.5), DType::bf16);
  const Tensor dout = to_gpu(randn({B, T, H * D}, g), DType::bf16);
  Tensor o1 = poisoned({B, T, H * D}, DType::bf16), o2 = poisoned({B, T, H * D}, DType::bf16);
  Tensor p1 = poisoned({B, H, T, T}, DType::bf16), p2 = poisoned({B, H, T, T}, DType::bf16);
  ops::attention_forward(o1, p1, qkv, H, by_args);
  ops::attention_forward(o2, p2, qkv, H, by_dev);
  CHECK(same(o1, o2));
  Tensor d1 = poisoned({B, T, 3 * H * D}, DType::bf16), d2 = poisoned({B, T, 3 * H * D}, DType::bf16);
  ops::attention_backward(d1, dout, qkv, p1, H, by_args);
  ops::attention_backward(d2, dout, qkv, p2, H, by_dev);
  CHECK(same(d1, d2));
  std::string why;
  if (ops::attention_lse_supported(Device::cuda, DType::bf16, B, T, H, D, 0.2, &why)) {
    Tensor l1 = poisoned({B, H, T}, DType::f32), l2 = poisoned({B, H, T}, DType::f32);
    ops::attention_forward_lse(o1, l1, qkv, H, by_args);
    ops::attention_forward_lse(o2, l2, qkv, H, by_dev);
    CHECK(same(o1, o2));
    ops::attention_backward_lse(d1, dout, qkv, o1, l1, H, by_args);
    ops::attention_backward_lse(d2, dout, qkv, o2, l2, H, by_dev);
    CHECK(same(d1, d2));
  } else {
    WARN("the flash form does not run here: " << why);
  }
}

// ---- attention -----------------------------------------------------------------------------

// Both forms compute the same function: the unfused form's out and dqkv equal the flash
// form's (cuDNN's fused attention) on the device, bf16 and fp16, without dropout (cuDNN
// draws its own dropout mask: the next case). Bounds: each form's own bound against the
// CPU (the ops table: unfused out 2 x kRtolLow, dqkv 4 x; flash 1 x and 2 x), added.
TEST_CASE("cuda unfused and flash attention agree", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(12);
  const int64_t B = 2, T = 23, H = 2, D = 64;
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(to_string(dt));
    const ops::AttentionDropout drop{0.0, 0x77ull, 0, 0, H};
    Tensor gq = to_gpu(randn({B, T, 3 * H * D}, g), dt), gdo = to_gpu(randn({B, T, H * D}, g), dt);
    Tensor o1 = poisoned({B, T, H * D}, dt), probs = poisoned({B, H, T, T}, dt);
    Tensor o2 = poisoned({B, T, H * D}, dt), lse = poisoned({B, H, T}, DType::f32);
    ops::attention_forward(o1, probs, gq, H, drop);
    ops::attention_forward_lse(o2, lse, gq, H, drop);
    check_close("out", o1, to_cpu_f32(o2), 3 * kRtolLow);
    Tensor d1 = poisoned(gq.shape(), dt), d2 = poisoned(gq.shape(), dt);
    ops::attention_backward(d1, gdo, gq, probs, H, drop);
    ops::attention_backward_lse(d2, gdo, gq, o2, lse, H, drop);
    check_close("dqkv", d1, to_cpu_f32(d2), 6 * kRtolLow);
  }
}

// With dropout the flash form on CUDA draws cuDNN's mask from (key, offset): the same key
// gives the same output and gradient bit for bit (the backward redraws the forward's
// mask), another key another output, and p > 0 differs from p = 0.
TEST_CASE("cuda flash attention dropout: deterministic per key", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(13);
  const int64_t B = 2, T = 40, H = 2, D = 32;
  Tensor gq = to_gpu(randn({B, T, 3 * H * D}, g), DType::bf16), gdo = to_gpu(randn({B, T, H * D}, g), DType::bf16);
  auto run = [&](double p, uint64_t key, Tensor* dqkv) {
    Tensor out = poisoned({B, T, H * D}, DType::bf16), lse = poisoned({B, H, T}, DType::f32);
    const ops::AttentionDropout drop{p, key, 0, 0, H};
    ops::attention_forward_lse(out, lse, gq, H, drop);
    *dqkv = poisoned(gq.shape(), DType::bf16);
    ops::attention_backward_lse(*dqkv, gdo, gq, out, lse, H, drop);
    return to_cpu_f32(out);
  };
  auto max_diff = [](const Tensor& x, const Tensor& y) {
    double m = 0;
    for (int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::fabs(double(x.data<float>()[i]) - y.data<float>()[i]));
    return m;
  };
  Tensor d1, d2, d3, d0;
  const Tensor a = run(0.1, 5, &d1), b = run(0.1, 5, &d2), c = run(0.1, 6, &d3), z = run(0.0, 5, &d0);
  CHECK(max_diff(a, b) == 0.0);
  CHECK(max_diff(to_cpu_f32(d1), to_cpu_f32(d2)) == 0.0);
  CHECK(max_diff(a, c) > 1e-2);
  CHECK(max_diff(a, z) > 1e-2);
}

// Grouped-query attention on cuDNN's graphs with dropout, on the emulated cuDNN, which
// draws the CPU op's mask at the offset mtnlg hands cuDNN (tensor parallelism 1): out and
// dqkv equal the CPU op's, so each sample's execution (2 groups of 2 heads: the groups as
// cuDNN's batch) and the one multi-query execution get their samples' masks.
TEST_CASE("cuda flash grouped-query attention with dropout: each sample's mask (emulated)", "[gpu]") {
  if (!gpu_ready() || !emulated_device()) return;
  std::mt19937_64 g(17);
  const int64_t B = 2, T = 24, H = 4, D = 16;
  for (int64_t G : {2, 1}) {
    INFO("groups " << G);
    const int64_t W = (H + 2 * G) * D;
    auto convert = [](const Tensor& x, DType dt) {
      Tensor y = Tensor::empty(x.shape(), dt);
      ops::convert(y, x);
      return y;
    };
    const Tensor q = randn({B, T, W}, g), dout = randn({B, T, H * D}, g);
    const ops::AttentionDropout drop{0.2, 77, 3, 0, H};
    // The CPU op in bf16 (the emulated cuDNN runs the same op on the device's copies).
    Tensor out = Tensor::empty({B, T, H * D}, DType::bf16), lse = Tensor::empty({B, H, T}, DType::f32);
    Tensor qc = convert(q, DType::bf16), dc = convert(dout, DType::bf16), dqkv = Tensor::empty({B, T, W}, DType::bf16);
    ops::attention_forward_lse(out, lse, qc, H, drop, G);
    ops::attention_backward_lse(dqkv, dc, qc, out, lse, H, drop, G);
    Tensor gq = to_gpu(q, DType::bf16), gdo = to_gpu(dout, DType::bf16);
    Tensor gout = poisoned({B, T, H * D}, DType::bf16), glse = poisoned({B, H, T}, DType::f32);
    ops::attention_forward_lse(gout, glse, gq, H, drop, G);
    Tensor gd = poisoned({B, T, W}, DType::bf16);
    ops::attention_backward_lse(gd, gdo, gq, gout, glse, H, drop, G);
    check_close("out", gout, convert(out, DType::f32), 1e-6);
    check_close("lse", glse, lse, 1e-6);
    check_close("dqkv", gd, convert(dqkv, DType::f32), 1e-6);
  }
}

// The flash backward's dqkv against the CPU's, whose D_i = sum_j P_ij dP_ij is exact where
// the flash form takes D_i = dO_i . O_i from the STORED output. The true (fp64) gradient of
// a row that attends to one key is 0 (a softmax over one element), as the CPU gives; with
// dropout that row's stored O = v / (1 - p) is rounded to the storage type, and the flash
// form carries the rounding into dq whole (an H200: 0.0173 where the truth is 0, bf16, p
// 0.1, query 0). Bound, derived per row: |dO . O - dO . stored(O)| <= u * sum_d |dO_id O_id|
// (u: the storage type's unit roundoff, 2^-8 bf16, 2^-11 f16, 0 f32), and dq_i = scale *
// sum_j P_ij (dP_ij - D_i) k_j, so an error e in D_i moves dq_id by at most scale * e *
// max_{j<=i} |k_jd| (the P_ij sum to 1). That term is added to the metric's rtol * (|ref| +
// rms) for the dq elements. dk_j sums e over the rows weighted by P_ij, which is 1 only for
// one-hot rows: dk and dv keep the plain metric.
namespace {
void check_flash_dqkv(const Tensor& gpu, const Tensor& ref, const Tensor& dout, const Tensor& out, const Tensor& qkv,
                      int64_t B, int64_t T, int64_t H, int64_t D, DType dt, double rtol) {
  const double u = dt == DType::bf16 ? std::ldexp(1.0, -8) : dt == DType::f16 ? std::ldexp(1.0, -11) : 0.0;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const float *dO = dout.data<float>(), *O = out.data<float>(), *q = qkv.data<float>();
  std::vector<double> extra(static_cast<size_t>(ref.numel()), 0.0);  // dq elements only
  std::vector<double> kmax(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::fill(kmax.begin(), kmax.end(), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t row = (b * T + i) * 3 * H * D + h * 3 * D, orow = (b * T + i) * H * D + h * D;
        double e = 0;
        for (int64_t d = 0; d < D; ++d) {
          e += std::fabs(static_cast<double>(dO[orow + d]) * O[orow + d]);
          kmax[static_cast<size_t>(d)] =
              std::max(kmax[static_cast<size_t>(d)], std::fabs(static_cast<double>(q[row + D + d])));
        }
        for (int64_t d = 0; d < D; ++d)
          extra[static_cast<size_t>(row + d)] = scale * u * e * kmax[static_cast<size_t>(d)];
      }
    }
  check_close("dqkv", gpu, ref, rtol, extra);
}
}  // namespace

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
  // The CPU comparison runs without dropout: cuDNN draws its own mask (the emulator's
  // is the CPU's, so there dropout is compared too).
  const double p = emulated_device() ? 0.1 : 0.0;
  const std::vector<S> shapes =
      emulated_device() ? std::vector<S>{S{2, 203, 3, 64, DType::bf16, p}, S{1, 160, 2, 128, DType::f16, 0.0},
                                         S{1100, 2, 60, 8, DType::bf16, p}}
                        : std::vector<S>{S{4, 1024, 104, 64, DType::bf16, p}, S{1, 2048, 8, 128, DType::f16, 0.0},
                                         S{1100, 20, 60, 16, DType::bf16, p}};
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
    check_flash_dqkv(gdqkv, dqkv, rdo, rounded(out, s.dt), rq, s.B, s.T, s.H, s.D, s.dt, optable::dqkv_rtol(s.dt, s.p));
  }
}

// Head sizes above 128: the real cuDNN 9.19 plans 160 (the 530B at tp 8) and 256 on sm90
// (test/core/cuda/test_cudnn_plan_table.cpp), so `auto` takes the flash form there. The
// flash form against the CPU at both, with cuDNN 9's dQ accumulator and deterministic.
TEST_CASE("cuda flash attention at head sizes 160 and 256 vs CPU, both backward algorithms", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(23);
  const double p = emulated_device() ? 0.1 : 0.0;  // the emulated mask is the CPU's
  for (int64_t D : {160, 256})
    for (bool det : {false, true}) {
      const int64_t B = 1, T = 40, H = 2;
      const DType dt = DType::bf16;
      INFO("D " << D << (det ? " deterministic" : " dQ accumulator"));
      std::string why;
      cuda::set_deterministic_attention(det);
      REQUIRE(ops::attention_lse_supported(Device::cuda, dt, B, T, H, D, p, &why));
      const ops::AttentionDropout drop{p, 0x5151ull, 0, 0, H};
      Tensor qkv = randn({B, T, 3 * H * D}, g), dout = randn({B, T, H * D}, g);
      Tensor rq = rounded(qkv, dt), rdo = rounded(dout, dt);
      Tensor out = cpu_zeros({B, T, H * D}), lse = cpu_zeros({B, H, T});
      ops::attention_forward_lse(out, lse, rq, H, drop);
      Tensor gq = to_gpu(qkv, dt), gdo = to_gpu(dout, dt);
      Tensor gout = poisoned({B, T, H * D}, dt), glse = poisoned({B, H, T}, DType::f32);
      ops::attention_forward_lse(gout, glse, gq, H, drop);
      check_close("out", gout, out, rtol_for(dt));
      check_close("lse", glse, lse, rtol_for(dt));
      Tensor dqkv = cpu_zeros(qkv.shape());
      ops::attention_backward_lse(dqkv, rdo, rq, rounded(out, dt), lse, H, drop);
      Tensor gdqkv = poisoned(qkv.shape(), dt);
      ops::attention_backward_lse(gdqkv, gdo, gq, gout, glse, H, drop);
      check_flash_dqkv(gdqkv, dqkv, rdo, rounded(out, dt), rq, B, T, H, D, dt, optable::dqkv_rtol(dt, p));
    }
  cuda::set_deterministic_attention(false);
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

TEST_CASE("cuda attention rejects what it cannot run", "[gpu]") {
  if (!gpu_ready()) return;
  // The flash form on CUDA is cuDNN's: fp32 is refused by mtnlg, head sizes by cuDNN (the
  // emulated cuDNN draws the real cuDNN 9.19's lines on sm90: multiples of 8, up to 256).
  Tensor qkv = Tensor::empty({1, 4, 3 * 64}, DType::f32, Device::cuda),
         out = Tensor::empty({1, 4, 64}, DType::f32, Device::cuda);
  Tensor lse = Tensor::empty({1, 1, 4}, DType::f32, Device::cuda);
  CHECK_THROWS_WITH(ops::attention_forward_lse(out, lse, qkv, 1, {}), Catch::Matchers::Contains("bf16 or fp16"));
  std::string why;
  CHECK_FALSE(ops::attention_lse_supported(Device::cuda, DType::f32, 1, 4, 1, 64, 0.0, &why));
  CHECK_THAT(why, Catch::Matchers::Contains("bf16 or fp16"));
  if (emulated_device()) {  // as the real cuDNN 9.19 on sm90 (test_cudnn_plan_table.cpp): no engine
    for (int64_t d : {12, 100, 264}) {
      CHECK_FALSE(ops::attention_lse_supported(Device::cuda, DType::bf16, 1, 4, 1, d, 0.0, &why));
      CHECK_THAT(why, Catch::Matchers::Contains("no engine") && Catch::Matchers::Contains("multiple of 8"));
    }
  }
  CHECK(ops::attention_lse_supported(Device::cuda, DType::bf16, 2, 16, 2, 64, 0.1, &why));
  CHECK_THAT(why, Catch::Matchers::Contains("cuDNN"));
  Tensor qb = Tensor::empty({1, 4, 3 * 8}, DType::bf16, Device::cuda),
         ob = Tensor::empty({1, 4, 8}, DType::bf16, Device::cuda);
  Tensor lb = Tensor::empty({1, 1, 4}, DType::bf16, Device::cuda);
  CHECK_THROWS_WITH(ops::attention_forward_lse(ob, lb, qb, 1, {}), Catch::Matchers::Contains("f32"));
  // Grouped-query attention is on cuDNN's fused path (K and V with fewer heads; the op
  // table computes it against the CPU): 2 groups of 2 heads and multi-query plan; groups
  // that do not divide the heads, and a head size cuDNN refuses, are refused with the reason.
  CHECK(ops::attention_lse_supported(Device::cuda, DType::bf16, 2, 16, 4, 64, 0.0, &why, 2));
  CHECK_THAT(why, Catch::Matchers::Contains("cuDNN"));
  CHECK(ops::attention_lse_supported(Device::cuda, DType::bf16, 2, 16, 4, 64, 0.1, &why, 1));
  CHECK(ops::attention_lse_supported(Device::cuda, DType::bf16, 2, 16, 4, 64, 0.0, &why, 4));  // groups == heads
  CHECK_FALSE(ops::attention_lse_supported(Device::cuda, DType::bf16, 2, 16, 4, 64, 0.0, &why, 3));
  CHECK_THAT(why, Catch::Matchers::Contains("4 heads do not split into 3 query groups"));
  if (emulated_device()) {
    CHECK_FALSE(ops::attention_lse_supported(Device::cuda, DType::bf16, 2, 16, 4, 100, 0.0, &why, 2));
    CHECK_THAT(why, Catch::Matchers::Contains("no engine") && Catch::Matchers::Contains("multiple of 8"));
  }
  CHECK(ops::attention_lse_supported(Device::cpu, DType::bf16, 2, 16, 4, 64, 0.0, &why, 2));
}

// ---- cross-entropy -----------------------------------------------------------------------

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

TEST_CASE("cuda AdamW: the flat multi-segment kernel vs CPU", "[gpu]") {
  if (!gpu_ready()) return;
  std::mt19937_64 g(10);
  const int64_t n = 10007;
  Tensor p = randn({n}, g), gr = randn({n}, g), m = randn({n}, g, 0.1), v = randn({n}, g, 0.1);
  for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::fabs(v.data<float>()[i]);
  ops::AdamWParams ap{1e-3, 0.9, 0.95, 1e-8, 0.1, 7, 0.5};
  // (ops::adamw_step alone, one segment with decay: the op table's "adamw" entry)
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
