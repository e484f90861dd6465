// The emulated CUDA runtime: device memory, pinned host memory, streams, events, the
// scheduler that runs queued work when a synchronisation forces it, kernel launches
// (checked against sm_90's limits), stream capture into CUDA graphs and their replay,
// the fault handler, and the device queries. See emu.hpp for the model and its
// guarantees, docs/specs/cuda-emulation.md for what each call accepts and refuses.
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/switches.hpp"
#include "emulator/cuda_emu.hpp"
#include "emulator/emu.hpp"
#include "emulator/internal.hpp"

#undef warpSize  // the kernels' macro; cudaDeviceProp has a field of that name

namespace mtnlg::emu {
struct Capture;
}

struct CUstream_st {
  int id = 0;
  unsigned flags = 0;
  std::deque<mtnlg::emu::Op> q;
  uint64_t enqueued = 0;
  // Ops finished; atomic because an event query from another thread reads it without the
  // emulator's lock (see cudaEventQuery).
  std::atomic<uint64_t> completed{0};
  bool busy = false;                   // its front op is running (or waiting for a dependency)
  mtnlg::emu::Capture* cap = nullptr;  // the graph capture in progress on it (cudaStreamBeginCapture)
};

struct CUevent_st {
  CUstream_st* s = nullptr;  // stream of the latest record (nullptr: never recorded)
  uint64_t seq = 0;          // done when s->completed >= seq
  unsigned flags = 0;
  uint64_t gen = 0;
  double t_ms = 0;
  int queries = 0;
  bool destroyed = false;
  uint64_t cap_id = 0;       // the capture its latest record was captured into (0: an ordinary record)
  int cap_branch = 0;        // captured: the branch (stream) it was recorded on and how many of
  size_t cap_pos = 0;        // that branch's ops came before it
  std::thread::id recorder;  // the thread of the latest record: only it has a query run work
};

// Where a recorded op sits in its graph: the branch it was captured on (0 the stream
// that began the capture, 1.. the streams that joined it by waiting on an event recorded
// in it: fork/join) and, for a dependency between branches (a captured
// cudaStreamWaitEvent), the branch and the count of its ops waited for.
struct GraphNode {
  int branch = 0;
  int wait_branch = -1;  // >= 0: a dependency node (no work of its own)
  size_t wait_pos = 0;
};

// A graph made by stream capture: the ops recorded in the order they were issued, each
// with its node (one chain per branch, the branches joined by dependency nodes).
struct CUgraph_st {
  uint64_t id = 0;
  int stream_id = 0;  // the stream that captured it
  std::vector<mtnlg::emu::Op> ops;
  std::vector<GraphNode> nodes;  // one per op
  int branches = 1;
  bool capturing = true;   // a capture is still recording into it
  bool destroyed = false;  // kept (empty) after cudaGraphDestroy, so a stale handle is recognised
};

// An instantiated graph: its own copy of the graph's ops (the graph may be destroyed).
struct CUgraphExec_st {
  uint64_t id = 0;
  uint64_t graph_id = 0;
  int stream_id = 0;
  std::vector<mtnlg::emu::Op> ops;
  std::vector<GraphNode> nodes;
  std::vector<CUstream_st*> side;  // the streams its branches 1.. run on (made at the first launch)
  bool destroyed = false;
  CUstream_st* last_stream = nullptr;  // where the latest launch was queued, and up to which op
  uint64_t last_seq = 0;
};

namespace mtnlg::emu {

// Stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture).
struct Capture {
  uint64_t id = 0;
  CUstream_st* s = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalidated = false;
  std::string why;  // the refused call that invalidated it
  CUgraph_st* graph = nullptr;
  // The branches' streams (s first) and how many ops each has recorded; `joined[b]`: how
  // many of branch b's ops the origin has waited for (it must wait for all by the end).
  std::vector<CUstream_st*> streams;
  std::vector<size_t> count, joined;
  int branch_of(const CUstream_st* t) const {
    for (size_t b = 0; b < streams.size(); ++b)
      if (streams[b] == t) return static_cast<int>(b);
    return -1;
  }
  void record(CUstream_st* t, mtnlg::emu::Op&& op, GraphNode node) {
    node.branch = branch_of(t);
    graph->ops.push_back(std::move(op));
    graph->nodes.push_back(node);
    ++count[static_cast<size_t>(node.branch)];
  }
};

namespace {

using Clock = std::chrono::steady_clock;
const Clock::time_point g_t0 = Clock::now();
double now_ms() { return std::chrono::duration<double, std::milli>(Clock::now() - g_t0).count(); }

size_t page() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

struct Alloc {
  char* map = nullptr;  // the mapping: data pages, then one guard page
  size_t map_len = 0;
  char* user = nullptr;  // what cudaMalloc returned: 256-byte aligned, as the driver's
  size_t bytes = 0;
  size_t slack = 0;  // bytes between the block's end and the guard page (< 256), 0xFF
  uint64_t id = 0;
};
struct Range {
  char* p = nullptr;
  size_t bytes = 0;
  const char* what = "";
};

std::recursive_mutex g_mu;
std::map<uintptr_t, Alloc> g_allocs;   // by user start
std::vector<Alloc> g_freed;            // the latest freed allocations (for messages)
std::map<uintptr_t, size_t> g_pinned;  // cudaHostAlloc'd ranges
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

std::vector<Capture*> g_captures;  // the captures in progress (invalidated ones too, until ended)
uint64_t g_next_capture_id = 1;
uint64_t g_next_graph_id = 1;
std::set<const CUgraph_st*> g_graphs;           // every graph ever made (destroyed ones kept, empty)
std::set<const CUgraphExec_st*> g_graph_execs;  // every exec ever made (likewise)
int64_t g_graph_launches = 0;
int64_t g_graph_ops_replayed = 0;
thread_local cudaStreamCaptureMode tl_capture_mode =
    cudaStreamCaptureModeGlobal;  // cudaThreadExchangeStreamCaptureMode

thread_local cudaError_t tl_last_error = cudaSuccess;
thread_local std::string tl_last_detail;
thread_local const char* tl_kernel = nullptr;
thread_local const uint3* tl_kernel_block = nullptr;

int64_t device_budget() { return *::mtnlg::switches::integer(::mtnlg::Switch::emu_memory_bytes); }

cudaError_t fail(cudaError_t e, const std::string& detail) {
  tl_last_error = e;
  tl_last_detail = detail;
  if (::mtnlg::switches::on(::mtnlg::Switch::emu_verbose))
    std::fprintf(stderr, "mtnlg cuda-emulator: %s\n", detail.c_str());
  return e;
}

// ---- memory -----------------------------------------------------------------------

void protect(const Alloc& a, bool rw) { mprotect(a.map, a.map_len - page(), rw ? PROT_READ | PROT_WRITE : PROT_NONE); }

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
// collects them; launch() hands them to the op, which checks their slack afterwards and
// keeps them as the op's uses for a graph's replay).
thread_local std::vector<MemoryUse> tl_launch_pointers;
// The innermost UseCollector of this thread (emu.hpp).
thread_local UseCollector* tl_uses = nullptr;

// A kernel must not have written into the slack between its allocation's end and the
// guard page (still 0xFF).
void check_slack(const char* kernel, const void* p) {
  const Alloc* a = find_alloc(reinterpret_cast<uintptr_t>(p));
  if (!a) return;  // freed by a later call of the same drain: nothing to check
  const auto* s = reinterpret_cast<const unsigned char*>(a->user + a->bytes);
  for (size_t i = 0; i < a->slack; ++i)
    if (s[i] != 0xFF)
      fatal(
          fmt_str("kernel %s wrote out of bounds: %zu bytes past the end of %s (found after the kernel, in the "
                  "alignment slack before the guard page)",
                  kernel, i, alloc_desc(*a).c_str()));
}

std::string kernel_desc() {
  if (!tl_kernel) return "host code";
  std::string s = fmt_str("kernel %s", tl_kernel);
  if (tl_kernel_block) s += fmt_str(" (block (%u,%u,%u))", tl_kernel_block->x, tl_kernel_block->y, tl_kernel_block->z);
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
      msg = fmt_str(
          "%s %s device memory at %p (offset %llu of %s) outside a stream's work: copy it to the host "
          "first (cudaMemcpy, Tensor::to(Device::cpu))",
          kernel_desc().c_str(), rw, si->si_addr, static_cast<unsigned long long>(a - u), alloc_desc(*al).c_str());
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

// ---- stream capture: who may do what while a capture is in progress --------------------

// The CUDA runtime's own message for the capture-related codes (cudaGetErrorString).
const char* capture_error_text(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    default: return nullptr;
  }
}

const char* mode_name(cudaStreamCaptureMode m) {
  switch (m) {
    case cudaStreamCaptureModeGlobal: return "global";
    case cudaStreamCaptureModeThreadLocal: return "thread-local";
    case cudaStreamCaptureModeRelaxed: return "relaxed";
  }
  return "?";
}

std::string capture_desc(const Capture* c) {
  return fmt_str("the capture on stream %d (graph #%llu, mode %s)", c->s->id,
                 static_cast<unsigned long long>(c->graph->id), mode_name(c->mode));
}

Capture* open_capture(uint64_t id) {
  for (Capture* c : g_captures)
    if (c->id == id) return c;
  return nullptr;
}

// The captures that forbid this thread's "potentially unsafe" calls (cudaMalloc, ...), by
// the rules of cudaThreadExchangeStreamCaptureMode: in the thread's mode global, its own
// captures not begun relaxed and other threads' captures begun global; in thread-local,
// its own captures not begun relaxed; in relaxed, none.
std::vector<Capture*> unsafe_blockers() {
  std::vector<Capture*> out;
  const std::thread::id me = std::this_thread::get_id();
  for (Capture* c : g_captures) {
    const bool mine = c->thread == me;
    bool blocks = false;
    if (tl_capture_mode == cudaStreamCaptureModeGlobal)
      blocks = (mine && c->mode != cudaStreamCaptureModeRelaxed) || (!mine && c->mode == cudaStreamCaptureModeGlobal);
    else if (tl_capture_mode == cudaStreamCaptureModeThreadLocal)
      blocks = mine && c->mode != cudaStreamCaptureModeRelaxed;
    if (blocks) out.push_back(c);
  }
  return out;
}

// The captures on blocking streams (created without cudaStreamNonBlocking): while one is
// in progress, the legacy default stream may not be used (it would depend on the capture).
std::vector<Capture*> blocking_captures() {
  std::vector<Capture*> out;
  for (Capture* c : g_captures)
    if (!(c->s->flags & cudaStreamNonBlocking)) out.push_back(c);
  return out;
}

// Refuses a call that is invalid during the captures `caps`: invalidates each (so that
// cudaStreamEndCapture answers cudaErrorStreamCaptureInvalidated and no graph) and sets
// the last error.
cudaError_t refuse(cudaError_t e, const std::vector<Capture*>& caps, const std::string& what) {
  std::string d = fmt_str("%s: %s", capture_error_text(e), what.c_str());
  for (Capture* c : caps) {
    d += "; " + capture_desc(c) + (c->invalidated ? " was already invalidated" : " is invalidated");
    if (!c->invalidated) {
      c->invalidated = true;
      c->why = what;
    }
  }
  return fail(e, d);
}

cudaError_t invalidated_capture(const Capture* c, const char* what) {
  return fail(cudaErrorStreamCaptureInvalidated,
              fmt_str("%s: %s on stream %d, whose capture (graph #%llu) was invalidated by an earlier call: %s",
                      capture_error_text(cudaErrorStreamCaptureInvalidated), what, c->s->id,
                      static_cast<unsigned long long>(c->graph->id), c->why.c_str()));
}

// Queues `op` on `s`, or records it while `s` captures. The one path every queued op
// takes (kernels, copies, host functions, cuBLAS, cuDNN, NCCL).
cudaError_t submit(CUstream_st* s, Op&& op) {
  if (Capture* c = s->cap) {
    if (c->invalidated) return invalidated_capture(c, op.name.c_str());
    c->record(s, std::move(op), {});
    return cudaSuccess;
  }
  if (s == g_null) {
    const std::vector<Capture*> b = blocking_captures();
    if (!b.empty())
      return refuse(cudaErrorStreamCaptureImplicit, b,
                    fmt_str("%s on the legacy default stream while a blocking stream captures", op.name.c_str()));
  }
  if (op.arm) op.step = op.arm();
  s->q.push_back(std::move(op));
  ++s->enqueued;
  return cudaSuccess;
}

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
    fatal(
        fmt_str("stream %d waits (through cudaStreamWaitEvent) for work queued after its own current op: a "
                "dependency cycle, which would hang a GPU",
                s->id));
  Op& op = s->q.front();
  s->busy = true;
  if (op.wait_stream) {
    if (op.wait_stream->completed < op.wait_seq) run_until(op.wait_stream, op.wait_seq);
  } else if (op.communication) {
    const double timeout_ms =
        static_cast<double>(*::mtnlg::switches::integer(::mtnlg::Switch::emu_comm_timeout_s)) * 1000.0;
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

// cudaMemcpy and cudaMemset: work on the legacy default stream that the host waits for.
// Refused while a blocking stream captures (the legacy stream would depend on it), and,
// as potentially unsafe calls, where this thread's capture mode forbids them.
cudaError_t refuse_synchronous(const char* api) {
  if (std::vector<Capture*> b = blocking_captures(); !b.empty())
    return refuse(cudaErrorStreamCaptureImplicit, b,
                  fmt_str("%s (synchronous, on the legacy default stream) while a blocking stream captures", api));
  if (std::vector<Capture*> b = unsafe_blockers(); !b.empty())
    return refuse(cudaErrorStreamCaptureUnsupported, b,
                  fmt_str("%s (synchronous: the host waits for it, and no graph records it) during a capture", api));
  return cudaSuccess;
}

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
  UseCollector uses;
  if (want_dst_dev) check_device_range(dst, n, api);
  if (want_src_dev) check_device_range(src, n, api);
  if (sync) {
    if (cudaError_t e = refuse_synchronous(api); e != cudaSuccess) return e;
  } else if (s->cap && (d == Mem::pageable || sr == Mem::pageable)) {
    // A graph's copy node reads and writes its host side when the graph runs: only pinned
    // memory stays valid (and unstaged) for that.
    return refuse(cudaErrorStreamCaptureUnsupported, {s->cap},
                  fmt_str("%s of %zu bytes %s pageable host memory (%p) on stream %d, which captures: a graph can "
                          "copy only device or pinned (cudaHostAlloc) memory",
                          api, n, d == Mem::pageable ? "into" : "from", d == Mem::pageable ? dst : src, s->id));
  }
  if (sync) run_all();  // cudaMemcpy: the legacy default stream waits for the device
  Op op;
  op.name = api;
  if (d == Mem::pinned) op.uses.push_back({dst, n, 0, true, std::string(api) + ": pinned destination"});
  if (sr == Mem::pinned) op.uses.push_back({src, n, 0, true, std::string(api) + ": pinned source"});
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
  for (MemoryUse& u : uses.take()) op.uses.push_back(std::move(u));
  if (cudaError_t e = submit(s, std::move(op)); e != cudaSuccess) return e;
  // A copy into pageable host memory returns when it is done; so does cudaMemcpy.
  if (sync || (!want_dst_dev && d == Mem::pageable)) run_until(s, s->enqueued);
  return cudaSuccess;
}

cudaError_t memset_impl(void* dst, int value, size_t n, cudaStream_t stream, bool sync) {
  const char* api = sync ? "cudaMemset" : "cudaMemsetAsync";
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, fmt_str("%s: invalid stream", api));
  if (n == 0) return cudaSuccess;
  UseCollector uses;
  check_device_range(dst, n, api);
  if (sync) {
    if (cudaError_t e = refuse_synchronous(api); e != cudaSuccess) return e;
    run_all();
  }
  Op op{api, [dst, value, n] {
          std::memset(dst, value, n);
          return true;
        }};
  op.uses = uses.take();
  if (cudaError_t e = submit(s, std::move(op)); e != cudaSuccess) return e;
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
  if (op.uses.empty() && tl_uses) op.uses = tl_uses->take();
  submit(s, std::move(op));  // a refusal sets the last error (the caller's API returns void or its own status)
}

void force(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (s->cap) fatal(fmt_str("force: stream %d is capturing a graph: its recorded work cannot run", s->id));
  run_until(s, s->enqueued);
}

UseCollector::UseCollector() : outer_(tl_uses) { tl_uses = this; }
UseCollector::~UseCollector() { tl_uses = outer_; }
std::vector<MemoryUse> UseCollector::take() { return std::exchange(uses_, {}); }

int64_t graph_launches() {
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  return g_graph_launches;
}
int64_t graph_ops_replayed() {
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  return g_graph_ops_replayed;
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
  if (tl_uses && g_depth == 0) tl_uses->add({p, bytes, al->id, false, what});  // not an op's own check as it runs
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

bool lt_candidates_fail() { return ::mtnlg::switches::text(::mtnlg::Switch::emu_lt_fail) == "1"; }

bool lt_refuse_epilogues() { return ::mtnlg::switches::text(::mtnlg::Switch::emu_lt_fail) == "epilogues"; }

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
  // This launch's pointer arguments (check_kernel_pointer); taken here, so a refused
  // launch leaves none behind for the next.
  std::vector<MemoryUse> ptr_uses = std::exchange(tl_launch_pointers, {});
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
  std::vector<const void*> ptrs;
  for (const MemoryUse& u : ptr_uses) ptrs.push_back(u.p);
  op.step = [spec, body = std::move(body), ptrs = std::move(ptrs)] {
    run_grid(spec, body);
    for (const void* p : ptrs) check_slack(spec.name, p);
    return true;
  };
  op.uses = std::move(ptr_uses);
  submit(s, std::move(op));  // a refusal (capture rules) sets the error cudaGetLastError returns
}

void check_kernel_pointer(const char* kernel, int index, const void* p) {
  if (!p) return;
  std::lock_guard<std::recursive_mutex> lock(g_mu);
  if (const Alloc* a = find_alloc(reinterpret_cast<uintptr_t>(p))) {
    tl_launch_pointers.push_back({p, 0, a->id, false, fmt_str("kernel %s: pointer argument #%d", kernel, index)});
    return;
  }
  fatal(
      fmt_str("launch of kernel %s: pointer argument #%d (%p) is not device memory (a host pointer, freed memory, "
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
  // Potentially unsafe during a capture: no graph records the allocation.
  if (std::vector<Capture*> b = unsafe_blockers(); !b.empty())
    return refuse(cudaErrorStreamCaptureUnsupported, b, fmt_str("cudaMalloc(%zu bytes) during a capture", bytes));
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
  // cudaFree synchronises the device, which includes the capturing streams: refused in
  // every capture mode.
  if (!g_captures.empty())
    return refuse(cudaErrorStreamCaptureUnsupported, g_captures,
                  fmt_str("cudaFree(%p) during a capture (it synchronises the device)", p));
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

static cudaError_t host_alloc(void** p, size_t bytes, const char* api) {
  Lock lock(g_mu);
  install_handler();
  if (!p) return fail(cudaErrorInvalidValue, fmt_str("%s: null output pointer", api));
  if (std::vector<Capture*> b = unsafe_blockers(); !b.empty())
    return refuse(cudaErrorStreamCaptureUnsupported, b, fmt_str("%s(%zu bytes) during a capture", api, bytes));
  void* m = mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation, "cudaHostAlloc: out of host memory");
  g_pinned[reinterpret_cast<uintptr_t>(m)] = std::max<size_t>(bytes, 1);
  *p = m;
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return host_alloc(p, bytes, "cudaHostAlloc"); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return host_alloc(p, bytes, "cudaMallocHost"); }
cudaError_t cudaFreeHost(void* p) {
  Lock lock(g_mu);
  if (!p) return cudaSuccess;
  if (!g_captures.empty())
    return refuse(cudaErrorStreamCaptureUnsupported, g_captures,
                  fmt_str("cudaFreeHost(%p) during a capture (it synchronises the device)", p));
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
  if (s->cap)
    return refuse(cudaErrorStreamCaptureUnsupported, {s->cap},
                  fmt_str("cudaStreamDestroy of stream %d, which captures (end the capture first)", s->id));
  run_until(s, s->enqueued);  // its work still completes
  g_streams.erase(std::find(g_streams.begin(), g_streams.end(), s));
  // Events recorded on it keep pointing here: keep the (empty) object.
  return cudaSuccess;
}
// cudaStreamSynchronize and cudaStreamQuery: what a capturing stream holds is not work
// scheduled to run, so neither may ask about it; nor about the legacy stream, which
// encompasses the blocking streams, while one of those captures.
static cudaError_t refuse_stream_wait(CUstream_st* s, const char* api) {
  if (s->cap)
    return refuse(cudaErrorStreamCaptureUnsupported, {s->cap}, fmt_str("%s of stream %d, which captures", api, s->id));
  if (s == g_null)
    if (std::vector<Capture*> b = blocking_captures(); !b.empty())
      return refuse(cudaErrorStreamCaptureImplicit, b,
                    fmt_str("%s of the legacy default stream while a blocking stream captures", api));
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: invalid stream");
  if (cudaError_t e = refuse_stream_wait(s, "cudaStreamSynchronize"); e != cudaSuccess) return e;
  run_until(s, s->enqueued);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery: invalid stream");
  if (cudaError_t e = refuse_stream_wait(s, "cudaStreamQuery"); e != cudaSuccess) return e;
  return s->completed >= s->enqueued ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int flags) {
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s) || !e) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: invalid handle");
  if (e->cap_id) {  // the event's latest record was captured
    if (Capture* c = open_capture(e->cap_id)) {
      if (c->invalidated) return invalidated_capture(c, "cudaStreamWaitEvent");
      if (s->cap && s->cap != c)
        return refuse(
            cudaErrorStreamCaptureMerge, {c, s->cap},
            fmt_str("cudaStreamWaitEvent: stream %d, which captures, waits on an event of another capture", s->id));
      if (!s->cap) {  // fork: the stream joins the capture as a new branch
        if (s == g_null)
          return refuse(cudaErrorStreamCaptureImplicit, {c},
                        "cudaStreamWaitEvent: the legacy default stream cannot join a capture");
        s->cap = c;
        c->streams.push_back(s);
        c->count.push_back(0);
        c->joined.push_back(0);
        ++c->graph->branches;
      }
      const int b = c->branch_of(s);
      if (b == e->cap_branch) return cudaSuccess;  // stream order holds
      if (b == 0)
        c->joined[static_cast<size_t>(e->cap_branch)] =
            std::max(c->joined[static_cast<size_t>(e->cap_branch)], e->cap_pos);
      Op dep;
      dep.name = "cudaStreamWaitEvent (captured dependency)";
      dep.step = [] { return true; };
      c->record(s, std::move(dep), GraphNode{0, e->cap_branch, e->cap_pos});
      return cudaSuccess;
    }
    return fail(cudaErrorInvalidValue,
                fmt_str("cudaStreamWaitEvent: stream %d waits on an event whose latest record was captured into a "
                        "graph (the capture has ended): the record is no point of any stream's work",
                        s->id));
  }
  if (Capture* c = s->cap) {
    if (c->invalidated) return invalidated_capture(c, "cudaStreamWaitEvent");
    if (!e->s) return cudaSuccess;  // never recorded: nothing to wait for
    if (flags & cudaEventWaitExternal)
      fatal(
          fmt_str("cudaStreamWaitEvent(cudaEventWaitExternal) on stream %d, which captures: an external event "
                  "wait node is not modelled by the emulator",
                  s->id));
    return refuse(cudaErrorStreamCaptureIsolation, {c},
                  fmt_str("cudaStreamWaitEvent: stream %d, which captures, waits on an event recorded outside the "
                          "capture (on stream %d)",
                          s->id, e->s->id));
  }
  if (s == g_null)
    if (std::vector<Capture*> b = blocking_captures(); !b.empty())
      return refuse(cudaErrorStreamCaptureImplicit, b,
                    "cudaStreamWaitEvent on the legacy default stream while a blocking stream captures");
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
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaLaunchHostFunc: invalid stream");
  return submit(s, Op{"cudaLaunchHostFunc", [fn, data] {
                        fn(data);
                        return true;
                      }});
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
  if (!e || e->destroyed || !valid_stream(s))
    return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: invalid handle");
  if (Capture* c = s->cap) {
    // Captured: the event now stands for a point in the graph (for waits in the same
    // capture), not for a point of any stream's work; it takes no time.
    if (c->invalidated) return invalidated_capture(c, "cudaEventRecord");
    ++e->gen;
    e->queries = 0;
    e->cap_id = c->id;
    e->cap_branch = c->branch_of(s);
    e->cap_pos = c->count[static_cast<size_t>(e->cap_branch)];
    e->s = nullptr;
    e->seq = 0;
    return cudaSuccess;
  }
  if (s == g_null)
    if (std::vector<Capture*> b = blocking_captures(); !b.empty())
      return refuse(cudaErrorStreamCaptureImplicit, b,
                    "cudaEventRecord on the legacy default stream while a blocking stream captures");
  const uint64_t gen = ++e->gen;
  e->queries = 0;
  e->cap_id = 0;
  e->recorder = std::this_thread::get_id();
  s->q.push_back(Op{"cudaEventRecord", [e, gen] {
                      if (e->gen == gen) e->t_ms = now_ms();
                      return true;
                    }});
  ++s->enqueued;
  e->s = s;
  e->seq = s->enqueued;
  return cudaSuccess;
}
// cudaEventQuery, cudaEventSynchronize, cudaEventElapsedTime on an event whose latest
// record was captured: cudaErrorCapturedEvent while the capture is open (invalidating
// it), cudaErrorInvalidValue once it has ended (the record became part of a graph).
// On an ordinary event, a query or a wait is a potentially unsafe call during a capture.
static cudaError_t refuse_event_use(cudaEvent_t e, const char* api, bool unsafe_call) {
  if (e->cap_id) {
    if (Capture* c = open_capture(e->cap_id))
      return refuse(cudaErrorCapturedEvent, {c},
                    fmt_str("%s on an event recorded in %s", api, capture_desc(c).c_str()));
    return fail(cudaErrorInvalidValue,
                fmt_str("%s: the event's latest record was captured into a graph (the capture has ended): it marks "
                        "no point of any stream's work; record it outside a capture (or with cudaEventRecordExternal, "
                        "not modelled)",
                        api));
  }
  if (unsafe_call)
    if (std::vector<Capture*> b = unsafe_blockers(); !b.empty())
      return refuse(cudaErrorStreamCaptureUnsupported, b, fmt_str("%s during a capture", api));
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: null event");
  std::unique_lock<std::recursive_mutex> lock(g_mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    // Another thread runs queued work (or waits in it for an NCCL peer): a query never
    // waits for the emulator's lock, as a GPU's never waits for the device. It answers
    // from the event's stream progress (the record itself happened before this query on
    // the caller's side: a watchdog polls events it was handed after their record).
    if (e->cap_id) return cudaErrorNotReady;
    return event_done(e) ? cudaSuccess : cudaErrorNotReady;
  }
  if (cudaError_t r = refuse_event_use(e, "cudaEventQuery", true); r != cudaSuccess) return r;
  if (event_done(e)) return cudaSuccess;
  // Not forced by a query: a poller sees "not ready" for a while, then the work runs
  // (it would finish eventually on a GPU too). Only on the thread that recorded the
  // event: a watchdog thread polling another thread's work never runs it (that work may
  // hold NCCL calls, which go to MPI from the training thread only).
  if (std::this_thread::get_id() != e->recorder) return cudaErrorNotReady;
  if (++e->queries < 64) return cudaErrorNotReady;
  run_until(e->s, e->seq);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  Lock lock(g_mu);
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: null event");
  if (cudaError_t r = refuse_event_use(e, "cudaEventSynchronize", true); r != cudaSuccess) return r;
  if (e->s) run_until(e->s, e->seq);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  Lock lock(g_mu);
  if (!a || !b || !ms) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null argument");
  for (cudaEvent_t e : {a, b})
    if (cudaError_t r = refuse_event_use(e, "cudaEventElapsedTime", false); r != cudaSuccess) return r;
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  if (!a->s || !b->s) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
  if (!event_done(a) || !event_done(b)) return fail(cudaErrorNotReady, "cudaEventElapsedTime: an event is not done");
  *ms = static_cast<float>(b->t_ms - a->t_ms);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  Lock lock(g_mu);
  resolve(nullptr);
  // The device encompasses every capturing stream: refused in every capture mode.
  if (!g_captures.empty())
    return refuse(cudaErrorStreamCaptureUnsupported, g_captures, "cudaDeviceSynchronize during a capture");
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
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    default: return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  // The emulator's message for the latest failure of this thread names what failed.
  if (e != cudaSuccess && e == tl_last_error && !tl_last_detail.empty()) return tl_last_detail.c_str();
  if (const char* text = capture_error_text(e)) return text;  // the runtime's own words
  if (e != cudaSuccess && !tl_last_detail.empty()) {
    static thread_local std::string s;
    s = std::string(cudaGetErrorName(e)) + " (emulated; last detail: " + tl_last_detail + ")";
    return s.c_str();
  }
  return cudaGetErrorName(e);
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = static_cast<int>(*::mtnlg::switches::integer(::mtnlg::Switch::emu_devices));
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
  a->type = m == Mem::device   ? cudaMemoryTypeDevice
            : m == Mem::pinned ? cudaMemoryTypeHost
                               : cudaMemoryTypeUnregistered;
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

// ---- stream capture and CUDA graphs -------------------------------------------------------
//
// One stream captures into one graph (a chain of the recorded ops); cudaGraphLaunch
// queues a copy of each op, in order, on the stream it is given. What is refused, and
// with which code, is listed in docs/specs/cuda-emulation.md ("Stream capture and graphs").

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (!mode) return fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode: null mode");
  if (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
      *mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue,
                fmt_str("cudaThreadExchangeStreamCaptureMode: mode %d", static_cast<int>(*mode)));
  std::swap(*mode, tl_capture_mode);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  Lock lock(g_mu);
  if (stream == cudaStreamPerThread)
    fatal(
        "cudaStreamBeginCapture on cudaStreamPerThread: the emulator runs the per-thread default stream as the "
        "legacy one, so its capture is not modelled; capture on a stream of cudaStreamCreate");
  CUstream_st* s = resolve(stream);
  if (s == g_null)
    return fail(cudaErrorStreamCaptureUnsupported,
                fmt_str("%s: cudaStreamBeginCapture on the legacy default stream (a graph cannot be captured there)",
                        capture_error_text(cudaErrorStreamCaptureUnsupported)));
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture: invalid stream");
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue, fmt_str("cudaStreamBeginCapture: capture mode %d", static_cast<int>(mode)));
  if (s->cap)
    return fail(cudaErrorIllegalState,
                fmt_str("%s: cudaStreamBeginCapture on stream %d, which is already capturing (%s)",
                        capture_error_text(cudaErrorIllegalState), s->id, capture_desc(s->cap).c_str()));
  auto* g = new CUgraph_st;
  g->id = g_next_graph_id++;
  g->stream_id = s->id;
  g_graphs.insert(g);
  auto* c = new Capture;
  c->id = g_next_capture_id++;
  c->s = s;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->graph = g;
  c->streams = {s};
  c->count = {0};
  c->joined = {0};
  s->cap = c;
  g_captures.push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  Lock lock(g_mu);
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamEndCapture: invalid stream");
  if (!pGraph) return fail(cudaErrorInvalidValue, "cudaStreamEndCapture: null graph pointer");
  Capture* c = s->cap;
  if (!c)
    return fail(cudaErrorIllegalState, fmt_str("%s: cudaStreamEndCapture on stream %d, which is not capturing",
                                               capture_error_text(cudaErrorIllegalState), s->id));
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread,
                fmt_str("%s: cudaStreamEndCapture of %s from another thread than the one that began it",
                        capture_error_text(cudaErrorStreamCaptureWrongThread), capture_desc(c).c_str()));
  if (c->s != s)
    return fail(cudaErrorStreamCaptureUnmatched,
                fmt_str("%s: cudaStreamEndCapture on stream %d, which joined %s (end it on the stream that began it)",
                        capture_error_text(cudaErrorStreamCaptureUnmatched), s->id, capture_desc(c).c_str()));
  for (CUstream_st* t : c->streams) t->cap = nullptr;
  g_captures.erase(std::find(g_captures.begin(), g_captures.end(), c));
  CUgraph_st* g = c->graph;
  g->capturing = false;
  const std::unique_ptr<Capture> ended(c);
  auto no_graph = [&](cudaError_t code, const std::string& why) {
    *pGraph = nullptr;
    g->destroyed = true;
    g->ops.clear();
    g->nodes.clear();
    return fail(code, why);
  };
  // Every stream that joined must have been joined back: the origin waited for all its ops.
  for (size_t b = 1; b < c->streams.size() && !c->invalidated; ++b)
    if (c->joined[b] < c->count[b]) {
      c->invalidated = true;
      c->why = fmt_str(
          "stream %d joined the capture and was not joined back (the capturing stream waited for %zu "
          "of its %zu ops: record an event on it and wait for that on stream %d)",
          c->streams[b]->id, c->joined[b], c->count[b], s->id);
      return no_graph(cudaErrorStreamCaptureUnjoined,
                      fmt_str("%s: cudaStreamEndCapture on stream %d: %s",
                              capture_error_text(cudaErrorStreamCaptureUnjoined), s->id, c->why.c_str()));
    }
  // Fault injection: a capture some library invalidated behind mtnlg's back (what a real
  // cuDNN or cuBLAS that synchronised inside the captured work would leave).
  if (::mtnlg::switches::on(::mtnlg::Switch::emu_capture_fail) && !c->invalidated) {
    c->invalidated = true;
    c->why = "MTNLG_EMU_CAPTURE_FAIL (fault injection)";
  }
  if (c->invalidated) {
    return no_graph(
        cudaErrorStreamCaptureInvalidated,
        fmt_str("%s: cudaStreamEndCapture on stream %d returns no graph: the capture was invalidated by: %s",
                capture_error_text(cudaErrorStreamCaptureInvalidated), s->id, c->why.c_str()));
  }
  *pGraph = g;
  return cudaSuccess;
}

// cudaStreamIsCapturing and cudaStreamGetCaptureInfo: asking about the legacy stream
// while a blocking stream captures is refused (without invalidating the capture).
static cudaError_t capture_status(cudaStream_t stream, cudaStreamCaptureStatus* st, const char* api) {
  if (!st) return fail(cudaErrorInvalidValue, fmt_str("%s: null status pointer", api));
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, fmt_str("%s: invalid stream", api));
  if (s == g_null && !blocking_captures().empty())
    return fail(cudaErrorStreamCaptureImplicit,
                fmt_str("%s: %s of the legacy default stream while a blocking stream captures",
                        capture_error_text(cudaErrorStreamCaptureImplicit), api));
  *st = !s->cap               ? cudaStreamCaptureStatusNone
        : s->cap->invalidated ? cudaStreamCaptureStatusInvalidated
                              : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* st) {
  Lock lock(g_mu);
  return capture_status(stream, st, "cudaStreamIsCapturing");
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* st, unsigned long long* id,
                                     cudaGraph_t* graph, const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                     size_t* num_deps) {
  Lock lock(g_mu);
  if (edges && !deps)
    return fail(cudaErrorInvalidValue, "cudaStreamGetCaptureInfo: edge data asked for without the dependencies");
  if (cudaError_t e = capture_status(stream, st, "cudaStreamGetCaptureInfo"); e != cudaSuccess) return e;
  if (*st != cudaStreamCaptureStatusActive) return cudaSuccess;  // the other outputs are valid only while active
  const Capture* c = resolve(stream)->cap;
  if (deps || edges)
    fatal(
        "cudaStreamGetCaptureInfo: the capture's node handles (dependencies_out, edgeData_out) are not modelled by "
        "the emulator (its graphs have no nodes to edit)");
  if (id) *id = c->id;
  if (graph) *graph = c->graph;
  if (num_deps) *num_deps = c->graph->ops.empty() ? 0 : 1;  // a chain: the next op depends on the last one
  return cudaSuccess;
}

// A graph or exec handle: null is an invalid value; one the emulator never made is a
// dangling or corrupt pointer (fatal: on a GPU, undefined behaviour).
static bool known_graph(const CUgraph_st* g, const char* api) {
  if (!g) return false;
  if (!g_graphs.count(g))
    fatal(fmt_str("%s: %p is no graph this process made (a dangling or corrupt handle)", api,
                  static_cast<const void*>(g)));
  return true;
}
static bool known_exec(const CUgraphExec_st* x, const char* api) {
  if (!x) return false;
  if (!g_graph_execs.count(x))
    fatal(fmt_str("%s: %p is no executable graph this process made (a dangling or corrupt handle)", api,
                  static_cast<const void*>(x)));
  return true;
}

static cudaError_t instantiate(cudaGraphExec_t* out, cudaGraph_t g, unsigned long long flags, const char* api) {
  Lock lock(g_mu);
  if (!out) return fail(cudaErrorInvalidValue, fmt_str("%s: null output pointer", api));
  if (!known_graph(g, api)) return fail(cudaErrorInvalidValue, fmt_str("%s: null graph", api));
  if (g->destroyed)
    return fail(cudaErrorInvalidResourceHandle,
                fmt_str("%s: graph #%llu was destroyed", api, static_cast<unsigned long long>(g->id)));
  if (flags & cudaGraphInstantiateFlagDeviceLaunch)
    fatal(
        fmt_str("%s: cudaGraphInstantiateFlagDeviceLaunch (a graph launched from the device) is not modelled by the "
                "emulator",
                api));
  const unsigned long long known = cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUseNodePriority;
  if (flags & ~known)  // cudaGraphInstantiateFlagUpload belongs to cudaGraphInstantiateWithParams
    return fail(cudaErrorInvalidValue, fmt_str("%s: flags 0x%llx", api, flags));
  auto* x = new CUgraphExec_st;
  x->id = g_graph_execs.size() + 1;
  x->graph_id = g->id;
  x->stream_id = g->stream_id;
  x->ops = g->ops;  // the exec's own copy: the graph may be destroyed or captured into further
  x->nodes = g->nodes;
  x->side.assign(static_cast<size_t>(g->branches - 1), nullptr);
  g_graph_execs.insert(x);
  *out = x;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* out, cudaGraph_t g, unsigned long long flags) {
  return instantiate(out, g, flags, "cudaGraphInstantiate");
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* out, cudaGraph_t g, unsigned long long flags) {
  return instantiate(out, g, flags, "cudaGraphInstantiateWithFlags");
}

static std::string exec_desc(const CUgraphExec_st* x) {
  return fmt_str("graph #%llu (exec #%llu, captured on stream %d, %zu ops)",
                 static_cast<unsigned long long>(x->graph_id), static_cast<unsigned long long>(x->id), x->stream_id,
                 x->ops.size());
}

// A replayed op must find its memory where the capture found it: the same device
// allocation (not a later one at the same address), the same pinned buffer.
static void check_replay_use(const CUgraphExec_st* x, size_t i, const Op& op, const MemoryUse& u) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(u.p);
  const std::string where = fmt_str("cudaGraphLaunch of %s: op %zu (%s), %s, at %p", exec_desc(x).c_str(), i,
                                    op.name.c_str(), u.what.c_str(), u.p);
  if (u.pinned) {
    if (is_pinned_host_pointer(u.p) && is_pinned_host_pointer(static_cast<const char*>(u.p) + u.bytes - 1)) return;
    fatal(where +
          fmt_str(": the pinned host memory (%zu bytes) it copies was freed with cudaFreeHost after the capture",
                  u.bytes));
  }
  const Alloc* now = find_alloc(a);
  if (now && now->id == u.alloc && (u.bytes == 0 || a + u.bytes <= reinterpret_cast<uintptr_t>(now->user) + now->bytes))
    return;
  std::string was = fmt_str("device allocation #%llu", static_cast<unsigned long long>(u.alloc));
  for (auto it = g_freed.rbegin(); it != g_freed.rend(); ++it)
    if (it->id == u.alloc) {
      was = alloc_desc(*it);
      break;
    }
  fatal(where + ": " + was + " was freed with cudaFree after the capture, so the replay would use freed memory" +
        (now ? " (the address now lies in " + alloc_desc(*now) + ")" : std::string()));
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t stream) {
  Lock lock(g_mu);
  if (!known_exec(x, "cudaGraphLaunch")) return fail(cudaErrorInvalidValue, "cudaGraphLaunch: null executable graph");
  if (x->destroyed)
    return fail(cudaErrorInvalidResourceHandle,
                fmt_str("cudaGraphLaunch: executable graph #%llu was destroyed (cudaGraphExecDestroy)",
                        static_cast<unsigned long long>(x->id)));
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: invalid stream");
  if (s->cap)
    fatal(
        fmt_str("cudaGraphLaunch of %s into stream %d, which is capturing: on a GPU the graph becomes a child-graph "
                "node of the capture; not modelled by the emulator",
                exec_desc(x).c_str(), s->id));
  if (s == g_null)
    if (std::vector<Capture*> b = blocking_captures(); !b.empty())
      return refuse(cudaErrorStreamCaptureImplicit, b,
                    "cudaGraphLaunch on the legacy default stream while a blocking stream captures");
  for (size_t i = 0; i < x->ops.size(); ++i)
    for (const MemoryUse& u : x->ops[i].uses) check_replay_use(x, i, x->ops[i], u);
  // A launch is ordered behind the exec's previous launch, whichever stream that was on.
  CUstream_st* prev = x->last_stream;
  if (prev && prev != s && valid_stream(prev) && prev->completed < x->last_seq) {
    Op w;
    w.name = "cudaGraphLaunch: the previous launch of the same executable graph";
    w.step = [] { return true; };
    w.wait_stream = prev;
    w.wait_seq = x->last_seq;
    s->q.push_back(std::move(w));
    ++s->enqueued;
  }
  // Branch 0 runs on `s`, branch b on the exec's b-th side stream; a dependency node waits
  // for the stream of its branch to have finished the ops it names. The branches' order
  // of issue is the capture's, so what a node waits for is queued already.
  std::vector<CUstream_st*> on{s};
  for (CUstream_st*& t : x->side) {
    if (!t) t = new_stream(cudaStreamNonBlocking);
    on.push_back(t);
  }
  std::vector<std::vector<uint64_t>> after(on.size());  // after[b][k]: its stream's count after k ops
  for (size_t b = 0; b < on.size(); ++b) after[b].push_back(on[b]->enqueued);
  for (size_t i = 0; i < x->ops.size(); ++i) {
    const GraphNode& n = x->nodes[i];
    Op op = x->ops[i];  // the same arguments on every replay, as a graph's nodes have
    if (op.arm) op.step = op.arm();
    if (n.wait_branch >= 0) {
      op.wait_stream = on[static_cast<size_t>(n.wait_branch)];
      op.wait_seq = after[static_cast<size_t>(n.wait_branch)][n.wait_pos];
    }
    CUstream_st* t = on[static_cast<size_t>(n.branch)];
    t->q.push_back(std::move(op));
    ++t->enqueued;
    after[static_cast<size_t>(n.branch)].push_back(t->enqueued);
  }
  x->last_stream = s;
  x->last_seq = s->enqueued;
  ++g_graph_launches;
  g_graph_ops_replayed += static_cast<int64_t>(x->ops.size());
  return cudaSuccess;
}

cudaError_t cudaGraphUpload(cudaGraphExec_t x, cudaStream_t stream) {
  Lock lock(g_mu);
  if (!known_exec(x, "cudaGraphUpload")) return fail(cudaErrorInvalidValue, "cudaGraphUpload: null executable graph");
  if (x->destroyed) return fail(cudaErrorInvalidResourceHandle, "cudaGraphUpload: the executable graph was destroyed");
  CUstream_st* s = resolve(stream);
  if (!valid_stream(s)) return fail(cudaErrorInvalidResourceHandle, "cudaGraphUpload: invalid stream");
  if (s->cap) fatal(fmt_str("cudaGraphUpload into stream %d, which is capturing: not modelled by the emulator", s->id));
  return cudaSuccess;  // nothing to upload: the ops are on the host already
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
  Lock lock(g_mu);
  if (!known_exec(x, "cudaGraphExecDestroy"))
    return fail(cudaErrorInvalidValue, "cudaGraphExecDestroy: null executable graph");
  if (x->destroyed)
    fatal(fmt_str("cudaGraphExecDestroy: executable graph #%llu destroyed twice (undefined behaviour on a GPU)",
                  static_cast<unsigned long long>(x->id)));
  x->destroyed = true;  // queued replays hold their own copies of the ops and still run
  x->ops.clear();
  x->ops.shrink_to_fit();
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  Lock lock(g_mu);
  if (!known_graph(g, "cudaGraphDestroy")) return fail(cudaErrorInvalidValue, "cudaGraphDestroy: null graph");
  if (g->destroyed)
    fatal(fmt_str("cudaGraphDestroy: graph #%llu destroyed twice (undefined behaviour on a GPU)",
                  static_cast<unsigned long long>(g->id)));
  if (g->capturing)
    fatal(fmt_str("cudaGraphDestroy: graph #%llu is still being captured into (on stream %d); end the capture first",
                  static_cast<unsigned long long>(g->id), g->stream_id));
  g->destroyed = true;  // its execs hold their own copies of the ops
  g->ops.clear();
  g->ops.shrink_to_fit();
  return cudaSuccess;
}
