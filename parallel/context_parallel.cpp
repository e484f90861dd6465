// Context parallelism: the load-balanced split, the in-process exchange, and attention
// across the ranks of a cp group (parallel/context_parallel.hpp). The attention is made of
// three ops (core/ops.hpp): attention_block_forward / attention_block_backward (a block of
// queries against a block of K/V with a causal offset) and attention_merge_forward (two
// partial results joined by their log-sum-exp); the a2a form uses attention_forward_lse /
// attention_backward_lse themselves.
#include "parallel/context_parallel.hpp"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "core/error.hpp"
#include "core/ops.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::parallel {

// ---- the split ----------------------------------------------------------------------------

int64_t cp_chunk_len(int64_t seq_len, int64_t cp) {
  if (cp < 1 || seq_len % (2 * cp) != 0)
    throw_runtime("context parallelism: a sequence of {} tokens does not split into 2 x {} equal chunks", seq_len, cp);
  return seq_len / (2 * cp);
}

int64_t cp_global_position(int64_t i, int64_t seq_len, int64_t cp, int64_t rank) {
  const int64_t c = cp_chunk_len(seq_len, cp);
  if (rank < 0 || rank >= cp || i < 0 || i >= 2 * c)
    throw_runtime("context parallelism: local row {} of rank {} is outside {} rows of {} ranks", i, rank, 2 * c, cp);
  return i < c ? rank * c + i : (2 * cp - 1 - rank) * c + (i - c);
}

std::vector<int64_t> cp_positions(int64_t seq_len, int64_t cp, int64_t rank) {
  std::vector<int64_t> p(static_cast<size_t>(seq_len / cp));
  for (size_t i = 0; i < p.size(); ++i) p[i] = cp_global_position(static_cast<int64_t>(i), seq_len, cp, rank);
  return p;
}

namespace {
// x's sizes as [B, T, row bytes]: its first two dimensions and the bytes of one position.
struct SeqDims {
  int64_t B, T, row;
};
SeqDims seq_dims(const char* what, const Tensor& x) {
  if (x.ndim() < 2) throw_runtime("{}: expected a tensor [B, T, ...], got {}", what, shape_str(x.shape()));
  return {x.dim(0), x.dim(1), x.numel() / std::max<int64_t>(x.dim(0) * x.dim(1), 1) * dtype_size(x.dtype())};
}
// Copies rank's two chunks between the whole sequence `full` and its part (to_part: full ->
// part), sample by sample: host memcpy, or the device's copy for device tensors.
void copy_chunks(const Tensor& full, const Tensor& part, int64_t cp, int64_t rank, bool to_part) {
  const SeqDims f = seq_dims("cp_split", full);
  const int64_t c = cp_chunk_len(f.T, cp), L = 2 * c, e = f.row / dtype_size(full.dtype());
  auto* fb = static_cast<char*>(full.raw());
  auto* pb = static_cast<char*>(part.raw());
  const bool host = full.device() == Device::cpu;
  for (int64_t b = 0; b < f.B; ++b)
    for (int64_t half = 0; half < 2; ++half) {
      const int64_t chunk = half == 0 ? rank : 2 * cp - 1 - rank;
      const int64_t fo = (b * f.T + chunk * c), po = (b * L + half * c);
      if (host) {
        const auto n = static_cast<size_t>(c * f.row);
        to_part ? std::memcpy(pb + po * f.row, fb + fo * f.row, n) : std::memcpy(fb + fo * f.row, pb + po * f.row, n);
        continue;
      }
      Tensor fv = full.flat(fo * e, c * e), pv = part.flat(po * e, c * e);
      to_part ? ops::copy(pv, fv) : ops::copy(fv, pv);
    }
}
}  // namespace

Tensor cp_split(const Tensor& x, int64_t cp, int64_t rank) {
  const SeqDims d = seq_dims("cp_split", x);
  cp_chunk_len(d.T, cp);
  if (rank < 0 || rank >= cp) throw_runtime("cp_split: rank {} of a group of {}", rank, cp);
  Shape s = x.shape();
  s[1] = d.T / cp;
  Tensor part = Tensor::empty(s, x.dtype(), x.device());
  copy_chunks(x, part, cp, rank, true);
  return part;
}

Tensor cp_gather(const std::vector<Tensor>& parts) {
  if (parts.empty()) throw_runtime("cp_gather: no parts");
  const auto cp = static_cast<int64_t>(parts.size());
  Shape s = parts[0].shape();
  seq_dims("cp_gather", parts[0]);
  s[1] *= cp;
  Tensor full = Tensor::empty(s, parts[0].dtype(), parts[0].device());
  for (int64_t r = 0; r < cp; ++r) {
    const Tensor& p = parts[static_cast<size_t>(r)];
    if (p.shape() != parts[0].shape() || p.dtype() != parts[0].dtype() || p.device() != parts[0].device())
      throw_runtime("cp_gather: part {} is {} {}, part 0 {} {}", r, shape_str(p.shape()), to_string(p.dtype()),
                    shape_str(parts[0].shape()), to_string(parts[0].dtype()));
    copy_chunks(full, p, cp, r, false);
  }
  return full;
}

namespace {
class Done final : public CpExchange::Pending {
 public:
  void wait() override {}
};
}  // namespace

std::unique_ptr<CpExchange::Pending> CpExchange::shift_start(const Tensor& send, Tensor& recv, int64_t k) {
  shift(send, recv, k);
  return std::make_unique<Done>();
}

// ---- the in-process exchange --------------------------------------------------------------

namespace {

// The group's shared state. Every rank holds `m` while it runs and releases it only while it
// waits in a barrier, so the ranks take turns.
struct Shared {
  explicit Shared(int64_t n) : n(n), posted(static_cast<size_t>(n), nullptr) {}
  std::mutex m;
  std::condition_variable cv;
  int64_t n, arrived = 0;
  uint64_t generation = 0;
  bool failed = false;
  std::vector<const Tensor*> posted;  // what each rank offers in the current exchange
};

void check_same(const char* op, const Tensor& a, const Tensor& b, int64_t times_a, int64_t times_b) {
  if (a.numel() * times_a != b.numel() * times_b || a.dtype() != b.dtype())
    throw_runtime("cp exchange {}: {} {} and {} {} do not match", op, shape_str(a.shape()), to_string(a.dtype()),
                  shape_str(b.shape()), to_string(b.dtype()));
}

class InProcessExchange final : public CpExchange {
 public:
  InProcessExchange(Shared& s, std::unique_lock<std::mutex>& lk, int64_t rank) : s_(s), lk_(lk), rank_(rank) {}
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return s_.n; }

  void shift(const Tensor& send, Tensor& recv, int64_t k) override {
    check_same("shift", send, recv, 1, 1);
    const int64_t from = ((rank_ - k) % s_.n + s_.n) % s_.n;
    exchange(send, [&] { std::memcpy(recv.raw(), s_.posted[static_cast<size_t>(from)]->raw(), bytes(recv)); });
    bytes_ += static_cast<double>(send.nbytes());
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    check_same("all_gather", in, out, s_.n, 1);
    exchange(in, [&] {
      for (int64_t j = 0; j < s_.n; ++j)
        std::memcpy(static_cast<char*>(out.raw()) + j * in.nbytes(), s_.posted[static_cast<size_t>(j)]->raw(),
                    bytes(in));
    });
    bytes_ += static_cast<double>(s_.n - 1) / static_cast<double>(s_.n) * static_cast<double>(out.nbytes());
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_same("reduce_scatter", in, out, 1, s_.n);
    exchange(in, [&] {
      const int64_t n = out.numel();
      if (out.dtype() == DType::f32)
        sum_blocks<float>(out, n);
      else if (out.dtype() == DType::f64)
        sum_blocks<double>(out, n);
      else
        throw_runtime("cp exchange reduce_scatter: f32 or f64, got {}", to_string(out.dtype()));
    });
    bytes_ += static_cast<double>(s_.n - 1) / static_cast<double>(s_.n) * static_cast<double>(in.nbytes());
  }
  void all_to_all(const Tensor& in, Tensor& out, int64_t m) override {
    check_same("all_to_all", in, out, 1, 1);
    m = subgroup(m);
    const int64_t block = in.nbytes() / m, first = rank_ / m * m;
    exchange(in, [&] {
      for (int64_t j = 0; j < m; ++j)
        std::memcpy(static_cast<char*>(out.raw()) + j * block,
                    static_cast<const char*>(s_.posted[static_cast<size_t>(first + j)]->raw()) + rank_ % m * block,
                    static_cast<size_t>(block));
    });
    bytes_ += static_cast<double>(m - 1) / static_cast<double>(m) * static_cast<double>(in.nbytes());
  }

 private:
  static size_t bytes(const Tensor& t) { return static_cast<size_t>(t.nbytes()); }
  int64_t subgroup(int64_t m) const {
    if (m == 0) return s_.n;
    if (m < 0 || s_.n % m != 0) throw_runtime("cp exchange all_to_all: groups of {} in {} ranks", m, s_.n);
    return m;
  }
  // out = the sum of block rank() of every rank's input, in rank order.
  template <typename T>
  void sum_blocks(Tensor& out, int64_t n) {
    T* o = out.data<T>();
    for (int64_t i = 0; i < n; ++i) o[i] = T(0);
    for (int64_t j = 0; j < s_.n; ++j) {
      const T* src = s_.posted[static_cast<size_t>(j)]->data<T>() + rank_ * n;
      for (int64_t i = 0; i < n; ++i) o[i] += src[i];
    }
  }
  // Posts `mine`, waits until every rank has, runs `take` (reading the others' posts),
  // and waits until every rank has taken before the posts may change.
  template <typename F>
  void exchange(const Tensor& mine, F&& take) {
    s_.posted[static_cast<size_t>(rank_)] = &mine;
    barrier();
    take();
    barrier();
  }
  void barrier() {
    if (s_.failed) throw_runtime("cp rank {}: another rank of the in-process group failed", rank_);
    const uint64_t gen = s_.generation;
    if (++s_.arrived == s_.n) {
      s_.arrived = 0;
      ++s_.generation;
      s_.cv.notify_all();
      return;
    }
    s_.cv.wait(lk_, [&] { return s_.generation != gen || s_.failed; });
    if (s_.failed) throw_runtime("cp rank {}: another rank of the in-process group failed", rank_);
  }
  Shared& s_;
  std::unique_lock<std::mutex>& lk_;
  int64_t rank_;
};

}  // namespace

namespace {

thread_local CpAttentionTimes t_cp_times;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

class CommExchange final : public CpExchange {
 public:
  explicit CommExchange(std::shared_ptr<Communicator> g) : g_(std::move(g)) {}
  int64_t rank() const override { return g_->rank(); }
  int64_t size() const override { return g_->size(); }

  void shift(const Tensor& send, Tensor& recv, int64_t k) override { shift_start(send, recv, k)->wait(); }
  std::unique_ptr<Pending> shift_start(const Tensor& send, Tensor& recv, int64_t k) override {
    check_same("shift", send, recv, 1, 1);
    const int64_t n = size(), to = ((rank() + k) % n + n) % n, from = ((rank() - k) % n + n) % n;
    auto p = std::make_unique<InFlight>(*this);
    if (to == rank()) {
      ops::copy(recv, send);
      return p;
    }
    counted([&] {
      p->reqs.push_back(g_->isend(send.raw(), send.numel(), send.dtype(), to, kTag));
      p->reqs.push_back(g_->irecv(recv.raw(), recv.numel(), recv.dtype(), from, kTag));
    });
    return p;
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    check_same("all_gather", in, out, size(), 1);
    counted([&] { g_->all_gather(in.raw(), out.raw(), in.numel(), in.dtype()); });
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    check_same("reduce_scatter", in, out, 1, size());
    counted([&] { g_->reduce_scatter(in.raw(), out.raw(), out.numel(), out.dtype()); });
  }
  void all_to_all(const Tensor& in, Tensor& out, int64_t m) override {
    check_same("all_to_all", in, out, 1, 1);
    const int64_t n = m == 0 ? size() : m;
    if (n < 1 || size() % n != 0) throw_runtime("cp exchange all_to_all: groups of {} in {} ranks", m, size());
    const int64_t me = rank() % n, first = rank() - me, block = in.numel() / n, e = dtype_size(in.dtype());
    auto at = [&](const Tensor& t, int64_t j) { return static_cast<char*>(t.raw()) + j * block * e; };
    counted([&] {
      std::vector<std::unique_ptr<Request>> sends;
      for (int64_t j = 0; j < n; ++j)
        if (j != me) sends.push_back(g_->isend(at(in, j), block, in.dtype(), first + j, kTag));
      Tensor mine = out.flat(me * block, block);
      ops::copy(mine, in.flat(me * block, block));
      for (int64_t j = 0; j < n; ++j)
        if (j != me) g_->recv(at(out, j), block, out.dtype(), first + j, kTag);
      for (auto& r : sends) r->wait_stream();
    });
  }

 private:
  static constexpr int kTag = 7300;  // the cp attention's messages
  // A shift's send and receive; the time waiting on them is the exchange's.
  struct InFlight final : Pending {
    explicit InFlight(CommExchange& ex) : ex(ex) {}
    void wait() override {
      ex.counted([&] {
        for (auto& r : reqs) r->wait_stream();
      });
      reqs.clear();
    }
    CommExchange& ex;
    std::vector<std::unique_ptr<Request>> reqs;
  };
  template <typename F>
  void counted(F&& f) {
    const double before = g_->bytes_counted();
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    f();
    t_cp_times.waiting += seconds_since(t0);
    t_cp_times.waiting_cpu += thread_cpu_seconds() - c0;
    bytes_ += g_->bytes_counted() - before;
  }
  std::shared_ptr<Communicator> g_;
};

}  // namespace

std::unique_ptr<CpExchange> make_cp_exchange(std::shared_ptr<Communicator> group) {
  if (!group) throw_runtime("make_cp_exchange: no group");
  return std::make_unique<CommExchange>(std::move(group));
}

void run_in_process(int64_t cp, const std::function<void(CpExchange&)>& fn) {
  if (cp < 1) throw_runtime("run_in_process: a group of {} ranks", cp);
  Shared shared(cp);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(cp));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < cp; ++r)
    threads.emplace_back([&, r] {
      std::unique_lock<std::mutex> lk(shared.m);
      try {
        InProcessExchange ex(shared, lk, r);
        fn(ex);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        shared.failed = true;
        shared.cv.notify_all();
      }
    });
  for (auto& t : threads) t.join();
  // The first failure, not a rank that only learnt of it.
  std::exception_ptr first;
  for (auto& e : errors)
    if (e && !first) first = e;
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const RuntimeError& x) {
      if (std::string(x.what()).find("another rank of the in-process group failed") == std::string::npos) {
        first = e;
        break;
      }
    } catch (...) {
      first = e;
      break;
    }
  }
  if (first) std::rethrow_exception(first);
}

// ---- attention across the group -----------------------------------------------------------

namespace {

// The local attention's sizes: B samples of L = 2c rows, H heads in G groups of Q, head size
// D; qkv rows of W, K/V rows of KW; rank r of n.
struct Dims {
  int64_t B, L, c, H, G, Q, D, W, KW, n, r;
  ops::AttentionDropout drop;
};

Dims dims_of(const char* op, const Tensor& qkv, const CpAttention& a, const CpExchange& ex) {
  const int64_t H = a.heads, G = a.groups > 0 ? a.groups : a.heads;
  if (H <= 0 || H % G != 0 || qkv.ndim() != 3 || qkv.dim(2) % (G * (H / G + 2)) != 0 || qkv.dim(1) % 2 != 0)
    throw_runtime("{}: qkv [B, L, G*(H/G+2)*D] with an even L, H % G == 0: got {} with {} heads in {} groups", op,
                  shape_str(qkv.shape()), H, G);
  const bool fused_io = a.fused && (a.type == CpCommType::p2p || a.type == CpCommType::all_gather) &&
                        (qkv.dtype() == DType::bf16 || qkv.dtype() == DType::f16);
  if (qkv.dtype() != DType::f32 && qkv.dtype() != DType::f64 && !fused_io)
    throw_runtime("{}: f32 or f64 tensors (the activations' wide form; bf16/fp16 with cuDNN's fused blocks), got {}",
                  op, to_string(qkv.dtype()));
  if (a.fused && (!fused_io || qkv.device() != Device::cuda || a.drop.p > 0))
    throw_runtime("{}: cuDNN's fused blocks take p2p or all_gather on CUDA, bf16/fp16, without attention dropout", op);
  const int64_t Q = H / G, D = qkv.dim(2) / (G * (Q + 2));
  return {qkv.dim(0), qkv.dim(1), qkv.dim(1) / 2, H, G, Q, D, qkv.dim(2), G * 2 * D, ex.size(), ex.rank(), a.drop};
}

// Between qkv's key/value columns and a K/V buffer [B, L, G*2*D] (per group [k | v]):
// ops::attention_kv_forward / _backward, on qkv's device.
Tensor kv_of(const Tensor& qkv, const Dims& d) {
  Tensor kv = Tensor::empty({d.B, d.L, d.KW}, qkv.dtype(), qkv.device());
  ops::attention_kv_forward(kv, qkv, d.H, d.G);
  return kv;
}
void put_kv(Tensor& dqkv, const Tensor& dkv, const Dims& d) { ops::attention_kv_backward(dqkv, dkv, d.H, d.G); }
// Buffers like `t` (its dtype and device).
Tensor empty_like(const Tensor& t, const Shape& s) { return Tensor::empty(s, t.dtype(), t.device()); }
Tensor zeros_like(const Tensor& t) {
  Tensor z = Tensor::empty(t.shape(), t.dtype(), t.device());
  ops::fill(z, 0.0);
  return z;
}

// The block a p2p step attends with the K/V of rank s: its own (causal), a lower rank's
// (every query, the first K/V chunk) or a higher rank's (the second query chunk, all K/V).
// A block of this rank's queries with dropout's positions: its rows are chunks r and
// 2cp-1-r; the K/V rows `kv_rows`.
ops::AttentionBlock local_block(const Dims& d, ops::SeqRows kv_rows) {
  ops::AttentionBlock b;
  b.drop = d.drop;
  b.seq_len = d.L * d.n;
  b.q_rows = {d.c, d.r, 2 * d.n - 1 - d.r};
  b.kv_rows = kv_rows;
  return b;
}

ops::AttentionBlock ring_block(int64_t s, const Dims& d) {
  ops::AttentionBlock b = local_block(d, {d.c, s, 2 * d.n - 1 - s});
  if (s == d.r) {
    b.causal = true;
  } else if (s < d.r) {
    b.k_count = d.c;
  } else {
    b.q_begin = d.c;
    b.q_count = d.c;
  }
  return b;
}

// The ring: step i attends with the K/V of rank r - i. The K/V of step i + 1 is posted
// before step i's block is computed, so that the transfer overlaps it (on NCCL the
// receive runs on a side stream; on MPI the library moves it meanwhile).
void p2p_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Dims& d, CpExchange& ex) {
  Tensor kv = kv_of(qkv, d), next = d.n > 1 ? empty_like(kv, kv.shape()) : Tensor();
  std::unique_ptr<CpExchange::Pending> coming;
  if (d.n > 1) coming = ex.shift_start(kv, next, 1);
  ops::attention_block_forward(out, lse, qkv, kv, d.H, ring_block(d.r, d), d.G);
  if (d.n == 1) return;
  Tensor part = empty_like(out, out.shape()), part_lse = empty_like(lse, lse.shape());
  for (int64_t i = 1; i < d.n; ++i) {
    coming->wait();  // now `next` holds the K/V of rank r - i, and `kv` was sent
    std::swap(kv, next);
    if (i + 1 < d.n) coming = ex.shift_start(kv, next, 1);
    ops::attention_block_forward(part, part_lse, qkv, kv, d.H, ring_block((d.r - i + d.n) % d.n, d), d.G);
    ops::attention_merge_forward(out, lse, out, lse, part, part_lse);
  }
}

// The K/V travel as in the forward (posted a step ahead); the dK/dV of a K/V block follow
// it round the ring, each rank adding its part, and go home after the last step.
void p2p_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                  const Dims& d, CpExchange& ex) {
  ops::fill(dqkv, 0.0);
  Tensor kv = kv_of(qkv, d), dkv = zeros_like(kv);
  if (d.n == 1) {
    ops::attention_block_backward(dqkv, dkv, dout, nullptr, qkv, kv, out, lse, d.H, ring_block(d.r, d), d.G);
    return put_kv(dqkv, dkv, d);
  }
  Tensor next = empty_like(kv, kv.shape()), dnext = empty_like(kv, kv.shape());
  auto coming = ex.shift_start(kv, next, 1);
  ops::attention_block_backward(dqkv, dkv, dout, nullptr, qkv, kv, out, lse, d.H, ring_block(d.r, d), d.G);
  for (int64_t i = 1; i < d.n; ++i) {  // K/V of rank r - i arrive with the gradient ranks r - i .. r - 1 gave them
    auto grads = ex.shift_start(dkv, dnext, 1);
    coming->wait();
    grads->wait();
    std::swap(kv, next);
    std::swap(dkv, dnext);
    if (i + 1 < d.n) coming = ex.shift_start(kv, next, 1);
    ops::attention_block_backward(dqkv, dkv, dout, nullptr, qkv, kv, out, lse, d.H,
                                  ring_block((d.r - i + d.n) % d.n, d), d.G);
  }
  ex.shift(dkv, dnext, 1);  // every rank has added to the K/V of rank r + 1: send it home
  put_kv(dqkv, dnext, d);
}

// p2p with cuDNN's fused blocks (bf16/fp16 activations on CUDA; docs/specs/cudnn-sdpa.md,
// "Blocks"): a block's out in the activation dtype and its lse (f32) are merged into an
// f32 accumulator by log-sum-exp, the final out rounded once to the activation dtype. A
// block from a higher rank writes the second chunk's rows only: its lse is -inf elsewhere
// first (weight 0 for the rows' stale, finite outputs).
void p2p_fused_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Dims& d, CpExchange& ex) {
  Tensor kv = kv_of(qkv, d), next = empty_like(kv, kv.shape());
  std::unique_ptr<CpExchange::Pending> coming;
  if (d.n > 1) coming = ex.shift_start(kv, next, 1);  // overlaps the diagonal block, as p2p_forward's
  Tensor part = empty_like(out, out.shape()), part_lse = empty_like(lse, lse.shape());
  ops::attention_block_fused_forward(part, lse, qkv, kv, d.H, ring_block(d.r, d), d.G);
  Tensor acc = Tensor::empty(out.shape(), DType::f32, out.device());
  ops::convert(acc, part);
  for (int64_t i = 1; i < d.n; ++i) {
    coming->wait();  // now `next` holds the K/V of rank r - i
    std::swap(kv, next);
    if (i + 1 < d.n) coming = ex.shift_start(kv, next, 1);
    const int64_t s = (d.r - i + d.n) % d.n;
    if (s > d.r) ops::fill(part_lse, -std::numeric_limits<double>::infinity());
    ops::attention_block_fused_forward(part, part_lse, qkv, kv, d.H, ring_block(s, d), d.G);
    ops::attention_merge_forward(acc, lse, acc, lse, part, part_lse);
  }
  ops::convert(out, acc);
}

// The gradients of cuDNN's fused blocks summed in f32: a block WRITES its rows' dQ (q
// columns) and dK/dV (its key rows) in the activation dtype, into scratch zeroed first,
// which is then added to dq [B, L, W] and dkv (f32).
class FusedGradSum {
 public:
  FusedGradSum(const Tensor& qkv, const Tensor& kv)
      : dq_blk_(empty_like(qkv, qkv.shape())),
        dkv_blk_(empty_like(kv, kv.shape())),
        dq_w_(Tensor::empty(qkv.shape(), DType::f32, qkv.device())),
        dkv_w_(Tensor::empty(kv.shape(), DType::f32, kv.device())) {}
  void add(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& qkv, const Tensor& kv, const Tensor& out,
           const Tensor& lse, const Dims& d, const ops::AttentionBlock& b) {
    ops::fill(dq_blk_, 0.0);
    ops::fill(dkv_blk_, 0.0);
    ops::attention_block_fused_backward(dq_blk_, dkv_blk_, dout, qkv, kv, out, lse, d.H, b, d.G);
    ops::convert(dq_w_, dq_blk_);
    ops::add_inplace(dq, dq_w_);
    ops::convert(dkv_w_, dkv_blk_);
    ops::add_inplace(dkv, dkv_w_);
  }

 private:
  Tensor dq_blk_, dkv_blk_, dq_w_, dkv_w_;
};

Tensor f32_zeros(const Shape& s, Device dev) {
  Tensor t = Tensor::empty(s, DType::f32, dev);
  ops::fill(t, 0.0);
  return t;
}

// Its backward: every block is handed the final out and lse; dQ summed over the steps and
// dK/dV in an f32 buffer that travels with the K/V back to its owner, as p2p_backward's;
// the final dqkv rounded once.
void p2p_fused_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Dims& d, CpExchange& ex) {
  Tensor kv = kv_of(qkv, d);
  Tensor dq = f32_zeros(qkv.shape(), qkv.device()), dkv = f32_zeros(kv.shape(), qkv.device());
  FusedGradSum sum(qkv, kv);
  if (d.n > 1) {  // the K/V posted a step ahead, the dK/dV once made, as p2p_backward's
    Tensor next = empty_like(kv, kv.shape()), dnext = empty_like(dkv, dkv.shape());
    auto coming = ex.shift_start(kv, next, 1);
    sum.add(dq, dkv, dout, qkv, kv, out, lse, d, ring_block(d.r, d));
    for (int64_t i = 1; i < d.n; ++i) {
      auto grads = ex.shift_start(dkv, dnext, 1);
      coming->wait();
      grads->wait();
      std::swap(kv, next);
      std::swap(dkv, dnext);
      if (i + 1 < d.n) coming = ex.shift_start(kv, next, 1);
      sum.add(dq, dkv, dout, qkv, kv, out, lse, d, ring_block((d.r - i + d.n) % d.n, d));
    }
    ex.shift(dkv, dnext, 1);  // home
    std::swap(dkv, dnext);
  } else {
    sum.add(dq, dkv, dout, qkv, kv, out, lse, d, ring_block(d.r, d));
  }
  put_kv(dq, dkv, d);
  ops::convert(dqkv, dq);
}

// The whole sequence's K/V [B, T, KW] in sequence order from every rank's.
Tensor gather_kv(const Tensor& qkv, const Dims& d, CpExchange& ex) {
  Tensor kv = kv_of(qkv, d), all = empty_like(qkv, {d.n * d.B, d.L, d.KW});
  ex.all_gather(kv, all);
  std::vector<Tensor> parts;
  for (int64_t j = 0; j < d.n; ++j) parts.push_back(all.rows(j * d.B, d.B));
  return cp_gather(parts);
}
// all_gather's backward: the whole sequence's dK/dV [B, T, KW] summed over the ranks, each
// rank getting its own rows (split by the owners' chunks, then reduce-scattered).
Tensor scatter_home(const Tensor& dkv_all, const Dims& d, CpExchange& ex) {
  Tensor blocks = empty_like(dkv_all, {d.n * d.B, d.L, d.KW}), dkv = empty_like(dkv_all, {d.B, d.L, d.KW});
  for (int64_t j = 0; j < d.n; ++j) {  // rank j's rows of the gradient, in rank order
    Tensor dst = blocks.rows(j * d.B, d.B);
    ops::copy(dst, cp_split(dkv_all, d.n, j));
  }
  ex.reduce_scatter(blocks, dkv);
  return dkv;
}

// The two blocks of all_gather: each local chunk's queries against the causal prefix of
// the whole sequence's keys (global offset = the chunk's first position).
ops::AttentionBlock prefix_block(int64_t half, const Dims& d) {
  const int64_t chunk = half == 0 ? d.r : 2 * d.n - 1 - d.r;
  ops::AttentionBlock b = local_block(d, {});  // the K/V in sequence order
  b.q_begin = half * d.c;
  b.q_count = d.c;
  b.k_count = (chunk + 1) * d.c;
  b.causal = true;
  b.causal_offset = chunk * d.c;
  return b;
}

void all_gather_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Dims& d, CpExchange& ex) {
  const Tensor kv = gather_kv(qkv, d, ex);
  Tensor part = empty_like(out, out.shape()), part_lse = empty_like(lse, lse.shape());
  ops::attention_block_forward(out, lse, qkv, kv, d.H, prefix_block(0, d), d.G);
  ops::attention_block_forward(part, part_lse, qkv, kv, d.H, prefix_block(1, d), d.G);
  ops::attention_merge_forward(out, lse, out, lse, part, part_lse);  // disjoint rows: each keeps its own
}

void all_gather_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                         const Dims& d, CpExchange& ex) {
  ops::fill(dqkv, 0.0);
  const Tensor kv = gather_kv(qkv, d, ex);
  Tensor dkv_all = zeros_like(kv);
  for (int64_t half : {0, 1})
    ops::attention_block_backward(dqkv, dkv_all, dout, nullptr, qkv, kv, out, lse, d.H, prefix_block(half, d), d.G);
  put_kv(dqkv, scatter_home(dkv_all, d, ex), d);
}

// all_gather with cuDNN's fused blocks: local chunk `half` (chunk k of the sequence)
// against the gathered K/V as its c x c causal diagonal (key rows k c ..) and, for k > 0,
// the unmasked c x k c prefix before it: prefix_block's causal prefix in two graphs cuDNN
// plans, whose results are merged as the ring's.
ops::AttentionBlock gather_fused_block(int64_t half, bool diagonal, const Dims& d) {
  const int64_t k = half == 0 ? d.r : 2 * d.n - 1 - d.r;
  ops::AttentionBlock b;
  b.q_begin = half * d.c;
  b.q_count = d.c;
  b.k_begin = diagonal ? k * d.c : 0;
  b.k_count = diagonal ? d.c : k * d.c;
  b.causal = diagonal;
  return b;
}

// Every block writes its own rows: the two diagonals fill out and lse, the two prefixes a
// second pair (rank 0's first chunk has none: lse -inf there), merged once in f32.
void all_gather_fused_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Dims& d, CpExchange& ex) {
  const Tensor kv = gather_kv(qkv, d, ex);
  Tensor part = empty_like(out, out.shape()), part_lse = empty_like(lse, lse.shape());
  for (int64_t half : {0, 1})
    ops::attention_block_fused_forward(part, lse, qkv, kv, d.H, gather_fused_block(half, true, d), d.G);
  Tensor acc = Tensor::empty(out.shape(), DType::f32, out.device());
  ops::convert(acc, part);
  ops::fill(part_lse, -std::numeric_limits<double>::infinity());
  for (int64_t half : {0, 1})
    if (gather_fused_block(half, false, d).k_count > 0)
      ops::attention_block_fused_forward(part, part_lse, qkv, kv, d.H, gather_fused_block(half, false, d), d.G);
  ops::attention_merge_forward(acc, lse, acc, lse, part, part_lse);
  ops::convert(out, acc);
}

// Its backward: the blocks' gradients summed in f32 (dK/dV over the whole sequence's
// rows), reduce-scattered in f32 as all_gather_backward's, dqkv rounded once.
void all_gather_fused_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, const Dims& d, CpExchange& ex) {
  const Tensor kv = gather_kv(qkv, d, ex);
  Tensor dq = f32_zeros(qkv.shape(), qkv.device()), dkv_all = f32_zeros(kv.shape(), qkv.device());
  FusedGradSum sum(qkv, kv);
  for (int64_t half : {0, 1})
    for (bool diagonal : {true, false})
      if (const ops::AttentionBlock b = gather_fused_block(half, diagonal, d); b.k_count > 0)
        sum.add(dq, dkv_all, dout, qkv, kv, out, lse, d, b);
  put_kv(dq, scatter_home(dkv_all, d, ex), d);
  ops::convert(dqkv, dq);
}

// a2a: x [B, L, w] of this rank's rows -> [B, m L, w / m] of the rows of the m ranks of its
// a2a group (all n for a2a), column block rank % m (block j travels to the group's j-th
// rank), in the order cp_gather gives m parts: for a2a the sequence; for a2a+p2p the two
// contiguous spans of the group's chunks (the group's place in a split over n / m). On x's
// device: the column blocks are laid out by ops::swap_axes.
Tensor to_heads(const Tensor& x, const Dims& d, CpExchange& ex, int64_t m) {
  const int64_t wb = x.dim(2) / m;
  Tensor send = empty_like(x, {m * d.B, d.L, wb}), recv = empty_like(x, send.shape());
  ops::swap_axes(send, x, 1, d.B * d.L, m);  // [rows, m, wb] -> [m, rows, wb]
  ex.all_to_all(send, recv, m);
  std::vector<Tensor> parts;
  for (int64_t j = 0; j < m; ++j) parts.push_back(recv.rows(j * d.B, d.B));
  return cp_gather(parts);
}
// The inverse: y [B, m L, w] of this rank's column block -> [B, L, w * m] of its rows.
Tensor from_heads(const Tensor& y, const Dims& d, CpExchange& ex, int64_t m) {
  const int64_t wb = y.dim(2);
  Tensor send = empty_like(y, {m * d.B, d.L, wb}), recv = empty_like(y, send.shape());
  for (int64_t j = 0; j < m; ++j) {
    Tensor dst = send.rows(j * d.B, d.B);
    ops::copy(dst, cp_split(y, m, j));
  }
  ex.all_to_all(send, recv, m);
  Tensor x = empty_like(y, {d.B, d.L, wb * m});
  ops::swap_axes(x, recv, 1, m, d.B * d.L);  // [m, rows, wb] -> [rows, m, wb]
  return x;
}
// lse [B, H, T] <-> [B, T, H] (rows by position, so that to_heads / from_heads move it).
Tensor transpose_lse(const Tensor& x) {
  Tensor y = empty_like(x, {x.dim(0), x.dim(2), x.dim(1)});
  ops::swap_axes(y, x, x.dim(0), x.dim(1), x.dim(2));
  return y;
}

void check_a2a(const Dims& d, int64_t m) {
  if (d.H % m != 0 || d.G % m != 0)
    throw_runtime("context-parallel a2a: {} heads in {} groups do not split over {} ranks (use p2p or all_gather)", d.H,
                  d.G, m);
}

// The dropout of this rank's heads after an a2a over m ranks: its block of heads, within
// all of them.
ops::AttentionDropout a2a_drop(const Dims& d, int64_t m) {
  ops::AttentionDropout drop = d.drop;
  drop.heads_total = d.drop.heads_total ? d.drop.heads_total : d.H;
  drop.head_offset = d.drop.head_offset + d.r % m * (d.H / m);
  return drop;
}

// a2a+p2p's ring: across the a2a groups of m consecutive ranks, rank r's peer k steps on
// being r + k m (the same place in the k-th next group). Only shift.
class AcrossGroups final : public CpExchange {
 public:
  AcrossGroups(CpExchange& ex, int64_t m) : ex_(ex), m_(m) {}
  int64_t rank() const override { return ex_.rank() / m_; }
  int64_t size() const override { return ex_.size() / m_; }
  void shift(const Tensor& send, Tensor& recv, int64_t k) override { ex_.shift(send, recv, k * m_); }
  void all_gather(const Tensor&, Tensor&) override { refuse(); }
  void reduce_scatter(const Tensor&, Tensor&) override { refuse(); }
  void all_to_all(const Tensor&, Tensor&, int64_t) override { refuse(); }

 private:
  [[noreturn]] static void refuse() { throw_runtime("a2a+p2p: the ring across the a2a groups only shifts"); }
  CpExchange& ex_;
  int64_t m_;
};

// The ring's view after the a2a over m ranks: this group's m L rows (two chunks of m c, the
// group's place g = r / m of a split over n / m) of H / m heads in G / m groups.
Dims ring_dims(const Dims& d, int64_t m) {
  Dims o = d;
  o.L = m * d.L, o.c = m * d.c, o.H = d.H / m, o.G = d.G / m, o.W = d.W / m, o.KW = d.KW / m;
  o.n = d.n / m, o.r = d.r / m, o.drop = a2a_drop(d, m);
  return o;
}

int64_t a2a_size(const CpAttention& a, const Dims& d) {
  if (a.a2a_size < 1 || d.n % a.a2a_size != 0)
    throw_runtime("context-parallel a2a+p2p: a2a groups of {} ranks do not divide {} ranks", a.a2a_size, d.n);
  check_a2a(d, a.a2a_size);
  return a.a2a_size;
}

// a2a is a2a+p2p with one group of all n ranks: after the heads' exchange each rank holds
// the whole sequence of its heads, and the "ring" is its one causal block.
int64_t a2a_all(const Dims& d) {
  check_a2a(d, d.n);
  return d.n;
}

void a2a_p2p_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Dims& d, int64_t m, CpExchange& ex) {
  const Dims o = ring_dims(d, m);
  const Tensor qkv_h = to_heads(qkv, d, ex, m);
  Tensor out_h = empty_like(qkv, {d.B, o.L, o.H * d.D}), lse_h = empty_like(lse, {d.B, o.H, o.L});
  AcrossGroups ring(ex, m);
  p2p_forward(out_h, lse_h, qkv_h, o, ring);
  ops::copy(out, from_heads(out_h, d, ex, m));
  ops::copy(lse, transpose_lse(from_heads(transpose_lse(lse_h), d, ex, m)));
}

void a2a_p2p_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                      const Dims& d, int64_t m, CpExchange& ex) {
  const Dims o = ring_dims(d, m);
  const Tensor qkv_h = to_heads(qkv, d, ex, m), out_h = to_heads(out, d, ex, m);
  const Tensor dout_h = to_heads(dout, d, ex, m), lse_h = transpose_lse(to_heads(transpose_lse(lse), d, ex, m));
  Tensor dqkv_h = empty_like(qkv_h, qkv_h.shape());
  AcrossGroups ring(ex, m);
  p2p_backward(dqkv_h, dout_h, qkv_h, out_h, lse_h, o, ring);
  ops::copy(dqkv, from_heads(dqkv_h, d, ex, m));
}

void check_outputs(const char* op, const Dims& d, const Tensor& qkv, std::initializer_list<const Tensor*> acts,
                   const Tensor& lse) {
  for (const Tensor* t : acts)
    if (t->dtype() != qkv.dtype() || t->device() != qkv.device())
      throw_runtime("{}: every tensor in qkv's dtype ({}) on its device ({})", op, to_string(qkv.dtype()),
                    to_string(qkv.device()));
  const DType wide = qkv.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (lse.numel() != d.B * d.H * d.L || lse.dtype() != wide || lse.device() != qkv.device())
    throw_runtime("{}: lse must be [B, H, L] = [{}, {}, {}] in {}", op, d.B, d.H, d.L, to_string(wide));
}

}  // namespace

CpAttentionTimes cp_attention_times() { return t_cp_times; }

namespace {
// Adds its lifetime to this thread's cp attention time.
struct InsideCpAttention {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double c0 = thread_cpu_seconds();
  ~InsideCpAttention() {
    t_cp_times.inside += seconds_since(t0);
    t_cp_times.inside_cpu += thread_cpu_seconds() - c0;
  }
};
}  // namespace

void cp_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const CpAttention& a, CpExchange& ex) {
  const InsideCpAttention timed;
  const char* op = "cp_attention_forward";
  const Dims d = dims_of(op, qkv, a, ex);
  check_outputs(op, d, qkv, {&out}, lse);
  if (out.numel() != d.B * d.L * d.H * d.D) throw_runtime("{}: out must be [B, L, H*D]", op);
  switch (a.type) {
    case CpCommType::p2p: return a.fused ? p2p_fused_forward(out, lse, qkv, d, ex) : p2p_forward(out, lse, qkv, d, ex);
    case CpCommType::all_gather:
      if (a.fused) return all_gather_fused_forward(out, lse, qkv, d, ex);
      return all_gather_forward(out, lse, qkv, d, ex);
    case CpCommType::a2a: return a2a_p2p_forward(out, lse, qkv, d, a2a_all(d), ex);
    case CpCommType::a2a_p2p: return a2a_p2p_forward(out, lse, qkv, d, a2a_size(a, d), ex);
  }
  throw_runtime("{}: unknown communication type", op);
}

void cp_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                           const CpAttention& a, CpExchange& ex) {
  const InsideCpAttention timed;
  const char* op = "cp_attention_backward";
  const Dims d = dims_of(op, qkv, a, ex);
  check_outputs(op, d, qkv, {&dqkv, &dout, &out}, lse);
  if (dqkv.numel() != qkv.numel() || dout.numel() != out.numel() || out.numel() != d.B * d.L * d.H * d.D)
    throw_runtime("{}: dqkv like qkv, dout and out [B, L, H*D]", op);
  switch (a.type) {
    case CpCommType::p2p:
      if (a.fused) return p2p_fused_backward(dqkv, dout, qkv, out, lse, d, ex);
      return p2p_backward(dqkv, dout, qkv, out, lse, d, ex);
    case CpCommType::all_gather:
      if (a.fused) return all_gather_fused_backward(dqkv, dout, qkv, out, lse, d, ex);
      return all_gather_backward(dqkv, dout, qkv, out, lse, d, ex);
    case CpCommType::a2a: return a2a_p2p_backward(dqkv, dout, qkv, out, lse, d, a2a_all(d), ex);
    case CpCommType::a2a_p2p: return a2a_p2p_backward(dqkv, dout, qkv, out, lse, d, a2a_size(a, d), ex);
  }
  throw_runtime("{}: unknown communication type", op);
}

}  // namespace mtnlg::parallel
