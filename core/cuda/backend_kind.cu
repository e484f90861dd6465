// cuda::emulated_backend() (core/cuda/backend_kind.hpp): this file is compiled for each
// CUDA backend, by nvcc for a GPU and by g++ for the emulated one, where
// emulator/cuda_emu.hpp (force-included) defines MTNLG_CUDA_EMULATE.
#include "core/cuda/backend_kind.hpp"

namespace mtnlg::cuda {

bool emulated_backend() {
#ifdef MTNLG_CUDA_EMULATE
  return true;
#else
  return false;
#endif
}

}  // namespace mtnlg::cuda
