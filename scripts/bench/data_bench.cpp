// Data pipeline micro-benchmarks, built by scripts/bench/*.sh against the static
// libraries of a build dir (no CMake target needed):
//   data_bench tokenize VOCAB MERGES DOCS.jsonl PASSES  -> per pass: seconds, MB/s, tokens/s
//   data_bench index DIR DOCS TOKENS SEQ EPOCHS        -> synthetic .idx + sparse .bin of DOCS
//       documents / TOKENS tokens; builds the GPT sample index for EPOCHS epochs; prints
//       seconds and peak RSS
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "data/gpt_dataset.hpp"
#include "data/indexed_dataset.hpp"
#include "data/tokenizer.hpp"

using namespace mtnlg::data;
using clk = std::chrono::steady_clock;

static double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

static int tokenize(int argc, char** argv) {
  if (argc < 6) return 2;
  auto tok = Tokenizer::from_files(argv[2], argv[3]);
  std::vector<std::string> docs;
  std::ifstream in(argv[4]);
  std::string line;
  size_t bytes = 0;
  while (std::getline(in, line)) {
    docs.push_back(nlohmann::json::parse(line)["text"].get<std::string>());
    bytes += docs.back().size();
  }
  const int passes = std::atoi(argv[5]);
  std::vector<int32_t> ids;
  for (int p = 0; p < passes; ++p) {
    auto t0 = clk::now();
    int64_t ntok = 0;
    uint64_t sum = 0;
    for (const auto& d : docs) {
      ids.clear();
      tok->encode(d, ids);
      ntok += static_cast<int64_t>(ids.size());
      for (int32_t v : ids) sum = sum * 31 + static_cast<uint64_t>(v);
    }
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    std::printf("{\"pass\": %d, \"seconds\": %.4f, \"bytes\": %zu, \"tokens\": %lld, \"checksum\": \"%llu\"}\n", p, s,
                bytes, static_cast<long long>(ntok), static_cast<unsigned long long>(sum));
  }
  return 0;
}

static int index_bench(int argc, char** argv) {
  if (argc < 7) return 2;
  const std::string prefix = std::string(argv[2]) + "/synthetic_text_document";
  const int64_t docs = std::atoll(argv[3]), tokens = std::atoll(argv[4]), seq = std::atoll(argv[5]),
                epochs = std::atoll(argv[6]);
  // Lengths: uniform in [1, 2*mean), fixed up so they sum to `tokens` exactly.
  std::vector<int32_t> lens(static_cast<size_t>(docs));
  std::mt19937_64 rng(1);
  const int64_t mean = tokens / docs;
  int64_t total = 0;
  for (auto& l : lens) {
    l = static_cast<int32_t>(1 + rng() % static_cast<uint64_t>(2 * mean - 1));
    total += l;
  }
  for (size_t i = 0; total != tokens; i = (i + 1) % lens.size()) {
    if (total < tokens) {
      ++lens[i];
      ++total;
    } else if (lens[i] > 1) {
      --lens[i];
      --total;
    }
  }
  {
    std::FILE* f = std::fopen((prefix + ".idx").c_str(), "wb");
    const uint64_t version = 1, n = lens.size(), d = lens.size() + 1;
    const uint8_t code = 8;
    std::fwrite(kIndexMagic, 1, 9, f);
    std::fwrite(&version, 8, 1, f);
    std::fwrite(&code, 1, 1, f);
    std::fwrite(&n, 8, 1, f);
    std::fwrite(&d, 8, 1, f);
    std::fwrite(lens.data(), 4, lens.size(), f);
    int64_t p = 0;
    std::vector<int64_t> ptr(lens.size()), di(lens.size() + 1);
    for (size_t i = 0; i < lens.size(); ++i) {
      ptr[i] = p;
      p += 2 * static_cast<int64_t>(lens[i]);
      di[i + 1] = static_cast<int64_t>(i + 1);
    }
    std::fwrite(ptr.data(), 8, ptr.size(), f);
    std::fwrite(di.data(), 8, di.size(), f);
    std::fclose(f);
    std::FILE* b = std::fopen((prefix + ".bin").c_str(), "wb");
    std::fclose(b);
    if (truncate((prefix + ".bin").c_str(), 2 * tokens) != 0) return 1;  // sparse: no data written
  }
  std::vector<int32_t>().swap(lens);
  const double rss0 = peak_rss_mib();
  auto t0 = clk::now();
  auto ds = std::make_shared<IndexedDataset>(prefix);
  const double t_open = std::chrono::duration<double>(clk::now() - t0).count();
  GptDatasetConfig cfg;
  cfg.seq_length = seq;
  cfg.split = std::string("1");  // (not = "1": GCC 12 -Wrestrict false positive, GCC PR105651)
  cfg.num_samples = (epochs * tokens - 1) / seq;
  auto t1 = clk::now();
  GptDataset g(ds, cfg);
  const double t_build = std::chrono::duration<double>(clk::now() - t1).count();
  std::printf(
      "{\"documents\": %lld, \"tokens\": %lld, \"seq_length\": %lld, \"num_samples\": %lld, \"epochs\": %lld, "
      "\"open_validate_s\": %.3f, \"index_build_s\": %.3f, \"peak_rss_mib_before\": %.0f, \"peak_rss_mib\": %.0f}\n",
      static_cast<long long>(docs), static_cast<long long>(tokens), static_cast<long long>(seq),
      static_cast<long long>(g.size()), static_cast<long long>(g.indices().num_epochs), t_open, t_build, rss0,
      peak_rss_mib());
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "tokenize") return tokenize(argc, argv);
  if (mode == "index") return index_bench(argc, argv);
  std::fprintf(stderr,
               "usage: data_bench tokenize VOCAB MERGES DOCS.jsonl PASSES | index DIR DOCS TOKENS SEQ EPOCHS\n");
  return 2;
}
