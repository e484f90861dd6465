// The emulated CUDA runtime: device memory, pinned host memory, streams, events, the
// scheduler that runs queued work when a synchronisation forces it, kernel launches
// (checked against sm_90's limits), the fault handler, and the device queries. See
// emu.hpp for the model and its guarantees.
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "emulator/cuda_emu.hpp"
#include "emulator/emu.hpp"
#include "emulator/internal.hpp"

#undef warpSize  // the kernels' macro; cudaDeviceProp has a field of that name

struct CUstream_st {
  int id = 0;
  unsigned flags = 0;
  std::deque<mtnlg::emu::Op> q;
  uint64_t enqueued = 0, completed = 0;
  bool busy = false;  // its front op is running (or waiting for a dependency)
};

struct CUevent_st {
  CUstream_st* s = nullptr;  // stream of the latest record (nullptr: never recorded)
  uint64_t seq = 0;          // done when s->completed >= seq
  unsigned flags = 0;
  uint64_t gen = 0;
  double t_ms = 0;
  int queries = 0;
  bool destroyed = false;
};

namespace mtnlg::emu {

namespace {

using Clock = std::chrono::steady_clock;
const Clock::time_point g_t0 = Clock::now();
double now_ms() { return std::chrono::duration<double, std::milli>(Clock::now() - g_t0).count(); }

size_t page() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

int64_t env_i64(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : dflt;
}

struct Alloc {
  char* map = nullptr;   // the mapping: data pages, then one guard page
  size_t map_len = 0;
  char* user = nullptr;  // what cudaMalloc returned: 256-byte aligned, as the driver's
  size_t bytes = 0;
  size_t slack = 0;      // bytes between the block's end and the guard page (< 256), 0xFF
  uint64_t id = 0;
};
struct Range {
  char* p = nullptr;
  size_t bytes = 0;
  const char* what = "";
};

std::recursive_mutex g_mu;
std::map<uintptr_t, Alloc> g_allocs;     // by user start
std::vector<Alloc> g_freed;              // the latest freed allocations (for messages)
std::map<uintptr_t, size_t> g_pinned;    // cudaHostAlloc'd ranges
// Fiber-stack and shared-memory guard pages. Registered from pool threads while a launch
// holds g_mu, so under a mutex of their own; reserved up front so that the SIGSEGV
// handler's read never races a reallocation.
std::mutex g_guard_mu;
std::vector<Range> g_guards = [] {
  std::vector<Range> v;
  v.reserve(1 << 17);
  return v;
}();
uint64_t g_next_alloc_id = 1;
int64_t g_device_bytes = 0;
bool g_device_rw = false;
int g_depth = 0;
int g_device = 0;
std::vector<CUstream_st*> g_streams;
CUstream_st* g_null = nullptr;
int g_next_stream_id = 0;
std::unordered_map<const void*, int> g_max_dyn_smem;  // cudaFuncSetAttribute
const char* volatile g_running_kernel = nullptr;

thread_local cudaError_t tl_last_error = cudaSuccess;
thread_local std::string tl_last_detail;
thread_local const char* tl_kernel = nullptr;
thread_local const uint3* tl_kernel_block = nullptr;

int64_t device_budget() { return env_i64("MTNLG_EMU_MEMORY_BYTES", int64_t{16} << 30); }

cudaError_t fail(cudaError_t e, const std::string& detail) {
  tl_last_error = e;
  tl_last_detail = detail;
  if (std::getenv("MTNLG_EMU_VERBOSE")) std::fprintf(stderr, "mtnlg cuda-emulator: %s\n", detail.c_str());
  return e;
}

// ---- memory -----------------------------------------------------------------------

void protect(const Alloc& a, bool rw) {
  mprotect(a.map, a.map_len - page(), rw ? PROT_READ | PROT_WRITE : PROT_NONE);
}

void set_device_access(bool rw) {
  if (g_device_rw == rw) return;
  for (auto& [k, a] : g_allocs) protect(a, rw);
  g_device_rw = rw;
}

// Device memory is accessible while queued work runs (depth > 0) and nowhere else.
struct Access {
  Access() {
    if (g_depth++ == 0) set_device_access(true);
  }
  ~Access() {
    if (--g_depth == 0) set_device_access(false);
  }
};

const Alloc* find_alloc(uintptr_t a) {
  auto it = g_allocs.upper_bound(a);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  const Alloc& al = it->second;
  if (a >= reinterpret_cast<uintptr_t>(al.user) && a < reinterpret_cast<uintptr_t>(al.user) + al.bytes) return &al;
  return nullptr;
}

// The allocation whose mapping (slack, data or guard) contains a.
const Alloc* find_mapping(uintptr_t a) {
  for (const auto& [k, al] : g_allocs)
    if (a >= reinterpret_cast<uintptr_t>(al.map) && a < reinterpret_cast<uintptr_t>(al.map) + al.map_len) return &al;
  return nullptr;
}

std::string alloc_desc(const Alloc& a) {
  return fmt_str("device allocation #%llu (%zu bytes at %p)", static_cast<unsigned long long>(a.id), a.bytes,
                 static_cast<void*>(a.user));
}

// The pointer arguments of the launch being prepared on this thread (check_kernel_pointer
// collects them; launch() hands them to the op, which checks their slack afterwards).
thread_local std::vector<const void*> tl_launch_pointers;

// A kernel must not have written into the slack between its allocation's end and the
// guard page (still 0xFF).
void check_slack(const char* kernel, const void* p) {
  const Alloc* a = find_alloc(reinterpret_cast<uintptr_t>(p));
  if (!a) return;  // freed by a later call of the same drain: nothing to check
  const auto* s = reinterpret_cast<const unsigned char*>(a->user + a->bytes);
  for (size_t i = 0; i < a->slack; ++i)
    if (s[i] != 0xFF)
      fatal(fmt_str("kernel %s wrote out of bounds: %zu bytes past the end of %s (found after the kernel, in the "
                    "alignment slack before the guard page)",
                    kernel, i, alloc_desc(*a).c_str()));
}

std::string kernel_desc() {
  if (!tl_kernel) return "host code";
  std::string s = fmt_str("kernel %s", tl_kernel);
  if (tl_kernel_block)
    s += fmt_str(" (block (%u,%u,%u))", tl_kernel_block->x, tl_kernel_block->y, tl_kernel_block->z);
  return s;
}

// ---- the fault handler -----------------------------------------------------------------

void write_err(const std::string& s) {
  const std::string line = "mtnlg cuda-emulator: " + s + "\n";
  ssize_t r = ::write(2, line.data(), line.size());
  (void)r;
}

void on_fault(int sig, siginfo_t* si, void* ucv) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
  bool write = false;
#if defined(__x86_64__)
  write = (static_cast<ucontext_t*>(ucv)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#endif
  const char* rw = write ? "writes" : "reads";
  std::string msg;
  if (const Alloc* al = find_mapping(a)) {
    const uintptr_t u = reinterpret_cast<uintptr_t>(al->user), end = u + al->bytes;
    if (a >= end)
      msg = fmt_str("%s %s out of bounds: address %p is %llu bytes past the end of %s", kernel_desc().c_str(), rw,
                    si->si_addr, static_cast<unsigned long long>(a - end), alloc_desc(*al).c_str());
    else if (a < u)
      msg = fmt_str("%s %s out of bounds: address %p is %llu bytes before the start of %s", kernel_desc().c_str(), rw,
                    si->si_addr, static_cast<unsigned long long>(u - a), alloc_desc(*al).c_str());
    else
      msg = fmt_str("%s %s device memory at %p (offset %llu of %s) outside a stream's work: copy it to the host "
                    "first (cudaMemcpy, Tensor::to(Device::cpu))",
                    kernel_desc().c_str(), rw, si->si_addr, static_cast<unsigned long long>(a - u),
                    alloc_desc(*al).c_str());
  } else {
    for (const Range& g : g_guards)
      if (a >= reinterpret_cast<uintptr_t>(g.p) && a < reinterpret_cast<uintptr_t>(g.p) + g.bytes)
        msg = fmt_str("%s %s %s at %p", kernel_desc().c_str(), rw, g.what, si->si_addr);
    if (msg.empty())
      for (const Alloc& f : g_freed)
        if (a >= reinterpret_cast<uintptr_t>(f.map) && a < reinterpret_cast<uintptr_t>(f.map) + f.map_len)
          msg = fmt_str("%s %s freed device memory at %p (%s, already freed with cudaFree)", kernel_desc().c_str(), rw,
                        si->si_addr, alloc_desc(f).c_str());
  }
  if (msg.empty()) {  // not ours: an ordinary crash
    signal(sig, SIG_DFL);
    return;
  }
  write_err(msg);
  _exit(134);
}

void ensure_altstack() {
  static thread_local bool done = false;
  if (done) return;
  done = true;
  stack_t ss{};
  ss.ss_size = 64 << 10;
  ss.ss_sp = mmap(nullptr, ss.ss_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ss.ss_sp != MAP_FAILED) sigaltstack(&ss, nullptr);
}

void install_handler() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  ensure_altstack();
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

// ---- streams and the scheduler ----------------------------------------------------------

CUstream_st* new_stream(unsigned flags) {
  auto* s = new CUstream_st;
  s->id = g_next_stream_id++;
  s->flags = flags;
  g_streams.push_back(s);
  return s;
}

CUstream_st* resolve(cudaStream_t s) {
  install_handler();
  if (!g_null) g_null = new_stream(0);
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return g_null;
  return s;
}

bool valid_stream(CUstream_st* s) { return std::find(g_streams.begin(), g_streams.end(), s) != g_streams.end(); }

void run_until(CUstream_st* s, uint64_t seq);

void pop_front(CUstream_st* s) {
  s->q.pop_front();
  ++s->completed;
}

// While a communication op waits for peers every other stream may run, as on a GPU.
// Returns whether anything ran.
bool progress_others() {
  bool any = false;
  for (auto it = g_streams.rbegin(); it != g_streams.rend(); ++it) {
    CUstream_st* t = *it;
    if (t->busy || t->q.empty()) continue;
    Op& op = t->q.front();
    if (op.wait_stream) {
      if (op.wait_stream->completed >= op.wait_seq) {
        pop_front(t);
        any = true;
      }
      continue;
    }
    t->busy = true;
    const bool done = op.step();
    t->busy = false;
    if (done) {
      pop_front(t);
      any = true;
    }
  }
  return any;
}

void run_front(CUstream_st* s) {
  if (s->busy)
    fatal(fmt_str("stream %d waits (through cudaStreamWaitEvent) for work queued after its own current op: a "
                  "dependency cycle, which would hang a GPU",
                  s->id));
  Op& op = s->q.front();
  s->busy = true;
  if (op.wait_stream) {
    if (op.wait_stream->completed < op.wait_seq) run_until(op.wait_stream, op.wait_seq);
  } else if (op.communication) {
    const double timeout_ms = static_cast<double>(env_i64("MTNLG_EMU_COMM_TIMEOUT_S", 300)) * 1000.0;
    double last = now_ms();
    while (!op.step()) {
      if (progress_others()) {
        last = now_ms();
      } else {
        if (now_ms() - last > timeout_ms)
          fatal(fmt_str("%s on stream %d waited %.0f s for its peers", op.name.c_str(), s->id, timeout_ms / 1000));
        std::this_thread::yield();
      }
    }
  } else {
    op.step();
  }
  s->busy = false;
  pop_front(s);
}

void run_until(CUstream_st* s, uint64_t seq) {
  Access access;
  while (s->completed < seq) run_front(s);
}

void run_all() {
  Access access;
  for (bool again = true; again;) {
    again = false;
    for (auto it = g_streams.rbegin(); it != g_streams.rend(); ++it)
      if (!(*it)->q.empty()) {
        run_until(*it, (*it)->enqueued);
        again = true;
      }
  }
}

bool event_done(const CUevent_st* e) { return !e->s || e->s->completed >= e->seq; }

enum class Mem { device, pinned, pageable };
Mem classify(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (find_alloc(a)) return Mem::device;
  if (is_pinned_host_pointer(p)) return Mem::pinned;
  return Mem::pageable;
}
const char* mem_name(Mem m) { return m == Mem::device ? "device" : m == Mem::pinned ? "pinned host" : "pageable host"; }

cudaError_t memcpy_impl(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream, bool sync,
                        const char* api) {
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, fmt_str("%s: invalid stream", api));
  if (n == 0) return cudaSuccess;
  const Mem d = classify(dst), sr = classify(src);
  if (kind == cudaMemcpyDefault)
    kind = d == Mem::device ? (sr == Mem::device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                            : (sr == Mem::device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  const bool want_dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool want_src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((d == Mem::device) != want_dst_dev || (sr == Mem::device) != want_src_dev)
    return fail(cudaErrorInvalidValue, fmt_str("%s: copy kind %d does not match the pointers (destination is %s "
                                               "memory, source is %s memory)",
                                               api, static_cast<int>(kind), mem_name(d), mem_name(sr)));
  if (want_dst_dev) check_device_range(dst, n, api);
  if (want_src_dev) check_device_range(src, n, api);
  if (sync) run_all();  // cudaMemcpy: the legacy default stream waits for the device
  Op op;
  op.name = api;
  if (sr == Mem::pageable) {
    // Pageable sources are staged at the call, as the driver does: the caller may reuse them.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + n);
    op.step = [dst, staged] {
      std::memcpy(dst, staged->data(), staged->size());
      return true;
    };
  } else {
    op.step = [dst, src, n] {
      std::memmove(dst, src, n);
      return true;
    };
  }
  enqueue(s, std::move(op));
  // A copy into pageable host memory returns when it is done; so does cudaMemcpy.
  if (sync || (!want_dst_dev && d == Mem::pageable)) run_until(s, s->enqueued);
  return cudaSuccess;
}

cudaError_t memset_impl(void* dst, int value, size_t n, cudaStream_t stream, bool sync) {
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: invalid stream");
  if (n == 0) return cudaSuccess;
  check_device_range(dst, n, "cudaMemset");
  if (sync) run_all();
  enqueue(s, Op{"cudaMemset", [dst, value, n] {
                  std::memset(dst, value, n);
                  return true;
                }});
  if (sync) run_until(s, s->enqueued);
  return cudaSuccess;
}

}  // namespace

// ---- emu.hpp --------------------------------------------------------------------------

// Exits with status 134 (what an abort gives a shell) but without a core dump or a
// signal: the message is the diagnosis, and test drivers read it from a normal exit.
[[noreturn]] void fatal(const std::string& msg) {
  write_err(msg);
  _exit(134);
}

void enqueue(cudaStream_t stream, Op op) {
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) fatal(fmt_str("%s enqueued on a stream that does not exist (destroyed?)", op.name.c_str()));
  s->q.push_back(std::move(op));
  ++s->enqueued;
}

void force(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  CUstream_st* s = resolve(stream);
  run_until(s, s->enqueued);
}

void check_device_range(const void* p, size_t bytes, const char* what) {
  if (bytes == 0) return;
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const Alloc* al = find_alloc(a);
  if (!al) {
    const Alloc* m = find_mapping(a);
    fatal(fmt_str("%s: %p (%zu bytes) is not device memory%s", what, p, bytes,
                  m ? (" (just outside " + alloc_desc(*m) + ")").c_str() : " (a host pointer, or freed)"));
  }
  const uintptr_t end = reinterpret_cast<uintptr_t>(al->user) + al->bytes;
  if (a + bytes > end)
    fatal(fmt_str("%s: [%p, +%zu bytes) runs %llu bytes past the end of %s", what, p, bytes,
                  static_cast<unsigned long long>(a + bytes - end), alloc_desc(*al).c_str()));
}

bool is_device_pointer(const void* p) {
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  return find_alloc(reinterpret_cast<uintptr_t>(p)) != nullptr;
}

bool is_pinned_host_pointer(const void* p) {
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a < it->first + it->second;
}

void set_last_error(cudaError_t e) { tl_last_error = e; }

bool lt_candidates_fail() {
  const char* v = std::getenv("MTNLG_EMU_LT_FAIL");
  return v && *v && std::strcmp(v, "0") != 0 && std::strcmp(v, "epilogues") != 0;
}

bool lt_refuse_epilogues() {
  const char* v = std::getenv("MTNLG_EMU_LT_FAIL");
  return v && std::strcmp(v, "epilogues") == 0;
}

// ---- internal.hpp ---------------------------------------------------------------------

void register_stack_guard(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_guard_mu);
  if (g_guards.size() < g_guards.capacity())
    g_guards.push_back({static_cast<char*>(p), bytes, "past the end of its 256 KiB stack (stack overflow)"});
}
void register_smem_guard(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_guard_mu);
  if (g_guards.size() < g_guards.capacity())
    g_guards.push_back({static_cast<char*>(p), bytes, "dynamic shared memory out of bounds (past the launch's size)"});
}
void set_running_kernel(const char* name) { g_running_kernel = name; }
void set_thread_kernel(const char* name, const uint3* block) {
  ensure_altstack();
  tl_kernel = name;
  tl_kernel_block = block;
}

// ---- launches (cuda_emu.hpp) ------------------------------------------------------------

void launch(const LaunchSpec& spec, std::function<void()> body) {
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  CUstream_st* s = resolve(spec.stream);
  const dim3 b = spec.block, g = spec.grid;
  const uint64_t threads = static_cast<uint64_t>(b.x) * b.y * b.z;
  std::string why;
  if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0)
    why = "a grid or block dimension is 0";
  else if (b.x > 1024 || b.y > 1024 || b.z > 64)
    why = fmt_str("block (%u,%u,%u) exceeds sm_90's (1024,1024,64)", b.x, b.y, b.z);
  else if (threads > 1024)
    why = fmt_str("block of %llu threads exceeds sm_90's 1024", static_cast<unsigned long long>(threads));
  else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    why = fmt_str("grid (%u,%u,%u) exceeds sm_90's (2^31-1,65535,65535)", g.x, g.y, g.z);
  if (!why.empty()) {
    fail(cudaErrorInvalidConfiguration, fmt_str("launch of kernel %s refused: %s", spec.name, why.c_str()));
    return;
  }
  auto it = g_max_dyn_smem.find(spec.fn);
  const size_t limit = it == g_max_dyn_smem.end() ? 49152 : static_cast<size_t>(it->second);
  if (spec.dynamic_smem > limit) {
    fail(cudaErrorInvalidValue,
         fmt_str("launch of kernel %s refused: %zu bytes of dynamic shared memory exceed the kernel's limit of %zu "
                 "(raise it with cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize), up to 232448)",
                 spec.name, spec.dynamic_smem, limit));
    return;
  }
  if (!valid_stream(s)) {
    fail(cudaErrorInvalidResourceHandle, fmt_str("launch of kernel %s on a stream that does not exist", spec.name));
    return;
  }
  Op op;
  op.name = std::string("kernel ") + spec.name;
  op.step = [spec, body = std::move(body), ptrs = std::move(tl_launch_pointers)] {
    run_grid(spec, body);
    for (const void* p : ptrs) check_slack(spec.name, p);
    return true;
  };
  tl_launch_pointers.clear();
  s->q.push_back(std::move(op));
  ++s->enqueued;
}

void check_kernel_pointer(const char* kernel, int index, const void* p) {
  if (!p) return;
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  if (find_alloc(reinterpret_cast<uintptr_t>(p))) {
    tl_launch_pointers.push_back(p);
    return;
  }
  fatal(fmt_str("launch of kernel %s: pointer argument #%d (%p) is not device memory (a host pointer, freed memory, "
                "or past the end of an allocation)",
                kernel, index, p));
}

}  // namespace mtnlg::emu

// ---- the CUDA runtime API ----------------------------------------------------------------

using namespace mtnlg::emu;
using Lock = std::lock_guard<std::recursive_mutex>;

cudaError_t cudaMalloc(void** p, size_t bytes) {
  Lock lock(g_mu);
  install_handler();
  if (!p) return fail(cudaErrorInvalidValue, "cudaMalloc: null output pointer");
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (g_device_bytes + static_cast<int64_t>(bytes) > device_budget())
    return fail(cudaErrorMemoryAllocation,
                fmt_str("cudaMalloc: %zu bytes: out of the emulated device's %lld bytes (%lld in use; "
                        "MTNLG_EMU_MEMORY_BYTES sets the size)",
                        bytes, static_cast<long long>(device_budget()), static_cast<long long>(g_device_bytes)));
  const size_t pages = (bytes + page() - 1) / page();
  const size_t len = (pages + 1) * page();
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation, fmt_str("cudaMalloc: mmap of %zu bytes failed", len));
  Alloc a;
  a.map = static_cast<char*>(m);
  a.map_len = len;
  // The block starts 256-byte aligned (what the driver guarantees, and what vectorised
  // kernels and cuBLASLt's heuristic rely on) and ends as close to the guard page as
  // that allows: an overrun past the slack faults at once; a write into the slack is
  // found after the kernel (check_slack), a read of it yields NaN.
  char* end = a.map + pages * page();
  a.user = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(end - bytes) & ~uintptr_t{255});
  a.bytes = bytes;
  a.slack = static_cast<size_t>(end - (a.user + bytes));
  a.id = g_next_alloc_id++;
  std::memset(a.user, 0xFF, bytes + a.slack);  // NaN in every floating type
  mprotect(a.map + pages * page(), page(), PROT_NONE);
  g_allocs[reinterpret_cast<uintptr_t>(a.user)] = a;
  protect(a, g_device_rw);
  g_device_bytes += static_cast<int64_t>(bytes);
  *p = a.user;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  Lock lock(g_mu);
  if (!p) return cudaSuccess;
  auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocs.end())
    return fail(cudaErrorInvalidValue, fmt_str("cudaFree(%p): not the start of a live device allocation", p));
  run_all();  // cudaFree synchronises the device
  Alloc a = it->second;
  g_allocs.erase(it);
  g_device_bytes -= static_cast<int64_t>(a.bytes);
  // Keep the address range reserved and inaccessible for a while, so a use after free
  // faults with a message instead of reaching a later mapping.
  mprotect(a.map, a.map_len, PROT_NONE);
  g_freed.push_back(a);
  if (g_freed.size() > 4096) {
    munmap(g_freed.front().map, g_freed.front().map_len);
    g_freed.erase(g_freed.begin());
  }
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  Lock lock(g_mu);
  install_handler();
  if (!p) return fail(cudaErrorInvalidValue, "cudaHostAlloc: null output pointer");
  void* m = mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation, "cudaHostAlloc: out of host memory");
  g_pinned[reinterpret_cast<uintptr_t>(m)] = std::max<size_t>(bytes, 1);
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t cudaFreeHost(void* p) {
  Lock lock(g_mu);
  if (!p) return cudaSuccess;
  auto it = g_pinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_pinned.end()) return fail(cudaErrorInvalidValue, "cudaFreeHost: not a pinned allocation");
  run_all();
  munmap(p, it->second);
  g_pinned.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  Lock lock(g_mu);
  *total = static_cast<size_t>(device_budget());
  *free = static_cast<size_t>(device_budget() - g_device_bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  Lock lock(g_mu);
  return memcpy_impl(dst, src, n, kind, nullptr, true, "cudaMemcpy");
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  Lock lock(g_mu);
  return memcpy_impl(dst, src, n, kind, s, false, "cudaMemcpyAsync");
}
cudaError_t cudaMemset(void* dst, int v, size_t n) {
  Lock lock(g_mu);
  return memset_impl(dst, v, n, nullptr, true);
}
cudaError_t cudaMemsetAsync(void* dst, int v, size_t n, cudaStream_t s) {
  Lock lock(g_mu);
  return memset_impl(dst, v, n, s, false);
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  Lock lock(g_mu);
  resolve(nullptr);
  *s = new_stream(flags);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s) || s == g_null) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: invalid stream");
  run_until(s, s->enqueued);  // its work still completes
  g_streams.erase(std::find(g_streams.begin(), g_streams.end(), s));
  // Events recorded on it keep pointing here: keep the (empty) object.
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: invalid stream");
  run_until(s, s->enqueued);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  return s->completed >= s->enqueued ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int) {
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s) || !e) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: invalid handle");
  if (!e->s || event_done(e)) return cudaSuccess;
  Op op;
  op.name = "cudaStreamWaitEvent";
  op.step = [] { return true; };
  op.wait_stream = e->s;
  op.wait_seq = e->seq;
  s->q.push_back(std::move(op));
  ++s->enqueued;
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  enqueue(stream, Op{"cudaLaunchHostFunc", [fn, data] {
                       fn(data);
                       return true;
                     }});
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  Lock lock(g_mu);
  auto* ev = new CUevent_st;
  ev->flags = flags;
  *e = ev;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Lock lock(g_mu);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: null event");
  e->destroyed = true;  // kept: a queued record may still write its time
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!e || e->destroyed || !valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: invalid handle");
  const uint64_t gen = ++e->gen;
  e->queries = 0;
  s->q.push_back(Op{"cudaEventRecord", [e, gen] {
                      if (e->gen == gen) e->t_ms = now_ms();
                      return true;
                    }});
  ++s->enqueued;
  e->s = s;
  e->seq = s->enqueued;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  Lock lock(g_mu);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: null event");
  if (event_done(e)) return cudaSuccess;
  // Not forced by a query: a poller sees "not ready" for a while, then the work runs
  // (it would finish eventually on a GPU too).
  if (++e->queries < 64) return cudaErrorNotReady;
  run_until(e->s, e->seq);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  Lock lock(g_mu);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: null event");
  if (e->s) run_until(e->s, e->seq);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  Lock lock(g_mu);
  if (!a || !b || !ms) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null argument");
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  if (!a->s || !b->s) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
  if (!event_done(a) || !event_done(b)) return fail(cudaErrorNotReady, "cudaEventElapsedTime: an event is not done");
  *ms = static_cast<float>(b->t_ms - a->t_ms);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  Lock lock(g_mu);
  resolve(nullptr);
  run_all();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = tl_last_error;
  tl_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return tl_last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  // The emulator's message for the latest failure of this thread names what failed.
  if (e != cudaSuccess && e == tl_last_error && !tl_last_detail.empty()) return tl_last_detail.c_str();
  if (e != cudaSuccess && !tl_last_detail.empty()) {
    static thread_local std::string s;
    s = std::string(cudaGetErrorName(e)) + " (emulated; last detail: " + tl_last_detail + ")";
    return s.c_str();
  }
  return cudaGetErrorName(e);
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = static_cast<int>(env_i64("MTNLG_EMU_DEVICES", 1));
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  int n = 0;
  cudaGetDeviceCount(&n);
  if (d < 0 || d >= n) return fail(cudaErrorInvalidDevice, fmt_str("cudaSetDevice(%d): %d emulated devices", d, n));
  g_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = g_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  int n = 0;
  cudaGetDeviceCount(&n);
  if (d < 0 || d >= n) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: no such device");
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "mtnlg emulated GPU");
  p->totalGlobalMem = static_cast<size_t>(device_budget());
  p->sharedMemPerBlock = 49152;
  p->sharedMemPerBlockOptin = 232448;
  p->sharedMemPerMultiprocessor = 233472;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  p->l2CacheSize = 50 << 20;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int d) {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, d) != cudaSuccess) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = static_cast<int>(p.sharedMemPerBlockOptin); break;
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    default: return fail(cudaErrorInvalidValue, fmt_str("cudaDeviceGetAttribute: attribute %d is not emulated", attr));
  }
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  Lock lock(g_mu);
  *a = cudaPointerAttributes{};
  const Mem m = classify(p);
  a->type = m == Mem::device ? cudaMemoryTypeDevice : m == Mem::pinned ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
  a->device = g_device;
  if (m == Mem::device) a->devicePointer = const_cast<void*>(p);
  if (m != Mem::device) a->hostPointer = const_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* fn, cudaFuncAttribute attr, int value) {
  Lock lock(g_mu);
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > 232448)
      return fail(cudaErrorInvalidValue,
                  fmt_str("cudaFuncSetAttribute: %d bytes of dynamic shared memory exceed sm_90's 232448", value));
    g_max_dyn_smem[fn] = value;
    return cudaSuccess;
  }
  return cudaSuccess;  // other attributes (carveout, ...) are hints
}
