#include "app/checkpoint/hf_interchange.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "app/checkpoint/checkpoint_tools.hpp"
#include "app/checkpoint/hf_families.hpp"
#include "app/process/module_configs.hpp"
#include "app/process/preflight.hpp"
#include "core/log.hpp"
#include "core/ops.hpp"
#include "data/hf_tokenizer.hpp"
#include "model/checkpoint.hpp"
#include "model/gpt.hpp"

namespace fs = std::filesystem;

namespace mtnlg::app {

namespace hf {

// ---- config.json ---------------------------------------------------------------------

void Config::bad(const std::string& key, const std::string& why) const { throw_input("{}: {}: {}", path, key, why); }

int64_t Config::integer(const std::string& key) const {
  if (!j.contains(key) || !j[key].is_number_integer()) throw_input("{}: '{}' missing or not an integer", path, key);
  return j[key].get<int64_t>();
}

int64_t Config::integer(const std::string& key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

double Config::number(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  if (!j[key].is_number()) bad(key, "not a number");
  return j[key].get<double>();
}

bool Config::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  if (!j[key].is_boolean()) bad(key, "not true or false");
  return j[key].get<bool>();
}

std::string Config::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  if (!j[key].is_string()) bad(key, "not a string");
  return j[key].get<std::string>();
}

Config read_config(const std::string& dir) {
  Config c;
  c.path = dir + "/config.json";
  std::ifstream f(c.path);
  if (!f) throw_input("{}: missing (a Hugging Face model directory has config.json and model.safetensors)", c.path);
  try {
    c.j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw_input("{}: not valid JSON: {}", c.path, e.what());
  }
  if (!c.j.is_object()) throw_input("{}: not a JSON object", c.path);
  return c;
}

// ---- weights -------------------------------------------------------------------------

namespace {
constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";
}  // namespace

Weights::Weights(const std::string& dir) : dir_(dir) {
  const std::string index = dir + "/" + kIndex;
  std::error_code ec;
  if (fs::is_regular_file(index, ec)) {
    nlohmann::json j;
    std::ifstream f(index);
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw_input("{}: not valid JSON: {}", index, e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw_input("{}: weight_map: missing or not an object", index);
    for (const auto& [name, file] : j["weight_map"].items()) {
      const std::string fname = file.is_string() ? file.get<std::string>() : "";
      if (fname.empty() || fname.find('/') != std::string::npos || fname == "." || fname == "..")
        throw_input("{}: weight_map.{}: not a file name in the directory", index, name);
      where_[name] = fname;
    }
    return;
  }
  if (!fs::is_regular_file(dir + "/" + kSingle, ec))
    throw_input("{}: neither {} nor {} (the weights of a Hugging Face model directory)", dir, kSingle, kIndex);
  open_ = kSingle;
  file_ = safetensors::read(dir + "/" + kSingle);
  for (const auto& n : file_.names) where_[n] = kSingle;
}

std::string Weights::index_or_single() const { return dir_ + "/" + (open_ == kSingle ? kSingle : kIndex); }

std::string Weights::first_unread() const {
  for (const auto& [name, file] : where_)
    if (!read_.count(name)) return name;
  return "";
}

Tensor Weights::get(const std::string& name, const Shape& shape) {
  auto it = where_.find(name);
  if (it == where_.end()) throw_input("{}: tensor '{}' missing", index_or_single(), name);
  read_.insert(name);
  if (it->second != open_) {
    file_ = {};  // one shard in memory at a time
    open_.clear();
    file_ = safetensors::read(dir_ + "/" + it->second);
    open_ = it->second;
  }
  const std::string where = dir_ + "/" + open_;
  auto t = file_.tensors.find(name);
  if (t == file_.tensors.end()) throw_input("{}: tensor '{}' missing ({} puts it there)", where, name, kIndex);
  if (t->second.shape() != shape)
    throw_input("{}: tensor '{}' has shape {}, expected {}", where, name, shape_str(t->second.shape()),
                shape_str(shape));
  const DType dt = t->second.dtype();
  if (dt == DType::f32) return t->second;
  if (dt != DType::bf16 && dt != DType::f16)
    throw_input("{}: tensor '{}' is {}, expected F32, BF16 or F16", where, name, safetensors::dtype_name(dt));
  Tensor x = Tensor::empty(shape);
  ops::convert(x, t->second);
  return x;
}

// ---- tensors of an export --------------------------------------------------------------

Tensor real_rows(const model::LoadedModel& m, const std::string& name, int64_t V) {
  const Tensor p = m.store.param(name);
  Tensor t = Tensor::empty({V, p.dim(1)});
  ops::copy(t, p.rows(0, V));
  return t;
}

Tensor param_copy(const model::LoadedModel& m, const std::string& name) { return m.store.param(name).clone(); }

Tensor transpose(const Tensor& w) {
  const int64_t a = w.dim(0), b = w.dim(1);
  Tensor t = Tensor::empty({b, a});
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) t.data<float>()[j * a + i] = w.data<float>()[i * b + j];
  return t;
}

}  // namespace hf

namespace {

enum class Family { gpt2, llama, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe };

// The family config.json's architectures / model_type name; InputError naming the field
// for one mtnlg does not import.
Family import_family(const hf::Config& cfg) {
  std::string arch;
  if (cfg.has("architectures")) {
    const auto& a = cfg.j["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string()) cfg.bad("architectures", "not a list of class names");
    arch = a[0].get<std::string>();
  }
  const std::string type = cfg.string("model_type", "");
  static const std::pair<const char*, const char*> known[] = {
      {"GPT2LMHeadModel", "gpt2"},         {"LlamaForCausalLM", "llama"},     {"Qwen2ForCausalLM", "qwen2"},
      {"Qwen3ForCausalLM", "qwen3"},       {"MixtralForCausalLM", "mixtral"}, {"Qwen2MoeForCausalLM", "qwen2_moe"},
      {"Qwen3MoeForCausalLM", "qwen3_moe"}};
  int by_arch = -1, by_type = -1;
  for (int i = 0; i < 7; ++i) {
    if (arch == known[i].first) by_arch = i;
    if (type == known[i].second) by_type = i;
  }
  if (!arch.empty() && by_arch < 0)
    cfg.bad("architectures", fmt::format("'{}': mtnlg imports GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, "
                                         "Qwen3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM and "
                                         "Qwen3MoeForCausalLM",
                                         arch));
  if (arch.empty() && by_type < 0)
    cfg.bad("model_type", fmt::format("'{}' (and no architectures): mtnlg imports gpt2, llama, qwen2, qwen3, mixtral, "
                                      "qwen2_moe and qwen3_moe",
                                      type));
  if (by_arch >= 0 && !type.empty() && by_type != by_arch)
    cfg.bad("model_type", fmt::format("'{}' does not go with architectures '{}'", type, arch));
  return static_cast<Family>(by_arch >= 0 ? by_arch : by_type);
}

hf::MoeKind moe_kind(Family f) {
  return f == Family::mixtral     ? hf::MoeKind::mixtral
         : f == Family::qwen2_moe ? hf::MoeKind::qwen2_moe
                                  : hf::MoeKind::qwen3_moe;
}

// The recipe of config.json's family (checked against recipe_path's when given).
Recipe import_recipe(const hf::Config& cfg, Family fam, const std::string& recipe_path) {
  switch (fam) {
    case Family::gpt2: return hf::gpt2_recipe(cfg, recipe_path);
    case Family::llama: return hf::llama_recipe(cfg, hf::LlamaKind::llama, recipe_path);
    case Family::qwen2: return hf::llama_recipe(cfg, hf::LlamaKind::qwen2, recipe_path);
    case Family::qwen3: return hf::llama_recipe(cfg, hf::LlamaKind::qwen3, recipe_path);
    default: return hf::moe_recipe(cfg, moe_kind(fam), recipe_path);
  }
}

// A tokenizer.json in DIR: checked now (it must load and fit `vocab` ids), so that a file
// mtnlg cannot run stops the import before anything is written. True when there is one.
bool check_tokenizer(const std::string& dir, int64_t vocab) {
  const fs::path tok_json = fs::path(dir) / "tokenizer.json";
  std::error_code ec;
  if (!fs::is_regular_file(tok_json, ec)) return false;
  auto tok = data::HfTokenizer::from_file(tok_json.string());
  if (tok->vocab_size() > vocab)
    throw_input("{}: {} token ids, more than the model's vocab_size {} in config.json", tok_json.string(),
                tok->vocab_size(), vocab);
  return true;
}

// tokenizer.json and tokenizer_config.json (those of them there) from `from` to `to`.
std::vector<std::string> copy_tokenizer(const fs::path& from, const fs::path& to) {
  std::vector<std::string> copied;
  std::error_code ec;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (fs::is_regular_file(from / f, ec)) {
      fs::copy_file(from / f, to / f, fs::copy_options::overwrite_existing);
      copied.push_back((to / f).string());
    }
  return copied;
}

// Writes the tensors as one model.safetensors or, above max_bytes, as shards with their
// index (a new shard starts where the next tensor would overflow the current one).
std::vector<std::string> write_weights(const std::string& dir, const std::vector<hf::OutTensor>& ts, DType dt,
                                       int64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t cur = 0, total = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    int64_t n = dtype_size(dt);
    for (auto d : ts[i].shape) n *= d;
    if (shards.empty() || (!shards.back().empty() && cur + n > max_bytes)) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += n;
    total += n;
  }
  std::vector<std::string> files;
  nlohmann::json map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1
                                 ? std::string("model.safetensors")
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<safetensors::Entry> entries;
    for (size_t i : shards[s]) {
      Tensor t = ts[i].make();
      MTNLG_CHECK(t.shape() == ts[i].shape, "export: {} made with shape {}, planned {}", ts[i].name,
                  shape_str(t.shape()), shape_str(ts[i].shape));
      if (dt != DType::f32) {
        Tensor x = Tensor::empty(t.shape(), dt);
        ops::convert(x, t);
        t = x;
      }
      entries.push_back({ts[i].name, t});
      map[ts[i].name] = name;
    }
    safetensors::write(dir + "/" + name, entries, {{"format", "pt"}});
    files.push_back(dir + "/" + name);
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    write_file_checked(dir + "/model.safetensors.index.json", index.dump(2) + "\n", "--output");
    files.push_back(dir + "/model.safetensors.index.json");
  }
  return files;
}

// The files of an earlier export that this one's would not all replace.
void remove_stale_weights(const std::string& dir) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n == "model.safetensors" || n == "model.safetensors.index.json" || std::regex_match(n, shard))
      fs::remove(e.path());
  }
}

// bos_token_id / eos_token_id of an export (see export_hf).
nlohmann::ordered_json token_id(int64_t given, const char* key, const fs::path& root, bool gpt2, int64_t vocab) {
  if (given >= 0) return given;
  std::error_code ec;
  const fs::path kept = root / "hf_config.json";
  if (fs::is_regular_file(kept, ec)) {
    std::ifstream f(kept);
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(f, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw_input("{}: not a JSON object", kept.string());
    if (j.contains(key)) return j[key];
  }
  if (gpt2 || vocab == 50257) return 50256;  // GPT-2's <|endoftext|>
  return nullptr;
}

}  // namespace

std::vector<std::string> export_hf(const std::string& in, const std::string& out_dir, const HfExportOptions& opt) {
  if (opt.dtype != DType::f32 && opt.dtype != DType::bf16) throw_input("--dtype: fp32 or bf16");
  if (opt.max_shard_bytes <= 0) throw_input("--max-shard-size: must be positive");
  const std::string dir = model::ckpt::resolve(in);
  const model::ckpt::TrainState st = model::ckpt::read_metadata(dir);
  const Recipe r = parse_recipe(st.recipe_yaml, dir + "/metadata.json");
  const bool gpt2 = !r.model.rope(), moe = r.model.moe.enabled();
  if (gpt2 && moe)
    throw_input(
        "{}: the checkpoint's recipe has model.num_experts ({}) with learned absolute positions: the Hugging "
        "Face MoE classes mtnlg exports (Mixtral, Qwen2-MoE, Qwen3-MoE) are of the Llama family",
        dir, r.model.moe.num_experts);
  std::string unfit = gpt2 ? hf::gpt2_unfit(r.model) : hf::llama_unfit(r.model);
  if (unfit.empty() && moe) unfit = hf::moe_unfit(r.model);
  if (!unfit.empty()) throw_input("{}: the checkpoint's recipe has {}", dir, unfit);
  if (opt.format == "hf-gpt2" && !gpt2)
    throw_input(
        "--format hf-gpt2: {} holds a Llama-family model (model.position_embedding_type: rope); export it with "
        "--format hf",
        dir);
  const model::LoadedModel m = load_for_inference(dir);
  hf::Export ex = gpt2 ? hf::gpt2_export(m) : moe ? hf::moe_export(r.model, m) : hf::llama_export(r.model, m);
  const fs::path root = fs::path(dir).parent_path();
  ex.config["bos_token_id"] = token_id(opt.bos_token_id, "bos_token_id", root, gpt2, m.cfg.vocab_size);
  ex.config["eos_token_id"] = token_id(opt.eos_token_id, "eos_token_id", root, gpt2, m.cfg.vocab_size);
  ex.config["torch_dtype"] = opt.dtype == DType::bf16 ? "bfloat16" : "float32";
  fs::create_directories(out_dir);
  remove_stale_weights(out_dir);
  std::vector<std::string> files = write_weights(out_dir, ex.tensors, opt.dtype, opt.max_shard_bytes);
  write_file_checked(out_dir + "/config.json", ex.config.dump(2) + "\n", "--output");
  files.push_back(out_dir + "/config.json");
  std::error_code ec;
  if (fs::is_regular_file(root / "tokenizer.json", ec))
    for (auto& f : copy_tokenizer(root, out_dir)) files.push_back(f);
  return files;
}

std::string import_hf(const std::string& in_dir, const std::string& out, const std::string& recipe_path,
                      const std::string& format) {
  const hf::Config cfg = hf::read_config(in_dir);
  const Family fam = import_family(cfg);
  if (format == "hf-gpt2" && fam != Family::gpt2)
    throw_input("--format hf-gpt2: {} is not a GPT-2 model (model_type '{}'); import it with --format hf", cfg.path,
                cfg.string("model_type", ""));
  const Recipe r = import_recipe(cfg, fam, recipe_path);
  // A tokenizer.json beside the model comes along (with its tokenizer_config.json, which
  // names the EOS): eval and generate find it in the checkpoint root.
  const bool with_tokenizer = check_tokenizer(in_dir, r.model.vocab_size);
  hf::Weights w(in_dir);
  const auto lock = claim_new_checkpoint_root(out, "--output");
  // inference_config: one rank's parameters, MoE layers included (gpt_config refuses them)
  model::GptConfig gc = inference_config(r);
  model::ParamStore store;
  model::declare_chunk_params(store, gc, {0, r.model.num_layers, true, true, ""}, 0, 1);
  store.finalize(DType::f32);
  if (fam == Family::gpt2)
    hf::gpt2_weights(w, r, store);
  else if (fam == Family::mixtral || fam == Family::qwen2_moe || fam == Family::qwen3_moe)
    hf::moe_weights(w, r, moe_kind(fam), store);
  else
    hf::llama_weights(w, r, store);
  const std::string dir = save_whole_model(out, r, store, 0);
  if (with_tokenizer) copy_tokenizer(in_dir, out);
  fs::copy_file(cfg.path, fs::path(out) / "hf_config.json", fs::copy_options::overwrite_existing);
  return dir;
}

int64_t parse_byte_size(const std::string& text, const std::string& key) {
  static const std::regex re(R"(\s*([0-9]+(?:\.[0-9]+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*)");
  std::smatch mt;
  if (!std::regex_match(text, mt, re))
    throw_input("{}: \"{}\" is not a size (e.g. 5GB, 500MB, 2GiB or a number of bytes)", key, text);
  static const std::pair<const char*, double> units[] = {
      {"B", 1},           {"KB", 1e3},           {"MB", 1e6},
      {"GB", 1e9},        {"TB", 1e12},          {"KiB", 1024.0},
      {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  double scale = 1;
  for (const auto& [u, s] : units)
    if (mt[2].str() == u) scale = s;
  const double bytes = std::stod(mt[1].str()) * scale;
  if (!(bytes >= 1) || bytes > 9e18) throw_input("{}: \"{}\" is not a size of at least 1 byte", key, text);
  return static_cast<int64_t>(bytes);
}

}  // namespace mtnlg::app
