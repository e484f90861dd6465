// GPU profile files ("format": "mtnlg-gpu-profile/1"): a GpuSpec as JSON, written by
// `mtnlg plan --calibrate` and read by `plan --gpu-profile` and `report --gpu-profile`.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "planner/cost_model.hpp"

namespace mtnlg::cost {

// The profile file's JSON for a GPU (its "format" line first).
nlohmann::json gpu_profile_json(const GpuSpec& g);
// Throws InputError (exit 2) naming the file and the field when it is not a profile.
GpuSpec load_gpu_profile(const std::string& path);

}  // namespace mtnlg::cost
