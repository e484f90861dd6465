// Collective watchdog (docs/RELIABILITY.md, class 8): a rank that stops answering
// (SIGSTOP, a wedged kernel, an endless loop) must not leave its peers waiting forever.
//
// With a timeout T > 0, the MPI backend issues every host-side collective and
// point-to-point transfer in its nonblocking form and polls it (MPI_Test, spinning,
// then yielding, then sleeping up to 0.2 ms once it has waited 0.1 s). A wait that
// passes T asks every rank of the world, over a private duplicate of MPI_COMM_WORLD,
// where it is; ranks answer from inside their own waits. A rank that gives no answer
// within a short grace (T/4, clamped to 1..10 s) is wedged or gone; one that answers
// but has not started this collective is waiting somewhere else. The lowest-ranked
// rank that did arrive prints one line
//   error: rank R (tp=..,pp=..,dp=.. host H) did not arrive at collective #N
//          (all_reduce, group dp) after T s: ...
// and calls MPI_Abort(MPI_COMM_WORLD, 1), so the launcher ends the job non-zero.
// The other ranks that timed out do the same after a further grace, should it fail to.
// N counts the collectives started on that group since it was created, from 1 (every
// rank starts them in the same order, so N is the same on every rank).
//
// T = 0 turns the watchdog off: the blocking MPI calls are used as before. The
// process-wide setting is off until a command sets it (`train` and `eval` do, from
// parallel.distributed_timeout_minutes, default 10 minutes); the environment variable
// MTNLG_COLLECTIVE_TIMEOUT (seconds, 0 = off) overrides it in every command.
// The GPU path (NCCL) has its own watchdog, with the same timeout: parallel/flight_recorder.hpp.
#pragma once
#include "parallel/topology.hpp"

namespace mtnlg::parallel {

// Sets the timeout the command asks for, in seconds (0 = off). MTNLG_COLLECTIVE_TIMEOUT,
// when set, wins. InputError when the variable is not a number >= 0, or when
// `seconds` is negative or not finite.
void set_collective_timeout(double seconds);
// The timeout in force, in seconds (0 = off); reads MTNLG_COLLECTIVE_TIMEOUT on first use.
double collective_timeout();
// The layout the world is split into; the watchdog names ranks by its coordinates.
// make_groups sets it.
void set_watchdog_topology(const Topology& topo);
// "rank 3 (tp=1,pp=1,dp=0 host node7)": coordinates when a topology of this world
// size is set, the host when known (`host` empty: left out).
std::string describe_rank(int64_t world_rank, const std::string& host);
// "tp=1,pp=1,dp=0" for a rank of the topology set, else "".
std::string rank_coord(int64_t world_rank);
// This machine's host name ("" when it cannot be read).
std::string host_name();

}  // namespace mtnlg::parallel
