// The CUDA entries of the mixture-of-experts ops (core/cuda/moe.cu), declared from their
// one declaration in core/moe_ops.hpp as core/cuda/ops_cuda.hpp does for the rest of the
// op set; a header of its own, so that the op set's kernels do not depend on the MoE
// ops. The router's GEMM is composed of convert and matmul, and the dispatch plan and the
// capacity are made on the host, by core/ops/moe.cpp for both devices, except the padded
// plan (fixed sizes), made here on the device.
#pragma once
#include "core/moe_ops.hpp"

namespace mtnlg::cuda {

#define MTNLG_CUDA_MOE_OP(name) decltype(::mtnlg::ops::name) name;
MTNLG_CUDA_MOE_OP(moe_router_logits_forward)   // the f64 router's only (kernels in double)
MTNLG_CUDA_MOE_OP(moe_router_logits_backward)  // the same
MTNLG_CUDA_MOE_OP(moe_topk_forward)            // a thread per row, in double (the CPU's choices)
MTNLG_CUDA_MOE_OP(moe_topk_backward)
MTNLG_CUDA_MOE_OP(moe_sinkhorn)  // one block, the rounds on the device
MTNLG_CUDA_MOE_OP(moe_aux_scores_forward)
MTNLG_CUDA_MOE_OP(moe_aux_scores_backward)
MTNLG_CUDA_MOE_OP(moe_aux_loss_forward)  // synchronises (the loss comes back to the host) unless given acc
MTNLG_CUDA_MOE_OP(moe_aux_loss_backward)
MTNLG_CUDA_MOE_OP(moe_z_loss_forward)  // synchronises unless given acc
MTNLG_CUDA_MOE_OP(moe_z_loss_backward)
MTNLG_CUDA_MOE_OP(moe_padded_dispatch_plan)  // a thread per slot, O(slots) each
MTNLG_CUDA_MOE_OP(moe_record_routing)
MTNLG_CUDA_MOE_OP(moe_permute)
MTNLG_CUDA_MOE_OP(moe_unpermute)
MTNLG_CUDA_MOE_OP(moe_weight_rows_forward)
MTNLG_CUDA_MOE_OP(moe_weight_rows_backward)
MTNLG_CUDA_MOE_OP(grouped_matmul_forward)  // cublasGemmGroupedBatchedEx, one problem per expert
MTNLG_CUDA_MOE_OP(grouped_matmul_backward)
MTNLG_CUDA_MOE_OP(moe_expert_bias_update)
MTNLG_CUDA_MOE_OP(sigmoid_gate_forward)
MTNLG_CUDA_MOE_OP(sigmoid_gate_backward)
MTNLG_CUDA_MOE_OP(moe_jitter)
#undef MTNLG_CUDA_MOE_OP

}  // namespace mtnlg::cuda
