// NCCL backend of Communicator (parallel/communicator.hpp) for tensors that live on the
// GPU: every pointer passed to it is a DEVICE pointer on the backend device
// (core/cuda/device.hpp). The trainer uses it for the tp/pp/dp/embedding groups when
// the model runs on CUDA; the MPI communicator stays the bootstrap (the NCCL unique
// id travels through its all_reduce) and the host-side channel (config checks, abort).
//
// Stream order. Collectives and recv() are enqueued on the backend compute stream and
// return at once: later kernels on that stream, and any copy back to the host, see the
// result (that replaces the "blocks until done" of the MPI backend; the data is on the
// device anyway). isend() runs on a separate send stream after the work already queued
// on the compute stream, so the buffer holds the values it had when isend was called;
// Request::wait() blocks the host until the send is complete; send() is isend + wait.
// iall_reduce() runs on a side stream (overlapping later compute) and its wait() makes
// the compute stream wait for it without blocking the host. barrier() synchronises
// the host.
//
// Point-to-point. NCCL has no tags (the argument is ignored; per-pair order is the
// posting order) and serialises the operations issued on one communicator. So that an
// isend followed by a recv on both sides of a pair cannot wait on each other, a group
// holds three NCCL communicators: one for collectives, one for messages from a lower
// to a higher rank ("up") and one for the other direction ("down").
//
// Built only with MTNLG_HAVE_NCCL (CUDA build with libnccl found; CPU-only builds do
// not compile nccl_*.cpp at all): have_nccl() says which, and make_nccl_communicator
// is declared only when it exists, so callers guard it with #ifdef MTNLG_HAVE_NCCL.
#pragma once
#include <memory>
#include <string>

#include "parallel/communicator.hpp"

namespace mtnlg::parallel {

inline bool have_nccl() {
#ifdef MTNLG_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

#ifdef MTNLG_HAVE_NCCL
// Collective over `bootstrap` (every rank calls it): creates an NCCL group with the same
// ranks, named `name`. Requires cuda::init_backend() on every rank first. A bootstrap of
// one rank gets a LocalCommunicator whose copies are device copies instead (no NCCL set-up
// for a group of one), unless `even_for_one` (the single-GPU test of the NCCL backend).
// The three NCCL communicators are non-blocking (ncclCommInitRankConfig, blocking = 0):
// initialisation waits for ncclCommGetAsyncError to report success, at most the
// collective timeout (parallel/watchdog.hpp), then aborts and throws naming the group.
// Every operation goes through the device watchdog (parallel/flight_recorder.hpp): it is
// recorded with CUDA events around it while the watchdog runs, and the group's
// communicators can be aborted from its thread. `world_rank` (>= 0) names the members'
// world ranks in the flight recorder (one small all-reduce over the bootstrap).
std::shared_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, const std::string& name,
                                                     bool even_for_one = false, int64_t world_rank = -1);
#endif

}  // namespace mtnlg::parallel
