// The failure classes through the binary, one TEST_CASE per class of docs/RELIABILITY.md: derived
// files are validated, finished work is never lost, recipe and command-line semantics,
// overflowing counts, data values, unchecked writes, stop signals, a rank that stops
// answering (under mpirun: [mpi]). Each ends in a one-line error (exit 2 naming the
// file/key, or the rank) or in the documented safe behaviour.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/blas_core.hpp"
#include "data/indexed_dataset.hpp"
#include "model/checkpoint.hpp"
#include "test/support/bad_input.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

const std::string kRecipe = test::source_dir() + "/recipes/tiny-ramp.yaml";
const std::string kSets = " --quiet --set training.train_iters=20 --set training.num_threads=1";

test::RunResult train(const std::string& dir, const std::string& extra, const std::string& env = "") {
  std::string cmd = env + " " + MTNLG_BINARY + " train " + kRecipe + kSets + " --set logging.dir=" + dir + " " + extra;
  auto r = test::run_command(cmd);
  UNSCOPED_INFO(cmd << "\n" << r.out);
  return r;
}

using test::expect_exit2;

// A small real dataset: 200 documents of 40 tokens below `vocab`.
std::string make_dataset(const test::TempDir& d, int max_id = 255) {
  const std::string prefix = (d / "corpus_text_document").string();
  data::IndexedDatasetWriter w(prefix, data::DType::u16);
  for (int doc = 0; doc < 200; ++doc) {
    std::vector<int32_t> ids(40);
    for (int i = 0; i < 40; ++i) ids[static_cast<size_t>(i)] = (doc * 7 + i * 13) % (max_id + 1);
    w.add_document(ids);
  }
  w.finalize();
  return prefix;
}

uint64_t fnv(const void* p, size_t n, uint64_t h) {
  auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

TEST_CASE("reliability 1: damaged index caches are rebuilt, impossible checkpoint state is refused", "[e2e]") {
  test::TempDir d("rel-derived");
  const std::string prefix = make_dataset(d);
  const std::string data = " --set data.mock=false --set 'data.blend=[{weight: 1, prefix: " + prefix +
                           "}]' --set data.split=1 --set data.cache_dir=" + d.str() +
                           "/cache --set training.train_iters=4";
  REQUIRE(train(d.str() + "/a", data).exit_code == 0);
  const auto want = test::read_losses(d / "a");
  std::string cache;
  for (auto& e : fs::directory_iterator(d / "cache"))
    if (e.path().extension() == ".gptidx") cache = e.path().string();
  REQUIRE(!cache.empty());
  const std::string original = test::read_file(cache);
  // a second run uses the cache as it is, quietly
  auto r = train(d.str() + "/b", data);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, !Contains("damaged"));

  // Parse the file to damage it the way a checksum cannot catch: a consistent checksum
  // over out-of-range indices (what a crafted or buggy writer would leave).
  size_t off = 8;
  uint64_t klen;
  std::memcpy(&klen, original.data() + off, 8);
  off += 8 + klen;
  const size_t meta_at = off;
  off += 24;
  auto vec_at = [&](size_t elem) {
    uint64_t n;
    std::memcpy(&n, original.data() + off, 8);
    size_t at = off + 8;
    off = at + n * elem;
    return std::pair<size_t, uint64_t>{at, n};
  };
  auto [doc_at, ndoc] = vec_at(4);
  auto [smp_at, nsmp] = vec_at(8);
  auto [shf_at, nshf] = vec_at(8);
  REQUIRE(off + 8 == original.size());
  auto reseal = [&](std::string s) {
    uint64_t h = fnv(s.data() + meta_at, 24, 0xcbf29ce484222325ull);
    h = fnv(s.data() + doc_at, ndoc * 4, h);
    h = fnv(s.data() + smp_at, nsmp * 8, h);
    h = fnv(s.data() + shf_at, nshf * 8, h);
    std::memcpy(s.data() + off, &h, 8);
    return s;
  };
  std::vector<std::pair<std::string, std::string>> damaged;
  {
    std::string s = original;
    s[shf_at + 3] ^= 0x40;  // a flipped bit: the checksum
    damaged.push_back({"bit flip", s});
  }
  {
    std::string s = original;
    const int64_t far = int64_t{1} << 40;
    std::memcpy(s.data() + shf_at, &far, 8);  // the segfault once seen: a sample far out of range
    damaged.push_back({"shuffle index out of range", reseal(s)});
  }
  {
    std::string s = original;
    const int64_t neg = -5;
    std::memcpy(s.data() + smp_at + 8 * 2, &neg, 8);  // a negative document position
    damaged.push_back({"sample index out of range", reseal(s)});
  }
  {
    std::string s = original;
    const int32_t doc = 1 << 30;
    std::memcpy(s.data() + doc_at, &doc, 4);
    damaged.push_back({"document id out of range", reseal(s)});
  }
  damaged.push_back({"truncated", original.substr(0, original.size() / 2)});
  damaged.push_back({"empty", ""});
  int k = 0;
  for (auto& [what, bytes] : damaged) {
    INFO(what);
    test::write_file(cache, bytes);
    r = train(d.str() + "/c" + std::to_string(k++), data);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Contains("index cache") && Contains("damaged") && Contains("rebuilding"));
    CHECK(test::read_losses(d / fmt::format("c{}", k - 1)) == want);
    CHECK(test::read_file(cache) == original);  // rebuilt in place
  }

  // Checkpoint state: impossible counters are refused with the file and the key.
  const std::string root = d.str() + "/ckpt";
  REQUIRE(train(d.str() + "/s", "--set checkpoint.save=" + root + " --set training.train_iters=2").exit_code == 0);
  const std::string it = model::ckpt::iteration_dir(root, 2);
  const std::string meta_text = test::read_file(it + "/metadata.json");
  for (auto [key, value] : {std::pair<const char*, int64_t>{"iteration", -4},
                            {"consumed_samples", -1},
                            {"optimizer_steps", 99},
                            {"consumed_tokens", -7}}) {
    auto j = nlohmann::json::parse(meta_text);
    j[key] = value;
    test::write_file(it + "/metadata.json", j.dump());
    INFO(key);
    expect_exit2(train(d.str() + "/m", "--set checkpoint.load=" + root), {"metadata.json", key});
    expect_exit2(test::run_mtnlg("checkpoint inspect " + root), {"metadata.json", key});
  }
  test::write_file(it + "/metadata.json", meta_text);
  // `latest` that is not a number, or out of range
  for (const char* bad : {"-3\n", "abc\n", "99999999999999999999999\n"}) {
    test::write_file(root + "/latest", bad);
    expect_exit2(test::run_mtnlg("checkpoint inspect " + root), {"latest"});
  }
  test::write_file(root + "/latest", "2\n");
  // a missing shard: inspect does not say "ok", training does not start
  fs::rename(it + "/" + model::ckpt::model_file(0, 0), d.str() + "/moved");
  r = test::run_mtnlg("checkpoint inspect " + root);
  expect_exit2(r, {"model_tp00_pp000.safetensors", "missing"});
  expect_exit2(train(d.str() + "/m2", "--set checkpoint.load=" + root), {"model_tp00_pp000.safetensors", "missing"});
}

TEST_CASE("reliability 2: kill -9, a lost `latest`, and resume give the uninterrupted losses", "[e2e]") {
  test::TempDir a("rel-straight"), d("rel-lost");
  REQUIRE(train(a.str(), "").exit_code == 0);
  const auto want = test::read_losses(a.path());
  REQUIRE(want.size() == 20);
  const std::string root = d.str() + "/ckpt";
  const std::string ck = " --set checkpoint.save=" + root + " --set checkpoint.load=" + root;
  std::string cmd = std::string("MTNLG_TEST_SAVE_DELAY_MS=3000 exec ") + MTNLG_BINARY + " train " + kRecipe + kSets +
                    " --set logging.dir=" + d.str() + "/run1" + ck + " --set checkpoint.save_interval=5 > " + d.str() +
                    "/log.txt 2>&1";
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  bool seen = false;  // the save of 15 has begun, so 10 is committed
  for (int i = 0; i < 1200 && !seen; ++i) {
    seen = fs::exists(model::ckpt::partial_dir(root, 15));
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  INFO(test::read_file(d / "log.txt"));
  REQUIRE(seen);
  REQUIRE(model::ckpt::latest_iteration(root) == 10);
  // The disk filled while `latest` was replaced: it is gone, iter_5 and iter_10 remain.
  fs::remove(root + "/latest");
  // A run that does not resume from the root refuses to start over it.
  expect_exit2(train(d.str() + "/fresh", "--set checkpoint.save=" + root),
               {"checkpoint.save", "committed", "iter_0000010"});
  // Resuming recovers the newest committed checkpoint and trains 11..20 exactly as before.
  auto r = train(d.str() + "/run2", ck);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("latest is missing") && Contains("iter_0000010"));
  const auto got = test::read_losses(d / "run2");
  REQUIRE(got.size() == 10);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[10 + i]);
  CHECK(model::ckpt::latest_iteration(root) == 20);
}

TEST_CASE("reliability 2: one run per checkpoint root; convert/import keep `latest`; eval --output checked first",
          "[e2e]") {
  test::TempDir d("rel-lock");
  const std::string root = d.str() + "/ckpt";
  REQUIRE(train(d.str(), "--set checkpoint.save=" + root + " --set training.train_iters=2").exit_code == 0);
  {
    // Another run holds the root (the lock an mtnlg train takes on its checkpoint.save).
    int fd = ::open((root + "/.lock").c_str(), O_RDWR | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
    expect_exit2(train(d.str() + "/second", "--set checkpoint.save=" + root + " --set checkpoint.load=" + root),
                 {"checkpoint.save", "another run"});
    expect_exit2(test::run_mtnlg("checkpoint convert --input " + root + " --output " + root + " --tp 2"),
                 {"another run"});
    ::close(fd);
  }
  // the lock dies with its holder: the same run now starts
  REQUIRE(train(d.str() + "/third",
                "--set checkpoint.save=" + root + " --set checkpoint.load=" + root + " --set training.train_iters=3")
              .exit_code == 0);
  CHECK(model::ckpt::latest_iteration(root) == 3);
  // convert into a root that holds checkpoints: refused, `latest` stays
  test::TempDir other("rel-other");
  REQUIRE(train(other.str(), "--set checkpoint.save=" + other.str() + "/ckpt --set training.train_iters=1").exit_code ==
          0);
  expect_exit2(test::run_mtnlg("checkpoint convert --input " + other.str() + "/ckpt --output " + root + " --tp 2"),
               {"--output", "already holds checkpoints"});
  CHECK(model::ckpt::latest_iteration(root) == 3);
  auto ok = test::run_mtnlg("checkpoint convert --input " + root + " --output " + d.str() + "/conv --tp 2");
  INFO(ok.out);
  CHECK(ok.exit_code == 0);
  // an unwritable eval --output fails at once, before any evaluation
  auto t0 = std::chrono::steady_clock::now();
  const std::string eval =
      "eval --checkpoint " + root + " --tasks piqa --data-dir " + test::source_dir() + "/test/fixtures/eval --output ";
  expect_exit2(test::run_mtnlg(eval + d.str() + "/no/such/dir/r.json"), {"--output", "no/such/dir"});
  expect_exit2(test::run_mtnlg(eval + d.str()), {"--output", "directory"});
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
}

TEST_CASE("reliability 6: duplicate keys, run-length --set, --set errors, non-recipe files, booleans", "[e2e]") {
  test::TempDir d("rel-recipe");
  auto file = [&](const std::string& name, const std::string& text) {
    test::write_file(d / name, text);
    return (d / name).string();
  };
  const std::string base =
      "model:\n  num_layers: 2\n  hidden_size: 32\n  num_attention_heads: 4\n  seq_length: 16\n  vocab_size: 100\n"
      "training:\n  micro_batch_size: 2\n  global_batch_size: 8\n  train_tokens: 1024\n"
      "data:\n  mock: true\n";
  // a key given twice: both lines named, whatever the nesting
  expect_exit2(test::run_mtnlg("recipe validate " + file("dup.yaml", base + "training:\n  micro_batch_size: 4\n")),
               {"dup.yaml:13:1", "'training' is given twice", "first at line 7"});
  expect_exit2(test::run_mtnlg("recipe validate " + file("dup2.yaml", base + "  mock: false\n")),
               {"dup2.yaml:13:3", "'data.mock' is given twice", "first at line 12"});
  expect_exit2(test::run_mtnlg("recipe validate " +
                               file("dup3.yaml", base + "  blend:\n    - {weight: 1, weight: 2, prefix: x}\n")),
               {"dup3.yaml:14:19", "'data.blend[0].weight' is given twice"});
  // a --set of one run length replaces the recipe's other, and recipe show says so
  const std::string good = file("good.yaml", base);
  auto r = test::run_mtnlg("recipe show " + good + " --set training.train_iters=10");
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("# --set training.train_iters=10 replaces the recipe's training.train_tokens") &&
                        Contains("train_iters: 10") && Contains("train_tokens: 0"));
  // two --sets of different run lengths are still ambiguous
  expect_exit2(
      test::run_mtnlg("recipe validate " + good + " --set training.train_iters=10 --set training.train_samples=5"),
      {"set exactly one of"});
  // a --set error names the --set, never the recipe's line 1
  for (auto [set, phrase] : {std::pair<const char*, const char*>{"training.bogus=1", "unknown key 'training.bogus'"},
                             {"bogus.key=1", "unknown key 'bogus'"},
                             {"model=3", "expected section.key=value"},
                             {"training.micro_batch_size=[1", "not valid YAML"},
                             {"training.micro_batch_size=abc", "expected an integer"}}) {
    auto e = test::run_mtnlg("recipe validate " + good + " --set '" + set + "'");
    INFO(set << "\n" << e.out);
    CHECK(e.exit_code == 2);
    CHECK_THAT(e.out, Contains(std::string("--set ") + set) && Contains(phrase));
    CHECK_THAT(e.out, !Contains("good.yaml:1:"));
  }
  // not a recipe file
  expect_exit2(test::run_mtnlg("recipe validate " + d.str()), {d.str().c_str(), "is a directory"});
  expect_exit2(test::run_mtnlg("train /dev/zero"), {"/dev/zero", "not a file"});
  expect_exit2(test::run_mtnlg("recipe validate " + file("multi.yaml", base + "---\nmodel:\n  num_layers: 4\n")),
               {"multi.yaml:14", "second YAML document"});
  expect_exit2(test::run_mtnlg("recipe validate " + file("nul.yaml", std::string("model:\n  num_layers: 2\0\0", 25))),
               {"nul.yaml"});
  // booleans: one spelling rule everywhere
  for (const char* yes : {"true", "True", "TRUE", "yes", "Yes", "on", "ON"})
    CHECK(test::run_mtnlg("recipe validate " + good + " --set data.mock=" + yes).exit_code == 0);
  for (const char* no : {"1", "y", "tRUE", "enabled"})
    expect_exit2(test::run_mtnlg("recipe validate " + good + " --set data.mock=" + no),
                 {"--set data.mock=", "data.mock", "expected true or false"});
}

TEST_CASE("reliability 5: counts near 2^63 and non-positive plan sizes exit 2 naming the key", "[e2e]") {
  test::TempDir d("rel-overflow");
  const std::string tiny = test::source_dir() + "/recipes/tiny-ramp.yaml";
  for (auto [set, key] :
       {std::pair<const char*, const char*>{"training.train_iters=9223372036854775807", "training.train_iters"},
        {"training.train_iters=576460752303423488", "training.train_iters"},
        {"training.train_samples=9223372036854775000", "training.train_samples"},
        {"training.train_tokens=9223372036854775800", "training.train_tokens"}}) {
    INFO(set);
    expect_exit2(test::run_mtnlg("recipe validate " + tiny + " --set " + set), {key, "overflow"});
    expect_exit2(test::run_mtnlg("train " + tiny + " --set logging.dir=" + d.str() + " --set " + set),
                 {key, "overflow"});
  }
  // a ramp too long to walk
  expect_exit2(test::run_mtnlg("train " + tiny + " --set logging.dir=" + d.str() +
                               " --set 'training.rampup_batch_size={start: 8, increment: 8, ramp_tokens: 9e18}'"),
               {"ramp_tokens"});
  for (const char* opt :
       {"--gpus 0", "--gpus -1", "--tp 0", "--pp 0", "--dp -3", "--gpus-per-node 0", "--top 0", "--gpus 99999999999"}) {
    auto r = test::run_mtnlg("plan " + test::source_dir() + "/recipes/gpt2-124m.yaml " + opt);
    INFO(opt << "\n" << r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Contains(std::string(opt).substr(0, std::string(opt).find(' '))));
  }
}

TEST_CASE("reliability 7: out-of-vocabulary token ids, --workers, number overflow in JSON", "[e2e]") {
  test::TempDir d("rel-data");
  const std::string prefix = make_dataset(d, 299);  // ids up to 299, the model's vocabulary is 256
  auto r = train(d.str() + "/run", " --set data.mock=false --set 'data.blend=[{weight: 1, prefix: " + prefix +
                                       "}]' --set data.split=1 --set training.train_iters=2");
  expect_exit2(r, {"corpus_text_document.bin", "token id", "model.vocab_size 256"});
  const std::string g = test::source_dir() + "/third_party/gpt2";
  if (!fs::exists(g + "/vocab.json")) FAIL("third_party/gpt2 missing: run scripts/fetch-gpt2-vocab.sh");
  const std::string vocab = " --vocab-file " + g + "/vocab.json --merge-file " + g + "/merges.txt --no-progress";
  test::write_file(d / "c.jsonl",
                   "{\"text\": \"hello\"}\n{\"text\": \"world\", \"score\": 1e400}\n{\"text\": \"again\"}\n");
  r = test::run_mtnlg("data preprocess --input " + (d / "c.jsonl").string() + " --output-prefix " + d.str() + "/out" +
                      vocab + " --workers 100000");
  expect_exit2(r, {"--workers", "100000", "hardware threads"});
  r = test::run_mtnlg("data preprocess --input " + (d / "c.jsonl").string() + " --output-prefix " + d.str() + "/out" +
                      vocab);
  expect_exit2(r, {"c.jsonl:2", "malformed JSON", "--skip-bad-lines"});
  r = test::run_mtnlg("data preprocess --input " + (d / "c.jsonl").string() + " --output-prefix " + d.str() + "/out" +
                      vocab + " --skip-bad-lines");
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("c.jsonl:2"));
}

TEST_CASE("reliability 4: unwritable outputs are found at start-up; a full disk under logging.dir is an error",
          "[e2e]") {
  test::TempDir d("rel-writes");
  test::write_file(d / "afile", "x");
  const std::string under_file = d.str() + "/afile/sub";
  expect_exit2(train(d.str() + "/run", "--set checkpoint.save=" + under_file), {"checkpoint.save", "afile/sub"});
  expect_exit2(train(under_file, ""), {"logging.dir", "afile/sub"});
  CHECK(!fs::exists(d / "run" / "metrics.jsonl"));  // found before any step
  // A full disk: metrics.jsonl and recipe.resolved.yaml on /dev/full (writes fail with ENOSPC).
  for (const char* name : {"metrics.jsonl", "recipe.resolved.yaml"}) {
    const fs::path dir = d / (std::string("full-") + name);
    fs::create_directories(dir);
    fs::create_symlink("/dev/full", dir / name);
    auto r = train(dir.string(), "--set training.train_iters=2");
    INFO(name << "\n" << r.out);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.out, Contains(name) && Contains("write failed") && Contains("No space left on device"));
  }
  // checkpoint export's config.json, likewise
  REQUIRE(
      train(d.str() + "/ck", "--set training.train_iters=1 --set checkpoint.save=" + d.str() + "/ck/root").exit_code ==
      0);
  fs::create_directories(d / "hf");
  fs::create_symlink("/dev/full", d / "hf" / "config.json");
  auto r = test::run_mtnlg("checkpoint export --input " + d.str() + "/ck/root --output " + d.str() + "/hf");
  INFO(r.out);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Contains("config.json: write failed") && Contains("No space left on device"));
}

TEST_CASE("reliability 3: stop signals save, or say that nothing was saved", "[e2e]") {
  test::TempDir d("rel-signals");
  // SIGTERM with no checkpoint.save: exit 1 saying so, never the requeue code
  auto r = train(d.str() + "/a", "--stopped-exit-code 75", "MTNLG_FAULT_INJECT=rank=0:iteration=3:mode=sigterm");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Contains("checkpoint.save is not set") && Contains("nothing was saved"));
  // without --quiet the missing save location is warned about at start-up
  r = test::run_command(std::string(MTNLG_BINARY) + " train " + kRecipe +
                        " --set training.train_iters=1 --set logging.dir=" + d.str() + "/w");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("warning: checkpoint.save is not set"));

  // Ctrl-C: the first SIGINT saves and stops (exit --stopped-exit-code), a second ends the process at once.
  auto start = [&](const std::string& dir, const std::string& env) {
    const std::string root = dir + "/ckpt";
    std::string cmd = env + " exec " + MTNLG_BINARY + " train " + kRecipe + kSets + " --set training.train_iters=400" +
                      " --set logging.dir=" + dir + " --set checkpoint.save=" + root + " --stopped-exit-code 75 > " +
                      dir + ".log 2>&1";
    pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // wait for the first iterations
    for (int i = 0; i < 1200; ++i) {
      std::ifstream f(dir + "/metrics.jsonl");
      std::string line;
      int n = 0;
      while (std::getline(f, line)) ++n;
      if (n >= 2) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pid;
  };
  for (int sig : {SIGINT, SIGHUP}) {
    const std::string dir = d.str() + "/sig" + std::to_string(sig);
    pid_t pid = start(dir, "");
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    INFO(strsignal(sig) << "\n" << test::read_file(dir + ".log"));
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 75);
    auto it = model::ckpt::latest_iteration(dir + "/ckpt");
    REQUIRE(it.has_value());
    CHECK(*it >= 2);
    CHECK(*it < 400);
  }
  {
    const std::string dir = d.str() + "/twice";
    pid_t pid = start(dir, "MTNLG_TEST_SAVE_DELAY_MS=20000");
    kill(pid, SIGINT);
    for (int i = 0; i < 600 && !fs::exists(dir + "/ckpt"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    INFO(test::read_file(dir + ".log"));
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGINT);
    CHECK(!model::ckpt::latest_iteration(dir + "/ckpt").has_value());  // nothing half-written was committed
  }
}

namespace {
// `np` ranks training with `sets`, rank `stopped` SIGSTOPping itself at iteration 2 under a
// 10 s collective timeout (long enough that a loaded machine's start-up never trips it):
// the job must end non-zero well before the 90 s guard; returns its output.
test::RunResult train_with_stopped_rank(const std::string& tag, int np, int stopped, const std::string& sets) {
  test::TempDir d(tag);
  const std::string cmd = fmt::format(
                              "MTNLG_FAULT_INJECT=rank={}:iteration=2:mode=stop MTNLG_COLLECTIVE_TIMEOUT=10 "
                              "timeout --verbose -k 5 90 ",
                              stopped) +
                          test::mpirun(np) + MTNLG_BINARY + " train " + kRecipe + kSets + sets +
                          " --set logging.dir=" + d.str();
  auto r = test::run_command(cmd);
  r.out = cmd + "\n" + r.out;
  return r;
}
}  // namespace

TEST_CASE("reliability 8: a rank that stops answering ends the job, named, within the collective timeout", "[mpi]") {
  // tp2 x pp2 on 4 ranks: rank 3 (tp=1, pp=1) stops, so its tp peer waits in an all-reduce
  // and a first-stage rank in a pipeline receive; the line printed names rank 3 by its
  // coordinates (which alive rank saw it first may vary).
  auto r = train_with_stopped_rank(
      "rel-watchdog", 4, 3,
      " --set parallel.tensor_model_parallel_size=2 --set parallel.pipeline_model_parallel_size=2");
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.out, !Contains("timeout: sending signal"));
  CHECK_THAT(r.out, Contains("rank 3: MTNLG_FAULT_INJECT stop at iteration 2"));
  CHECK_THAT(r.out, Contains("error: rank 3 (tp=1,pp=1,dp=0 host "));
  CHECK_THAT(r.out, Contains("did not arrive at "));
  CHECK_THAT(r.out, Contains("it does not answer (stopped, hung outside MPI, or dead)"));
  CHECK_THAT(r.out, Contains("collective timeout 10 s]"));
}

// The same for the experts' all-to-all: 2 ranks exchanging an MoE layer's tokens (ep 2),
// rank 1 stopped: the line names it, the all-to-all and its ep group.
TEST_CASE("reliability 8: a rank that stops during the MoE token exchange is named with the all-to-all", "[mpi]") {
  auto r = train_with_stopped_rank("rel-watchdog-ep", 2, 1,
                                   " --set model.num_experts=4 --set model.moe_ffn_hidden_size=24"
                                   " --set model.add_bias_linear=false --set parallel.expert_model_parallel_size=2"
                                   " --set parallel.expert_tensor_parallel_size=1");
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.out, !Contains("timeout: sending signal"));
  CHECK_THAT(r.out, Contains("error: rank 1 (tp=0,pp=0,dp=1 host "));
  CHECK_THAT(r.out, Contains("(all_to_all, group ep)"));
  CHECK_THAT(r.out, Contains("it does not answer (stopped, hung outside MPI, or dead)"));
}

TEST_CASE("reliability 8: a bad collective timeout is exit 2 naming the key or the variable", "[e2e]") {
  test::TempDir d("rel-watchdog-input");
  expect_exit2(train(d.str() + "/a", "--set parallel.distributed_timeout_minutes=-1"),
               {"parallel.distributed_timeout_minutes"});
  expect_exit2(train(d.str() + "/b", "", "MTNLG_COLLECTIVE_TIMEOUT=soon"), {"MTNLG_COLLECTIVE_TIMEOUT=\"soon\""});
  // 0 turns the watchdog off; a single process has no collectives to watch anyway.
  CHECK(train(d.str() + "/c", "--set parallel.distributed_timeout_minutes=0", "MTNLG_COLLECTIVE_TIMEOUT=0").exit_code ==
        0);
}

TEST_CASE("reliability 9: OpenBLAS's generic kernel is replaced and the banner names the BLAS core", "[e2e]") {
  const std::string want = blas_core_for_cpu();
  if (want.empty()) {
    WARN("skipped: this CPU has neither AVX2 nor AVX-512");
    return;
  }
  test::TempDir d("rel-blas");
  const std::string args = std::string(MTNLG_BINARY) + " train " + kRecipe +
                           " --set training.train_iters=1 --set training.num_threads=1 --set logging.dir=" + d.str();
  // Debian's OpenBLAS on an unknown CPU model loads "Prescott": mtnlg re-runs itself with the right core.
  auto r = test::run_command("env -u OPENBLAS_CORETYPE MTNLG_TEST_BLAS_CORE=Prescott " + args);
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("OpenBLAS " + want + " (selected by mtnlg: the library chose Prescott)"));
  // A core type the user set is kept, with a warning when it is the slow one.
  r = test::run_command("OPENBLAS_CORETYPE=Prescott " + args);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("warning: OPENBLAS_CORETYPE=Prescott selects OpenBLAS's generic") &&
                        Contains("OpenBLAS Prescott (generic kernels: slow on this CPU)"));
  // With no variable set: the fast figure either way, re-run only when the library chose badly.
  r = test::run_command("env -u OPENBLAS_CORETYPE " + args);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("measured CPU sgemm rate, OpenBLAS "));
  CHECK_THAT(r.out, !Contains("generic kernels"));
  // Whether the library chooses badly here is its first choice: this test process may
  // itself have been re-run with a better core, which its own description says.
  const bool rerun = blas_description().find("selected by mtnlg") != std::string::npos;
  if (rerun || blas_core_is_generic(blas_loaded_core()))
    CHECK_THAT(r.out, Contains("selected by mtnlg"));
  else
    CHECK_THAT(r.out, !Contains("selected by mtnlg"));
}

namespace {
// "CPU matmul: OpenBLAS <core>..." in a process's output -> <core> ("" when absent).
std::string reported_core(const std::string& out) {
  const std::string key = "CPU matmul: OpenBLAS ";
  const size_t at = out.find(key);
  if (at == std::string::npos) return "";
  const size_t from = at + key.size();
  return out.substr(from, out.find_first_of(" \n", from) - from);
}
}  // namespace

// Run by the case below in a fresh copy of this test binary: the core it computes with.
TEST_CASE("blas probe: this test process's OpenBLAS core", "[.][blas-probe]") {
  std::printf("CPU matmul: %s\n", blas_description().c_str());
}

// A test that compares its in-process reference with what the mtnlg it starts computed
// bit for bit needs both on the same kernels: both mains select the core in one place
// (core/blas_core.hpp). Shown twice: as this suite runs, and as on a fresh machine with no
// OPENBLAS_CORETYPE, where Debian's OpenBLAS may not know the CPU and load "Prescott".
TEST_CASE("reliability 9b: a test process and the mtnlg it starts multiply with the same OpenBLAS core", "[e2e]") {
  const std::string self = blas_loaded_core();
  auto v = test::run_mtnlg("--version");
  INFO(v.out);
  REQUIRE(v.exit_code == 0);
  CHECK(reported_core(v.out) == self);
  const std::string fresh = "env -u OPENBLAS_CORETYPE -u MTNLG_TEST_BLAS_CORE ";
  auto probe = test::run_command(fresh + fs::read_symlink("/proc/self/exe").string() + " \"[blas-probe]\"");
  auto bin = test::run_command(fresh + MTNLG_BINARY + " --version");
  INFO(probe.out << "\n" << bin.out);
  REQUIRE(probe.exit_code == 0);
  REQUIRE(bin.exit_code == 0);
  const std::string a = reported_core(probe.out), b = reported_core(bin.out);
  CHECK(!a.empty());
  CHECK(a == b);
  if (!blas_core_for_cpu().empty()) CHECK_FALSE(blas_core_is_generic(a));
}

#ifdef MTNLG_HAVE_CUDA
// A CUDA build says whether cuDNN (the flash attention form on GPUs) loads on this machine,
// and why not when it does not.
TEST_CASE("mtnlg --version names cuDNN's state in a CUDA build", "[e2e]") {
  auto v = test::run_command(std::string("MTNLG_CUDNN=0 ") + MTNLG_BINARY + " --version");
  INFO(v.out);
  REQUIRE(v.exit_code == 0);
  CHECK_THAT(v.out, Catch::Matchers::Contains(
                        "attention (flash form on CUDA): cuDNN unavailable: switched off (MTNLG_CUDNN=0)"));
  auto w = test::run_mtnlg("--version");
  CHECK_THAT(w.out, Catch::Matchers::Contains("attention (flash form on CUDA): cuDNN"));
}
#endif
