// Context parallelism's building blocks (docs/specs/context-parallel.md): the load-balanced
// split of every sequence over the ranks of a cp group, and causal attention across those
// ranks, forward and backward, for the three communication types (p2p ring, all_gather,
// a2a), over a CpExchange: the group's transport. The per-rank functions below are what
// each rank runs; run_in_process gives a group of in-process ranks (threads that take
// turns), which is how the tests prove them against the one-rank attention op.
//
// With attention dropout every rank draws the one-rank op's mask at its rows' global
// positions. Tensors in f32 or f64 (the wide form of the activations) on any one device:
// the host, the test device or CUDA (the blocks, the merge and the K/V buffer are ops of
// core/ops.hpp; a2a lays its heads out with ops::swap_axes), so every type runs on each. On
// CUDA, p2p and all_gather also take bf16/fp16 with cuDNN's fused blocks (CpAttention::fused).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "config/parallel.hpp"
#include "core/op_params.hpp"
#include "core/tensor.hpp"

namespace mtnlg::parallel {

class Communicator;

// ---- the split ------------------------------------------------------------------------
// A sequence of T tokens is cut into 2 cp chunks of T / (2 cp); rank r holds chunks r and
// 2 cp - 1 - r, in that order, so its local positions ascend and every rank has the same
// share of the causal work. T must be a multiple of 2 cp (RuntimeError otherwise; the
// recipe checks it first).
int64_t cp_chunk_len(int64_t seq_len, int64_t cp);
// The global position of local row i of `rank` (positions stay global: learned and rotary
// positions are read at these).
int64_t cp_global_position(int64_t i, int64_t seq_len, int64_t cp, int64_t rank);
std::vector<int64_t> cp_positions(int64_t seq_len, int64_t cp, int64_t rank);
// x [B, T, ...] (any dtype: tokens, labels, loss mask, position ids, activations) ->
// `rank`'s rows [B, T / cp, ...] (a new tensor).
Tensor cp_split(const Tensor& x, int64_t cp, int64_t rank);
// The inverse: the parts of ranks 0 .. cp-1 ([B, T / cp, ...] each) -> [B, T, ...].
Tensor cp_gather(const std::vector<Tensor>& parts);

// ---- the transport ----------------------------------------------------------------------
// What attention across a cp group needs from the group's communicator. Tensors are
// contiguous, on the group's device (host tensors for MPI and the in-process group, GPU
// memory for NCCL); every rank calls the same operations in the same order with the
// same sizes and dtype. A Communicator-backed version maps shift to isend + recv and the
// others to its collectives.
class CpExchange {
 public:
  CpExchange() = default;
  CpExchange(const CpExchange&) = delete;
  CpExchange& operator=(const CpExchange&) = delete;
  virtual ~CpExchange() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  // Sends `send` to rank + k and receives into `recv` (the same numel and dtype) from
  // rank - k (mod size).
  virtual void shift(const Tensor& send, Tensor& recv, int64_t k) = 0;
  // A shift in flight: neither tensor may be written, nor `recv` read, until wait().
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };
  // shift, started: the ring posts the next step's K/V before it computes this step's
  // block, so that the transfer overlaps the compute. Shifts in flight complete in the
  // order they were started. This default shifts at once (the in-process group).
  virtual std::unique_ptr<Pending> shift_start(const Tensor& send, Tensor& recv, int64_t k);
  // out (size() x in.numel()) = the ranks' `in` in rank order.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // in = size() blocks of out.numel(); out = the sum over ranks of their block rank(),
  // added in rank order.
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  // in and out = m blocks of equal size, among the m consecutive ranks that hold this one
  // (ranks (rank() / m) m + j, j < m; m = 0: every rank): block j of `in` goes to the j-th of
  // them, block j of `out` comes from it.
  virtual void all_to_all(const Tensor& in, Tensor& out, int64_t m = 0) = 0;
  // Bytes this rank sent, counted as Communicator counts them (parallel/communicator.hpp).
  double bytes_sent() const { return bytes_; }

 protected:
  double bytes_ = 0;
};

// The exchange over a cp group's Communicator (MPI on the CPU and the test device; NCCL on
// CUDA: receives and collectives on the compute stream, isend and irecv on side streams,
// every operation recorded by the device watchdog under the group's name "cp"): shift is
// isend + irecv (shift_start returns them in flight; on NCCL their wait makes the compute
// stream wait, the host goes on), all_to_all one isend per peer then the receives in rank
// order, the others the group's collectives; a rank's own block is the device's copy;
// bytes_sent() is what the group counted meanwhile.
std::unique_ptr<CpExchange> make_cp_exchange(std::shared_ptr<Communicator> group);

// Runs fn(exchange) on `cp` in-process ranks, one thread each, which take turns: a rank
// runs until it waits in the exchange (so the ops never run concurrently). An exception
// on one rank wakes the others (they throw too) and the first is rethrown here.
void run_in_process(int64_t cp, const std::function<void(CpExchange&)>& fn);

// ---- attention across the group ----------------------------------------------------------
// Causal self-attention of each rank's rows, with the layout of attention_forward_lse
// (qkv [B, L, G*(H/G+2)*D], L = T / cp local rows of the load-balanced split; out
// [B, L, H*D], lse [B, H, L]), equal to the one-rank op's rows of this rank:
//   p2p         a ring of cp steps: K/V blocks (the groups' K/V only) passed to rank + 1,
//               each step's block attended (diagonal: causal; from a lower rank: every query
//               against the first chunk; from a higher rank: the second chunk's queries
//               against both) and merged by log-sum-exp;
//   all_gather  K/V gathered, each local chunk against the causal prefix;
//   a2a         the heads' groups exchanged (G and H divisible by cp), one full-sequence
//               attention_forward_lse per rank, the outputs exchanged back;
//   a2a+p2p     the heads' groups exchanged within groups of a2a_size consecutive ranks
//               (G and H divisible by it), then the p2p ring across those groups over the
//               group's positions (two chunks of a2a_size x T / (2 cp) of the sequence).
// a2a and a2a+p2p run on host tensors only (RuntimeError on a device).
struct CpAttention {
  int64_t heads = 0;
  int64_t groups = 0;  // 0: one group per head
  CpCommType type = CpCommType::p2p;
  // As attention_forward_lse's over the whole sequence (sample_offset, head_offset and
  // heads_total as a tensor-parallel rank passes them).
  ops::AttentionDropout drop{};
  int64_t a2a_size = 0;  // a2a+p2p: hierarchical_context_parallel_sizes[0], a divisor of the group's size
  // p2p and all_gather: every block is cuDNN's fused graph (CUDA; qkv, out and dout
  // bf16/fp16, lse f32; no attention dropout; ops::attention_cp_blocks_fused_supported says
  // whether cuDNN plans them). The blocks' results are merged and summed in f32, rounded once.
  bool fused = false;
};
void cp_attention_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const CpAttention& a, CpExchange& ex);
// dqkv (written) from the final out and lse: p2p sends the K/V around again with their
// gradients, which arrive back at their owner after the last step; all_gather gathers K/V
// again and reduce-scatters dK/dV; a2a exchanges qkv, out, lse and dout to heads and dqkv
// back.
void cp_attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                           const CpAttention& a, CpExchange& ex);

// This thread's time in the two functions above since the process started (seconds):
// `inside` all of it, `waiting` the part spent blocked in a Communicator-backed exchange;
// wall-clock and this thread's CPU time (`_cpu`: what it computed, not counting time it
// was descheduled; MPI's busy waiting counts in both). inside - waiting is the rank's own
// attention work, which the load-balanced split makes equal across the cp ranks (the
// trainer's --comm-report writes them per iteration).
struct CpAttentionTimes {
  double inside = 0, waiting = 0, inside_cpu = 0, waiting_cpu = 0;
};
CpAttentionTimes cp_attention_times();

}  // namespace mtnlg::parallel
