// tokenizer.json: UTF-8 repair, the Oniguruma -> PCRE2 rewrite, hand-checked small files
// (BPE merges by rank, unk/fuse_unk/byte_fallback, added-token flags, template, decoders),
// unsupported components as InputErrors naming their JSON path, and the oracle: Hugging
// Face's tokenizers (npm `tokenizers`, test/data/hf_ids.js) on the 6 MB corpus of
// scripts/make-tokenizer-corpus.py with GPT-2's, Llama 3's, Qwen3's and Llama 2's files,
// and on variants of them that switch on the other components.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.hpp"
#include "data/hf_regex.hpp"
#include "data/hf_tokenizer.hpp"
#include "test/support/data_util.hpp"

using namespace mtnlg;
using namespace mtnlg::data;
using nlohmann::json;
using Ids = std::vector<int32_t>;

namespace {

// A small character-level BPE file (no byte-level alphabet): a, b, c merge to "abc".
json tiny() {
  return json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [
      {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
      {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
    ],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
              "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
              "vocab": {"<unk>": 0, "<s>": 1, "a": 2, "b": 3, "c": 4, "ab": 5, "bc": 6, "abc": 7, " ": 8, "<0x78>": 9},
              "merges": ["b c", "a b", ["ab", "c"]]}
  })");
}

std::shared_ptr<const HfTokenizer> load(const json& j, const test::TempDir& tmp, const std::string& name = "t.json") {
  test::write_file(tmp / name, j.dump());
  return HfTokenizer::from_file((tmp / name).string());
}

std::string node_cmd(const std::string& tools) {
  return "NODE_PATH='" + tools + "/node_modules' node " + test::source_dir() + "/test/data/hf_ids.js ";
}

// Documents [0, n) of the corpus written to `path` (length-prefixed), n = all when < 0.
std::vector<std::string> corpus_docs(const std::string& path, int64_t max_bytes) {
  auto docs = test::read_length_prefixed(test::tokenizer_corpus() + ".bin");
  std::vector<std::string> keep;
  int64_t bytes = 0;
  for (auto& d : docs) {
    if (max_bytes >= 0 && bytes >= max_bytes) break;
    bytes += static_cast<int64_t>(d.size());
    keep.push_back(std::move(d));
  }
  std::string out;
  for (const auto& d : keep) {
    const auto n = static_cast<uint32_t>(d.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += d;
  }
  test::write_file(path, out);
  return keep;
}

// Encodes every document with mtnlg and with Hugging Face's library; all must agree.
// Returns the number of documents compared.
int64_t compare_with_oracle(const std::string& tokenizer_json, const test::TempDir& tmp, int64_t max_bytes,
                            bool add_special = true) {
  const std::string tools = test::npm_tools_dir();
  const std::string corpus = (tmp / "corpus.bin").string();
  const auto docs = corpus_docs(corpus, max_bytes);
  const std::string ids = (tmp / "ids.bin").string();
  auto r = test::run_command(node_cmd(tools) + "ids " + tokenizer_json + " " + corpus + " " + ids +
                             (add_special ? "" : " --no-special"));
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const auto want = test::read_id_lists(ids);
  REQUIRE(want.size() == docs.size());
  auto tok = HfTokenizer::from_file(tokenizer_json);
  int64_t bad = 0, invalid_utf8 = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const Ids got = tok->encode(docs[i], add_special);
    invalid_utf8 += !utf8_valid(docs[i]);
    if (got != want[i] && bad++ < 3) {
      size_t k = 0;
      while (k < got.size() && k < want[i].size() && got[k] == want[i][k]) ++k;
      std::string ctx;
      for (size_t q = k > 3 ? k - 3 : 0; q < k + 4; ++q)
        ctx += fmt::format(" [{}: {} vs {}]", q, q < got.size() ? tok->id_to_token(got[q]) : "-",
                           q < want[i].size() ? tok->id_to_token(want[i][q]) : "-");
      FAIL_CHECK("document " << i << " differs at id " << k << " of " << want[i].size() << ":" << ctx);
    }
  }
  CHECK(bad == 0);
  CHECK(invalid_utf8 > 0);  // the corpus holds invalid UTF-8, and it was compared too
  return static_cast<int64_t>(docs.size());
}

}  // namespace

TEST_CASE("utf8: one U+FFFD per maximal ill-formed subpart, as the WHATWG decoder", "[data]") {
  const std::string R = "\xEF\xBF\xBD";
  CHECK(utf8_valid("plain ascii"));
  CHECK(utf8_valid("caf\xC3\xA9 \xF0\x9F\x98\x80 \xE6\x97\xA5"));
  CHECK_FALSE(utf8_valid("\xED\xA0\x80"));  // a surrogate
  CHECK_FALSE(utf8_valid("\xC0\xAF"));      // an overlong
  CHECK(utf8_lossy("a\xFF"
                   "b") == "a" + R + "b");
  CHECK(utf8_lossy("\xF0\x9F\x98") == R);                  // truncated 4-byte: one
  CHECK(utf8_lossy("\xE2\x82(") == R + "(");               // truncated 3-byte: one
  CHECK(utf8_lossy("\xED\xA0\x80") == R + R + R);          // ED's second byte must be < A0
  CHECK(utf8_lossy("\xF4\x90\x80\x80") == R + R + R + R);  // above U+10FFFF
  CHECK(utf8_lossy("\xC0\xAF") == R + R);
  CHECK(utf8_lossy("x\xC3") == "x" + R);
  CHECK(utf8_lossy("ok \xE6\x97\xA5") == "ok \xE6\x97\xA5");
}

TEST_CASE("hf regex: Oniguruma's \\s and \\w become explicit classes; unsupported forms refused", "[data]") {
  const std::string s = oniguruma_to_pcre2("\\s+(?!\\S)", "p");
  CHECK_THAT(s, Catch::Matchers::Contains("\\x{85}"));
  CHECK(s.rfind("[\\x{9}", 0) == 0);
  CHECK_THAT(oniguruma_to_pcre2("[^\\s\\p{L}]", "p"), Catch::Matchers::StartsWith("[^\\x{9}-\\x{D}"));
  CHECK(oniguruma_to_pcre2("\\p{N}{1,3}", "p") == "\\p{N}{1,3}");
  CHECK_THROWS_AS(oniguruma_to_pcre2("[\\S]", "p"), InputError);
  CHECK_THROWS_AS(HfRegex("(unclosed", "here"), InputError);
  // U+0085 is \s for Oniguruma (and so for Hugging Face), not for PCRE2's own \s.
  HfRegex re("\\s+", "p");
  size_t a = 0, b = 0;
  REQUIRE(re.next("x\xC2\x85y", 0, a, b));
  CHECK((a == 1 && b == 3));
  std::vector<std::pair<size_t, size_t>> m;
  HfRegex("x*", "p").for_each_match("ab", [&](size_t i, size_t j) { m.emplace_back(i, j); });
  CHECK(m.size() == 3);  // empty matches at 0, 1, 2, each one character further
}

TEST_CASE("hf tokenizer: BPE merges by rank, unk, fuse_unk, byte_fallback", "[data]") {
  test::TempDir tmp("hf-tiny");
  json j = tiny();
  auto t = load(j, tmp);
  CHECK(t->vocab_size() == 10);
  // "b c" has rank 0: "abc" -> a + bc, and a+bc is no merge; "ab c" needs ab first.
  CHECK(t->encode("abc") == Ids{2, 6});
  CHECK(t->encode("abab") == Ids{5, 5});
  CHECK(t->encode("xa") == Ids{0, 2});
  CHECK(t->encode("xxa") == Ids{0, 0, 2});
  j["model"]["fuse_unk"] = true;
  CHECK(load(j, tmp, "f.json")->encode("xxa") == Ids{0, 2});
  j["model"]["byte_fallback"] = true;
  CHECK(load(j, tmp, "b.json")->encode("xa") == Ids{9, 2});  // <0x78>
  CHECK(load(j, tmp, "b.json")->encode("ya") == Ids{0, 2});  // no <0x79>: unk
  j["model"]["ignore_merges"] = true;
  CHECK(load(j, tmp, "i.json")->encode("abc") == Ids{7});  // a whole-word token wins
  CHECK(t->encode("<s>ab<unk>") == Ids{1, 5, 0});          // added tokens cut out first
  CHECK(t->token_to_id("abc") == 7);
  CHECK(t->id_to_token(7) == "abc");
  CHECK(t->is_special(1));
  CHECK_FALSE(t->is_special(7));
  CHECK_THROWS_AS(t->id_to_token(10), InputError);
  CHECK_THROWS_AS(t->decode(Ids{10}), InputError);
  CHECK(t->decode(Ids{5, 4}) == "ab c");  // no decoder: tokens joined by spaces, as the library does
}

TEST_CASE("hf tokenizer: added-token flags, normalizers, template, decoders", "[data]") {
  test::TempDir tmp("hf-flags");
  json j = tiny();
  j["added_tokens"].push_back({{"id", 10},
                               {"content", "[L]"},
                               {"single_word", false},
                               {"lstrip", true},
                               {"rstrip", false},
                               {"normalized", false},
                               {"special", true}});
  j["added_tokens"].push_back({{"id", 11},
                               {"content", "[R]"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", true},
                               {"normalized", false},
                               {"special", false}});
  j["added_tokens"].push_back({{"id", 12},
                               {"content", "cab"},
                               {"single_word", true},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", false},
                               {"special", false}});
  auto t = load(j, tmp);
  CHECK(t->encode("a  [L]b") == Ids{2, 10, 3});        // lstrip takes the spaces before it
  CHECK(t->encode("a[R]  b") == Ids{2, 11, 3});        // rstrip the ones after
  CHECK(t->encode("a cab b") == Ids{2, 8, 12, 8, 3});  // a single word
  CHECK(t->encode("acab") == Ids{2, 4, 5});            // inside a word: not the token
  // Normalizers: Prepend + Replace (SentencePiece style), NFKC; a normalized added token
  // is matched in the normalized text.
  json n = tiny();
  n["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFKC"},
      {"type": "Replace", "pattern": {"String": "q"}, "content": "c"}, {"type": "Prepend", "prepend": "a"}]})");
  auto tn = load(n, tmp, "n.json");
  CHECK(tn->encode("bq") == Ids{2, 6});  // "a" + "bc": a, bc
  CHECK(tn->encode("\xEF\xBD\x82"
                   "c") == Ids{2, 6});  // fullwidth b -> b under NFKC
  CHECK(tn->encode("") == Ids{});       // Prepend leaves empty text empty
  // Template: BOS before the sequence, EOS-like after; only with add_special_tokens.
  json p = tiny();
  p["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<unk>", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                                     "<unk>": {"id": "<unk>", "ids": [0], "tokens": ["<unk>"]}}})");
  auto tp = load(p, tmp, "p.json");
  CHECK(tp->encode("ab") == Ids{1, 5, 0});
  CHECK(tp->encode("ab", false) == Ids{5});
  CHECK(tp->encode("") == Ids{1, 0});
  // Decoders: SentencePiece's chain (Replace, ByteFallback, Fuse, Strip).
  json d = tiny();
  d["model"]["vocab"]
   ["\xE2\x96\x81"
    "a"] = 13;
  d["model"]["vocab"]["<0xC3>"] = 14;
  d["model"]["vocab"]["<0xA9>"] = 15;
  d["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  auto td = load(d, tmp, "d.json");
  CHECK(td->decode(Ids{13, 14, 15, 13}) == "a\xC3\xA9 a");  // <0xC3><0xA9> is é
  CHECK(td->decode(Ids{13, 14, 13}) == "a\xEF\xBF\xBD a");  // a lone byte: U+FFFD
  CHECK(td->decode(Ids{1, 13}, true) == "a");               // skip special tokens
}

TEST_CASE("hf tokenizer: invalid UTF-8 in the text is U+FFFD per maximal subpart", "[data]") {
  test::TempDir tmp("hf-utf8");
  json j = tiny();
  j["model"]["vocab"]["\xEF\xBF\xBD"] = 13;
  auto t = load(j, tmp);
  CHECK(t->encode("a\xFF"
                  "b") == Ids{2, 13, 3});
  CHECK(t->encode("a\xED\xA0\x80") == Ids{2, 13, 13, 13});
  CHECK(t->encode("\xF0\x9F\x98"
                  "c") == Ids{13, 4});
}

TEST_CASE("hf tokenizer: unsupported components are InputErrors naming the JSON path", "[data]") {
  test::TempDir tmp("hf-bad");
  struct Case {
    std::string ptr, value, want;
  };
  const std::vector<Case> cases = {
      {"/normalizer", R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]})",
       "normalizer.normalizers[1].type: unsupported normalizer 'Lowercase'"},
      {"/pre_tokenizer", R"({"type": "Whitespace"})", "pre_tokenizer.type: unsupported pre-tokenizer 'Whitespace'"},
      {"/pre_tokenizer", R"({"type": "Sequence", "pretokenizers": [{"type": "ByteLevel"}, {"type": "Digits"}]})",
       "pre_tokenizer: unsupported pre-tokenizer after ByteLevel"},
      {"/pre_tokenizer", R"({"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways", "invert": false})",
       "pre_tokenizer.behavior: unsupported split behavior 'Sideways'"},
      {"/pre_tokenizer", R"({"type": "Split", "pattern": {"Regex": "[\\S]"}, "behavior": "Isolated", "invert": false})",
       "pre_tokenizer.pattern.Regex: \\S inside a bracketed class"},
      {"/post_processor", R"({"type": "RobertaProcessing"})",
       "post_processor.type: unsupported post-processor 'RobertaProcessing'"},
      {"/decoder", R"({"type": "CTC"})", "decoder.type: unsupported decoder 'CTC'"},
      {"/model/type", R"("WordPiece")", "model.type: unsupported model 'WordPiece'"},
      {"/model/dropout", "0.1", "model.dropout: unsupported BPE dropout"},
      {"/model/continuing_subword_prefix", R"("##")", "model.continuing_subword_prefix: unsupported"},
      {"/truncation", R"({"max_length": 512})", "truncation: unsupported"},
      {"/model/merges/1", R"("a zz")", "model.merges[1]: 'a', 'zz' or 'azz' is not in model.vocab"},
      {"/model/unk_token", R"("<nope>")", "model.unk_token: '<nope>' is not in model.vocab"},
  };
  for (const auto& c : cases) {
    json j = tiny();
    j[json::json_pointer(c.ptr)] = json::parse(c.value);
    test::write_file(tmp / "t.json", j.dump());
    INFO(c.ptr << " = " << c.value);
    try {
      HfTokenizer::from_file((tmp / "t.json").string());
      FAIL_CHECK("expected InputError");
    } catch (const InputError& e) {
      CHECK_THAT(e.what(),
                 Catch::Matchers::StartsWith((tmp / "t.json").string() + ": ") && Catch::Matchers::Contains(c.want));
    }
  }
  test::write_file(tmp / "bad.json", "{\"model\": ");
  CHECK_THROWS_WITH(HfTokenizer::from_file((tmp / "bad.json").string()),
                    Catch::Matchers::Contains("bad.json: not valid JSON"));
  CHECK_THROWS_WITH(HfTokenizer::from_file((tmp / "none.json").string()),
                    Catch::Matchers::Contains("none.json: cannot open"));
}

TEST_CASE("hf tokenizer: threads share one tokenizer and agree", "[data]") {
  test::TempDir tmp("hf-threads");
  auto t = load(tiny(), tmp);
  const std::string text = "abcabc ab<s>xx c abab";
  const Ids want = t->encode(text);
  std::vector<int> ok(4, 0);
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      bool good = true;
      for (int i = 0; i < 300; ++i) good = good && t->encode(text) == want;
      ok[static_cast<size_t>(k)] = good;
    });
  for (auto& x : th) x.join();
  CHECK(ok == std::vector<int>{1, 1, 1, 1});
}

// Its own ctest entry (data.oracle-hf-corpus, label oracle): four runs of the library over
// 6 MB take minutes on a loaded machine, so it gets a timeout of its own.
TEST_CASE("hf tokenizer: ids equal Hugging Face tokenizers on the 6 MB corpus", "[data][hf_corpus][.]") {
  for (std::string name : {"gpt2", "llama3", "qwen3", "llama2"}) {
    DYNAMIC_SECTION(name) {
      MTNLG_REQUIRE_HF(path, name);
      test::TempDir tmp("hf-oracle");
      const int64_t n = compare_with_oracle(path, tmp, -1);
      CHECK(n >= 500);
      // Round trips: the byte-level files without a normalizer give the (repaired)
      // text back; Qwen3's NFC text encodes to the same ids again.
      auto tok = HfTokenizer::from_file(path);
      const auto docs = test::read_length_prefixed(test::tokenizer_corpus() + ".bin");
      int64_t bad = 0;
      for (const auto& d : docs) {
        const Ids ids = tok->encode(d);
        if (name == "gpt2" || name == "llama3") bad += tok->decode(ids) != utf8_lossy(d);
        if (name == "qwen3") bad += tok->encode(tok->decode(ids)) != ids;
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("hf tokenizer: decode equals Hugging Face's decode", "[data][oracle]") {
  const std::vector<std::string> texts = {"Hello world",
                                          " leading space",
                                          "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80",
                                          "a\xEF\xBF\xBD"
                                          "b",
                                          "tabs\tand\nnew  lines ",
                                          "<s>x</s> <|endoftext|>",
                                          "<|begin_of_text|>hi<|im_start|>",
                                          "12345 678"};
  for (std::string name : {"gpt2", "llama3", "qwen3", "llama2"}) {
    DYNAMIC_SECTION(name) {
      MTNLG_REQUIRE_HF(path, name);
      std::string in;
      for (const auto& t : texts) in += json(t).dump() + "\n";
      test::TempDir tmp("hf-decode");
      test::write_file(tmp / "in.jsonl", in);
      auto r =
          test::run_command(node_cmd(test::npm_tools_dir()) + "strings " + path + " < " + (tmp / "in.jsonl").string());
      INFO(r.out);
      REQUIRE(r.exit_code == 0);
      std::istringstream lines(r.out);
      auto tok = HfTokenizer::from_file(path);
      std::vector<Ids> ids(texts.size());
      for (size_t i = 0; i < texts.size(); ++i) {
        std::string l;
        REQUIRE(std::getline(lines, l));
        ids[i] = json::parse(l).get<Ids>();
        CHECK(tok->encode(texts[i]) == ids[i]);
      }
      for (size_t i = 0; i < texts.size(); ++i) {
        std::string l;
        REQUIRE(std::getline(lines, l));
        CHECK(tok->decode(ids[i]) == json::parse(l).get<std::string>());
      }
    }
  }
}

TEST_CASE("hf tokenizer: variants switching on the other components equal Hugging Face", "[data][oracle]") {
  // Each variant edits a real file; 400 KB of the corpus each.
  struct Variant {
    std::string base, name;
    std::function<void(json&)> edit;
  };
  const std::vector<Variant> variants = {
      {"gpt2", "added-token flags, NFKC, normalized tokens",
       [](json& j) {
         j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFKC"},
             {"type": "Replace", "pattern": {"Regex": "[0-9]{4,}"}, "content": "####"}]})");
         auto add = [&](int id, const char* c, bool l, bool r, bool w, bool n, bool s) {
           j["added_tokens"].push_back({{"id", id},
                                        {"content", c},
                                        {"lstrip", l},
                                        {"rstrip", r},
                                        {"single_word", w},
                                        {"normalized", n},
                                        {"special", s}});
         };
         add(50257, "<|im_start|>", true, false, false, false, true);
         add(50258, "<|im_end|>", false, true, false, false, true);
         add(50259, "the", false, false, true, true, false);
         add(50260, "\xEF\xAC\x81", false, false, false, true, false);  // "ﬁ": normalized to "fi" first
         add(50261, "<s>", true, true, false, false, true);
       }},
      {"llama3", "Meta's BOS template, Digits, NFC",
       [](json& j) {
         j["normalizer"] = json::parse(R"({"type": "NFC"})");
         j["pre_tokenizer"]["pretokenizers"].insert(j["pre_tokenizer"]["pretokenizers"].begin(),
                                                    json::parse(R"({"type": "Digits", "individual_digits": false})"));
         j["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
             {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
             {"type": "TemplateProcessing",
              "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
              "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
              "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}}}]})");
       }},
      {"llama2", "Metaspace pre-tokenizer (prepend first), individual digits",
       [](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
             {"type": "Digits", "individual_digits": true},
             {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true}]})");
         j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"},
             {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true}]})");
       }},
      {"gpt2", "Split behaviours and invert, ByteLevel with add_prefix_space and no regex",
       [](json& j) {
         j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"String": ","}, "behavior": "Removed", "invert": false},
             {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "MergedWithNext", "invert": false},
             {"type": "Split", "pattern": {"Regex": "[.!?]"}, "behavior": "MergedWithPrevious", "invert": false},
             {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "Contiguous", "invert": false},
             {"type": "Split", "pattern": {"Regex": "\\p{L}+"}, "behavior": "Isolated", "invert": true},
             {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": false}]})");
       }},
  };
  for (const auto& v : variants) {
    DYNAMIC_SECTION(v.base << ": " << v.name) {
      MTNLG_REQUIRE_HF(path, v.base);
      test::TempDir tmp("hf-variant");
      json j = json::parse(test::read_file(path));
      v.edit(j);
      const std::string file = (tmp / "tokenizer.json").string();
      test::write_file(file, j.dump());
      CHECK(compare_with_oracle(file, tmp, 400000) > 20);
      CHECK(compare_with_oracle(file, tmp, 100000, false) > 5);
    }
  }
}
