// Tensor-parallel regions as named forward/backward pairs (Megatron's mappings):
//
//   copy_to_tp           forward: identity          backward: all-reduce (sum)
//   reduce_from_tp       forward: all-reduce (sum)  backward: identity
//   gather_from_sp       forward: all-gather rows   backward: reduce-scatter rows
//   scatter_to_sp        forward: reduce-scatter    backward: all-gather rows
//
// "rows" are the tokens of a micro batch (sample-major); with sequence parallelism
// each tp rank holds a contiguous block of rows/tp of the residual stream. The model
// calls the forward of a pair in its forward pass and the matching backward in its
// backward pass, so each collective appears exactly where Megatron's autograd puts it.
// On a group of one every function is a copy or a no-op.
#pragma once
#include "core/tensor.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::model::tp {

// In place all-reduce of x over `comm`, in x's dtype.
void all_reduce(parallel::Communicator* comm, Tensor& x, parallel::ReduceOp op = parallel::ReduceOp::sum);
// out [rows*size, C] = rows of every rank in rank order; in [rows, C].
void all_gather_rows(parallel::Communicator* comm, const Tensor& in, Tensor& out);
// out [rows/size, C] = this rank's block of the sum of every rank's in [rows, C].
void reduce_scatter_rows(parallel::Communicator* comm, const Tensor& in, Tensor& out);

// The pairs. `sp` selects the sequence-parallel variant of a region boundary.
// Entering a column-parallel GEMM: x (local rows) -> full rows, identical on all ranks.
Tensor enter_column_parallel_forward(parallel::Communicator* comm, bool sp, const Tensor& x);
Tensor enter_column_parallel_backward(parallel::Communicator* comm, bool sp, Tensor& dfull);
// Leaving a row-parallel GEMM: partial sums (full rows) -> reduced (local rows).
Tensor leave_row_parallel_forward(parallel::Communicator* comm, bool sp, Tensor& partial);
Tensor leave_row_parallel_backward(parallel::Communicator* comm, bool sp, const Tensor& dlocal);

}  // namespace mtnlg::model::tp
