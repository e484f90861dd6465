// The SIMT executor of the emulated CUDA backend: runs one kernel grid on the CPU.
//
// Blocks are spread over a small pool of OS threads (the caller included), in reverse
// block order. Within a block every CUDA thread is a fiber (Boost.Context) on the block's
// OS thread, so the threads really run concurrently in the sense that matters to CUDA
// code: a __syncthreads or a warp shuffle suspends the fiber until the threads it waits
// for get there, and nothing but those points orders them. Fibers run in lane order
// until they block; a barrier releases when every live (not exited) thread of the
// block waits at it, so a thread that returned early does not hold up a later barrier.
//
// Strictness (each is fatal, naming the kernel, block and threads):
//   - a barrier reached at different __syncthreads calls by live threads (divergence);
//   - a shuffle whose mask names a lane that does not exist in the block or has exited,
//     or that does not contain the caller, or reads a lane outside the mask;
//   - no thread can move (threads at a barrier while others wait in a shuffle);
//   - dynamic shared memory ends at a guard page and starts NaN-filled (0xFF bytes).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/switches.hpp"
#include "emulator/cuda_emu.hpp"
#include "emulator/emu.hpp"
#include "emulator/internal.hpp"

namespace ctx = boost::context;

namespace mtnlg::emu {

struct SimtThread {
  uint3 idx{};
  int linear = 0, lane = 0, warp = 0;
  enum State { ready, at_barrier, at_shuffle, done } state = ready;
  const char* file = "";
  int line = 0;
  const char* what = "";
  bool started = false;
  ctx::fiber fiber;  // this CUDA thread
  ctx::fiber sink;   // the block scheduler (what a yield resumes)
};

namespace {

struct WarpExchange {
  bool open = false;
  unsigned mask = 0, arrived = 0, departed = 0, exited = 0;
  uint64_t vals[32] = {};
};

struct Block {
  const LaunchSpec* spec = nullptr;
  std::vector<SimtThread> threads;
  std::vector<WarpExchange> warps;
  int live = 0;
  uint64_t progress = 0;  // bumped by every state change (arrivals, departures, exits)
  uint3 idx{};
};

thread_local Block* tl_block = nullptr;
thread_local char* tl_smem = nullptr;

// ---- per-OS-thread resources ----------------------------------------------------------

constexpr size_t kStackBytes = 256 << 10;
constexpr size_t kSmemBytes = 232448;  // sm_90's opt-in maximum per block (227 KiB)

size_t page() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// Fiber stacks: each ends (at its low end) at a guard page; recycled per OS thread.
struct StackPool {
  std::vector<ctx::stack_context> free;
};
thread_local StackPool tl_stacks;

struct PooledStack {
  ctx::stack_context allocate() {
    if (!tl_stacks.free.empty()) {
      ctx::stack_context sc = tl_stacks.free.back();
      tl_stacks.free.pop_back();
      return sc;
    }
    const size_t total = kStackBytes + page();
    void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) fatal("cannot map a fiber stack for the SIMT executor");
    mprotect(base, page(), PROT_NONE);  // guard below the stack
    register_stack_guard(base, page());
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(base) + total;
    return sc;
  }
  void deallocate(ctx::stack_context& sc) noexcept { tl_stacks.free.push_back(sc); }
};

// Dynamic shared memory of the block running on this OS thread: `bytes` ending at a
// guard page, filled with 0xFF.
char* block_smem(size_t bytes) {
  static thread_local char* region = nullptr;
  if (!region) {
    const size_t total = kSmemBytes + page() + page();
    void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) fatal("cannot map shared memory for the SIMT executor");
    region = static_cast<char*>(base);
    char* guard = region + total - page();
    mprotect(guard, page(), PROT_NONE);
    register_smem_guard(guard, page());
  }
  char* end = region + kSmemBytes + page();
  const size_t rounded = (bytes + 15) / 16 * 16;
  char* p = end - rounded;
  std::memset(p, 0xFF, rounded);
  return p;
}

// ---- diagnostics --------------------------------------------------------------------

std::string where(const Block& b) {
  return fmt_str("kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), %u x %u x %u threads", b.spec->name, b.idx.x, b.idx.y,
                 b.idx.z, b.spec->grid.x, b.spec->grid.y, b.spec->grid.z, b.spec->block.x, b.spec->block.y,
                 b.spec->block.z);
}

// "threads 0-15, 32 at a.cu:10 (__syncthreads); threads 16-31 at ..." for the given states.
std::string describe_waiters(const Block& b) {
  struct Group {
    std::string site;
    std::vector<int> ids;
  };
  std::vector<Group> groups;
  for (const SimtThread& t : b.threads) {
    if (t.state == SimtThread::done || t.state == SimtThread::ready) continue;
    std::string site =
        fmt_str("%s at %s:%d", t.state == SimtThread::at_barrier ? "__syncthreads" : t.what, t.file, t.line);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.site == site; });
    if (it == groups.end()) {
      groups.push_back({site, {}});
      it = groups.end() - 1;
    }
    it->ids.push_back(t.linear);
  }
  std::string out;
  for (const Group& g : groups) {
    std::string ids;
    for (size_t i = 0; i < g.ids.size();) {
      size_t j = i;
      while (j + 1 < g.ids.size() && g.ids[j + 1] == g.ids[j] + 1) ++j;
      if (!ids.empty()) ids += ",";
      ids += j == i ? std::to_string(g.ids[i]) : std::to_string(g.ids[i]) + "-" + std::to_string(g.ids[j]);
      i = j + 1;
    }
    if (!out.empty()) out += "; ";
    out += "threads " + ids + " wait in " + g.site;
  }
  return out;
}

void yield_to_scheduler() {
  SimtThread* t = tl_thread;
  t->sink = std::move(t->sink).resume();
}

// ---- one block ------------------------------------------------------------------------

void run_block(Block& b, const std::function<void()>& body) {
  const LaunchSpec& s = *b.spec;
  const int n = static_cast<int>(s.block.x * s.block.y * s.block.z);
  b.threads.resize(static_cast<size_t>(n));
  b.warps.assign(static_cast<size_t>((n + 31) / 32), WarpExchange{});
  for (int i = 0; i < n; ++i) {
    SimtThread& t = b.threads[static_cast<size_t>(i)];
    t = SimtThread{};
    t.linear = i;
    t.lane = i % 32;
    t.warp = i / 32;
    t.idx = uint3{static_cast<unsigned>(i) % s.block.x, (static_cast<unsigned>(i) / s.block.x) % s.block.y,
                  static_cast<unsigned>(i) / (s.block.x * s.block.y)};
  }
  b.live = n;
  tl_block = &b;
  tl_smem = s.dynamic_smem ? block_smem(s.dynamic_smem) : nullptr;
  for (;;) {
    const uint64_t before = b.progress;
    for (SimtThread& t : b.threads) {
      if (t.state == SimtThread::done || t.state == SimtThread::at_barrier) continue;
      if (!t.started) {
        t.started = true;
        SimtThread* tp = &t;
        t.fiber = ctx::fiber(std::allocator_arg, PooledStack{}, [tp, &body](ctx::fiber&& sink) {
          tp->sink = std::move(sink);
          body();
          return std::move(tp->sink);
        });
      }
      tl_thread = &t;
      t.fiber = std::move(t.fiber).resume();
      tl_thread = nullptr;
      if (!t.fiber) {  // returned from the kernel
        t.state = SimtThread::done;
        --b.live;
        ++b.progress;
        WarpExchange& w = b.warps[static_cast<size_t>(t.warp)];
        w.exited |= 1u << t.lane;
        if (w.open && (w.mask >> t.lane & 1u) && !(w.arrived >> t.lane & 1u))
          fatal(
              fmt_str("%s: thread %d exited while a warp shuffle's mask 0x%08x names it (lanes of warp %d that "
                      "arrived: 0x%08x)",
                      where(b).c_str(), t.linear, w.mask, t.warp, w.arrived));
      }
    }
    if (b.live == 0) break;
    int at_barrier = 0;
    for (const SimtThread& t : b.threads) at_barrier += t.state == SimtThread::at_barrier;
    if (at_barrier == b.live) {
      const SimtThread* first = nullptr;
      for (const SimtThread& t : b.threads) {
        if (t.state != SimtThread::at_barrier) continue;
        if (!first) {
          first = &t;
        } else if (t.line != first->line || std::strcmp(t.file, first->file) != 0) {
          fatal(fmt_str("%s: divergent __syncthreads: not every live thread reached the same barrier: %s",
                        where(b).c_str(), describe_waiters(b).c_str()));
        }
      }
      for (SimtThread& t : b.threads)
        if (t.state == SimtThread::at_barrier) t.state = SimtThread::ready;
      ++b.progress;
      continue;
    }
    if (b.progress == before)
      fatal(fmt_str("%s: no thread can proceed (a barrier or shuffle that some threads never reach): %s",
                    where(b).c_str(), describe_waiters(b).c_str()));
  }
  b.threads.clear();  // frees nothing but the fibers' handles (all finished)
  tl_block = nullptr;
  tl_smem = nullptr;
}

// ---- the pool ------------------------------------------------------------------------

class Pool {
 public:
  Pool() {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const auto e = ::mtnlg::switches::integer(::mtnlg::Switch::emu_threads))
      n = static_cast<int>(std::min<int64_t>(*e, 64));
    n = std::clamp(n, 1, 64);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }
  // Runs fn(block) for block in [0, total) on the pool and the calling thread.
  void run(int64_t total, const std::function<void(int64_t)>& fn) {
    if (total <= 1 || workers_.empty()) {
      for (int64_t i = total - 1; i >= 0; --i) fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      total_ = total;
      next_.store(0);
      active_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return active_ == 0; });
    job_ = nullptr;
  }

 private:
  void work() {
    for (;;) {
      const int64_t i = next_.fetch_add(1);
      if (i >= total_) return;
      (*job_)(total_ - 1 - i);
    }
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
      }
      work();
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_cv_.notify_all();
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t total_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  uint64_t generation_ = 0;
};

Pool& pool() {
  static auto* p = new Pool;  // never destroyed: workers may outlive static destruction
  return *p;
}

}  // namespace

thread_local SimtThread* tl_thread = nullptr;
thread_local uint3 tl_block_idx{};
thread_local dim3 tl_block_dim{};
thread_local dim3 tl_grid_dim{};

uint3 thread_idx() { return tl_thread->idx; }
int lane_id() { return tl_thread->lane; }
void* dynamic_shared() {
  if (!tl_smem)
    fatal(fmt_str("%s: the kernel uses dynamic shared memory but was launched with 0 bytes of it",
                  where(*tl_block).c_str()));
  return tl_smem;
}

void syncthreads(const char* file, int line) {
  SimtThread* t = tl_thread;
  t->state = SimtThread::at_barrier;
  t->file = file;
  t->line = line;
  ++tl_block->progress;
  yield_to_scheduler();  // resumed by the scheduler once the barrier releases (state ready)
}

uint64_t warp_exchange(unsigned mask, uint64_t bits, int src, int width, const char* what, const char* file, int line) {
  SimtThread* t = tl_thread;
  Block& b = *tl_block;
  WarpExchange& w = b.warps[static_cast<size_t>(t->warp)];
  const int n = static_cast<int>(b.threads.size());
  const int lanes = std::min(32, n - t->warp * 32);
  const unsigned exists = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
  const unsigned bit = 1u << t->lane;
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    fatal(fmt_str("%s: %s at %s:%d: width %d is not a power of two <= 32", where(b).c_str(), what, file, line, width));
  if (!(mask & bit))
    fatal(fmt_str("%s: %s at %s:%d: thread %d calls it with mask 0x%08x, which does not name its own lane %d",
                  where(b).c_str(), what, file, line, t->linear, mask, t->lane));
  if (mask & ~exists)
    fatal(
        fmt_str("%s: %s at %s:%d: mask 0x%08x names lanes 0x%08x of warp %d, which do not exist (the block has %d "
                "threads)",
                where(b).c_str(), what, file, line, mask, mask & ~exists, t->warp, n));
  if (mask & w.exited)
    fatal(fmt_str("%s: %s at %s:%d: mask 0x%08x names lanes 0x%08x of warp %d, which have exited", where(b).c_str(),
                  what, file, line, mask, mask & w.exited, t->warp));
  t->state = SimtThread::at_shuffle;
  t->what = what;
  t->file = file;
  t->line = line;
  // Join the open exchange when it is this shuffle's (same mask, not joined yet);
  // otherwise wait for it to close.
  while (w.open && (w.mask != mask || (w.arrived & bit))) yield_to_scheduler();
  if (!w.open) {
    w.open = true;
    w.mask = mask;
    w.arrived = w.departed = 0;
  }
  w.vals[t->lane] = bits;
  w.arrived |= bit;
  ++b.progress;
  while (w.arrived != w.mask) yield_to_scheduler();
  if (src < 0 || src >= 32 || !(mask >> src & 1u))
    fatal(fmt_str("%s: %s at %s:%d: lane %d reads lane %d, which is not in the mask 0x%08x", where(b).c_str(), what,
                  file, line, t->lane, src, mask));
  const uint64_t r = w.vals[src];
  w.departed |= bit;
  if (w.departed == w.mask) w.open = false;
  ++b.progress;
  t->state = SimtThread::ready;
  return r;
}

void run_grid(const LaunchSpec& spec, const std::function<void()>& body) {
  const int64_t gx = spec.grid.x, gy = spec.grid.y, gz = spec.grid.z;
  const int64_t total = gx * gy * gz;
  set_running_kernel(spec.name);
  pool().run(total, [&](int64_t id) {
    Block b;
    b.spec = &spec;
    b.idx = uint3{static_cast<unsigned>(id % gx), static_cast<unsigned>((id / gx) % gy),
                  static_cast<unsigned>(id / (gx * gy))};
    tl_block_idx = b.idx;
    tl_block_dim = spec.block;
    tl_grid_dim = spec.grid;
    set_thread_kernel(spec.name, &b.idx);
    run_block(b, body);
    set_thread_kernel(nullptr, nullptr);
  });
  set_running_kernel(nullptr);
}

}  // namespace mtnlg::emu
