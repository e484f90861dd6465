// Recipe loading. Every key is declared once in the field table below: its name, how to
// read it (with range checks) and how to write it back. Reading walks the YAML maps and
// looks each key up in the table, so an unknown key is reported where it stands.
#include "config/recipe.hpp"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.hpp"

namespace mtnlg {

std::string to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}
std::string to_string(SpikePolicy p) {
  switch (p) {
    case SpikePolicy::stop: return "stop";
    case SpikePolicy::skip: return "skip";
    case SpikePolicy::rerun: return "rerun";
  }
  return "?";
}
std::string to_string(DeviceKind d) {
  switch (d) {
    case DeviceKind::automatic: return "auto";
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return "cuda";
    case DeviceKind::test: return "test";
  }
  return "?";
}
std::string to_string(RecomputeGranularity r) {
  switch (r) {
    case RecomputeGranularity::none: return "none";
    case RecomputeGranularity::selective: return "selective";
    case RecomputeGranularity::full: return "full";
  }
  return "?";
}
std::string to_string(CpCommType c) {
  switch (c) {
    case CpCommType::p2p: return "p2p";
    case CpCommType::a2a: return "a2a";
    case CpCommType::all_gather: return "all_gather";
    case CpCommType::a2a_p2p: return "a2a+p2p";
  }
  return "?";
}
std::string to_string(AttentionBackend a) {
  switch (a) {
    case AttentionBackend::automatic: return "auto";
    case AttentionBackend::flash: return "flash";
    case AttentionBackend::unfused: return "unfused";
  }
  return "?";
}
std::string to_string(TokenizerType t) {
  switch (t) {
    case TokenizerType::gpt2_bpe: return "GPT2BPETokenizer";
    case TokenizerType::huggingface: return "HuggingFaceTokenizer";
  }
  return "?";
}
std::string to_string(PositionEmbedding p) { return p == PositionEmbedding::rope ? "rope" : "learned_absolute"; }
std::string to_string(Normalization n) { return n == Normalization::RMSNorm ? "RMSNorm" : "LayerNorm"; }
std::string to_string(MoeLoadBalancing b) {
  switch (b) {
    case MoeLoadBalancing::aux_loss: return "aux_loss";
    case MoeLoadBalancing::seq_aux_loss: return "seq_aux_loss";
    case MoeLoadBalancing::global_aux_loss: return "global_aux_loss";
    case MoeLoadBalancing::none: return "none";
    case MoeLoadBalancing::sinkhorn: return "sinkhorn";
  }
  return "?";
}
std::string to_string(MoeScoreFunction f) { return f == MoeScoreFunction::sigmoid ? "sigmoid" : "softmax"; }
std::string to_string(MoeDropPolicy p) { return p == MoeDropPolicy::position ? "position" : "probs"; }
std::string to_string(MoeRouterDtype d) {
  switch (d) {
    case MoeRouterDtype::none: return "none";
    case MoeRouterDtype::fp32: return "fp32";
    case MoeRouterDtype::fp64: return "fp64";
  }
  return "?";
}
std::string to_string(MoeDispatcher d) { return d == MoeDispatcher::alltoall ? "alltoall" : "allgather"; }
std::string to_string(LrDecayStyle s) {
  switch (s) {
    case LrDecayStyle::cosine: return "cosine";
    case LrDecayStyle::linear: return "linear";
    case LrDecayStyle::constant: return "constant";
  }
  return "?";
}

int64_t ModelConfig::padded_vocab_size(int64_t tp) const {
  int64_t m = make_vocab_size_divisible_by * tp;
  return (vocab_size + m - 1) / m * m;
}


namespace {

// Where a value came from, for messages: "file:line:col" or "--set key=value".
struct Ctx {
  std::string origin;
  std::map<std::string, std::string> overridden;  // dotted path -> "--set ..." text
  std::vector<std::string> notes;

  std::string where(const std::string& path_in, const YAML::Node& n) const {
    const std::string path = !path_in.empty() && path_in[0] == '.' ? path_in.substr(1) : path_in;
    // The value a --set wrote, anything below it, or a map it created on the way.
    for (auto& [p, text] : overridden)
      if (path == p || path.rfind(p + ".", 0) == 0 ||
          (!path.empty() && p.rfind(path + ".", 0) == 0 && n.Mark().is_null()))
        return text;
    if (n.IsDefined() && n.Mark().line >= 0)
      return fmt::format("{}:{}:{}", origin, n.Mark().line + 1, n.Mark().column + 1);
    return origin;
  }
};

[[noreturn]] void bad(const Ctx& c, const std::string& path, const YAML::Node& n, const std::string& msg) {
  throw InputError(fmt::format("{}: {}: {}", c.where(path, n), path, msg));
}

std::string scalar_text(const Ctx& c, const std::string& path, const YAML::Node& n, const char* expect) {
  if (!n.IsScalar())
    bad(c, path, n, fmt::format("expected {}, got a {}", expect, n.IsMap() ? "map" : n.IsSequence() ? "list" : "null"));
  return n.Scalar();
}

int64_t read_int(const Ctx& c, const std::string& path, const YAML::Node& n, int64_t lo, int64_t hi) {
  std::string s = scalar_text(c, path, n, "an integer");
  int64_t v;
  try {
    v = parse_count(s, path);
  } catch (const InputError&) {
    bad(c, path, n,
        fmt::format("expected an integer in [{}, {}] (counts accept 12e9 or \"270B\"), got \"{}\"", lo, hi, s));
  }
  if (v < lo || v > hi) bad(c, path, n, fmt::format("{} is out of range: valid is [{}, {}]", v, lo, hi));
  return v;
}

double read_double(const Ctx& c, const std::string& path, const YAML::Node& n, double lo, double hi) {
  std::string s = scalar_text(c, path, n, "a number");
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v))
    bad(c, path, n, fmt::format("expected a number in [{}, {}], got \"{}\"", lo, hi, s));
  if (v < lo || v > hi) bad(c, path, n, fmt::format("{} is out of range: valid is [{}, {}]", s, lo, hi));
  return v;
}

}  // namespace

// One spelling rule for every boolean (recipe keys, --set values, environment switches):
// YAML 1.1's true/yes/on and false/no/off, each in lower, Capitalised or UPPER case.

namespace {

bool read_bool(const Ctx& c, const std::string& path, const YAML::Node& n) {
  std::string s = scalar_text(c, path, n, "true or false");
  if (auto b = parse_bool(s)) return *b;
  bad(c, path, n, fmt::format("expected true or false (or yes/no, on/off), got \"{}\"", s));
}

std::string read_string(const Ctx& c, const std::string& path, const YAML::Node& n) {
  if (n.IsNull()) return "";
  return scalar_text(c, path, n, "a string");
}

constexpr int64_t kMaxI = std::numeric_limits<int64_t>::max();

struct Field {
  std::string name;
  std::function<void(Recipe&, const YAML::Node&, const Ctx&, const std::string& path)> read;
  std::function<void(const Recipe&, YAML::Emitter&)> write;
};

using Table = std::vector<std::pair<std::string, std::vector<Field>>>;

template <typename Get>
Field int_field(std::string name, Get get, int64_t lo, int64_t hi = kMaxI) {
  return {
      name,
      [=](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) { get(r) = read_int(c, p, n, lo, hi); },
      [=](const Recipe& r, YAML::Emitter& e) { e << YAML::Key << name << YAML::Value << get(const_cast<Recipe&>(r)); }};
}
template <typename Get>
Field dbl_field(std::string name, Get get, double lo, double hi) {
  return {name,
          [=](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
            get(r) = read_double(c, p, n, lo, hi);
          },
          [=](const Recipe& r, YAML::Emitter& e) {
            e << YAML::Key << name << YAML::Value << fmt::format("{}", get(const_cast<Recipe&>(r)));
          }};
}
template <typename Get>
Field bool_field(std::string name, Get get) {
  return {
      name, [=](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) { get(r) = read_bool(c, p, n); },
      [=](const Recipe& r, YAML::Emitter& e) { e << YAML::Key << name << YAML::Value << get(const_cast<Recipe&>(r)); }};
}
template <typename Get>
Field str_field(std::string name, Get get) {
  return {name,
          [=](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) { get(r) = read_string(c, p, n); },
          [=](const Recipe& r, YAML::Emitter& e) {
            e << YAML::Key << name << YAML::Value << YAML::DoubleQuoted << get(const_cast<Recipe&>(r));
          }};
}
template <typename E, typename Get>
Field enum_field(std::string name, Get get, std::initializer_list<E> values) {
  std::vector<E> vals(values);
  return {name,
          [=](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
            std::string s = n.IsNull() ? "none" : scalar_text(c, p, n, "a name");
            for (E e : vals)
              if (to_string(e) == s) {
                get(r) = e;
                return;
              }
            std::string valid;
            for (E e : vals) {                   // appended piece by piece: `"|" + to_string(e)` trips GCC 12's
              if (!valid.empty()) valid += '|';  // -Wrestrict false positive (GCC PR105651)
              valid += to_string(e);
            }
            bad(c, p, n, fmt::format("\"{}\" is not valid: expected {}", s, valid));
          },
          [=](const Recipe& r, YAML::Emitter& e) {
            e << YAML::Key << name << YAML::Value << to_string(get(const_cast<Recipe&>(r)));
          }};
}

// A second name of a key (Megatron's older spelling): read, never written back.
Field alias_field(Field f) {
  f.write = [](const Recipe&, YAML::Emitter&) {};
  return f;
}

// Reads a map node's keys against a list of names; unknown keys are errors.
void check_keys(const Ctx& c, const std::string& path, const YAML::Node& n, const std::vector<std::string>& names) {
  if (!n.IsMap()) bad(c, path, n, "expected a map of keys");
  for (auto it = n.begin(); it != n.end(); ++it) {
    std::string k = it->first.Scalar();
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      std::string valid;
      for (auto& s : names) {
        if (!valid.empty()) valid += ", ";
        valid += s;
      }
      throw InputError(fmt::format("{}: unknown key '{}{}{}': valid keys are {}", c.where(path + "." + k, it->first),
                                   path, path.empty() ? "" : ".", k, valid));
    }
  }
}

// A key of mixture of experts: written back only when the model has experts, so that a
// dense recipe's resolved YAML (and the recipe its checkpoints keep) is what it was.
Field moe_only(Field f) {
  auto inner = f.write;
  f.write = [inner](const Recipe& r, YAML::Emitter& e) {
    if (r.model.moe.enabled()) inner(r, e);
  };
  return f;
}

// model.moe_layer_freq: an int N (layer i is MoE iff i % N == 0) or a 0/1 list, one per layer.
Field moe_layer_freq_field() {
  return {"moe_layer_freq",
          [](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
            auto& m = r.model.moe;
            m.moe_layer_pattern.clear();
            m.moe_layer_freq = 1;
            if (n.IsSequence()) {
              for (size_t i = 0; i < n.size(); ++i)
                m.moe_layer_pattern.push_back(read_int(c, fmt::format("{}[{}]", p, i), n[i], 0, 1));
              if (m.moe_layer_pattern.empty()) bad(c, p, n, "expected an integer >= 1 or a 0/1 list, one per layer");
              return;
            }
            m.moe_layer_freq = read_int(c, p, n, 1, 100000);
          },
          [](const Recipe& r, YAML::Emitter& e) {
            const auto& m = r.model.moe;
            e << YAML::Key << "moe_layer_freq" << YAML::Value;
            if (m.moe_layer_pattern.empty())
              e << m.moe_layer_freq;
            else
              e << YAML::Flow << m.moe_layer_pattern;
          }};
}

// model.moe_expert_capacity_factor: a positive number, or absent / null (dropless).
Field moe_capacity_field() {
  return {"moe_expert_capacity_factor",
          [](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
            auto& cf = r.model.moe.moe_expert_capacity_factor;
            if (n.IsNull() || (n.IsScalar() && n.Scalar() == "none")) {
              cf.reset();
              return;
            }
            cf = read_double(c, p, n, 1e-6, 1e6);
          },
          [](const Recipe& r, YAML::Emitter& e) {
            const auto& cf = r.model.moe.moe_expert_capacity_factor;
            e << YAML::Key << "moe_expert_capacity_factor" << YAML::Value;
            if (cf)
              e << fmt::format("{}", *cf);
            else
              e << YAML::Null;
          }};
}

// The router's keys (model section).
std::vector<Field> moe_router_fields() {
  using M = MoeConfig;
  auto moe = [](Recipe& r) -> M& { return r.model.moe; };
  return {
      int_field(
          "moe_router_topk", [=](Recipe& r) -> int64_t& { return moe(r).moe_router_topk; }, 1, 1 << 16),
      enum_field<MoeLoadBalancing>(
          "moe_router_load_balancing_type",
          [=](Recipe& r) -> MoeLoadBalancing& { return moe(r).moe_router_load_balancing_type; },
          {MoeLoadBalancing::aux_loss, MoeLoadBalancing::seq_aux_loss, MoeLoadBalancing::global_aux_loss,
           MoeLoadBalancing::none, MoeLoadBalancing::sinkhorn}),
      dbl_field(
          "moe_aux_loss_coeff", [=](Recipe& r) -> double& { return moe(r).moe_aux_loss_coeff; }, 0.0, 1e6),
      dbl_field(
          "moe_z_loss_coeff", [=](Recipe& r) -> double& { return moe(r).moe_z_loss_coeff; }, 0.0, 1e6),
      enum_field<MoeScoreFunction>("moe_router_score_function",
                                   [=](Recipe& r) -> MoeScoreFunction& { return moe(r).moe_router_score_function; },
                                   {MoeScoreFunction::softmax, MoeScoreFunction::sigmoid}),
      bool_field("moe_router_pre_softmax", [=](Recipe& r) -> bool& { return moe(r).moe_router_pre_softmax; }),
      dbl_field(
          "moe_router_topk_scaling_factor", [=](Recipe& r) -> double& { return moe(r).moe_router_topk_scaling_factor; },
          0.0, 1e6),
      bool_field("moe_router_enable_expert_bias",
                 [=](Recipe& r) -> bool& { return moe(r).moe_router_enable_expert_bias; }),
      dbl_field(
          "moe_router_bias_update_rate", [=](Recipe& r) -> double& { return moe(r).moe_router_bias_update_rate; }, 0.0,
          1e3),
      int_field(
          "moe_router_num_groups", [=](Recipe& r) -> int64_t& { return moe(r).moe_router_num_groups; }, 0, 1 << 16),
      int_field(
          "moe_router_group_topk", [=](Recipe& r) -> int64_t& { return moe(r).moe_router_group_topk; }, 0, 1 << 16),
      enum_field<MoeRouterDtype>("moe_router_dtype",
                                 [=](Recipe& r) -> MoeRouterDtype& { return moe(r).moe_router_dtype; },
                                 {MoeRouterDtype::none, MoeRouterDtype::fp32, MoeRouterDtype::fp64}),
      dbl_field(
          "moe_input_jitter_eps", [=](Recipe& r) -> double& { return moe(r).moe_input_jitter_eps; }, 0.0, 0.999),
  };
}

// Every MoE key of the model section, in the order docs/RECIPES.md lists them.
std::vector<Field> moe_fields() {
  using M = MoeConfig;
  auto moe = [](Recipe& r) -> M& { return r.model.moe; };
  std::vector<Field> f = {
      int_field(
          "num_experts", [=](Recipe& r) -> int64_t& { return moe(r).num_experts; }, 0, 1 << 20),
      int_field(
          "moe_ffn_hidden_size", [=](Recipe& r) -> int64_t& { return moe(r).moe_ffn_hidden_size; }, 0, 1 << 22),
      int_field(
          "moe_shared_expert_intermediate_size",
          [=](Recipe& r) -> int64_t& { return moe(r).moe_shared_expert_intermediate_size; }, 0, 1 << 22),
      bool_field("moe_shared_expert_gate", [=](Recipe& r) -> bool& { return moe(r).moe_shared_expert_gate; }),
      moe_layer_freq_field(),
  };
  for (auto& x : moe_router_fields()) f.push_back(std::move(x));
  f.push_back(moe_capacity_field());
  f.push_back(bool_field("moe_pad_expert_input_to_capacity",
                         [=](Recipe& r) -> bool& { return moe(r).moe_pad_expert_input_to_capacity; }));
  f.push_back(enum_field<MoeDropPolicy>("moe_token_drop_policy",
                                        [=](Recipe& r) -> MoeDropPolicy& { return moe(r).moe_token_drop_policy; },
                                        {MoeDropPolicy::probs, MoeDropPolicy::position}));
  f.push_back(enum_field<MoeDispatcher>("moe_token_dispatcher_type",
                                        [=](Recipe& r) -> MoeDispatcher& { return moe(r).moe_token_dispatcher_type; },
                                        {MoeDispatcher::allgather, MoeDispatcher::alltoall}));
  for (auto& x : f) x = moe_only(std::move(x));
  return f;
}

// The recipe's keys, one entry each, section by section. Long on purpose: it is a
// table, read by looking a key up, and splitting it would only scatter the keys.
const Table& table() {
  static const Table t = [] {
    Table t;
    t.push_back(
        {"model",
         {
             int_field(
                 "num_layers", [](Recipe& r) -> int64_t& { return r.model.num_layers; }, 1, 100000),
             int_field(
                 "hidden_size", [](Recipe& r) -> int64_t& { return r.model.hidden_size; }, 1, 1 << 20),
             int_field(
                 "num_attention_heads", [](Recipe& r) -> int64_t& { return r.model.num_attention_heads; }, 1, 1 << 16),
             int_field(
                 "ffn_hidden_size", [](Recipe& r) -> int64_t& { return r.model.ffn_hidden_size; }, 0, 1 << 22),
             int_field(
                 "seq_length", [](Recipe& r) -> int64_t& { return r.model.seq_length; }, 1, 1 << 22),
             int_field(
                 "max_position_embeddings", [](Recipe& r) -> int64_t& { return r.model.max_position_embeddings; }, 0,
                 1 << 22),
             int_field(
                 "vocab_size", [](Recipe& r) -> int64_t& { return r.model.vocab_size; }, 1, 1 << 24),
             int_field(
                 "make_vocab_size_divisible_by",
                 [](Recipe& r) -> int64_t& { return r.model.make_vocab_size_divisible_by; }, 1, 1 << 16),
             dbl_field(
                 "init_method_std", [](Recipe& r) -> double& { return r.model.init_method_std; }, 0.0, 10.0),
             dbl_field(
                 "hidden_dropout", [](Recipe& r) -> double& { return r.model.hidden_dropout; }, 0.0, 0.99),
             dbl_field(
                 "attention_dropout", [](Recipe& r) -> double& { return r.model.attention_dropout; }, 0.0, 0.99),
             dbl_field(
                 "norm_epsilon", [](Recipe& r) -> double& { return r.model.layernorm_epsilon; }, 0.0, 1.0),
             alias_field(dbl_field(
                 "layernorm_epsilon", [](Recipe& r) -> double& { return r.model.layernorm_epsilon; }, 0.0, 1.0)),
             enum_field<AttentionBackend>(
                 "attention_backend", [](Recipe& r) -> AttentionBackend& { return r.model.attention_backend; },
                 {AttentionBackend::automatic, AttentionBackend::flash, AttentionBackend::unfused}),
             enum_field<PositionEmbedding>(
                 "position_embedding_type",
                 [](Recipe& r) -> PositionEmbedding& { return r.model.position_embedding_type; },
                 {PositionEmbedding::learned_absolute, PositionEmbedding::rope}),
             dbl_field(
                 "rotary_base", [](Recipe& r) -> double& { return r.model.rotary_base; }, 1.0, 1e12),
             dbl_field(
                 "rotary_percent", [](Recipe& r) -> double& { return r.model.rotary_percent; }, 0.0, 1.0),
             bool_field("rotary_interleaved", [](Recipe& r) -> bool& { return r.model.rotary_interleaved; }),
             bool_field("use_rope_scaling", [](Recipe& r) -> bool& { return r.model.use_rope_scaling; }),
             dbl_field(
                 "rope_scaling_factor", [](Recipe& r) -> double& { return r.model.rope_scaling_factor; }, 1.0, 1e6),
             enum_field<Normalization>("normalization",
                                       [](Recipe& r) -> Normalization& { return r.model.normalization; },
                                       {Normalization::LayerNorm, Normalization::RMSNorm}),
             bool_field("swiglu", [](Recipe& r) -> bool& { return r.model.swiglu; }),
             int_field(
                 "num_query_groups", [](Recipe& r) -> int64_t& { return r.model.num_query_groups; }, 0, 1 << 16),
             bool_field("untie_embeddings_and_output_weights",
                        [](Recipe& r) -> bool& { return r.model.untie_embeddings_and_output_weights; }),
             bool_field("add_bias_linear", [](Recipe& r) -> bool& { return r.model.add_bias_linear; }),
             bool_field("add_qkv_bias", [](Recipe& r) -> bool& { return r.model.add_qkv_bias; }),
             bool_field("qk_layernorm", [](Recipe& r) -> bool& { return r.model.qk_layernorm; }),
             int_field(
                 "kv_channels", [](Recipe& r) -> int64_t& { return r.model.kv_channels; }, 0, 1 << 16),
         }});
    for (auto& f : moe_fields()) t.back().second.push_back(std::move(f));
    Field pipeline_layers{
        "pipeline_layers",
        [](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
          r.parallel.pipeline_layers.clear();
          if (n.IsNull()) return;
          if (!n.IsSequence()) bad(c, p, n, "expected a list of layer counts, one per pipeline stage");
          for (size_t i = 0; i < n.size(); ++i)
            r.parallel.pipeline_layers.push_back(read_int(c, fmt::format("{}[{}]", p, i), n[i], 1, 100000));
        },
        [](const Recipe& r, YAML::Emitter& e) {
          e << YAML::Key << "pipeline_layers" << YAML::Value << YAML::Flow << r.parallel.pipeline_layers;
        }};
    // cp_comm_type: one value for every layer; "allgather" (Megatron's help text) is read as all_gather.
    Field cp_comm{"cp_comm_type",
                  [](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
                    if (n.IsSequence())
                      bad(c, p, n, "expected one of p2p|a2a|all_gather|a2a+p2p (one value for every layer)");
                    const std::string s = scalar_text(c, p, n, "a name");
                    for (CpCommType v : {CpCommType::p2p, CpCommType::a2a, CpCommType::all_gather, CpCommType::a2a_p2p})
                      if (to_string(v) == s) {
                        r.parallel.cp_comm_type = v;
                        return;
                      }
                    if (s == "allgather") {
                      r.parallel.cp_comm_type = CpCommType::all_gather;
                      return;
                    }
                    bad(c, p, n, fmt::format("\"{}\" is not valid: expected p2p|a2a|all_gather|a2a+p2p", s));
                  },
                  [](const Recipe& r, YAML::Emitter& e) {
                    e << YAML::Key << "cp_comm_type" << YAML::Value << to_string(r.parallel.cp_comm_type);
                  }};
    Field hier_cp{"hierarchical_context_parallel_sizes",
                  [](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
                    auto& v = r.parallel.hierarchical_context_parallel_sizes;
                    v.clear();
                    if (n.IsNull()) return;
                    if (!n.IsSequence()) bad(c, p, n, "expected a list of group sizes, [a2a size, p2p size]");
                    for (size_t i = 0; i < n.size(); ++i)
                      v.push_back(read_int(c, fmt::format("{}[{}]", p, i), n[i], 1, 4096));
                  },
                  [](const Recipe& r, YAML::Emitter& e) {
                    e << YAML::Key << "hierarchical_context_parallel_sizes" << YAML::Value;
                    if (r.parallel.hierarchical_context_parallel_sizes.empty())
                      e << YAML::Null;
                    else
                      e << YAML::Flow << r.parallel.hierarchical_context_parallel_sizes;
                  }};
    t.push_back(
        {"parallel",
         {
             int_field(
                 "tensor_model_parallel_size",
                 [](Recipe& r) -> int64_t& { return r.parallel.tensor_model_parallel_size; }, 1, 1024),
             int_field(
                 "pipeline_model_parallel_size",
                 [](Recipe& r) -> int64_t& { return r.parallel.pipeline_model_parallel_size; }, 1, 4096),
             moe_only(int_field(
                 "expert_model_parallel_size",
                 [](Recipe& r) -> int64_t& { return r.parallel.expert_model_parallel_size; }, 1, 1 << 16)),
             moe_only(int_field(
                 "expert_tensor_parallel_size",
                 [](Recipe& r) -> int64_t& { return r.parallel.expert_tensor_parallel_size; }, 0, 1024)),
             int_field(
                 "num_layers_per_virtual_pipeline_stage",
                 [](Recipe& r) -> int64_t& { return r.parallel.num_layers_per_virtual_pipeline_stage; }, 0, 100000),
             pipeline_layers,
             bool_field("sequence_parallel", [](Recipe& r) -> bool& { return r.parallel.sequence_parallel; }),
             int_field(
                 "context_parallel_size", [](Recipe& r) -> int64_t& { return r.parallel.context_parallel_size; }, 1,
                 4096),
             cp_comm,
             hier_cp,
             bool_field("use_distributed_optimizer",
                        [](Recipe& r) -> bool& { return r.parallel.use_distributed_optimizer; }),
             enum_field<RecomputeGranularity>(
                 "recompute_granularity",
                 [](Recipe& r) -> RecomputeGranularity& { return r.parallel.recompute_granularity; },
                 {RecomputeGranularity::none, RecomputeGranularity::selective, RecomputeGranularity::full}),
             int_field(
                 "ddp_bucket_size", [](Recipe& r) -> int64_t& { return r.parallel.ddp_bucket_size; }, 0),
             dbl_field(
                 "distributed_timeout_minutes",
                 [](Recipe& r) -> double& { return r.parallel.distributed_timeout_minutes; }, 0.0, 1e6),
             dbl_field(
                 "heartbeat_timeout_minutes", [](Recipe& r) -> double& { return r.parallel.heartbeat_timeout_minutes; },
                 0.0, 1e6),
         }});
    Field ramp{"rampup_batch_size",
               [](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
                 if (n.IsNull() || (n.IsScalar() && n.Scalar() == "none")) {
                   r.training.rampup_batch_size.reset();
                   return;
                 }
                 check_keys(c, p, n, {"start", "increment", "ramp_tokens"});
                 RampupBatchSize rb = r.training.rampup_batch_size.value_or(RampupBatchSize{});
                 if (n["start"]) rb.start = read_int(c, p + ".start", n["start"], 1, kMaxI);
                 if (n["increment"]) rb.increment = read_int(c, p + ".increment", n["increment"], 1, kMaxI);
                 if (n["ramp_tokens"]) rb.ramp_tokens = read_int(c, p + ".ramp_tokens", n["ramp_tokens"], 1, kMaxI);
                 for (const char* k : {"start", "increment", "ramp_tokens"})
                   if (!n[k] && !r.training.rampup_batch_size)
                     bad(c, p, n,
                         fmt::format("missing '{}': rampup_batch_size needs start, increment and ramp_tokens", k));
                 r.training.rampup_batch_size = rb;
               },
               [](const Recipe& r, YAML::Emitter& e) {
                 e << YAML::Key << "rampup_batch_size" << YAML::Value;
                 if (!r.training.rampup_batch_size) {
                   e << YAML::Null;
                   return;
                 }
                 auto& rb = *r.training.rampup_batch_size;
                 e << YAML::Flow << YAML::BeginMap << YAML::Key << "start" << YAML::Value << rb.start << YAML::Key
                   << "increment" << YAML::Value << rb.increment << YAML::Key << "ramp_tokens" << YAML::Value
                   << rb.ramp_tokens << YAML::EndMap;
               }};
    t.push_back(
        {"training",
         {
             enum_field<Precision>("precision", [](Recipe& r) -> Precision& { return r.training.precision; },
                                   {Precision::fp32, Precision::bf16, Precision::fp16}),
             enum_field<DeviceKind>("device", [](Recipe& r) -> DeviceKind& { return r.training.device; },
                                    {DeviceKind::automatic, DeviceKind::cpu, DeviceKind::cuda, DeviceKind::test}),
             int_field(
                 "micro_batch_size", [](Recipe& r) -> int64_t& { return r.training.micro_batch_size; }, 1, 1 << 20),
             int_field(
                 "global_batch_size", [](Recipe& r) -> int64_t& { return r.training.global_batch_size; }, 1, 1LL << 40),
             ramp,
             int_field(
                 "train_iters", [](Recipe& r) -> int64_t& { return r.training.train_iters; }, 0),
             int_field(
                 "train_samples", [](Recipe& r) -> int64_t& { return r.training.train_samples; }, 0),
             int_field(
                 "train_tokens", [](Recipe& r) -> int64_t& { return r.training.train_tokens; }, 0),
             int_field(
                 "seed", [](Recipe& r) -> int64_t& { return r.training.seed; }, 0, (1LL << 32) - 1),
             dbl_field(
                 "exit_duration_mins", [](Recipe& r) -> double& { return r.training.exit_duration_mins; }, 0.0, 1e9),
             int_field(
                 "exit_interval", [](Recipe& r) -> int64_t& { return r.training.exit_interval; }, 0),
             int_field(
                 "eval_interval", [](Recipe& r) -> int64_t& { return r.training.eval_interval; }, 0),
             int_field(
                 "eval_iters", [](Recipe& r) -> int64_t& { return r.training.eval_iters; }, 0),
             int_field(
                 "num_threads", [](Recipe& r) -> int64_t& { return r.training.num_threads; }, 0, 4096),
             int_field(
                 "max_nonfinite_in_a_row", [](Recipe& r) -> int64_t& { return r.training.max_nonfinite_in_a_row; }, 1),
             bool_field("check_for_nan_in_loss_and_grad",
                        [](Recipe& r) -> bool& { return r.training.check_for_nan_in_loss_and_grad; }),
             bool_field("enable_cuda_graph", [](Recipe& r) -> bool& { return r.training.enable_cuda_graph; }),
             bool_field("deterministic_mode", [](Recipe& r) -> bool& { return r.training.deterministic_mode; }),
             dbl_field(
                 "loss_spike_threshold", [](Recipe& r) -> double& { return r.training.loss_spike_threshold; }, 0.0,
                 1e6),
             int_field(
                 "loss_spike_window", [](Recipe& r) -> int64_t& { return r.training.loss_spike_window; }, 1, 100000),
             enum_field<SpikePolicy>("spike_policy", [](Recipe& r) -> SpikePolicy& { return r.training.spike_policy; },
                                     {SpikePolicy::stop, SpikePolicy::skip, SpikePolicy::rerun}),
             int_field(
                 "param_hash_interval", [](Recipe& r) -> int64_t& { return r.training.param_hash_interval; }, 0),
         }});
    t.push_back(
        {"optimizer",
         {
             dbl_field(
                 "lr", [](Recipe& r) -> double& { return r.optimizer.lr; }, 0.0, 10.0),
             dbl_field(
                 "min_lr", [](Recipe& r) -> double& { return r.optimizer.min_lr; }, 0.0, 10.0),
             enum_field<LrDecayStyle>("lr_decay_style",
                                      [](Recipe& r) -> LrDecayStyle& { return r.optimizer.lr_decay_style; },
                                      {LrDecayStyle::cosine, LrDecayStyle::linear, LrDecayStyle::constant}),
             int_field(
                 "lr_warmup_tokens", [](Recipe& r) -> int64_t& { return r.optimizer.lr_warmup_tokens; }, 0),
             int_field(
                 "lr_decay_tokens", [](Recipe& r) -> int64_t& { return r.optimizer.lr_decay_tokens; }, 0),
             dbl_field(
                 "weight_decay", [](Recipe& r) -> double& { return r.optimizer.weight_decay; }, 0.0, 10.0),
             dbl_field(
                 "adam_beta1", [](Recipe& r) -> double& { return r.optimizer.adam_beta1; }, 0.0, 0.999999),
             dbl_field(
                 "adam_beta2", [](Recipe& r) -> double& { return r.optimizer.adam_beta2; }, 0.0, 0.999999999),
             dbl_field(
                 "adam_eps", [](Recipe& r) -> double& { return r.optimizer.adam_eps; }, 0.0, 1.0),
             dbl_field(
                 "clip_grad", [](Recipe& r) -> double& { return r.optimizer.clip_grad; }, 0.0, 1e9),
             dbl_field(
                 "initial_loss_scale", [](Recipe& r) -> double& { return r.optimizer.initial_loss_scale; }, 1.0, 1e38),
             int_field(
                 "loss_scale_window", [](Recipe& r) -> int64_t& { return r.optimizer.loss_scale_window; }, 1),
             int_field(
                 "hysteresis", [](Recipe& r) -> int64_t& { return r.optimizer.hysteresis; }, 1),
             dbl_field(
                 "min_loss_scale", [](Recipe& r) -> double& { return r.optimizer.min_loss_scale; }, 1e-30, 1e38),
         }});
    Field blend{"blend",
                [](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
                  r.data.blend.clear();
                  if (n.IsNull()) return;
                  if (!n.IsSequence()) bad(c, p, n, "expected a list of {weight, prefix} entries");
                  for (size_t i = 0; i < n.size(); ++i) {
                    std::string ip = fmt::format("{}[{}]", p, i);
                    check_keys(c, ip, n[i], {"weight", "prefix"});
                    BlendSource s;
                    if (!n[i]["prefix"])
                      bad(c, ip, n[i], "missing 'prefix' (a Megatron .bin/.idx path without extension)");
                    s.prefix = read_string(c, ip + ".prefix", n[i]["prefix"]);
                    if (n[i]["weight"]) s.weight = read_double(c, ip + ".weight", n[i]["weight"], 1e-12, 1e12);
                    s.weighted = static_cast<bool>(n[i]["weight"]);
                    r.data.blend.push_back(s);
                  }
                },
                [](const Recipe& r, YAML::Emitter& e) {
                  e << YAML::Key << "blend" << YAML::Value << YAML::BeginSeq;
                  for (auto& s : r.data.blend) {
                    e << YAML::Flow << YAML::BeginMap;
                    if (s.weighted) e << YAML::Key << "weight" << YAML::Value << fmt::format("{}", s.weight);
                    e << YAML::Key << "prefix" << YAML::Value << s.prefix << YAML::EndMap;
                  }
                  e << YAML::EndSeq;
                }};
    // data.path: PREFIX is Megatron's unweighted `--data-path PREFIX`, kept in the recipe
    // as a blend of one entry without weight (which is also how to_yaml writes it).
    Field path{"path",
               [](Recipe& r, const YAML::Node& n, const Ctx& c, const std::string& p) {
                 if (n.IsNull()) return;
                 if (!r.data.blend.empty())
                   bad(c, p, n,
                       "data.path and data.blend are both set (data.path is one source without a weight; remove one, "
                       "or --set data.blend=null)");
                 BlendSource s;
                 s.prefix = read_string(c, p, n);
                 s.weighted = false;
                 r.data.blend.push_back(s);
               },
               [](const Recipe&, YAML::Emitter&) {}};
    t.push_back({"data",
                 {
                     blend,
                     path,
                     str_field("split", [](Recipe& r) -> std::string& { return r.data.split; }),
                     str_field("vocab_file", [](Recipe& r) -> std::string& { return r.data.vocab_file; }),
                     str_field("merge_file", [](Recipe& r) -> std::string& { return r.data.merge_file; }),
                     enum_field<TokenizerType>("tokenizer_type",
                                               [](Recipe& r) -> TokenizerType& { return r.data.tokenizer_type; },
                                               {TokenizerType::gpt2_bpe, TokenizerType::huggingface}),
                     str_field("tokenizer_model", [](Recipe& r) -> std::string& { return r.data.tokenizer_model; }),
                     str_field("cache_dir", [](Recipe& r) -> std::string& { return r.data.cache_dir; }),
                     bool_field("mock", [](Recipe& r) -> bool& { return r.data.mock; }),
                     bool_field("eod_mask_loss", [](Recipe& r) -> bool& { return r.data.eod_mask_loss; }),
                 }});
    t.push_back({"checkpoint",
                 {
                     str_field("save", [](Recipe& r) -> std::string& { return r.checkpoint.save; }),
                     str_field("load", [](Recipe& r) -> std::string& { return r.checkpoint.load; }),
                     int_field(
                         "save_interval", [](Recipe& r) -> int64_t& { return r.checkpoint.save_interval; }, 0),
                     int_field(
                         "keep_last", [](Recipe& r) -> int64_t& { return r.checkpoint.keep_last; }, 0),
                 }});
    t.push_back({"logging",
                 {
                     str_field("dir", [](Recipe& r) -> std::string& { return r.logging.dir; }),
                     int_field(
                         "log_interval", [](Recipe& r) -> int64_t& { return r.logging.log_interval; }, 1),
                     bool_field("tensorboard", [](Recipe& r) -> bool& { return r.logging.tensorboard; }),
                     dbl_field(
                         "peak_tflops", [](Recipe& r) -> double& { return r.logging.peak_tflops; }, 0.0, 1e9),
                     dbl_field(
                         "straggler_margin", [](Recipe& r) -> double& { return r.logging.straggler_margin; }, 0.0, 1e6),
                     int_field(
                         "straggler_intervals", [](Recipe& r) -> int64_t& { return r.logging.straggler_intervals; }, 0),
                     bool_field("step_timing", [](Recipe& r) -> bool& { return r.logging.step_timing; }),
                     bool_field("gpu_profile", [](Recipe& r) -> bool& { return r.logging.gpu_profile; }),
                 }});
    return t;
  }();
  return t;
}

// Sets doc[a][b]... = value, creating maps on the way.
void apply_override(YAML::Node doc, const std::string& spec, Ctx& ctx) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    throw_input("--set {}: expected section.key=value (e.g. --set training.train_iters=100)", spec);
  std::string path = spec.substr(0, eq), value = spec.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (parts.size() < 2 || std::any_of(parts.begin(), parts.end(), [](auto& s) { return s.empty(); }))
    throw_input("--set {}: expected section.key=value (e.g. --set training.train_iters=100)", spec);
  YAML::Node v;
  try {
    v = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw_input("--set {}: value is not valid YAML: {}", spec, e.msg);
  }
  // yaml-cpp nodes are handles: walking down by reassigning would rebind; use recursion.
  std::function<void(YAML::Node, size_t)> set = [&](YAML::Node n, size_t i) {
    if (i + 1 == parts.size()) {
      n[parts[i]] = v;
      return;
    }
    if (!n[parts[i]] || !n[parts[i]].IsMap()) n[parts[i]] = YAML::Node(YAML::NodeType::Map);
    set(n[parts[i]], i + 1);
  };
  // A run length is one of three keys: a --set of one replaces the recipe's other one
  // (two --sets of different ones are still an error, from validate()).
  static const char* kRunLength[] = {"train_iters", "train_samples", "train_tokens"};
  if (parts.size() == 2 && parts[0] == "training" &&
      std::any_of(std::begin(kRunLength), std::end(kRunLength), [&](const char* k) { return parts[1] == k; }) &&
      doc["training"] && doc["training"].IsMap()) {
    for (const char* other : kRunLength) {
      const std::string key = std::string("training.") + other;
      if (parts[1] == other || !doc["training"][other] || ctx.overridden.count(key)) continue;
      doc["training"].remove(other);
      ctx.notes.push_back(fmt::format("--set {} replaces the recipe's {}", spec, key));
    }
  }
  set(doc, 0);
  ctx.overridden[path] = "--set " + spec;
}

// yaml-cpp keeps the first of two equal keys in a map; an override appended to a recipe
// would be ignored. Reject them, naming both places.
void check_duplicate_keys(const Ctx& c, const YAML::Node& n, const std::string& path) {
  if (n.IsMap()) {
    std::map<std::string, YAML::Mark> seen;
    for (auto it = n.begin(); it != n.end(); ++it) {
      const std::string k = it->first.IsScalar() ? it->first.Scalar() : "?";
      const std::string kp = path.empty() ? k : path + "." + k;
      auto [at, fresh] = seen.emplace(k, it->first.Mark());
      if (!fresh)
        throw InputError(fmt::format("{}:{}:{}: key '{}' is given twice (first at line {}); remove one", c.origin,
                                     it->first.Mark().line + 1, it->first.Mark().column + 1, kp, at->second.line + 1));
      check_duplicate_keys(c, it->second, kp);
    }
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) check_duplicate_keys(c, n[i], fmt::format("{}[{}]", path, i));
  }
}

Recipe parse_doc(YAML::Node doc, Ctx& ctx, const std::vector<std::string>& overrides) {
  if (doc.IsNull()) doc = YAML::Node(YAML::NodeType::Map);
  if (!doc.IsMap())
    throw_input("{}: a recipe is a map of sections (model, parallel, training, ...)", ctx.where("", doc));
  for (auto& o : overrides) apply_override(doc, o, ctx);
  std::vector<std::string> sections;
  for (auto& [s, _] : table()) sections.push_back(s);
  check_keys(ctx, "", doc, sections);
  Recipe r;
  for (auto& [sec, fields] : table()) {
    YAML::Node sn = doc[sec];
    if (!sn || sn.IsNull()) continue;
    std::vector<std::string> names;
    for (auto& f : fields) names.push_back(f.name);
    check_keys(ctx, sec, sn, names);
    for (auto& f : fields) {
      YAML::Node fn = sn[f.name];
      if (fn) f.read(r, fn, ctx, sec + "." + f.name);
    }
  }
  // Derived defaults.
  // Megatron's default MLP width: 4 x hidden; with SwiGLU two thirds of that for each of gate
  // and up (the same parameters), rounded down to a multiple of 64.
  if (r.model.ffn_hidden_size == 0)
    r.model.ffn_hidden_size = r.model.swiglu ? 4 * r.model.hidden_size * 2 / 3 / 64 * 64 : 4 * r.model.hidden_size;
  if (r.model.max_position_embeddings == 0) r.model.max_position_embeddings = r.model.seq_length;
  if (r.model.moe.enabled() && r.model.moe.moe_ffn_hidden_size == 0)
    r.model.moe.moe_ffn_hidden_size = r.model.ffn_hidden_size;
  validate(r);
  return r;
}

}  // namespace

Recipe parse_recipe(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides) {
  Ctx ctx{origin, {}, {}};
  YAML::Node doc;
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(text);
    if (docs.size() > 1)
      throw_input("{}:{}: a second YAML document begins here (after '---'); a recipe is one document", origin,
                  docs[1].Mark().line + 1);
    if (!docs.empty()) doc = docs[0];
  } catch (const YAML::Exception& e) {
    throw_input("{}:{}:{}: invalid YAML: {}", origin, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (text.find('\0') != std::string::npos) throw_input("{}: holds NUL bytes: not a YAML recipe", origin);
  check_duplicate_keys(ctx, doc, "");
  Recipe r = parse_doc(doc, ctx, overrides);
  r.notes = ctx.notes;
  std::filesystem::path p(origin);
  r.name = p.stem().string();
  r.source_path = origin;
  if (r.logging.dir.empty()) r.logging.dir = "runs/" + r.name;
  return r;
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(st)) throw_input("{}: is a directory, expected a recipe YAML file", path);
  if (std::filesystem::is_character_file(st) || std::filesystem::is_block_file(st) || std::filesystem::is_socket(st))
    throw_input("{}: a device or socket, not a file: expected a recipe YAML file", path);
  constexpr uintmax_t kMaxBytes = 16u << 20;
  if (std::filesystem::is_regular_file(st) && std::filesystem::file_size(path, ec) > kMaxBytes)
    throw_input("{}: {} bytes, too large for a recipe (at most 16 MiB)", path, std::filesystem::file_size(path, ec));
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw_input("{}: cannot open recipe file ({})", path,
                std::filesystem::exists(path) ? "permission denied" : "no such file");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_recipe(ss.str(), path, overrides);
}

namespace {
[[noreturn]] void invalid(const Recipe& r, const std::string& msg) {
  throw InputError(fmt::format("{}: {}", r.source_path.empty() ? "recipe" : r.source_path, msg));
}

// The architecture keys against each other (the layout-independent ones; num_query_groups
// against tp is with the parallel checks).
void validate_architecture(const Recipe& r) {
  auto& m = r.model;
  if (m.num_query_groups > 0 && m.num_attention_heads % m.num_query_groups != 0)
    invalid(r, fmt::format("model.num_attention_heads ({}) must be divisible by model.num_query_groups ({})",
                           m.num_attention_heads, m.num_query_groups));
  if (m.rope()) {
    const double rot = static_cast<double>(m.head_dim()) * m.rotary_percent;
    const auto rot_dim = static_cast<int64_t>(std::llround(rot));
    if (!(m.rotary_percent > 0) || std::abs(rot - static_cast<double>(rot_dim)) > 1e-9 || rot_dim % 2 != 0)
      invalid(r, fmt::format("model.rotary_percent ({}) must be in (0, 1] and rotate an even whole number of each "
                             "head's {} dims",
                             m.rotary_percent, m.head_dim()));
  } else if (m.use_rope_scaling) {
    invalid(r, "model.use_rope_scaling applies to rotary positions: set model.position_embedding_type: rope");
  }
  if (m.swiglu && m.ffn_hidden_size <= 0) invalid(r, "model.ffn_hidden_size must be positive with model.swiglu");
  if (m.qk_layernorm && !m.rmsnorm())
    invalid(r, "model.qk_layernorm is an RMSNorm of each query and key head: it needs model.normalization: RMSNorm");
}

// A dense model (num_experts 0) with an MoE key changed from its default, or an expert
// layout: the key would be ignored, so it is an error naming it.
void validate_dense_moe_keys(const Recipe& r) {
  const MoeConfig& m = r.model.moe;
  const MoeConfig d;
  const std::pair<const char*, bool> changed[] = {
      {"model.moe_router_topk", m.moe_router_topk != d.moe_router_topk},
      {"model.moe_ffn_hidden_size", m.moe_ffn_hidden_size != d.moe_ffn_hidden_size},
      {"model.moe_shared_expert_intermediate_size",
       m.moe_shared_expert_intermediate_size != d.moe_shared_expert_intermediate_size},
      {"model.moe_shared_expert_gate", m.moe_shared_expert_gate},
      {"model.moe_layer_freq", m.moe_layer_freq != 1 || !m.moe_layer_pattern.empty()},
      {"model.moe_router_load_balancing_type", m.moe_router_load_balancing_type != d.moe_router_load_balancing_type},
      {"model.moe_aux_loss_coeff", m.moe_aux_loss_coeff != 0},
      {"model.moe_z_loss_coeff", m.moe_z_loss_coeff != 0},
      {"model.moe_router_score_function", m.moe_router_score_function != d.moe_router_score_function},
      {"model.moe_router_pre_softmax", m.moe_router_pre_softmax},
      {"model.moe_router_topk_scaling_factor", m.moe_router_topk_scaling_factor != 0},
      {"model.moe_router_enable_expert_bias", m.moe_router_enable_expert_bias},
      {"model.moe_router_bias_update_rate", m.moe_router_bias_update_rate != d.moe_router_bias_update_rate},
      {"model.moe_router_num_groups", m.moe_router_num_groups != 0},
      {"model.moe_router_group_topk", m.moe_router_group_topk != 0},
      {"model.moe_expert_capacity_factor", m.moe_expert_capacity_factor.has_value()},
      {"model.moe_pad_expert_input_to_capacity", m.moe_pad_expert_input_to_capacity},
      {"model.moe_token_drop_policy", m.moe_token_drop_policy != d.moe_token_drop_policy},
      {"model.moe_router_dtype", m.moe_router_dtype != d.moe_router_dtype},
      {"model.moe_input_jitter_eps", m.moe_input_jitter_eps != 0},
      {"model.moe_token_dispatcher_type", m.moe_token_dispatcher_type != d.moe_token_dispatcher_type},
      {"parallel.expert_model_parallel_size", r.parallel.expert_model_parallel_size != 1},
      {"parallel.expert_tensor_parallel_size", r.parallel.expert_tensor_parallel_size != 0},
  };
  for (const auto& [key, set] : changed)
    if (set)
      invalid(r, fmt::format("{} is set but model.num_experts is 0 (a dense model): set model.num_experts", key));
}

// Sinkhorn's balancing chooses the experts itself and weighs them by a softmax over all
// experts (top-k > 1) or a sigmoid (top-k 1), as Megatron-Core does: the keys that would
// change that, the balancing loss and a capacity (Megatron-Core's checks) are refused.
void validate_moe_sinkhorn(const Recipe& r) {
  const MoeConfig& m = r.model.moe;
  const MoeConfig d{};
  if (m.moe_router_load_balancing_type != MoeLoadBalancing::sinkhorn) return;
  auto no = [&](bool set, const char* key, const char* why) {
    if (set)
      invalid(r, fmt::format("{} is set with model.moe_router_load_balancing_type: sinkhorn, which {}", key, why));
  };
  no(m.moe_aux_loss_coeff > 0, "model.moe_aux_loss_coeff", "has no balancing loss (set it to 0)");
  no(m.moe_expert_capacity_factor.has_value(), "model.moe_expert_capacity_factor",
     "routes dropless (a capacity needs aux_loss, seq_aux_loss, global_aux_loss or none)");
  no(m.moe_router_enable_expert_bias, "model.moe_router_enable_expert_bias", "balances without an expert bias");
  no(m.moe_router_num_groups > 0 || m.moe_router_group_topk > 0, "model.moe_router_num_groups",
     "chooses from all experts (no group-limited routing)");
  no(m.moe_router_score_function != d.moe_router_score_function || m.moe_router_pre_softmax,
     "model.moe_router_score_function or moe_router_pre_softmax",
     "weighs the chosen experts by a softmax over all experts (top-k > 1) or a sigmoid (top-k 1) itself");
  no(m.moe_router_topk_scaling_factor != 0, "model.moe_router_topk_scaling_factor", "does not scale the weights");
}

// The router's keys against each other (Megatron-Core's checks, and the combinations that
// would leave a key without effect).
void validate_moe_router(const Recipe& r) {
  const MoeConfig& m = r.model.moe;
  const bool sigmoid = m.moe_router_score_function == MoeScoreFunction::sigmoid;
  if (m.moe_router_topk > m.num_experts)
    invalid(r, fmt::format("model.moe_router_topk ({}) must not exceed model.num_experts ({})", m.moe_router_topk,
                           m.num_experts));
  validate_moe_sinkhorn(r);
  if (m.moe_router_topk == 1 && !sigmoid && !m.moe_router_pre_softmax &&
      m.moe_router_load_balancing_type != MoeLoadBalancing::sinkhorn)
    invalid(r,
            "model.moe_router_topk 1 with the softmax score function needs model.moe_router_pre_softmax: true (a "
            "softmax over one selected logit is always 1, so the router would get no gradient)");
  if (m.moe_router_pre_softmax && sigmoid)
    invalid(r, "model.moe_router_pre_softmax applies to moe_router_score_function: softmax, not sigmoid");
  if (m.moe_router_enable_expert_bias && !sigmoid)
    invalid(r,
            "model.moe_router_enable_expert_bias (aux-loss-free balancing) needs model.moe_router_score_function: "
            "sigmoid");
  if (!m.moe_router_enable_expert_bias && m.moe_router_bias_update_rate != MoeConfig{}.moe_router_bias_update_rate)
    invalid(r, "model.moe_router_bias_update_rate is set but model.moe_router_enable_expert_bias is false");
  if (m.moe_router_enable_expert_bias && !(m.moe_router_bias_update_rate > 0))
    invalid(r, "model.moe_router_bias_update_rate must be positive with model.moe_router_enable_expert_bias");
  if (m.moe_router_load_balancing_type == MoeLoadBalancing::none && m.moe_aux_loss_coeff > 0)
    invalid(r, fmt::format("model.moe_aux_loss_coeff ({}) has no effect with model.moe_router_load_balancing_type: "
                           "none: choose aux_loss, seq_aux_loss or global_aux_loss, or set the coefficient to 0",
                           m.moe_aux_loss_coeff));
  if (m.moe_input_jitter_eps > 0 && m.moe_input_jitter_eps >= 1)
    invalid(r, "model.moe_input_jitter_eps must be below 1");
}

// Group-limited routing: experts in moe_router_num_groups equal groups, moe_router_group_topk
// of them kept per token, the top-k taken inside those.
void validate_moe_groups(const Recipe& r) {
  const MoeConfig& m = r.model.moe;
  if (m.moe_router_group_topk == 0 && m.moe_router_num_groups == 0) return;
  if (m.moe_router_group_topk == 0)
    invalid(r,
            "model.moe_router_num_groups is set but model.moe_router_group_topk is not: group-limited routing "
            "needs both");
  if (m.moe_router_num_groups == 0)
    invalid(r, "model.moe_router_group_topk needs model.moe_router_num_groups (the number of expert groups)");
  if (m.num_experts % m.moe_router_num_groups != 0)
    invalid(r, fmt::format("model.num_experts ({}) must be divisible by model.moe_router_num_groups ({})",
                           m.num_experts, m.moe_router_num_groups));
  if (m.moe_router_group_topk > m.moe_router_num_groups)
    invalid(r, fmt::format("model.moe_router_group_topk ({}) must not exceed model.moe_router_num_groups ({})",
                           m.moe_router_group_topk, m.moe_router_num_groups));
  if (m.moe_router_group_topk > m.moe_router_topk)
    invalid(r, fmt::format("model.moe_router_group_topk ({}) must not exceed model.moe_router_topk ({}): a group's "
                           "score is the sum of its top moe_router_topk / moe_router_group_topk experts",
                           m.moe_router_group_topk, m.moe_router_topk));
  if (m.moe_router_topk > m.moe_router_group_topk * (m.num_experts / m.moe_router_num_groups))
    invalid(r, fmt::format("model.moe_router_topk ({}) exceeds the experts of the moe_router_group_topk ({}) groups "
                           "a token keeps ({} each)",
                           m.moe_router_topk, m.moe_router_group_topk, m.num_experts / m.moe_router_num_groups));
}

// Sizes, layers, capacity and the expert layout of an MoE model.
void validate_moe(const Recipe& r) {
  const MoeConfig& m = r.model.moe;
  if (!m.enabled()) return validate_dense_moe_keys(r);
  validate_moe_router(r);
  validate_moe_groups(r);
  if (!m.moe_layer_pattern.empty() && static_cast<int64_t>(m.moe_layer_pattern.size()) != r.model.num_layers)
    invalid(r, fmt::format("model.moe_layer_freq lists {} layers but model.num_layers is {}",
                           m.moe_layer_pattern.size(), r.model.num_layers));
  if (m.moe_shared_expert_gate && m.moe_shared_expert_intermediate_size == 0)
    invalid(r, "model.moe_shared_expert_gate needs a shared expert: set model.moe_shared_expert_intermediate_size");
  if (m.moe_pad_expert_input_to_capacity && !m.moe_expert_capacity_factor)
    invalid(r,
            "model.moe_pad_expert_input_to_capacity needs model.moe_expert_capacity_factor (without it routing "
            "is dropless and there is no capacity to pad to)");
  if (!m.moe_expert_capacity_factor && m.moe_token_drop_policy != MoeConfig{}.moe_token_drop_policy)
    invalid(r,
            "model.moe_token_drop_policy is set but model.moe_expert_capacity_factor is not (dropless routing "
            "drops nothing)");
  const int64_t ep = r.ep(), etp = r.etp(), tp = r.tp();
  if (m.num_experts % ep != 0)
    invalid(r, fmt::format("model.num_experts ({}) must be divisible by parallel.expert_model_parallel_size ({})",
                           m.num_experts, ep));
  if (m.moe_ffn_hidden_size % etp != 0)
    invalid(r, fmt::format("model.moe_ffn_hidden_size ({}) must be divisible by the expert tensor-parallel size ({})",
                           m.moe_ffn_hidden_size, etp));
  if (m.moe_shared_expert_intermediate_size % tp != 0)
    invalid(r, fmt::format("model.moe_shared_expert_intermediate_size ({}) must be divisible by "
                           "parallel.tensor_model_parallel_size ({})",
                           m.moe_shared_expert_intermediate_size, tp));
  if (r.model.add_bias_linear && etp > 1)
    invalid(r, fmt::format("model.add_bias_linear with experts needs an expert tensor-parallel size of 1 (it is {}): "
                           "set parallel.expert_tensor_parallel_size: 1 or model.add_bias_linear: false",
                           etp));
}

// model: sizes, heads, the architecture's options, positions.
void validate_model(const Recipe& r) {
  auto& m = r.model;
  if (m.num_layers <= 0 || m.hidden_size <= 0 || m.num_attention_heads <= 0 || m.seq_length <= 0)
    invalid(r, "model.num_layers, model.hidden_size, model.num_attention_heads and model.seq_length are required");
  if (m.kv_channels == 0 && m.hidden_size % m.num_attention_heads != 0)
    invalid(r, fmt::format("model.hidden_size ({}) must be divisible by model.num_attention_heads ({}), or set "
                           "model.kv_channels (the head size)",
                           m.hidden_size, m.num_attention_heads));
  validate_architecture(r);
  if (m.max_position_embeddings < m.seq_length)
    invalid(r, fmt::format("model.max_position_embeddings ({}) must be >= model.seq_length ({})",
                           m.max_position_embeddings, m.seq_length));
  validate_moe(r);
}

// training keys that stop a run (checked before the layout, as they always were).
void validate_run_stops(const Recipe& r) {
  auto& t = r.training;
  if (t.exit_interval > 0 && r.checkpoint.save.empty())
    invalid(r,
            "training.exit_interval stops the run with a checkpoint, so it needs checkpoint.save (the directory to "
            "resume from)");
  if (t.loss_spike_threshold > 0 && t.loss_spike_threshold <= 1)
    invalid(r, fmt::format("training.loss_spike_threshold ({}) is a ratio to the running mean of the loss: 0 (off) or "
                           "above 1, e.g. 2.0",
                           t.loss_spike_threshold));
}

// parallel: context parallelism against the sequence, the heads per tensor-parallel rank
// and its communication type (docs/specs/context-parallel.md).
void validate_context_parallel(const Recipe& r) {
  auto& m = r.model;
  auto& p = r.parallel;
  const int64_t cp = p.context_parallel_size, tp = p.tensor_model_parallel_size;
  const auto& hier = p.hierarchical_context_parallel_sizes;
  if (!hier.empty() && p.cp_comm_type != CpCommType::a2a_p2p)
    invalid(r, fmt::format("parallel.hierarchical_context_parallel_sizes is read only with parallel.cp_comm_type: "
                           "a2a+p2p (it is {}): remove it",
                           to_string(p.cp_comm_type)));
  if (cp == 1) return;
  if (m.seq_length % (2 * cp) != 0)
    invalid(r, fmt::format("parallel.context_parallel_size ({}) needs model.seq_length ({}) divisible by 2 x "
                           "context_parallel_size = {}: each rank holds two of the sequence's {} equal chunks",
                           cp, m.seq_length, 2 * cp, 2 * cp));
  if (p.sequence_parallel && tp > 1 && (m.seq_length / cp) % tp != 0)
    invalid(r, fmt::format("parallel.sequence_parallel with parallel.context_parallel_size ({}) needs each rank's "
                           "model.seq_length / context_parallel_size = {} tokens divisible by "
                           "tensor_model_parallel_size ({})",
                           cp, m.seq_length / cp, tp));
  int64_t a2a = 0;  // the size of the all-to-all groups
  if (p.cp_comm_type == CpCommType::a2a) a2a = cp;
  if (p.cp_comm_type == CpCommType::a2a_p2p) {
    int64_t prod = 1;
    for (int64_t x : hier) prod *= x;
    if (hier.size() != 2 || prod != cp)
      invalid(r, fmt::format("parallel.cp_comm_type a2a+p2p needs parallel.hierarchical_context_parallel_sizes: [a2a "
                             "size, p2p size] whose product is parallel.context_parallel_size ({})",
                             cp));
    a2a = hier[0];
  }
  const int64_t heads = m.num_attention_heads / tp, groups = m.query_groups() / tp;
  if (a2a > 1 && (heads % a2a != 0 || groups % a2a != 0))
    invalid(r, fmt::format("parallel.cp_comm_type {} exchanges heads: the attention heads ({}) and query groups ({}) "
                           "per tensor-parallel rank must be divisible by its all-to-all size ({}); use p2p or "
                           "all_gather",
                           to_string(p.cp_comm_type), heads, groups, a2a));
}

// parallel: the model's heads, groups, FFN and layers against the tensor/pipeline sizes.
void validate_parallel(const Recipe& r) {
  auto& m = r.model;
  auto& p = r.parallel;
  if (p.heartbeat_timeout_minutes > 0 && p.heartbeat_timeout_minutes < 1)
    invalid(r, fmt::format("parallel.heartbeat_timeout_minutes ({}) must be 0 (off) or at least 1: a peer that is only "
                           "paused (a debugger, swapping) must not be taken for a dead one",
                           p.heartbeat_timeout_minutes));
  int64_t tp = p.tensor_model_parallel_size, pp = p.pipeline_model_parallel_size;
  if (m.num_attention_heads % tp != 0)
    invalid(r,
            fmt::format("model.num_attention_heads ({}) must be divisible by parallel.tensor_model_parallel_size ({})",
                        m.num_attention_heads, tp));
  if (m.query_groups() % tp != 0)
    invalid(r, fmt::format("model.num_query_groups ({}) must be divisible by parallel.tensor_model_parallel_size ({}): "
                           "each tensor-parallel rank holds whole key/value groups",
                           m.query_groups(), tp));
  if (m.ffn_hidden_size % tp != 0)
    invalid(r, fmt::format("model.ffn_hidden_size ({}) must be divisible by parallel.tensor_model_parallel_size ({})",
                           m.ffn_hidden_size, tp));
  if (!p.pipeline_layers.empty()) {
    if (static_cast<int64_t>(p.pipeline_layers.size()) != pp)
      invalid(r, fmt::format("parallel.pipeline_layers lists {} stages but parallel.pipeline_model_parallel_size is {}",
                             p.pipeline_layers.size(), pp));
    int64_t sum = 0;
    for (auto x : p.pipeline_layers) sum += x;
    if (sum != m.num_layers)
      invalid(r, fmt::format("parallel.pipeline_layers sums to {} but model.num_layers is {}", sum, m.num_layers));
    if (p.num_layers_per_virtual_pipeline_stage > 0)
      invalid(r, "parallel.pipeline_layers cannot be combined with num_layers_per_virtual_pipeline_stage");
  } else if (m.num_layers % pp != 0) {
    invalid(
        r, fmt::format("model.num_layers ({}) must be divisible by parallel.pipeline_model_parallel_size ({}), or list "
                       "parallel.pipeline_layers",
                       m.num_layers, pp));
  } else if (m.num_layers < pp) {
    invalid(r,
            fmt::format("model.num_layers ({}) is smaller than the number of pipeline stages ({})", m.num_layers, pp));
  }
  if (int64_t v = p.num_layers_per_virtual_pipeline_stage; v > 0) {
    if (pp < 2) invalid(r, "parallel.num_layers_per_virtual_pipeline_stage needs pipeline_model_parallel_size >= 2");
    if ((m.num_layers / pp) % v != 0)
      invalid(r, fmt::format(
                     "layers per pipeline stage ({}) must be divisible by num_layers_per_virtual_pipeline_stage ({})",
                     m.num_layers / pp, v));
  }
  if (p.sequence_parallel && m.seq_length % tp != 0)
    invalid(r,
            fmt::format(
                "parallel.sequence_parallel needs model.seq_length ({}) divisible by tensor_model_parallel_size ({})",
                m.seq_length, tp));
  validate_context_parallel(r);
}

// training: the batch, the run's length (and that its token count fits 64 bits), the rampup.
void validate_training(const Recipe& r) {
  auto& m = r.model;
  auto& t = r.training;
  if (t.global_batch_size <= 0) invalid(r, "training.global_batch_size is required");
  if (t.global_batch_size % t.micro_batch_size != 0)
    invalid(r, fmt::format("training.global_batch_size ({}) must be divisible by training.micro_batch_size ({})",
                           t.global_batch_size, t.micro_batch_size));
  int n_len = (t.train_iters > 0) + (t.train_samples > 0) + (t.train_tokens > 0);
  if (n_len != 1) invalid(r, "set exactly one of training.train_iters, training.train_samples, training.train_tokens");
  {
    // The run's token count (iterations x batch x sequence) must fit the 64-bit counters
    // that the trainer, checkpoints and schedules keep.
    int64_t samples = t.train_samples, tokens = 0;
    const bool over = (t.train_iters > 0 && __builtin_mul_overflow(t.train_iters, t.global_batch_size, &samples)) ||
                      (t.train_tokens == 0 && __builtin_mul_overflow(samples, m.seq_length, &tokens)) ||
                      (t.train_tokens > 0 && t.train_tokens > std::numeric_limits<int64_t>::max() - m.seq_length);
    if (over) {
      const std::string key = t.train_iters > 0     ? fmt::format("training.train_iters ({})", t.train_iters)
                              : t.train_samples > 0 ? fmt::format("training.train_samples ({})", t.train_samples)
                                                    : fmt::format("training.train_tokens ({})", t.train_tokens);
      invalid(r,
              fmt::format("{} x training.global_batch_size ({}) x model.seq_length ({}) overflows a 64-bit token count",
                          key, t.global_batch_size, m.seq_length));
    }
  }
  if (t.rampup_batch_size) {
    auto& rb = *t.rampup_batch_size;
    if (rb.start >= t.global_batch_size)
      invalid(r, fmt::format("training.rampup_batch_size.start ({}) must be smaller than global_batch_size ({})",
                             rb.start, t.global_batch_size));
    if ((t.global_batch_size - rb.start) % rb.increment != 0)
      invalid(r, fmt::format(
                     "training.rampup_batch_size: global_batch_size - start ({}) must be a multiple of increment ({})",
                     t.global_batch_size - rb.start, rb.increment));
    if (rb.start % t.micro_batch_size != 0 || rb.increment % t.micro_batch_size != 0)
      invalid(
          r, fmt::format(
                 "training.rampup_batch_size: start ({}) and increment ({}) must be multiples of micro_batch_size ({})",
                 rb.start, rb.increment, t.micro_batch_size));
  }
}

// optimizer: learning rates and loss scales.
void validate_optimizer(const Recipe& r) {
  auto& t = r.training;
  auto& o = r.optimizer;
  if (o.min_lr > o.lr)
    invalid(r, fmt::format("optimizer.min_lr ({}) must not exceed optimizer.lr ({})", o.min_lr, o.lr));
  if (o.lr_decay_tokens > 0 && o.lr_warmup_tokens > o.lr_decay_tokens)
    invalid(r, fmt::format("optimizer.lr_warmup_tokens ({}) must not exceed optimizer.lr_decay_tokens ({})",
                           o.lr_warmup_tokens, o.lr_decay_tokens));
  if (t.precision == Precision::fp16 && o.min_loss_scale > o.initial_loss_scale)
    invalid(r, "optimizer.min_loss_scale must not exceed optimizer.initial_loss_scale");
}

// data: the blend, the tokenizer's files, the split.
void validate_data(const Recipe& r) {
  auto& d = r.data;
  if (!d.mock && d.blend.empty())
    invalid(r, "data.blend is empty: list {weight, prefix} sources, set data.path: PREFIX, or set data.mock: true");
  if (d.blend.size() > 1)
    for (size_t i = 0; i < d.blend.size(); ++i)
      if (!d.blend[i].weighted)
        invalid(r, fmt::format("data.blend[{}] ({}) has no weight: a blend of several sources needs a weight on every "
                               "entry (only a single source may go without one)",
                               i, d.blend[i].prefix));
  // The tokenizer: each type with its own files, never the other's.
  if (d.tokenizer_type == TokenizerType::huggingface) {
    if (d.tokenizer_model.empty())
      invalid(r,
              "data.tokenizer_type HuggingFaceTokenizer needs data.tokenizer_model (a tokenizer.json, or a directory "
              "holding one)");
    if (!d.vocab_file.empty() || !d.merge_file.empty())
      invalid(r,
              "data.vocab_file and data.merge_file are GPT-2's files (data.tokenizer_type GPT2BPETokenizer); with "
              "HuggingFaceTokenizer the tokenizer is data.tokenizer_model alone: remove them");
  } else if (!d.tokenizer_model.empty()) {
    invalid(r, fmt::format("data.tokenizer_model ({}) is read only with data.tokenizer_type: HuggingFaceTokenizer (the "
                           "type is {}, whose files are data.vocab_file and data.merge_file)",
                           d.tokenizer_model, to_string(d.tokenizer_type)));
  }
  {
    // split: up to three comma-separated non-negative numbers, not all zero.
    std::stringstream ss(d.split);
    double sum = 0;
    int n = 0;
    for (std::string part; std::getline(ss, part, ',');) {
      char* end = nullptr;
      double v = std::strtod(part.c_str(), &end);
      if (part.empty() || *end != '\0' || v < 0 || !std::isfinite(v))
        invalid(r, fmt::format(
                       "data.split \"{}\": expected up to three comma-separated non-negative numbers like \"969,30,1\"",
                       d.split));
      sum += v;
      ++n;
    }
    if (n == 0 || n > 3 || sum <= 0)
      invalid(r, fmt::format("data.split \"{}\": expected up to three comma-separated numbers with a positive sum",
                             d.split));
  }
}
}  // namespace

// The cross-key rules, section by section in the recipe's order (the training keys that
// stop a run come before the layout's rules, as they always did).
void validate(const Recipe& r) {
  validate_model(r);
  validate_run_stops(r);
  validate_parallel(r);
  validate_training(r);
  validate_optimizer(r);
  validate_data(r);
}

void validate_layout(const Recipe& r, int64_t world) {
  int64_t tp = r.tp(), pp = r.pp(), cp = r.parallel.context_parallel_size;
  if (cp > 1 && world % (tp * cp * pp) != 0)
    invalid(r, fmt::format("world size {} is not divisible by tensor_model_parallel_size x context_parallel_size x "
                           "pipeline_model_parallel_size = {} x {} x {}",
                           world, tp, cp, pp));
  if (world % (tp * pp) != 0)
    invalid(r,
            fmt::format(
                "world size {} is not divisible by tensor_model_parallel_size x pipeline_model_parallel_size = {} x {}",
                world, tp, pp));
  if (r.model.moe.enabled() && world % (r.etp() * r.ep() * pp) != 0)
    invalid(r, fmt::format("world size {} is not divisible by expert_tensor_parallel_size x "
                           "expert_model_parallel_size x pipeline_model_parallel_size = {} x {} x {}",
                           world, r.etp(), r.ep(), pp));
  int64_t dp = world / (tp * cp * pp);
  auto& t = r.training;
  int64_t unit = t.micro_batch_size * dp;
  if (t.global_batch_size % unit != 0)
    invalid(r,
            fmt::format(
                "training.global_batch_size ({}) must be divisible by micro_batch_size x data_parallel_size = {} x {}",
                t.global_batch_size, t.micro_batch_size, dp));
  if (t.rampup_batch_size) {
    auto& rb = *t.rampup_batch_size;
    if (rb.start % unit != 0 || rb.increment % unit != 0)
      invalid(r, fmt::format(
                     "training.rampup_batch_size start ({}) and increment ({}) must be multiples of micro_batch_size x "
                     "data_parallel_size = {}",
                     rb.start, rb.increment, unit));
  }
  if (int64_t v = r.parallel.num_layers_per_virtual_pipeline_stage; v > 0) {
    // Interleaving needs the microbatches of every batch to fill whole groups of pp.
    int64_t min_batch = t.rampup_batch_size ? t.rampup_batch_size->start : t.global_batch_size;
    int64_t m = min_batch / unit;
    if (m % pp != 0)
      invalid(r, fmt::format("interleaved pipeline: microbatches per batch ({}) must be a multiple of "
                             "pipeline_model_parallel_size ({})",
                             m, pp));
  }
}

void refuse_moe_model(const Recipe& r, const std::string& command) {
  if (!r.model.moe.enabled()) return;
  invalid(r, fmt::format("model.num_experts ({}): {} does not run MoE models yet (`mtnlg train` on the CPU, "
                         "`plan`, `eval`, `generate`, and Hugging Face `checkpoint export` and `import` do), and a "
                         "dense model is never built in their place",
                         r.model.moe.num_experts, command));
}

void refuse_unwired_moe(const Recipe& r) {
  const MoeConfig& m = r.model.moe;
  if (!m.enabled()) return;
  auto refuse = [&](const std::string& key, const std::string& what) {
    invalid(r, fmt::format("{}: {} with MoE layers is not built yet", key, what));
  };
  if (r.tp() > 1 && !r.parallel.sequence_parallel)
    invalid(r, fmt::format("parallel.sequence_parallel: MoE layers with tensor_model_parallel_size {} need sequence "
                           "parallelism (each tp rank routes its own tokens); set it to true",
                           r.tp()));
  if ((r.tp() > 1 || r.cp() > 1) && m.moe_router_load_balancing_type == MoeLoadBalancing::seq_aux_loss)
    refuse("model.moe_router_load_balancing_type",
           fmt::format("seq_aux_loss under tensor_model_parallel_size {} x context_parallel_size {} (sequences split "
                       "over ranks)",
                       r.tp(), r.cp()));
  if ((r.tp() > 1 || r.cp() > 1) && m.moe_router_load_balancing_type == MoeLoadBalancing::sinkhorn)
    refuse("model.moe_router_load_balancing_type",
           fmt::format("sinkhorn under tensor_model_parallel_size {} x context_parallel_size {} (its factors sum over "
                       "the micro batch's tokens, split over ranks)",
                       r.tp(), r.cp()));
  if (m.moe_router_load_balancing_type == MoeLoadBalancing::global_aux_loss &&
      r.parallel.recompute_granularity == RecomputeGranularity::full)
    refuse("model.moe_router_load_balancing_type",
           "global_aux_loss with parallel.recompute_granularity full (a recomputed forward would add its micro batch "
           "to the step's running counts again)");
  if (r.model.add_bias_linear) refuse("model.add_bias_linear", "true (expert biases)");
}

std::string to_yaml(const Recipe& r) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  for (auto& [sec, fields] : table()) {
    e << YAML::Key << sec << YAML::Value << YAML::BeginMap;
    for (auto& f : fields) f.write(r, e);
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace mtnlg
