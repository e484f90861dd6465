#include "planner/gpu_profile.hpp"

#include <fstream>
#include <utility>

#include "core/error.hpp"

namespace mtnlg::cost {

namespace {
constexpr const char* kProfileFormat = "mtnlg-gpu-profile/1";
}  // namespace

nlohmann::json gpu_profile_json(const GpuSpec& g) {
  return {{"format", kProfileFormat},
          {"name", g.name},
          {"description", g.description},
          {"peak_flops", g.peak_flops},
          {"gemm_eff_max", g.gemm_eff_max},
          {"sm_count", g.sm_count},
          {"memory_bytes", g.memory_bytes},
          {"hbm_bw", g.hbm_bw},
          {"nvlink_bus_bw", g.nvlink_bus_bw},
          {"ib_bw", g.ib_bw},
          {"nvlink_alpha", g.nvlink_alpha},
          {"ib_alpha", g.ib_alpha},
          {"kernel_overhead", g.kernel_overhead},
          {"compute_slots", g.compute_slots},
          {"gemm_k_half", g.gemm_k_half},
          {"attn_fwd_flops", g.attn_fwd_flops},
          {"attn_bwd_flops", g.attn_bwd_flops},
          {"attn_seq_half", g.attn_seq_half},
          {"attn_dim_half", g.attn_dim_half},
          {"hbm_peak_bw", g.hbm_peak_bw}};
}

GpuSpec load_gpu_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_input("--gpu-profile {}: cannot open", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw_input("--gpu-profile {}: not JSON ({})", path, e.what());
  }
  if (!j.is_object() || j.value("format", "") != kProfileFormat)
    throw_input("--gpu-profile {}: not a GPU profile (\"format\": \"{}\" missing)", path, kProfileFormat);
  GpuSpec g;
  auto num = [&](const char* k) {
    if (!j.contains(k) || !j[k].is_number() || !(j[k].get<double>() > 0))
      throw_input("--gpu-profile {}: field {} must be a positive number", path, k);
    return j[k].get<double>();
  };
  g.name = j.value("name", std::string("profile"));
  g.description = j.value("description", std::string("GPU profile ") + path);
  g.peak_flops = num("peak_flops");
  g.gemm_eff_max = num("gemm_eff_max");
  g.sm_count = static_cast<int64_t>(num("sm_count"));
  g.memory_bytes = num("memory_bytes");
  g.hbm_bw = num("hbm_bw");
  g.nvlink_bus_bw = num("nvlink_bus_bw");
  g.ib_bw = num("ib_bw");
  g.nvlink_alpha = num("nvlink_alpha");
  g.ib_alpha = num("ib_alpha");
  g.kernel_overhead = num("kernel_overhead");
  if (j.contains("compute_slots")) {  // optional (0: one device per process)
    if (!j["compute_slots"].is_number() || j["compute_slots"].get<double>() < 0)
      throw_input("--gpu-profile {}: field compute_slots must be a number >= 0", path);
    g.compute_slots = j["compute_slots"].get<double>();
  }
  // Optional (profiles written before the GEMM curve, the fused-attention rates and the
  // data-sheet bandwidth): the curve's default K/(K+64), no fused-attention entry, no
  // physical bounds on a calibration from it.
  for (auto [key, field] :
       {std::pair{"gemm_k_half", &g.gemm_k_half}, std::pair{"attn_fwd_flops", &g.attn_fwd_flops},
        std::pair{"attn_bwd_flops", &g.attn_bwd_flops}, std::pair{"attn_seq_half", &g.attn_seq_half},
        std::pair{"attn_dim_half", &g.attn_dim_half}, std::pair{"hbm_peak_bw", &g.hbm_peak_bw}}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_number() || j[key].get<double>() < 0)
      throw_input("--gpu-profile {}: field {} must be a number >= 0", path, key);
    *field = j[key].get<double>();
  }
  return g;
}

}  // namespace mtnlg::cost
