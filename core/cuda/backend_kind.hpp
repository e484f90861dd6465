// Which CUDA backend this binary is linked with: the emulated one (emulator/: the kernels
// on the CPU) or a GPU's. A property of the build, defined in backend_kind.cu, which is
// compiled once for each backend; host code asks it instead of matching the device's name.
#pragma once

namespace mtnlg::cuda {

bool emulated_backend();

}  // namespace mtnlg::cuda
