#include "model/tp_regions.hpp"

#include "core/ops.hpp"

namespace mtnlg::model::tp {

namespace {
bool trivial(parallel::Communicator* comm) { return comm == nullptr || comm->size() == 1; }
}  // namespace

// Payloads travel in the tensor's own dtype (bf16 activations as bf16, f32 statistics as f32).
void all_reduce(parallel::Communicator* comm, Tensor& x, parallel::ReduceOp op) {
  if (trivial(comm)) return;
  comm->all_reduce(x.raw(), x.numel(), x.dtype(), op);
}

void all_gather_rows(parallel::Communicator* comm, const Tensor& in, Tensor& out) {
  if (trivial(comm)) {
    ops::copy(out, in);
    return;
  }
  MTNLG_CHECK(out.numel() == in.numel() * comm->size() && out.dtype() == in.dtype(), "all_gather_rows: {} {} vs {} {}",
              out.numel(), to_string(out.dtype()), in.numel(), to_string(in.dtype()));
  comm->all_gather(in.raw(), out.raw(), in.numel(), in.dtype());
}

void reduce_scatter_rows(parallel::Communicator* comm, const Tensor& in, Tensor& out) {
  if (trivial(comm)) {
    ops::copy(out, in);
    return;
  }
  MTNLG_CHECK(in.numel() == out.numel() * comm->size() && out.dtype() == in.dtype(),
              "reduce_scatter_rows: {} {} vs {} {}", in.numel(), to_string(in.dtype()), out.numel(),
              to_string(out.dtype()));
  comm->reduce_scatter(in.raw(), out.raw(), out.numel(), in.dtype());
}

Tensor enter_column_parallel_forward(parallel::Communicator* comm, bool sp, const Tensor& x) {
  if (!sp || trivial(comm)) return x;  // copy_to_tp: identity
  int64_t g = comm->size();
  Tensor full = Tensor::empty({x.dim(0) * g, x.dim(1)}, x.dtype(), x.device());
  all_gather_rows(comm, x, full);  // gather_from_sp
  return full;
}

Tensor enter_column_parallel_backward(parallel::Communicator* comm, bool sp, Tensor& dfull) {
  if (trivial(comm)) return dfull;
  if (!sp) {  // copy_to_tp backward: all-reduce
    all_reduce(comm, dfull);
    return dfull;
  }
  Tensor local = Tensor::empty({dfull.dim(0) / comm->size(), dfull.dim(1)}, dfull.dtype(), dfull.device());
  reduce_scatter_rows(comm, dfull, local);  // gather_from_sp backward: reduce-scatter
  return local;
}

Tensor leave_row_parallel_forward(parallel::Communicator* comm, bool sp, Tensor& partial) {
  if (trivial(comm)) return partial;
  if (!sp) {  // reduce_from_tp: all-reduce
    all_reduce(comm, partial);
    return partial;
  }
  Tensor local = Tensor::empty({partial.dim(0) / comm->size(), partial.dim(1)}, partial.dtype(), partial.device());
  reduce_scatter_rows(comm, partial, local);  // scatter_to_sp
  return local;
}

Tensor leave_row_parallel_backward(parallel::Communicator* comm, bool sp, const Tensor& dlocal) {
  if (!sp || trivial(comm)) return dlocal;  // reduce_from_tp backward: identity
  Tensor full = Tensor::empty({dlocal.dim(0) * comm->size(), dlocal.dim(1)}, dlocal.dtype(), dlocal.device());
  all_gather_rows(comm, dlocal, full);  // scatter_to_sp backward: all-gather
  return full;
}

}  // namespace mtnlg::model::tp
