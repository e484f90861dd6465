// `mtnlg data samples RECIPE --range A:B [--part train|valid|test] [--json]`: the sample
// stream a run would read, without training. For global samples A..B-1 of the part, in
// training order (what the Loader hands out: global batch k covers consecutive indices),
// prints the source index, the document (sequence) ids of that source's .idx the sample
// spans, and its seq_length+1 token ids. For debugging data order and contamination,
// and the tests that compare mtnlg's order with Megatron's rules.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/process/module_configs.hpp"
#include "core/error.hpp"
#include "config/recipe.hpp"
#include "data/sample_source.hpp"

namespace mtnlg::app {

namespace {

struct SamplesArgs {
  std::string recipe;
  std::vector<std::string> sets;
  std::string range;
  std::string part = "train";
  bool json = false;
};

std::pair<int64_t, int64_t> parse_range(const std::string& s) {
  const auto colon = s.find(':');
  auto num = [&](const std::string& t) -> int64_t {
    if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos || t.size() > 18)
      throw_input("--range {}: expected A:B with whole numbers A < B (global sample indices, B exclusive)", s);
    return std::stoll(t);
  };
  if (colon == std::string::npos) throw_input("--range {}: expected A:B (e.g. --range 0:16)", s);
  const int64_t a = num(s.substr(0, colon)), b = num(s.substr(colon + 1));
  if (a >= b) throw_input("--range {}: expected A < B (B is exclusive)", s);
  return {a, b};
}

void run_samples(const SamplesArgs& a) {
  const Recipe r = load_recipe(a.recipe, a.sets);
  const auto [from, to] = parse_range(a.range);
  int part = -1;
  if (a.part == "train") part = 0;
  if (a.part == "valid") part = 1;
  if (a.part == "test") part = 2;
  if (part < 0) throw_input("--part {}: expected train, valid or test", a.part);
  std::shared_ptr<const data::SampleSource> src;
  if (r.data.mock) {
    src = data::make_mock_source(r.model.vocab_size, r.model.seq_length, static_cast<uint64_t>(r.training.seed));
  } else {
    if (!data::split_part_present(r.data.split, part))
      throw_input("{}: data.split \"{}\" has no {} part", a.recipe, r.data.split, a.part);
    const std::string cache = r.data.cache_dir.empty() ? r.logging.dir + "/index-cache" : r.data.cache_dir;
    const int64_t n = data::split_num_samples(r.training, r.model.seq_length)[static_cast<size_t>(part)];
    src = data::make_blend_source(blend_spec(r), part, n, cache);
  }
  if (to > src->size())
    throw_input("--range {}: the {} part holds {} samples for this recipe (indices 0..{})", a.range, a.part,
                src->size(), src->size() - 1);
  const auto names = src->source_names();
  std::vector<int32_t> buf(static_cast<size_t>(r.model.seq_length + 1));
  for (int64_t i = from; i < to; ++i) {
    src->sample(i, buf.data());
    const int k = src->source_of(i);
    const auto docs = src->documents_of(i);
    if (a.json) {
      nlohmann::json j = {{"sample", i}, {"source", k}, {"documents", docs}, {"tokens", buf}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::string d, t;
      for (auto x : docs) d += (d.empty() ? "" : ",") + std::to_string(x);
      for (auto x : buf) t += (t.empty() ? "" : " ") + std::to_string(x);
      std::printf("sample %lld | source %d %s | documents %s | tokens %s\n", static_cast<long long>(i), k,
                  names[static_cast<size_t>(k)].c_str(), d.empty() ? "-" : d.c_str(), t.c_str());
    }
  }
}

}  // namespace

void register_data_samples(CLI::App& data_cmd) {
  auto* cmd = data_cmd.add_subcommand(
      "samples", "Print a run's samples A..B-1 in training order: source, documents and token ids, without training");
  static SamplesArgs args;
  cmd->add_option("recipe", args.recipe, "Recipe YAML")->required();
  cmd->add_option("--set", args.sets, "Override a recipe key: section.key=value; repeatable");
  cmd->add_option("--range", args.range, "A:B, global sample indices A..B-1 (B exclusive)")->required();
  cmd->add_option("--part", args.part, "Split part: train, valid or test")->capture_default_str();
  cmd->add_flag("--json", args.json, "One JSON object per line: {\"sample\", \"source\", \"documents\", \"tokens\"}");
  cmd->callback([] { run_samples(args); });
}

}  // namespace mtnlg::app
