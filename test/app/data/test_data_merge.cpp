// `mtnlg data merge` and `data preprocess` under mpirun: merged prefixes are the same
// bytes as writing (or preprocessing) the concatenation of their inputs in order, a
// dtype mismatch is refused naming the prefix, and preprocess gives byte-identical
// files on 1, 2, 3 and 4 ranks.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/progress.hpp"
#include "data/indexed_dataset.hpp"
#include "core/error.hpp"
#include "data/merge.hpp"
#include "data/preprocess.hpp"
#include "test/support/data_util.hpp"

using namespace mtnlg;
using namespace mtnlg::data;
using mtnlg::test::TempDir;
namespace fs = std::filesystem;

namespace {

using test::gpt2_vocab_args;
std::vector<std::string> corpus_lines(int64_t docs) { return test::jsonl_corpus_lines(docs, /*blank_lines=*/true); }
using test::join_lines;

// Documents of 0..3 sequences with pseudo-random lengths and ids, from `seed`.
struct Doc {
  std::vector<int32_t> ids;
  std::vector<int64_t> lens;
};
std::vector<Doc> make_docs(int64_t n, uint32_t seed) {
  std::vector<Doc> docs;
  uint64_t x = seed * 2654435761u + 1;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int64_t d = 0; d < n; ++d) {
    Doc doc;
    const int64_t seqs = static_cast<int64_t>(next() % 4);
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t len = static_cast<int64_t>(next() % 50);
      for (int64_t t = 0; t < len; ++t) doc.ids.push_back(static_cast<int32_t>(next() % 50257));
      doc.lens.push_back(len);
    }
    docs.push_back(std::move(doc));
  }
  return docs;
}

void write_docs(const std::string& prefix, const std::vector<Doc>& docs, DType dt = DType::u16) {
  IndexedDatasetWriter w(prefix, dt);
  for (const auto& d : docs) w.add_document(d.ids, d.lens);
  w.finalize();
}

bool same_files(const std::string& a, const std::string& b) {
  return test::read_file(a + ".bin") == test::read_file(b + ".bin") &&
         test::read_file(a + ".idx") == test::read_file(b + ".idx");
}

using test::count_files;

}  // namespace

TEST_CASE("merge: concatenation of datasets equals writing all documents in order", "[data]") {
  TempDir tmp("merge");
  // Parts with multi-sequence and empty documents, one part with no documents at all,
  // one with only empty documents.
  std::vector<std::vector<Doc>> parts = {make_docs(40, 1), make_docs(0, 2), make_docs(25, 3), make_docs(1, 4)};
  parts.push_back({Doc{}, Doc{}});
  std::vector<std::string> prefixes;
  std::vector<Doc> all;
  for (size_t i = 0; i < parts.size(); ++i) {
    prefixes.push_back((tmp / ("p" + std::to_string(i))).string());
    write_docs(prefixes.back(), parts[i]);
    all.insert(all.end(), parts[i].begin(), parts[i].end());
  }
  write_docs((tmp / "whole").string(), all);
  const auto res = merge_indexed_datasets(prefixes, (tmp / "merged").string(), false);
  CHECK(res.documents == static_cast<int64_t>(all.size()));
  CHECK(same_files((tmp / "merged").string(), (tmp / "whole").string()));
  IndexedDataset m((tmp / "merged").string());  // the reader's validation accepts it
  CHECK(m.num_documents() == static_cast<int64_t>(all.size()));
  // A directory argument stands for its prefixes sorted by name.
  fs::create_directories(tmp / "dir");
  for (size_t i = 0; i < parts.size(); ++i) write_docs((tmp / "dir" / ("s" + std::to_string(i))).string(), parts[i]);
  merge_indexed_datasets(expand_merge_inputs({(tmp / "dir").string()}), (tmp / "merged2").string(), false);
  CHECK(same_files((tmp / "merged2").string(), (tmp / "whole").string()));
  // One input: a byte copy.
  merge_indexed_datasets({prefixes[0]}, (tmp / "one").string(), false);
  CHECK(same_files((tmp / "one").string(), prefixes[0]));
}

TEST_CASE("merge: mismatched dtypes, a missing prefix and output over an input are refused", "[data]") {
  TempDir tmp("merge-bad");
  const std::string a = (tmp / "a").string(), b = (tmp / "b").string();
  write_docs(a, make_docs(5, 1), DType::u16);
  write_docs(b, make_docs(5, 2), DType::i32);
  try {
    merge_indexed_datasets({a, b}, (tmp / "out").string(), false);
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Matchers::Contains(b) && Catch::Matchers::Contains("int32") &&
                             Catch::Matchers::Contains("uint16"));
  }
  CHECK_THROWS_AS(merge_indexed_datasets({a, (tmp / "nope").string()}, (tmp / "out").string(), false), InputError);
  CHECK_THROWS_AS(merge_indexed_datasets({a, a}, a, false), InputError);
  CHECK_THROWS_AS(merge_indexed_datasets({}, (tmp / "out").string(), false), InputError);
  CHECK(count_files(tmp.path()) == 4);  // nothing written, no temporary left
}

TEST_CASE("line_aligned_range: parts cut at line starts and cover the file", "[data]") {
  TempDir tmp("ranges");
  const std::string text = "a\nbb\n\nccc\ndddd\ne";  // no final newline
  test::write_file(tmp / "t.jsonl", text);
  for (int64_t parts = 1; parts <= 7; ++parts) {
    int64_t at = 0;
    for (int64_t p = 0; p < parts; ++p) {
      auto [b, e] = line_aligned_range((tmp / "t.jsonl").string(), parts, p);
      CHECK(b == at);
      CHECK(e >= b);
      CHECK((b == 0 || text[static_cast<size_t>(b - 1)] == '\n'));
      at = e;
    }
    CHECK(at == static_cast<int64_t>(text.size()));
  }
  // Line numbers inside a range count from the file's first line.
  auto [b, e] = line_aligned_range((tmp / "t.jsonl").string(), 2, 1);
  LineReader rd((tmp / "t.jsonl").string(), b, e);
  std::string line;
  REQUIRE(rd.next(line));
  CHECK(line == "dddd");
  CHECK(rd.line_number() == 5);
}

TEST_CASE("e2e merge: preprocessing 3 parts and merging equals preprocessing the whole file", "[data][e2e]") {
  MTNLG_REQUIRE_GPT2(tok);
  TempDir tmp("merge-e2e");
  const auto lines = corpus_lines(900);
  const size_t c1 = 250, c2 = 700;
  test::write_file(tmp / "whole.jsonl", join_lines(lines, 0, lines.size()));
  test::write_file(tmp / "p0.jsonl", join_lines(lines, 0, c1));
  test::write_file(tmp / "p1.jsonl", join_lines(lines, c1, c2));
  test::write_file(tmp / "p2.jsonl", join_lines(lines, c2, lines.size()));
  for (std::string n : {"whole", "p0", "p1", "p2"}) {
    auto r = test::run_mtnlg("data preprocess --input " + (tmp / (n + ".jsonl")).string() + " --output-prefix " +
                             (tmp / n).string() + gpt2_vocab_args() + " --append-eod --no-progress");
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
  }
  auto pre = [&](const std::string& n) { return (tmp / (n + "_text_document")).string(); };
  auto r = test::run_mtnlg("data merge --input " + pre("p0") + " " + pre("p1") + " " + pre("p2") + " --output-prefix " +
                           (tmp / "merged").string() + " --no-progress");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Matchers::Contains("3 prefixes, 900 documents"));
  CHECK(same_files((tmp / "merged").string(), pre("whole")));

  // A prefix of another dtype: exit 2 naming it, nothing written.
  const std::string odd = (tmp / "odd").string();
  write_docs(odd, make_docs(3, 9), DType::i32);
  auto bad = test::run_mtnlg("data merge --input " + pre("p0") + " " + odd + " --output-prefix " +
                             (tmp / "bad").string() + " --no-progress");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.out, Catch::Matchers::Contains(odd + ": dtype int32"));
  CHECK_FALSE(fs::exists(tmp / "bad.bin"));
  CHECK_FALSE(fs::exists(tmp / "bad.idx"));
}

TEST_CASE("e2e preprocess: 1, 2, 3 and 4 ranks give byte-identical files", "[data][mpi]") {
  MTNLG_REQUIRE_GPT2(tok);
  TempDir tmp("pre-ranks");
  fs::create_directories(tmp / "gz");
  const auto lines = corpus_lines(1200);
  test::write_file(tmp / "c.jsonl", join_lines(lines, 0, lines.size()));
  const std::string base = " data preprocess --input " + (tmp / "c.jsonl").string() + gpt2_vocab_args() +
                           " --append-eod --json-keys text title --no-progress --output-prefix ";
  auto r1 = test::run_command(std::string(MTNLG_BINARY) + base + (tmp / "np1").string());
  INFO(r1.out);
  REQUIRE(r1.exit_code == 0);
  for (int np = 2; np <= 4; ++np) {
    const std::string out = (tmp / ("np" + std::to_string(np))).string();
    auto r = test::run_command(test::mpirun(np) + MTNLG_BINARY + base + out);
    INFO(np << " ranks: " << r.out);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Matchers::Contains("1200 documents") &&
                          Catch::Matchers::Contains("(" + std::to_string(np) + " ranks)"));
    CHECK_THAT(r.out, !Catch::Matchers::Contains("ranks): ["));  // --no-progress: no progress line
    for (std::string k : {"_text_document", "_title_document"}) CHECK(same_files(out + k, (tmp / "np1").string() + k));
  }
  // Only the outputs remain: input + 4 runs x 2 keys x 2 files, no parts.
  CHECK(count_files(tmp.path()) == 1 + 4 * 2 * 2);
  // With progress: one line on rank 0 counting the input bytes of all ranks out of the
  // file's size (so a bar, a percentage and, while running, an ETA) and the tokens.
  {
    fs::create_directories(tmp / "progress");
    const std::string out = (tmp / "progress" / "np2").string();
    const std::string size = human_count(static_cast<double>(fs::file_size(tmp / "c.jsonl")));
    auto r =
        test::run_command(test::mpirun(2) + MTNLG_BINARY + " data preprocess --input " + (tmp / "c.jsonl").string() +
                          gpt2_vocab_args() + " --append-eod --json-keys text title --output-prefix " + out);
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Matchers::Contains("preprocess c.jsonl (2 ranks): [########################] 100.0%") &&
                          Catch::Matchers::Contains(size + "/" + size + " B") &&  // every byte counted once
                          Catch::Matchers::Contains("tokens/s"));
    for (std::string k : {"_text_document", "_title_document"}) CHECK(same_files(out + k, (tmp / "np1").string() + k));
    fs::remove_all(tmp / "progress");
  }

  // A gzip input cannot be cut at byte offsets: rank 0 reads it whole, same bytes.
  {
    const std::string text = test::read_file(tmp / "c.jsonl");
    REQUIRE(test::write_gz(tmp / "gz" / "c.jsonl.gz", text));
    const std::string out = (tmp / "gz" / "np3").string();
    auto r = test::run_command(test::mpirun(3) + MTNLG_BINARY + " data preprocess --input " +
                               (tmp / "gz" / "c.jsonl.gz").string() + gpt2_vocab_args() +
                               " --append-eod --json-keys text title --no-progress --output-prefix " + out);
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    for (std::string k : {"_text_document", "_title_document"}) CHECK(same_files(out + k, (tmp / "np1").string() + k));
    CHECK(count_files(tmp / "gz") == 1 + 2 * 2);
  }

  // A bad line on a later rank's share: every rank stops, exit 2, the message names
  // file:line, and no output or part is left.
  auto badlines = lines;
  badlines[1000] = "{not json";
  test::write_file(tmp / "bad.jsonl", join_lines(badlines, 0, badlines.size()));
  const std::string before = std::to_string(count_files(tmp.path()));
  auto bad =
      test::run_command(test::mpirun(3) + MTNLG_BINARY + " data preprocess --input " + (tmp / "bad.jsonl").string() +
                        gpt2_vocab_args() + " --no-progress --output-prefix " + (tmp / "bad").string());
  INFO(bad.out);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.out,
             Catch::Matchers::Contains("bad.jsonl:1001: malformed JSON") && Catch::Matchers::Contains("rank 2"));
  CHECK(std::to_string(count_files(tmp.path())) == before);
}

TEST_CASE("split_inputs: shares cover the inputs in order, cut at line starts, never inside a compressed file",
          "[data]") {
  TempDir tmp("split-inputs");
  const auto lines = corpus_lines(300);
  const std::string a = join_lines(lines, 0, 40), b = join_lines(lines, 40, 200), c = join_lines(lines, 200, 300);
  test::write_file(tmp / "a.jsonl", a);
  REQUIRE(test::write_gz(tmp / "b.jsonl.gz", b));
  test::write_file(tmp / "e.jsonl", "");  // an empty input contributes nothing
  test::write_file(tmp / "c.jsonl", c + "{\"text\": \"no newline at the end\"}");
  const std::vector<std::string> in = {(tmp / "a.jsonl").string(), (tmp / "b.jsonl.gz").string(),
                                       (tmp / "e.jsonl").string(), (tmp / "c.jsonl").string()};
  const int64_t total = total_input_bytes(in);
  CHECK(total == static_cast<int64_t>(fs::file_size(in[0]) + fs::file_size(in[1]) + fs::file_size(in[3])));
  for (int64_t parts = 1; parts <= 7; ++parts) {
    INFO(parts << " parts");
    // The pieces of all shares, in order, are every input whole or cut at line starts,
    // each byte exactly once.
    std::vector<std::string> got(in.size());
    std::vector<int64_t> next_begin(in.size(), 0);
    int64_t nonempty = 0;
    for (int64_t p = 0; p < parts; ++p) {
      const auto pieces = split_inputs(in, parts, p);
      nonempty += !pieces.empty();
      size_t last = 0;
      for (const auto& pc : pieces) {
        const size_t i = static_cast<size_t>(std::find(in.begin(), in.end(), pc.path) - in.begin());
        REQUIRE(i < in.size());
        CHECK(i >= last);  // file order within a share
        last = i;
        const std::string bytes = test::read_file(pc.path);
        const int64_t e = pc.end < 0 ? static_cast<int64_t>(bytes.size()) : pc.end;
        if (i == 1) CHECK((pc.begin == 0 && pc.end == -1));  // the gzip file is one unit
        CHECK(pc.begin == next_begin[i]);
        CHECK((pc.begin == 0 || bytes[static_cast<size_t>(pc.begin - 1)] == '\n'));
        got[i] += bytes.substr(static_cast<size_t>(pc.begin), static_cast<size_t>(e - pc.begin));
        next_begin[i] = e;
      }
    }
    for (size_t i = 0; i < in.size(); ++i) CHECK(got[i] == test::read_file(in[i]));
    if (parts > 1) CHECK(nonempty > 1);  // the work is actually shared
  }
  CHECK(inputs_label(in) == "a.jsonl +3 more");
  CHECK(inputs_label({in[0]}) == "a.jsonl");
}

TEST_CASE("e2e preprocess: several inputs give the files of preprocessing their concatenation", "[data][e2e]") {
  MTNLG_REQUIRE_GPT2(tok);
  TempDir tmp("pre-multi");
  const auto lines = corpus_lines(900);
  const size_t c1 = 130, c2 = 610;  // three inputs of different sizes
  test::write_file(tmp / "whole.jsonl", join_lines(lines, 0, lines.size()));
  test::write_file(tmp / "p0.jsonl", join_lines(lines, 0, c1));
  test::write_file(tmp / "p1.jsonl", join_lines(lines, c1, c2));
  REQUIRE(test::write_gz(tmp / "p2.jsonl.gz", join_lines(lines, c2, lines.size())));
  const std::string p0 = (tmp / "p0.jsonl").string(), p1 = (tmp / "p1.jsonl").string(),
                    p2 = (tmp / "p2.jsonl.gz").string();
  const std::string args = gpt2_vocab_args() + " --append-eod --json-keys text title --no-progress";
  auto whole = test::run_mtnlg("data preprocess --input " + (tmp / "whole.jsonl").string() + " --output-prefix " +
                               (tmp / "whole").string() + args);
  INFO(whole.out);
  REQUIRE(whole.exit_code == 0);
  // A list after one --input, or --input repeated; 1 or 3 workers.
  const std::vector<std::pair<std::string, std::string>> forms = {
      {"list", "--input " + p0 + " " + p1 + " " + p2 + " --workers 1"},
      {"repeated", "--input " + p0 + " --input " + p1 + " --input " + p2 + " --workers 3"}};
  for (const auto& [name, form] : forms) {
    auto r = test::run_mtnlg("data preprocess " + form + " --output-prefix " + (tmp / name).string() + args);
    INFO(name << ": " << r.out);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Matchers::Contains("900 documents"));
    for (std::string k : {"_text_document", "_title_document"})
      CHECK(same_files((tmp / name).string() + k, (tmp / "whole").string() + k));
  }
  // In another order the documents follow that order (not the same files).
  auto swapped = test::run_mtnlg("data preprocess --input " + p1 + " " + p0 + " " + p2 + " --output-prefix " +
                                 (tmp / "swapped").string() + args);
  REQUIRE(swapped.exit_code == 0);
  CHECK_FALSE(same_files((tmp / "swapped_text_document").string(), (tmp / "whole_text_document").string()));
  const int64_t outputs = count_files(tmp.path());

  // A bad line in the second input names that file and its own line number.
  auto bad_lines = std::vector<std::string>(lines.begin() + c1, lines.begin() + c2);
  bad_lines[41] = "{\"text\": \"unterminated";
  test::write_file(tmp / "bad1.jsonl", join_lines(bad_lines, 0, bad_lines.size()));
  for (std::string workers : {"1", "3"}) {
    auto bad = test::run_mtnlg("data preprocess --input " + p0 + " " + (tmp / "bad1.jsonl").string() + " " + p2 +
                               " --workers " + workers + " --output-prefix " + (tmp / "bad").string() + args);
    INFO(bad.out);
    CHECK(bad.exit_code == 2);
    CHECK_THAT(bad.out, Catch::Matchers::Contains((tmp / "bad1.jsonl").string() + ":42: malformed JSON"));
    CHECK(count_files(tmp.path()) == outputs + 1);  // nothing written
  }

  // The same file twice (by the same or another path), a missing input, or an output
  // that is an input: exit 2 naming the file, nothing written.
  const std::string other_path = (tmp / "." / "p1.jsonl").string();
  fs::create_hard_link(tmp / "p1.jsonl", tmp / "p1-link.jsonl");
  struct Bad {
    std::string inputs, prefix, message;
  };
  const std::vector<Bad> cases = {
      {p0 + " " + p1 + " " + p0, (tmp / "o").string(), p0 + " and " + p0 + " are the same file"},
      {p1 + " " + other_path, (tmp / "o").string(), p1 + " and " + other_path + " are the same file"},
      {p1 + " " + (tmp / "p1-link.jsonl").string(), (tmp / "o").string(), "are the same file"},
      {p0 + " " + (tmp / "nope.jsonl").string(), (tmp / "o").string(),
       (tmp / "nope.jsonl").string() + ": input file not found"},
      {p0 + " " + (tmp / "whole_text_document.bin").string(), (tmp / "whole").string(),
       "the output " + (tmp / "whole_text_document.bin").string() + " is the input"},
  };
  for (const auto& c : cases) {
    auto r = test::run_mtnlg("data preprocess --input " + c.inputs + " --output-prefix " + c.prefix + args);
    INFO(c.inputs << ": " << r.out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Catch::Matchers::Contains(c.message));
  }
  // The dataset that was named as an input is untouched.
  CHECK(same_files((tmp / "whole_text_document").string(), (tmp / "list_text_document").string()));
  CHECK(count_files(tmp.path()) == outputs + 2);  // + bad1.jsonl and the hard link
}

TEST_CASE("e2e preprocess: several inputs (one gzip) on 1..4 ranks give the single-process files", "[data][mpi]") {
  MTNLG_REQUIRE_GPT2(tok);
  TempDir tmp("pre-multi-ranks");
  const auto lines = corpus_lines(1500);
  const size_t c1 = 900, c2 = 1000;  // a large, a small and a middle-sized input
  test::write_file(tmp / "a.jsonl", join_lines(lines, 0, c1));
  REQUIRE(test::write_gz(tmp / "b.jsonl.gz", join_lines(lines, c1, c2)));
  test::write_file(tmp / "c.jsonl", join_lines(lines, c2, lines.size()));
  const std::string inputs =
      (tmp / "a.jsonl").string() + " " + (tmp / "b.jsonl.gz").string() + " " + (tmp / "c.jsonl").string();
  const std::string base = " data preprocess --input " + inputs + gpt2_vocab_args() +
                           " --append-eod --json-keys text title --no-progress --output-prefix ";
  auto r1 = test::run_command(std::string(MTNLG_BINARY) + base + (tmp / "np1").string());
  INFO(r1.out);
  REQUIRE(r1.exit_code == 0);
  CHECK_THAT(r1.out, Catch::Matchers::Contains("1500 documents"));
  for (int np = 1; np <= 4; ++np) {
    const std::string out = (tmp / ("mpi" + std::to_string(np))).string();
    auto r = test::run_command(test::mpirun(np) + MTNLG_BINARY + base + out);
    INFO(np << " ranks: " << r.out);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Matchers::Contains("1500 documents"));
    for (std::string k : {"_text_document", "_title_document"}) CHECK(same_files(out + k, (tmp / "np1").string() + k));
  }
  // Only the outputs remain: 3 inputs + 5 runs x 2 keys x 2 files, no parts.
  CHECK(count_files(tmp.path()) == 3 + 5 * 2 * 2);
  // Progress on rank 0 counts the bytes of all inputs (the gzip one by its file size).
  {
    fs::create_directories(tmp / "progress");
    const int64_t total = static_cast<int64_t>(fs::file_size(tmp / "a.jsonl") + fs::file_size(tmp / "b.jsonl.gz") +
                                               fs::file_size(tmp / "c.jsonl"));
    const std::string size = human_count(static_cast<double>(total));
    auto r =
        test::run_command(test::mpirun(2) + MTNLG_BINARY + " data preprocess --input " + inputs + gpt2_vocab_args() +
                          " --append-eod --output-prefix " + (tmp / "progress" / "np2").string());
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out,
               Catch::Matchers::Contains("preprocess a.jsonl +2 more (2 ranks): [########################] 100.0%") &&
                   Catch::Matchers::Contains(size + "/" + size + " B"));
    fs::remove_all(tmp / "progress");
  }
  // A bad line in the last input on 3 ranks: exit 2 naming that file and line, no output
  // or part left; a duplicate input: exit 2 naming it.
  auto bad = lines;
  bad[c2 + 300] = "{not json";
  test::write_file(tmp / "c-bad.jsonl", join_lines(bad, c2, bad.size()));
  const int64_t before = count_files(tmp.path());
  auto rb =
      test::run_command(test::mpirun(3) + MTNLG_BINARY + " data preprocess --input " + (tmp / "a.jsonl").string() +
                        " " + (tmp / "b.jsonl.gz").string() + " " + (tmp / "c-bad.jsonl").string() + gpt2_vocab_args() +
                        " --no-progress --output-prefix " + (tmp / "bad").string());
  INFO(rb.out);
  CHECK(rb.exit_code == 2);
  CHECK_THAT(rb.out, Catch::Matchers::Contains("c-bad.jsonl:301: malformed JSON"));
  CHECK(count_files(tmp.path()) == before);
  auto rd = test::run_command(test::mpirun(2) + MTNLG_BINARY + " data preprocess --input " + inputs + " " +
                              (tmp / "a.jsonl").string() + gpt2_vocab_args() + " --no-progress --output-prefix " +
                              (tmp / "dup").string());
  INFO(rd.out);
  CHECK(rd.exit_code == 2);
  CHECK_THAT(rd.out, Catch::Matchers::Contains("a.jsonl are the same file"));
  CHECK(count_files(tmp.path()) == before);
}
