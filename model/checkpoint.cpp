#include "model/checkpoint.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/atomic_file.hpp"
#include "core/log.hpp"
#include "core/safetensors.hpp"
#include "core/ops.hpp"
#include "core/crc32c.hpp"

namespace fs = std::filesystem;

namespace mtnlg::model::ckpt {

std::string iteration_dir(const std::string& root, int64_t it) { return fmt::format("{}/iter_{:07d}", root, it); }
std::string partial_dir(const std::string& root, int64_t it) { return iteration_dir(root, it) + ".partial"; }
std::string model_file(int64_t tp, int64_t pp) { return fmt::format("model_tp{:02d}_pp{:03d}.safetensors", tp, pp); }
std::string optim_file(int64_t tp, int64_t pp, int64_t dp) {
  return fmt::format("optim_tp{:02d}_pp{:03d}_dp{:03d}.safetensors", tp, pp, dp);
}
std::string expert_model_file(int64_t etp, int64_t ep, int64_t pp) {
  return fmt::format("model_experts_etp{:02d}_ep{:03d}_pp{:03d}.safetensors", etp, ep, pp);
}
std::string expert_optim_file(int64_t etp, int64_t ep, int64_t pp, int64_t edp) {
  return fmt::format("optim_experts_etp{:02d}_ep{:03d}_pp{:03d}_dp{:03d}.safetensors", etp, ep, pp, edp);
}

namespace {

uint32_t checksum(const Tensor& t) { return crc32c(t.raw(), static_cast<size_t>(t.nbytes())); }

nlohmann::json slice_json(const ParamInfo& p, int64_t flat_begin, int64_t flat_end, uint32_t crc) {
  nlohmann::json j = {{"global_shape", p.global_shape}, {"shape", p.shape},
                      {"split_dim", p.split_dim},       {"split_rank", p.split_rank},
                      {"split_count", p.split_count},   {"flat_begin", flat_begin},
                      {"flat_end", flat_end},           {"crc32c", crc}};
  if (p.split_parts > 1) j["split_parts"] = p.split_parts;  // absent: one part
  return j;
}

}  // namespace

namespace {
// The snapshot of the store's flat elements [begin, end), which hold whole parameters.
Snapshot region_snapshot(const ParamStore& store, const OptimShard* opt, int64_t begin, int64_t end, bool write_model,
                         bool write_optim) {
  Snapshot s;
  for (ParamInfo p : store.infos())
    if (p.offset >= begin && p.offset < end) {
      p.offset -= begin;
      s.infos.push_back(std::move(p));
    }
  s.write_model = write_model;
  s.write_optim = write_optim && opt != nullptr;
  // On a GPU the step stalls only for these copies into pinned host memory (DMA speed);
  // the files are written from the snapshot by the caller's writer thread.
  auto to_host = [](const Tensor& t) {
    if (t.device() != Device::cuda) return t.to(Device::cpu);
    Tensor h = Tensor::empty_pinned(t.shape(), t.dtype());
    h.copy_from(t);
    return h;
  };
  if (write_model) s.params = to_host(store.params().flat(begin, end - begin));
  if (s.write_optim) {
    s.opt_begin = opt->begin - begin;
    s.opt_end = opt->end - begin;
    s.exp_avg = to_host(*opt->exp_avg);
    s.exp_avg_sq = to_host(*opt->exp_avg_sq);
  }
  return s;
}
}  // namespace

Snapshot take_snapshot(const ParamStore& store, const OptimShard* opt, int64_t tp_rank, int64_t pp_rank,
                       int64_t dp_rank, bool write_model, bool write_optim) {
  Snapshot s = region_snapshot(store, opt, 0, store.expert_offset(), write_model, write_optim);
  s.model_name = model_file(tp_rank, pp_rank);
  s.optim_name = optim_file(tp_rank, pp_rank, dp_rank);
  return s;
}

Snapshot take_expert_snapshot(const ParamStore& store, const OptimShard* opt, int64_t etp_rank, int64_t ep_rank,
                              int64_t pp_rank, int64_t edp_rank, bool write_model, bool write_optim) {
  Snapshot s = region_snapshot(store, opt, store.expert_offset(), store.numel(), write_model, write_optim);
  s.model_name = expert_model_file(etp_rank, ep_rank, pp_rank);
  s.optim_name = expert_optim_file(etp_rank, ep_rank, pp_rank, edp_rank);
  return s;
}

void write_snapshot(const std::string& dir, const Snapshot& s) {
  fs::create_directories(dir);
  if (s.write_model) {
    std::vector<safetensors::Entry> entries;
    nlohmann::json meta = nlohmann::json::object();
    for (auto& p : s.infos) {
      Tensor t = s.params.flat(p.offset, p.numel).view(p.shape);
      entries.push_back({p.name, t});
      meta[p.name] = slice_json(p, 0, p.numel, checksum(t));
    }
    safetensors::write(
        dir + "/" + s.model_name, entries,
        {{"format", "mtnlg-checkpoint"}, {"version", std::to_string(kFormatVersion)}, {"tensors", meta.dump()}});
  }
  if (s.write_optim) {
    std::vector<safetensors::Entry> entries;
    nlohmann::json meta = nlohmann::json::object();
    for (auto& p : s.infos) {
      int64_t b = std::max(s.opt_begin, p.offset), e = std::min(s.opt_end, p.offset + p.numel);
      if (b >= e) continue;
      for (int which = 0; which < 2; ++which) {
        const Tensor& src = which == 0 ? s.exp_avg : s.exp_avg_sq;
        std::string name = (which == 0 ? "exp_avg." : "exp_avg_sq.") + p.name;
        Tensor t = src.flat(b - s.opt_begin, e - b);
        entries.push_back({name, t});
        meta[name] = slice_json(p, b - p.offset, e - p.offset, checksum(t));
      }
    }
    safetensors::write(
        dir + "/" + s.optim_name, entries,
        {{"format", "mtnlg-checkpoint"}, {"version", std::to_string(kFormatVersion)}, {"tensors", meta.dump()}});
  }
}

void write_metadata(const std::string& dir, const TrainState& st) {
  fs::create_directories(dir);
  nlohmann::json j = {{"format", "mtnlg-checkpoint"},
                      {"format_version", kFormatVersion},
                      {"iteration", st.iteration},
                      {"consumed_samples", st.consumed_samples},
                      {"consumed_tokens", st.consumed_tokens},
                      {"optimizer_steps", st.optimizer_steps},
                      {"per_source_samples", st.per_source_samples},
                      {"skipped_total", st.skipped_total},
                      {"nan_total", st.nan_total},
                      {"loss_scaler", st.loss_scaler},
                      {"loss_scale", st.loss_scale},
                      {"loss_scale_skipped", st.loss_scale_skipped},
                      {"loss_scale_good_steps", st.loss_scale_good_steps},
                      {"loss_scale_hysteresis", st.loss_scale_hysteresis},
                      {"seed", st.seed},
                      {"layout",
                       {{"tensor_model_parallel_size", st.layout.tp},
                        {"pipeline_model_parallel_size", st.layout.pp},
                        {"data_parallel_size", st.layout.dp},
                        {"virtual_chunks", st.layout.virtual_chunks},
                        {"use_distributed_optimizer", st.layout.zero1}}},
                      {"recipe", st.recipe_yaml}};
  if (st.layout.cp > 1) j["layout"]["context_parallel_size"] = st.layout.cp;
  if (st.layout.ep > 0) {
    j["layout"]["expert_model_parallel_size"] = st.layout.ep;
    j["layout"]["expert_tensor_parallel_size"] = st.layout.etp;
    j["layout"]["expert_data_parallel_size"] = st.layout.edp;
  }
  write_file_atomic(dir + "/metadata.json", j.dump(2) + "\n");
}

void commit(const std::string& root, int64_t iteration, int64_t keep_last) {
  std::string part = partial_dir(root, iteration), final_dir = iteration_dir(root, iteration);
  if (fs::exists(final_dir)) fs::remove_all(final_dir);
  fs::rename(part, final_dir);
  write_file_atomic(root + "/latest", std::to_string(iteration) + "\n");
  if (keep_last > 0) {
    std::vector<int64_t> its;
    for (auto& e : fs::directory_iterator(root)) {
      std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("iter_", 0) == 0 && n.find('.') == std::string::npos) {
        try {
          its.push_back(std::stoll(n.substr(5)));
        } catch (...) {}
      }
    }
    std::sort(its.begin(), its.end());
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < its.size(); ++i)
      if (its[i] != iteration) fs::remove_all(iteration_dir(root, its[i]));
  }
}

std::vector<int64_t> committed_iterations(const std::string& root) {
  std::vector<int64_t> its;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return its;
  for (auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() < 6 || n.rfind("iter_", 0) != 0 || n.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    if (n.size() - 5 > 18) continue;  // not an iteration this program could have written
    if (!fs::exists(e.path() / "metadata.json", ec)) continue;
    its.push_back(std::stoll(n.substr(5)));
  }
  std::sort(its.begin(), its.end());
  return its;
}

std::optional<int64_t> latest_iteration(const std::string& root) {
  std::ifstream f(root + "/latest");
  if (!f) {
    // `latest` is replaced last, by rename: it is missing only when its write failed (a
    // full disk) or someone removed it. The committed directories are the truth.
    auto its = committed_iterations(root);
    if (its.empty()) return std::nullopt;
    log::warn("{}/latest is missing; using the newest committed checkpoint {}", root, iteration_dir(root, its.back()));
    return its.back();
  }
  std::string s;
  std::getline(f, s);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || v < 0 || errno == ERANGE || end == s.c_str() || (*end != '\0' && *end != '\n' && *end != ' '))
    throw_input("{}/latest: expected an iteration number, found \"{}\"", root, s);
  if (!fs::exists(iteration_dir(root, v) + "/metadata.json"))
    throw_input("{}/latest names iteration {} but {} has no metadata.json", root, v, iteration_dir(root, v));
  return v;
}

std::string resolve(const std::string& path) {
  if (fs::exists(path + "/metadata.json")) return path;
  if (!fs::exists(path)) throw_input("{}: no such checkpoint directory", path);
  auto it = latest_iteration(path);
  if (!it) throw_input("{}: no checkpoint here (no `latest` file and no metadata.json)", path);
  return iteration_dir(path, *it);
}

TrainState read_metadata(const std::string& dir) {
  std::string path = dir + "/metadata.json";
  std::ifstream f(path);
  if (!f) throw_input("{}: missing (not a complete mtnlg checkpoint)", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw_input("{}: not valid JSON: {}", path, e.what());
  }
  TrainState st;
  try {
    if (j.value("format", "") != "mtnlg-checkpoint") throw_input("{}: not an mtnlg checkpoint", path);
    int v = j.at("format_version").get<int>();
    if (v != kFormatVersion)
      throw_input("{}: format version {} is not supported (this mtnlg reads {})", path, v, kFormatVersion);
    st.iteration = j.at("iteration").get<int64_t>();
    st.consumed_samples = j.at("consumed_samples").get<int64_t>();
    st.consumed_tokens = j.at("consumed_tokens").get<int64_t>();
    st.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    st.per_source_samples = j.at("per_source_samples").get<std::vector<int64_t>>();
    st.skipped_total = j.at("skipped_total").get<int64_t>();
    st.nan_total = j.at("nan_total").get<int64_t>();
    st.loss_scaler = j.value("loss_scaler", false);  // absent in checkpoints written before fp16 training
    st.loss_scale_skipped = j.value("loss_scale_skipped", int64_t{0});
    st.loss_scale = j.at("loss_scale").get<double>();
    st.loss_scale_good_steps = j.at("loss_scale_good_steps").get<int64_t>();
    st.loss_scale_hysteresis = j.at("loss_scale_hysteresis").get<int64_t>();
    st.seed = j.at("seed").get<uint64_t>();
    auto& l = j.at("layout");
    st.layout.tp = l.at("tensor_model_parallel_size").get<int64_t>();
    st.layout.pp = l.at("pipeline_model_parallel_size").get<int64_t>();
    st.layout.dp = l.at("data_parallel_size").get<int64_t>();
    st.layout.virtual_chunks = l.at("virtual_chunks").get<int64_t>();
    st.layout.zero1 = l.at("use_distributed_optimizer").get<bool>();
    st.layout.cp = l.value("context_parallel_size", int64_t{1});
    st.layout.ep = l.value("expert_model_parallel_size", int64_t{0});
    st.layout.edp = l.value("expert_data_parallel_size", int64_t{1});
    st.layout.etp = l.value("expert_tensor_parallel_size", int64_t{1});
    st.recipe_yaml = j.at("recipe").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw_input("{}: {}", path, e.what());
  }
  if (st.layout.tp < 1 || st.layout.pp < 1 || st.layout.dp < 1 || st.layout.tp > 4096 || st.layout.pp > 65536 ||
      st.layout.dp > (int64_t{1} << 24) || st.layout.virtual_chunks < 1 || st.layout.virtual_chunks > 65536 ||
      st.layout.cp < 1 || st.layout.cp > 65536 || st.layout.ep < 0 || st.layout.ep > 65536 || st.layout.edp < 1 ||
      st.layout.edp > (int64_t{1} << 24) || st.layout.etp < 1 || st.layout.etp > 4096)
    throw_input("{}: impossible layout tp={} pp={} dp={}", path, st.layout.tp, st.layout.pp, st.layout.dp);
  // Counters: state, not a cache, so an impossible value is an error rather than a run
  // that trains "iteration -4".
  auto count = [&](const char* key, int64_t v, int64_t hi) {
    if (v < 0 || v > hi) throw_input("{}: \"{}\" is {}, impossible (expected 0..{})", path, key, v, hi);
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  count("iteration", st.iteration, kMax);
  count("consumed_samples", st.consumed_samples, kMax);
  count("consumed_tokens", st.consumed_tokens, kMax);
  count("optimizer_steps", st.optimizer_steps, st.iteration);
  count("skipped_total", st.skipped_total, st.iteration);
  count("nan_total", st.nan_total, st.iteration);
  count("loss_scale_good_steps", st.loss_scale_good_steps, kMax);
  count("loss_scale_hysteresis", st.loss_scale_hysteresis, kMax);
  if (st.iteration > 0 && st.consumed_samples == 0)
    throw_input("{}: iteration {} with 0 consumed_samples is impossible", path, st.iteration);
  for (int64_t v : st.per_source_samples) count("per_source_samples", v, st.consumed_samples);
  if (!(std::isfinite(st.loss_scale) && st.loss_scale > 0))
    throw_input("{}: \"loss_scale\" is {}, impossible (expected a finite number > 0)", path, st.loss_scale);
  // The directory name and the file must agree (a copied or renamed directory).
  const std::string base = fs::path(dir).lexically_normal().filename().string();
  if (base.rfind("iter_", 0) == 0 && base.size() > 5 && base.find_first_not_of("0123456789", 5) == std::string::npos &&
      base.size() - 5 <= 18 && std::stoll(base.substr(5)) != st.iteration)
    throw_input("{}: \"iteration\" is {} but the directory is {}", path, st.iteration, base);
  return st;
}

namespace {

struct SavedSlice {
  Shape global_shape, shape;
  int64_t split_dim = -1, split_rank = 0, split_count = 1, flat_begin = 0, flat_end = 0;
  int64_t split_parts = 1;
  uint32_t crc = 0;
};

SavedSlice parse_slice(const nlohmann::json& m, const std::string& file, const std::string& name) {
  SavedSlice s;
  try {
    s.global_shape = m.at("global_shape").get<Shape>();
    s.shape = m.at("shape").get<Shape>();
    s.split_dim = m.at("split_dim").get<int64_t>();
    s.split_rank = m.at("split_rank").get<int64_t>();
    s.split_count = m.at("split_count").get<int64_t>();
    s.flat_begin = m.at("flat_begin").get<int64_t>();
    s.flat_end = m.at("flat_end").get<int64_t>();
    s.crc = m.at("crc32c").get<uint32_t>();
    s.split_parts = m.value("split_parts", int64_t{1});
  } catch (const nlohmann::json::exception& e) {
    throw_input("{}: tensor '{}': bad slice metadata: {}", file, name, e.what());
  }
  int64_t nd = static_cast<int64_t>(s.shape.size());
  bool ok = nd == static_cast<int64_t>(s.global_shape.size()) && nd > 0 && s.split_dim >= -1 && s.split_dim < nd &&
            s.split_count >= 1 && s.split_rank >= 0 && s.split_rank < s.split_count && s.flat_begin >= 0 &&
            s.flat_begin <= s.flat_end && s.split_parts >= 1 &&
            (s.split_parts == 1 || (s.split_dim >= 0 && s.shape[s.split_dim] % s.split_parts == 0 &&
                                    s.global_shape[s.split_dim] == s.shape[s.split_dim] * s.split_count));
  if (ok) {
    for (int64_t d = 0; d < nd; ++d) {
      if (s.shape[d] < 0 || s.global_shape[d] < 0) ok = false;
      int64_t lo = d == s.split_dim ? s.split_rank * s.shape[d] : 0;
      if (ok && lo + s.shape[d] > s.global_shape[d]) ok = false;
    }
    if (ok && s.flat_end > shape_numel(s.shape)) ok = false;
  }
  if (!ok) throw_input("{}: tensor '{}': inconsistent slice metadata (shape, split or range)", file, name);
  return s;
}

// Copies elements of a saved slice piece (`src`, flat range [flat_begin, flat_end) of the
// saved local shard) into `dst` (this rank's local shard of `p`, flat buffer offset
// p.offset), for destination flat indices inside [dst_lo, dst_hi) of the store. Returns
// the number of elements written.
int64_t scatter_slice(const SavedSlice& s, const float* src, const ParamInfo& p, float* dst_store, int64_t dst_lo,
                      int64_t dst_hi) {
  const int64_t nd = static_cast<int64_t>(s.shape.size());
  if (nd != static_cast<int64_t>(p.shape.size())) return 0;
  const int64_t my_lo = p.split_dim >= 0 ? p.split_rank * p.shape[p.split_dim] : 0;
  const int64_t saved_lo = s.split_dim >= 0 ? s.split_rank * s.shape[s.split_dim] : 0;
  // Fast path: identical shard geometry -> a straight copy of the overlapping range.
  if (s.shape == p.shape && s.global_shape == p.global_shape && s.split_dim == p.split_dim && saved_lo == my_lo &&
      s.split_parts == p.split_parts) {
    int64_t b = std::max(s.flat_begin, dst_lo - p.offset), e = std::min(s.flat_end, dst_hi - p.offset);
    if (b >= e) return 0;
    std::memcpy(dst_store + p.offset + b, src + (b - s.flat_begin), static_cast<size_t>(e - b) * sizeof(float));
    return e - b;
  }
  // General path: walk the saved elements with incremental coordinates.
  std::vector<int64_t> c(static_cast<size_t>(nd), 0);
  int64_t idx = s.flat_begin;
  for (int64_t d = nd - 1; d >= 0; --d) {
    c[d] = idx % s.shape[d];
    idx /= s.shape[d];
  }
  int64_t written = 0;
  for (int64_t e = s.flat_begin; e < s.flat_end; ++e) {
    // global coordinate on the split dim; others equal local
    int64_t my_flat = 0;
    bool inside = true;
    for (int64_t d = 0; d < nd; ++d) {
      int64_t g = d == s.split_dim && s.split_parts > 1
                      ? split_global_coord(c[d], s.shape[d], s.split_rank, s.split_count, s.split_parts)
                      : c[d] + (d == s.split_dim ? saved_lo : 0);
      int64_t l = d == p.split_dim && p.split_parts > 1
                      ? split_local_coord(g, p.shape[d], p.split_rank, p.split_count, p.split_parts)
                      : g - (d == p.split_dim ? my_lo : 0);
      if (l < 0 || l >= p.shape[d]) {
        inside = false;
        break;
      }
      my_flat = my_flat * p.shape[d] + l;
    }
    if (inside) {
      int64_t at = p.offset + my_flat;
      if (at >= dst_lo && at < dst_hi) {
        dst_store[at] = src[e - s.flat_begin];
        ++written;
      }
    }
    for (int64_t d = nd - 1; d >= 0; --d) {  // increment the coordinate
      if (++c[d] < s.shape[d]) break;
      c[d] = 0;
    }
  }
  return written;
}

// Elements of p (within [lo, hi) of the store) that lie inside the saved global shape:
// the rest (vocabulary padding beyond the saved one) legitimately has no source.
int64_t expected_elements(const ParamInfo& p, const Shape& saved_global, int64_t lo, int64_t hi) {
  const int64_t nd = static_cast<int64_t>(p.shape.size());
  const int64_t my_lo = p.split_dim >= 0 ? p.split_rank * p.shape[p.split_dim] : 0;
  bool all_inside = true;
  for (int64_t d = 0; d < nd; ++d)
    if ((d == p.split_dim ? my_lo : 0) + p.shape[d] > saved_global[d]) all_inside = false;
  int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
  if (b >= e) return 0;
  if (all_inside) return e - b;
  int64_t n = 0;
  std::vector<int64_t> c(static_cast<size_t>(nd));
  for (int64_t i = b - p.offset; i < e - p.offset; ++i) {
    int64_t idx = i;
    bool in = true;
    for (int64_t d = nd - 1; d >= 0; --d) {
      int64_t l = idx % p.shape[d];
      idx /= p.shape[d];
      if (l + (d == p.split_dim ? my_lo : 0) >= saved_global[d]) in = false;
    }
    n += in;
  }
  return n;
}

struct LoadedFile {
  std::string path;
  safetensors::File file;
  std::map<std::string, SavedSlice> slices;
};

LoadedFile open_ckpt_file(const std::string& path) {
  LoadedFile lf;
  lf.path = path;
  lf.file = safetensors::read(path);
  auto it = lf.file.metadata.find("tensors");
  if (lf.file.metadata["format"] != "mtnlg-checkpoint" || it == lf.file.metadata.end())
    throw_input("{}: not an mtnlg checkpoint shard (no slice metadata)", path);
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw_input("{}: slice metadata is not valid JSON: {}", path, e.what());
  }
  for (auto& name : lf.file.names) {
    if (!meta.contains(name)) throw_input("{}: tensor '{}' has no slice metadata", path, name);
    SavedSlice s = parse_slice(meta[name], path, name);
    const Tensor& t = lf.file.tensors[name];
    if (t.dtype() != DType::f32)
      throw_input("{}: tensor '{}': expected F32, found {}", path, name, safetensors::dtype_name(t.dtype()));
    if (t.numel() != s.flat_end - s.flat_begin)
      throw_input("{}: tensor '{}': {} elements but its slice says {}", path, name, t.numel(),
                  s.flat_end - s.flat_begin);
    if (checksum(t) != s.crc) throw_input("{}: tensor '{}': checksum mismatch (corrupted file)", path, name);
    lf.slices[name] = s;
  }
  return lf;
}

std::vector<std::string> files_with_prefix(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0 && e.path().extension() == ".safetensors") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Fills `dst` (store-flat coordinates, elements [lo, hi)) for tensors named prefix+param.
void fill_from(const std::string& dir, const std::string& file_prefix, const std::string& name_prefix,
               const std::vector<ParamInfo>& infos, float* dst, int64_t lo, int64_t hi, const std::string& what) {
  std::map<std::string, int64_t> written;
  std::map<std::string, Shape> saved_global;
  auto files = files_with_prefix(dir, file_prefix);
  if (files.empty()) throw_input("{}: no {}*.safetensors files ({} missing)", dir, file_prefix, what);
  std::map<std::string, const ParamInfo*> by_name;
  for (auto& p : infos) by_name[name_prefix + p.name] = &p;
  for (auto& path : files) {
    // Skip files that hold nothing this rank needs, without reading their data: the
    // metadata says which names they carry.
    LoadedFile lf = open_ckpt_file(path);
    for (auto& [name, s] : lf.slices) {
      auto it = by_name.find(name);
      if (it == by_name.end()) continue;
      const ParamInfo& p = *it->second;
      if (s.global_shape.size() != p.global_shape.size())
        throw_input("{}: tensor '{}' has rank {} but the model needs {}", path, name, s.global_shape.size(),
                    p.global_shape.size());
      for (size_t d = 0; d < s.global_shape.size(); ++d)
        if (static_cast<int64_t>(d) != 0 && s.global_shape[d] != p.global_shape[d])
          throw_input("{}: tensor '{}' has global shape {} but the model needs {}", path, name,
                      shape_str(s.global_shape), shape_str(p.global_shape));
      if (s.global_shape[0] != p.global_shape[0] && !p.vocab_rows)
        throw_input("{}: tensor '{}' has global shape {} but the model needs {}", path, name, shape_str(s.global_shape),
                    shape_str(p.global_shape));
      saved_global[name] = s.global_shape;
      written[name] += scatter_slice(s, lf.file.tensors[name].data<float>(), p, dst, lo, hi);
    }
  }
  for (auto& p : infos) {
    std::string name = name_prefix + p.name;
    int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (b >= e) continue;
    auto sg = saved_global.find(name);
    if (sg == saved_global.end()) throw_input("{}: the checkpoint has no tensor '{}' ({})", dir, name, what);
    int64_t need = expected_elements(p, sg->second, lo, hi);
    // Duplicates (the tied embedding lives on two stages) may write an element twice.
    if (written[name] < need)
      throw_input("{}: tensor '{}': the checkpoint covers {} of the {} elements this rank needs", dir, name,
                  written[name], need);
  }
}

}  // namespace

void load_into(const std::string& dir, ParamStore& store, const OptimShard* opt, Tensor* exp_avg, Tensor* exp_avg_sq) {
  // Read into host memory, then placed on the store's device (no copy on the CPU); the
  // caller rebuilds the low-precision compute copy (ParamStore::sync_weights).
  const bool on_host = store.params().device() == Device::cpu;
  Tensor params = on_host ? store.params() : Tensor::empty({store.numel()}, store.params().dtype(), Device::cpu);
  ops::fill(params, 0.0);
  fill_from(dir, "model_", "", store.infos(), params.data<float>(), 0, store.numel(), "model weights");
  if (!on_host) store.params().copy_from(params);
  if (opt && exp_avg && exp_avg_sq) load_optimizer_state(dir, store, *opt, *exp_avg, *exp_avg_sq);
}

void load_optimizer_state(const std::string& dir, const ParamStore& store, const OptimShard& opt, Tensor& exp_avg,
                          Tensor& exp_avg_sq) {
  // Optimizer tensors are named exp_avg.<param>; load into a store-shaped scratch then copy the shard.
  Tensor scratch = Tensor::zeros({store.numel()}, DType::f32, Device::cpu);
  const int64_t n = opt.end - opt.begin;
  fill_from(dir, "optim_", "exp_avg.", store.infos(), scratch.data<float>(), opt.begin, opt.end, "optimizer state");
  exp_avg.copy_from(scratch.flat(opt.begin, n));
  ops::fill(scratch, 0.0);
  fill_from(dir, "optim_", "exp_avg_sq.", store.infos(), scratch.data<float>(), opt.begin, opt.end, "optimizer state");
  exp_avg_sq.copy_from(scratch.flat(opt.begin, n));
}

LoadedModel load_whole_model(const std::string& dir, const GptConfig& cfg) {
  LoadedModel m;
  m.cfg = cfg;
  m.cfg.hidden_dropout = 0;
  m.cfg.attention_dropout = 0;
  m.cfg.recompute = RecomputeGranularity::none;
  m.cfg.dtype = DType::f32;  // the fp32 master weights, computed in fp32
  ChunkSpec spec{0, m.cfg.num_layers_total, true, true, ""};
  declare_chunk_params(m.store, m.cfg, spec, 0, 1);
  m.store.finalize(DType::f32);
  load_into(dir, m.store);
  return m;
}

bool has_optimizer_state(const std::string& dir) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("optim_", 0) == 0) return true;
  return false;
}

std::vector<std::string> missing_files(const std::string& dir, const TrainState& st) {
  std::vector<std::string> miss;
  std::error_code ec;
  bool any_optim = false;
  for (auto& e : fs::directory_iterator(dir, ec))
    any_optim = any_optim || e.path().filename().string().rfind("optim_", 0) == 0;
  const int64_t odp = st.layout.zero1 ? st.layout.replicas() : 1;
  for (int64_t p = 0; p < st.layout.pp; ++p)
    for (int64_t t = 0; t < st.layout.tp; ++t) {
      if (!fs::exists(dir + "/" + model_file(t, p), ec)) miss.push_back(model_file(t, p));
      if (any_optim)
        for (int64_t d = 0; d < odp; ++d)
          if (!fs::exists(dir + "/" + optim_file(t, p, d), ec)) miss.push_back(optim_file(t, p, d));
    }
  const int64_t oedp = st.layout.zero1 ? st.layout.edp : 1;
  for (int64_t p = 0; p < st.layout.pp; ++p)
    for (int64_t e = 0; e < st.layout.ep; ++e)
      for (int64_t t = 0; t < st.layout.etp; ++t) {
        if (!fs::exists(dir + "/" + expert_model_file(t, e, p), ec)) miss.push_back(expert_model_file(t, e, p));
        if (any_optim)
          for (int64_t d = 0; d < oedp; ++d)
            if (!fs::exists(dir + "/" + expert_optim_file(t, e, p, d), ec))
              miss.push_back(expert_optim_file(t, e, p, d));
      }
  return miss;
}

std::vector<TensorReport> inspect(const std::string& dir_in) {
  std::string dir = resolve(dir_in);
  std::vector<TensorReport> out;
  for (auto& path : files_with_prefix(dir, "")) {
    safetensors::File f = safetensors::read(path);
    nlohmann::json meta = nlohmann::json::object();
    if (f.metadata.count("tensors")) {
      try {
        meta = nlohmann::json::parse(f.metadata["tensors"]);
      } catch (...) {
        throw_input("{}: slice metadata is not valid JSON", path);
      }
    }
    for (auto& name : f.names) {
      TensorReport t;
      t.file = fs::path(path).filename().string();
      t.name = name;
      const Tensor& x = f.tensors[name];
      t.dtype = safetensors::dtype_name(x.dtype());
      t.shape = x.shape();
      if (meta.contains(name)) {
        SavedSlice s = parse_slice(meta[name], path, name);
        t.global_shape = s.global_shape;
        t.split_dim = s.split_dim;
        t.split_rank = s.split_rank;
        t.split_count = s.split_count;
        t.flat_begin = s.flat_begin;
        t.flat_end = s.flat_end;
        t.checksum_ok = checksum(x) == s.crc;
      }
      out.push_back(t);
    }
  }
  return out;
}

}  // namespace mtnlg::model::ckpt
