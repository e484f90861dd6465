// Pipeline schedules as pure instruction tables: for (stages p, this stage r,
// microbatches m, virtual chunks v) the ordered list of compute and communication
// actions rank r executes in one iteration. No model or communicator knowledge.
//
// Virtual stages. With v chunks per rank, chunk c on rank r is global virtual stage
// c*p + r (Megatron's interleaving): activations flow r -> r+1 within a chunk and
// from rank p-1 chunk c to rank 0 chunk c+1. Virtual stage 0 reads the data, virtual
// stage v*p-1 computes the loss; those two have no recv_forward / send_forward
// (respectively no send_backward / recv_backward).
//
// Executor contract (what the table is checked against in test/schedules):
//  * Run the actions in order, one at a time.
//  * forward(k, c) / backward(k, c): compute microbatch k on chunk c. recv_forward(k, c)
//    comes right before the forward that consumes it, send_forward(k, c) right after the
//    forward that produces it; likewise recv_backward/send_backward around backward.
//  * Sends are nonblocking and buffered: post Communicator::isend and move on; keep
//    the buffer alive until the request's wait(); wait for each at its release point
//    (send_release_points) or at the end of the table (before the gradient reduction),
//    never earlier. Recvs block (Communicator::recv).
//  * peer_stage is the pipeline rank (rank in the pp group) of the other side.
//    Between one ordered pair of ranks, the k-th send_forward matches the k-th
//    recv_forward (and the same for the backward direction), so one tag per direction
//    is enough (e.g. 0 = activations, 1 = activation gradients); the carried
//    (microbatch, chunk) identifies the message for checks.
//  * For a send, `chunk` is the sender's chunk; for a recv, the receiver's chunk.
// Under this contract the tables of all ranks run to completion together (no deadlock)
// for every valid (p, m, v); the tests simulate it exhaustively for p <= 8, m <= 32, v <= 4.
//
// In-flight activations (forwards whose backward has not run yet), per rank:
//   no pipelining: 1;  GPipe: m;  1F1B: min(p - r, m);
//   interleaved: min(warmup + 1, m*v) microbatch-chunks with
//     warmup = m*v when m == p (all forwards first, as Megatron), else
//     min(2*(p - r - 1) + (v - 1)*p, m*v).
//   The first stage thus holds p + (p-1)/v stage-equivalents of activations against p
//   for 1F1B: the (1 + (p-1)/(p*v)) factor of planner.md.
// Bubble (idle time over the whole pipeline, unit forward/backward per stage):
//   1F1B and GPipe (p-1)/m of the ideal time, interleaved (p-1)/(v*m) when m > p (more
//   when m == p, where every forward runs first). The tests check these exactly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mtnlg::schedules {

enum class PipeOp { forward, backward, send_forward, recv_forward, send_backward, recv_backward };

struct PipeAction {
  PipeOp op;
  int64_t microbatch;  // 0..m-1
  int64_t chunk;       // model chunk (virtual stage index on this rank) 0..v-1
  int64_t peer_stage;  // pipeline rank of the other side; -1 for forward/backward
  bool operator==(const PipeAction&) const = default;
};

std::string to_string(PipeOp op);
std::string to_string(const PipeAction& a);  // "send_forward mb=3 chunk=1 peer=2"

// p = 1: forward then backward of each microbatch (plain gradient accumulation).
std::vector<PipeAction> schedule_no_pipelining(int64_t m);
// All forwards, then all backwards (in the same microbatch order).
std::vector<PipeAction> schedule_gpipe(int64_t p, int64_t r, int64_t m);
// Megatron's non-interleaved 1F1B: min(p-r-1, m) warmup forwards, then one forward
// one backward, then the cooldown backwards.
std::vector<PipeAction> schedule_1f1b(int64_t p, int64_t r, int64_t m);
// Megatron's interleaved 1F1B with microbatch groups of G = p. v == 1 gives
// schedule_1f1b. InputError unless p >= 2 (for v > 1), v >= 1 and m % p == 0.
std::vector<PipeAction> schedule_interleaved_1f1b(int64_t p, int64_t r, int64_t m, int64_t v);

// The table the trainer's executor runs: no pipelining when p == v == 1, interleaved
// 1F1B when v > 1, else 1F1B (InputError as those).
std::vector<PipeAction> schedule_for(int64_t p, int64_t r, int64_t m, int64_t v);

// When a send's buffer may be released. Waiting for a nonblocking send at an arbitrary
// point can deadlock (the peer may not receive it until this rank does something more);
// waiting once the peer's matching receive is known to have started cannot (MPI's
// progress rule: a send whose matching receive has started completes without further
// calls by the receiver). This rank knows it only through the messages it received:
// the schedules of all p ranks are simulated under the executor contract with vector
// clocks carried by the pipeline messages, and a send is due after the first receive
// of this rank's table at which the clock shows the peer past its matching receive.
// (Collectives inside forward/backward also order ranks; they are ignored, so the
// points are late, never early.) Returns, for rank r's table (schedule_for), one entry
// per action: for a send, the index of the action after which to wait for it, or the
// table's size when only the end of the step is known safe; -1 for the other actions.
std::vector<int64_t> send_release_points(int64_t p, int64_t r, int64_t m, int64_t v);
// The same for every rank at once (one simulation): element q is rank q's.
std::vector<std::vector<int64_t>> send_release_points_all(int64_t p, int64_t m, int64_t v);

// Warmup forwards of the interleaved schedule on rank r (see above).
int64_t interleaved_warmup(int64_t p, int64_t r, int64_t m, int64_t v);
// Largest number of forwards in the table whose backward has not run yet.
int64_t max_in_flight(const std::vector<PipeAction>& actions);

}  // namespace mtnlg::schedules
