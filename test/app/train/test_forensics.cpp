// Spike and NaN forensics through the binary (docs/RELIABILITY.md, "Spike and NaN
// forensics"), with planted faults:
//  - a corrupt document (a long run of one token) planted in a tiny two-source corpus
//    whose other documents the model learns quickly: the loss spike is replayed,
//    classified persistent, and its samples named by source and document, the same
//    samples `mtnlg data samples` shows holding that document;
//  - under spike_policy skip the run goes on with the batch counted as skipped, and every
//    later iteration is bit-identical to a run whose update at that iteration was
//    dropped (the nan-skip path, MTNLG_FAULT_INJECT mode=overflow at that iteration) and
//    differs from a run that learned from the batch;
//  - a sample whose activations turn non-finite at layer 1 (mode=poison): persistent,
//    the first non-finite layer and the micro batch's samples named, the run stopped;
//  - mpirun dp=2, one bit flipped in rank 1's reduced gradient (mode=bitflip_grad):
//    transient, rank 1 named, and spike_policy rerun continues bit-identical to a run
//    without the fault; the clean run with checks on every step reports nothing;
//  - mpirun dp=4, one bit flipped in rank 2's parameters (mode=bitflip_param): the
//    parameter hash names rank 2 at the next check and stops the run; with dp=2 there is
//    no majority and both replicas are named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/indexed_dataset.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
namespace fs = std::filesystem;

namespace {

constexpr int kOddDoc = 37;  // in source 1 ("odd")

// Two sources of documents that cycle through tokens 0..15 (a pattern a tiny model
// learns within a few dozen iterations); source 1's document kOddDoc is instead 24 x token 63,
// which seed 5 puts in one sample (85, iteration 43) after the model has learned the pattern.
std::string corpus_recipe(const fs::path& dir) {
  uint64_t s = 7;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (const char* name : {"plain", "odd"}) {
    data::IndexedDatasetWriter w((dir / name).string(), data::DType::u16);
    for (int d = 0; d < 60; ++d) {
      std::vector<int32_t> doc;
      const int len = 10 + static_cast<int>(next() % 20), phase = static_cast<int>(next() % 16);
      for (int k = 0; k < len; ++k) doc.push_back((phase + k) % 16);
      if (std::strcmp(name, "odd") == 0 && d == kOddDoc) doc.assign(24, 63);
      w.add_document(doc);
    }
    w.finalize();
  }
  const std::string path = (dir / "corpus.yaml").string();
  test::write_file(path,
                   "model: {num_layers: 2, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 64,\n"
                   "        make_vocab_size_divisible_by: 8, hidden_dropout: 0.0, attention_dropout: 0.0}\n"
                   "training: {micro_batch_size: 1, global_batch_size: 2, train_iters: 60, num_threads: 1, seed: 5}\n"
                   "optimizer: {lr: 1.0e-2, min_lr: 1.0e-3, lr_warmup_tokens: 64}\n"
                   "data:\n  split: '100,0,0'\n  blend: [{weight: 1.0, prefix: " +
                       (dir / "plain").string() + "}, {weight: 1.0, prefix: " + (dir / "odd").string() +
                       "}]\nlogging: {tensorboard: false, log_interval: 1}\n");
  return path;
}

std::vector<nlohmann::json> events(const fs::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "forensics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

test::RunResult train(const std::string& recipe, const test::TempDir& run, const std::string& sets, int np = 1,
                      const std::string& env = "") {
  auto r = test::run_train(recipe, run.str(), sets, np, env);
  UNSCOPED_INFO(test::train_command(recipe, run.str(), sets, np, env) << "\n" << r.out);
  return r;
}

// The loss and grad norm of every iteration, as their bits (null: NaN).
struct Row {
  int64_t iteration;
  double loss, grad_norm;
  int64_t skipped;
};
std::vector<Row> rows(const fs::path& run) {
  std::vector<Row> out;
  for (const auto& j : test::read_iteration_records(run))
    out.push_back({j["iteration"].get<int64_t>(), j["loss"].is_null() ? std::nan("") : j["loss"].get<double>(),
                   j["grad_norm"].is_null() ? std::nan("") : j["grad_norm"].get<double>(),
                   j["skipped"].get<int64_t>()});
  return out;
}
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

const std::string kSpike = "--set training.loss_spike_threshold=3.0 --set training.loss_spike_window=5 ";

}  // namespace

TEST_CASE(
    "forensics: a planted document's loss spike is persistent and named by source and document; skip drops "
    "exactly its update",
    "[e2e][forensics]") {
  test::TempDir dir("forensics-corpus");
  const std::string recipe = corpus_recipe(dir.path());
  test::TempDir a("forensics-skip");
  REQUIRE(train(recipe, a, kSpike + "--set training.spike_policy=skip").exit_code == 0);
  const auto ev = events(a.path());
  REQUIRE(ev.size() == 1);
  const auto& e = ev[0];
  INFO(e.dump(2));
  CHECK(e["trigger"] == "loss spike");
  CHECK(e["verdict"] == "persistent");
  CHECK(e["replay"]["loss_bit_identical"] == true);
  CHECK(e["action"] == "skip");
  CHECK(e["ranks"].empty());
  REQUIRE(!e["samples"].empty());
  const int64_t spike = e["iteration"].get<int64_t>();
  for (const auto& sm : e["samples"]) {
    CHECK(sm["source"] == 1);
    CHECK(sm["source_name"].get<std::string>().find("odd") != std::string::npos);
    const auto docs = sm["documents"].get<std::vector<int64_t>>();
    CHECK(std::find(docs.begin(), docs.end(), kOddDoc) != docs.end());
    // The sample is in the spiking batch, and `data samples` agrees on its source and documents.
    const int64_t idx = sm["sample"].get<int64_t>();
    CHECK(idx / 2 == spike - 1);
    const auto ds = test::run_mtnlg("data samples " + recipe + " --set logging.dir=" + a.str() + " --json --range " +
                                    std::to_string(idx) + ":" + std::to_string(idx + 1));
    REQUIRE(ds.exit_code == 0);
    const auto j = nlohmann::json::parse(ds.out.substr(ds.out.find('{')));
    CHECK(j["source"] == 1);
    CHECK(j["documents"] == sm["documents"]);
  }

  // The skipped run against one whose update at that iteration is dropped (no forensics),
  // and one that learned from the batch.
  test::TempDir b("forensics-dropped"), c("forensics-learned");
  REQUIRE(train(recipe, b, "", 1, "MTNLG_FAULT_INJECT=rank=0:iteration=" + std::to_string(spike) + ":mode=overflow")
              .exit_code == 0);
  REQUIRE(train(recipe, c, "").exit_code == 0);
  const auto ra = rows(a.path()), rb = rows(b.path()), rc = rows(c.path());
  REQUIRE(ra.size() == 60);
  REQUIRE(rb.size() == 60);
  REQUIRE(rc.size() == 60);
  bool learned_differs = false;
  for (size_t i = 0; i < ra.size(); ++i) {
    INFO("iteration " << ra[i].iteration);
    CHECK(same_bits(ra[i].loss, rb[i].loss));
    if (ra[i].iteration != spike) CHECK(same_bits(ra[i].grad_norm, rb[i].grad_norm));
    CHECK(ra[i].skipped == (ra[i].iteration >= spike ? 1 : 0));
    if (ra[i].iteration > spike && !same_bits(ra[i].loss, rc[i].loss)) learned_differs = true;
    if (ra[i].iteration <= spike) CHECK(same_bits(ra[i].loss, rc[i].loss));
  }
  CHECK(learned_differs);
  // The report's summary row.
  const auto rep = test::run_mtnlg("report " + a.str());
  REQUIRE(rep.exit_code == 0);
  const std::string page = test::read_file(a.path() / "report.html");
  CHECK(page.find("Spikes and NaNs (forensics)") != std::string::npos);
  CHECK(page.find("iteration " + std::to_string(spike) + ": loss spike, persistent: sample") != std::string::npos);
}

TEST_CASE("forensics: a sample whose activations turn non-finite is persistent, with its layer and samples named",
          "[e2e][forensics]") {
  test::TempDir run("forensics-poison");
  const std::string recipe = test::source_dir() + "/recipes/tiny-mock.yaml";
  const auto r = train(recipe, run,
                       "--set training.train_iters=6 --set training.num_threads=1 --set logging.log_interval=1 "
                       "--set training.check_for_nan_in_loss_and_grad=true",
                       1, "MTNLG_FAULT_INJECT=rank=0:iteration=3:mode=poison:layer=1");
  CHECK(r.exit_code == 1);  // spike_policy stop
  CHECK(r.out.find("forensics: iteration 3: non-finite loss or gradient: replayed: persistent") != std::string::npos);
  CHECK(r.out.find("first non-finite activation: layer 1 output") != std::string::npos);
  const auto ev = events(run.path());
  REQUIRE(ev.size() == 1);
  INFO(ev[0].dump(2));
  CHECK(ev[0]["verdict"] == "persistent");
  CHECK(ev[0]["first_nonfinite_layer"] == 1);
  CHECK(ev[0]["action"] == "stop");
  // Iteration 3 starts at sample 16 (global batch 8); its first micro batch is samples 16, 17.
  std::vector<int64_t> named;
  for (const auto& sm : ev[0]["samples"]) named.push_back(sm["sample"].get<int64_t>());
  CHECK(named == std::vector<int64_t>{16, 17});
}

TEST_CASE(
    "forensics: a bit flipped in one replica's gradient is transient and names the rank; rerun continues as if "
    "it never happened",
    "[mpi][forensics]") {
  const std::string recipe = test::source_dir() + "/recipes/tiny-mock.yaml";
  const std::string sets =
      "--set training.train_iters=8 --set training.num_threads=1 --set logging.log_interval=1 "
      "--set training.check_for_nan_in_loss_and_grad=true --set training.param_hash_interval=1 ";
  test::TempDir flip("forensics-bitflip"), clean("forensics-clean");
  REQUIRE(train(recipe, flip, sets + "--set training.spike_policy=rerun", 2,
                "MTNLG_FAULT_INJECT=rank=1:iteration=4:mode=bitflip_grad")
              .exit_code == 0);
  REQUIRE(train(recipe, clean, sets, 2).exit_code == 0);
  const auto ev = events(flip.path());
  REQUIRE(ev.size() == 1);
  INFO(ev[0].dump(2));
  CHECK(ev[0]["iteration"] == 4);
  CHECK(ev[0]["trigger"] == "the data-parallel replicas' gradient norms disagree");
  CHECK(ev[0]["verdict"] == "transient");
  REQUIRE(ev[0]["ranks"].size() == 1);
  CHECK(ev[0]["ranks"][0]["rank"] == 1);
  CHECK(ev[0]["ranks"][0]["dp"] == 1);
  CHECK(ev[0]["action"] == "rerun");
  CHECK(events(clean.path()).empty());  // checks every step, parameter hash every step: nothing
  const auto rf = rows(flip.path()), rc = rows(clean.path());
  REQUIRE(rf.size() == 8);
  REQUIRE(rc.size() == 8);
  for (size_t i = 0; i < rf.size(); ++i) {
    INFO("iteration " << rf[i].iteration);
    CHECK(same_bits(rf[i].loss, rc[i].loss));
    CHECK(same_bits(rf[i].grad_norm, rc[i].grad_norm));
    CHECK(rf[i].skipped == 0);
  }
}

TEST_CASE("forensics: a bit flipped in one replica's parameters is named by the parameter hash", "[mpi][forensics]") {
  const std::string recipe = test::source_dir() + "/recipes/tiny-mock.yaml";
  test::TempDir run("forensics-param");
  const auto r = train(recipe, run,
                       "--set training.train_iters=8 --set training.num_threads=1 --set training.param_hash_interval=2",
                       4, "MTNLG_FAULT_INJECT=rank=2:iteration=3:mode=bitflip_param");
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("forensics: iteration 4: the data-parallel replicas' parameters differ") != std::string::npos);
  CHECK(r.out.find("outvoted by its replicas: rank 2 (tp=0,pp=0,dp=2)") != std::string::npos);
  const auto ev = events(run.path());
  REQUIRE(ev.size() == 1);
  CHECK(ev[0]["ranks"].size() == 1);
  CHECK(ev[0]["ranks"][0]["rank"] == 2);
  CHECK(ev[0]["outvoted"] == true);
  // Two replicas cannot outvote each other: both are named.
  test::TempDir two("forensics-param-dp2");
  const auto r2 = train(
      recipe, two, "--set training.train_iters=8 --set training.num_threads=1 --set training.param_hash_interval=2", 2,
      "MTNLG_FAULT_INJECT=rank=1:iteration=3:mode=bitflip_param");
  CHECK(r2.exit_code != 0);
  CHECK(r2.out.find("no majority, one of: rank 0 (tp=0,pp=0,dp=0), rank 1 (tp=0,pp=0,dp=1)") != std::string::npos);
}

TEST_CASE("forensics: recipe keys are checked", "[e2e][forensics]") {
  const std::string recipe = test::source_dir() + "/recipes/tiny-mock.yaml";
  auto r = test::run_mtnlg("recipe show " + recipe + " --set training.loss_spike_threshold=0.5");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("training.loss_spike_threshold (0.5) is a ratio to the running mean") != std::string::npos);
  r = test::run_mtnlg("recipe show " + recipe + " --set training.spike_policy=ignore");
  CHECK(r.exit_code == 2);
  CHECK(r.out.find("spike_policy") != std::string::npos);
  r = test::run_mtnlg("recipe show " + recipe +
                      " --set training.spike_policy=skip --set training.param_hash_interval=5");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("spike_policy: skip") != std::string::npos);
}
