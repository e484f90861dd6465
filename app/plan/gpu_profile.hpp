// GPU profile files ("format": "mtnlg-gpu-profile/1"), written by `mtnlg plan
// --calibrate` and read by `plan --gpu-profile` and `report --gpu-profile`.
#pragma once
#include <string>

#include "planner/cost_model.hpp"

namespace mtnlg::app {

// Throws InputError (exit 2) naming the file and the field when it is not a profile.
cost::GpuSpec load_gpu_profile(const std::string& path);

}  // namespace mtnlg::app
