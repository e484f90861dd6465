// Host memory on the device's side of copies (staging.cpp): small host-to-device uploads
// staged in pinned memory so they return without waiting, and the cache of page-locked
// buffers behind Tensor::empty_pinned. Included by core/cuda/device.hpp.
#pragma once
#include <cstdint>

namespace mtnlg::cuda {

// Host-to-device copies of at most 4 MiB (token ids, loss masks) return without waiting:
// the source is staged in pinned memory and copied on the backend stream. The count of
// such uploads since start-up.
int64_t async_uploads();
// Bytes of page-locked host memory held for Tensor::empty_pinned (checkpoint snapshots).
int64_t pinned_host_bytes();

// Installs the copy and pinned-host hooks into cuda_allocator_hooks() (core/tensor.hpp):
// copies between host and device go through the staging ring or wait for the stream, and
// copies from or to the host are refused inside a CUDA graph capture. Called by init_backend.
void install_staging_hooks();

}  // namespace mtnlg::cuda
