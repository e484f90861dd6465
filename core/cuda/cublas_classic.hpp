// Classic cuBLAS's handle, the GEMM fallback of core/cuda/gemm.cu: created by
// init_backend (core/cuda/device.cpp) on the backend stream with the backend's workspace,
// so that nothing about it changes later, inside a CUDA graph capture least of all
// (cublasCreate allocates device memory; cublasSetStream resets the handle to cuBLAS's
// default workspace pool, which CUDA >= 12.2 allocates inside a captured graph).
#pragma once
#include <cublas_api.h>

namespace mtnlg::cuda {

cublasHandle_t cublas_classic();

}  // namespace mtnlg::cuda
