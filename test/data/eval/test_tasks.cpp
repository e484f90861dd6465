// Eval tasks (data/eval/tasks.hpp): prompts per task on the hand-written HF-schema
// fixtures (test/fixtures/eval), few-shot assembly against the spec's RNG vectors,
// harness tokenization/windowing, and the metric / stderr formulas.
#include <catch2/catch.hpp>
#include <sstream>
#include <cmath>

#include "data/eval/metrics.hpp"
#include "data/eval/requests.hpp"
#include "data/eval/tasks.hpp"
#include "test/support/data_util.hpp"

using namespace mtnlg::data::eval;
using Catch::Matchers::Contains;

namespace {

std::string fixtures() { return mtnlg::test::source_dir() + "/test/fixtures/eval"; }

std::vector<Doc> load(const std::string& task, const std::string& split, TaskOptions opt = {}) {
  return load_split(fixtures(), task_info(task), split, opt);
}

}  // namespace

TEST_CASE("eval tasks: unknown task lists the valid ones", "[eval]") {
  CHECK_THROWS_WITH(task_info("lambada"), Contains("unknown task 'lambada'") && Contains("hellaswag") &&
                                              Contains("race_high") && Contains("wic"));
  CHECK(task_names().size() == 9);
}

TEST_CASE("eval tasks: LAMBADA splits off the last word, plain and cloze", "[eval]") {
  auto docs = load("lambada_openai", "test");
  REQUIRE(docs.size() == 5);
  CHECK(docs[1].text.substr(docs[1].text.size() - 26) == "started leading her to the");
  CHECK(docs[1].choices == std::vector<std::string>{" dock"});
  CHECK(docs[3].choices == std::vector<std::string>{" Helen"});
  TaskOptions cloze;
  cloze.lambada_format = LambadaFormat::cloze;
  auto c = load("lambada_openai", "test", cloze);
  CHECK(c[1].text == docs[1].text + " ____. ->");
  CHECK(c[1].target == " dock");
}

TEST_CASE("eval tasks: BoolQ, PIQA, ANLI, HANS and WiC prompts", "[eval]") {
  auto b = load("boolq", "validation");
  CHECK(b[1].text ==
        "Property tax -- Property tax or 'house tax' is a local tax on buildings, along with appurtenant land.\n"
        "Question: is house tax and property tax are same?\nAnswer:");
  CHECK(b[1].choices == std::vector<std::string>{" no", " yes"});
  CHECK(b[1].gold == 1);
  CHECK(b[0].target == " no");

  auto p = load("piqa", "validation");
  CHECK(p[1].text == "Question: dresser\nAnswer:");
  CHECK(p[1].choices ==
        std::vector<std::string>{" replace drawer with bobby pin ", " finish, woodgrain with  bobby pin "});
  CHECK(p[1].norm_choices[0] == "replace drawer with bobby pin ");

  auto a = load("anli_r2", "test_r2");
  CHECK(a[2].text ==
        "Alexandra Lendon Bastedo was a British actress.\nQuestion: Bastedo was American. True, False, or "
        "Neither?\nAnswer:");
  CHECK(a[2].choices == std::vector<std::string>{" True", " Neither", " False"});
  CHECK(a[2].gold == 2);

  auto h = load("hans", "validation");
  CHECK(
      h[0].text ==
      "The doctors supported the scientist .\nQuestion: The scientist supported the doctors . True or False?\nAnswer:");
  CHECK(h[0].gold == 1);
  CHECK(h[0].group == "lexical_overlap");

  auto w = load("wic", "validation");
  CHECK(w[0].text ==
        "Sentence 1: Do you want to come over to my place later?\nSentence 2: A political system with no place for the "
        "less prominent groups.\nQuestion: Is the word 'place' used in the same way in the two sentences "
        "above?\nAnswer:");
  // start1/end1 count code points, not bytes ("café" after an em dash)
  CHECK_THAT(w[2].text, Contains("Is the word 'café' used"));
}

TEST_CASE("eval tasks: HellaSwag preprocessing", "[eval]") {
  CHECK(hellaswag_preprocess("  a [title] b [x] c  d   e ") == "a. b c d  e");
  // no second strip: a leading tag leaves its space (as in Python)
  CHECK(hellaswag_preprocess("[header] How to [step] x [unclosed") == " How to x [unclosed");
  CHECK(py_capitalize("the LADY") == "The lady");
  auto h = load("hellaswag", "validation");
  CHECK(h[0].text == "Roof shingle removal: A man is sitting on a roof. He");
  CHECK(h[0].choices[3] == " starts pulling up roofing on a roof.");
  CHECK(h[0].gold == 3);
  // empty ctx_b: the strip removes the trailing space; bracketed markup is deleted
  CHECK(h[2].text == "Home and Garden: How to make a worm bin. Choose a container. You can use a plastic tub.");
  CHECK(h[2].choices[0] == "  Drill holes in the lid.. Add bedding.");
  CHECK(h[2].choices[3] == " Buy a dog.");
}

TEST_CASE("eval tasks: py_capitalize and py_strip equal Python's on all of Unicode", "[eval][oracle]") {
  // Spot checks that need no Python.
  CHECK(py_capitalize("ǆemal") == "ǅemal");        // dz digraph: titlecase, not uppercase
  CHECK(py_capitalize("ß") == "Ss");               // sharp s titlecases to two letters
  CHECK(py_capitalize("xΣΣ Σ") == "Xσς σ");        // final sigma rule
  CHECK(py_strip("\u3000 a\u00a0\u0085") == "a");  // U+3000, NBSP, NEL
  CHECK(py_strip("\x1c a \x1f") == "a");
  CHECK(py_strip("\ufeffa ") == "\ufeffa");  // U+FEFF is not whitespace in Python
  if (!mtnlg::test::python_has("json")) {
    WARN("skipped: no python3");
    return;
  }
  const std::string py = mtnlg::test::python() + " " + mtnlg::test::source_dir() + "/test/data/eval/py_case_oracle.py";
  auto r = mtnlg::test::run_command(
      py + " 'ΟΔΟΣ ΟΔΟΣ.' \"ΑΣ'Σ\" 'aΣ\u0301b' 'İSTANBUL' 'ŉ ǉ ǈ ﬁ' 'Σ' 'aΣ' '\u00a0 ΣΑΣ \u2003'");
  REQUIRE(r.exit_code == 0);
  std::istringstream in(r.out);
  int64_t lines = 0, bad = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    const auto s = j[0].get<std::string>(), t = j[2].get<std::string>();
    ++lines;
    if (py_capitalize(s) != j[1].get<std::string>() || py_strip(t) != j[3].get<std::string>()) {
      if (++bad <= 10) {
        CHECK(py_capitalize(s) == j[1].get<std::string>());
        CHECK(py_strip(t) == j[3].get<std::string>());
      }
    }
  }
  CHECK(lines > 130000);
  CHECK(bad == 0);
}

TEST_CASE("eval tasks: WinoGrande partial scoring", "[eval]") {
  auto w = load("winogrande", "validation");
  CHECK(w[0].choice_contexts == std::vector<std::string>{"Sarah was a much better surgeon than Maria so Sarah",
                                                         "Sarah was a much better surgeon than Maria so Maria"});
  CHECK(w[0].choices == std::vector<std::string>{" always got the harder cases.", " always got the harder cases."});
  CHECK(w[1].gold == 1);
  CHECK(w[1].text == "Sarah was a much better surgeon than Maria so Maria");
}

TEST_CASE("eval tasks: RACE groups questions by article and scores the last one", "[eval]") {
  auto r = load("race_high", "test");
  REQUIRE(r.size() == 2);
  const std::string art1 = r[0].row["article"].get<std::string>();
  // v0.3: a "  _  ." question keeps only its last 5 characters (the harness bug)
  CHECK(r[0].text == "Article: " + art1 +
                         "\n\nQuestion: What did the students want to do?\nAnswer: Travel\n _  .teacher\n"
                         "When did the talk happen?");
  CHECK(r[0].choices == std::vector<std::string>{" Last week", " Yesterday", " Last year", " Today"});
  CHECK(r[0].gold == 0);
  CHECK(r[1].gold == 3);
  TaskOptions v4;
  v4.version = HarnessVersion::v0_4;
  auto r4 = load("race_high", "test", v4);
  // v0.4's reference release v0.4.9.1 still has the bug (v0.4.12 fixed it).
  CHECK(r4[0].text == r[0].text);
  // EleutherAI/race rows: `problems` as a Python literal
  auto t = load("race_high", "train");
  REQUIRE(t.size() == 2);
  CHECK(t[0].text ==
        "Article: Tom has a dog. The dog is brown and likes to run in the park.\n\n"
        "Question: What color is the dog?\nAnswer: Brown\nThe dog likes to  _  .");
  CHECK(t[0].target == " run in the park");
  CHECK(t[1].row["article"] == "Mary's \"garden\" is small.");
}

TEST_CASE("eval tasks: malformed rows and missing files name file:line", "[eval]") {
  mtnlg::test::TempDir d("evaltasks");
  std::filesystem::create_directories(d / "piqa");
  mtnlg::test::write_file(d / "piqa/validation.jsonl",
                          "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}\n{\"goal\": 3, \"sol1\": "
                          "\"a\", \"sol2\": \"b\", \"label\": 0}\n");
  CHECK_THROWS_WITH(load_split(d.str(), task_info("piqa"), "validation", {}),
                    Contains("piqa/validation.jsonl:2: field 'goal' must be a string"));
  mtnlg::test::write_file(d / "piqa/validation.jsonl",
                          "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}\n{oops\n");
  CHECK_THROWS_WITH(load_split(d.str(), task_info("piqa"), "validation", {}),
                    Contains("validation.jsonl:2: malformed JSON row"));
  mtnlg::test::write_file(d / "piqa/validation.jsonl",
                          "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 5}\n");
  CHECK_THROWS_WITH(load_split(d.str(), task_info("piqa"), "validation", {}),
                    Contains("field 'label' is 5, expected 0..1"));
  CHECK_THROWS_WITH(load_split(d.str(), task_info("piqa"), "train", {}),
                    Contains("piqa/train.jsonl: split file missing"));
}

namespace {

std::vector<Doc> synthetic(int64_t n, const std::string& tag) {
  std::vector<Doc> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[i].index = i;
    v[i].row = {{"id", tag + std::to_string(i)}};
    v[i].text = tag + std::to_string(i);
    v[i].choices = {" a", " b"};
    v[i].target = " a";
  }
  return v;
}

}  // namespace

TEST_CASE("eval few-shot: v0.3 shuffles with Random(42) and samples with the same object", "[eval]") {
  // The spec's vector: Random(42).shuffle(range(10)) -> [7,3,...]; then
  // sample(range(40398), 5) -> [38698, 27651, 2082, 1952, 6140] (WinoGrande's train size).
  auto eval_docs = synthetic(10, "e");
  auto pool = synthetic(40398, "t");
  auto inst = build_instances(task_info("winogrande"), eval_docs, &pool, false, 5, {}, -1);
  REQUIRE(inst.size() == 10);
  CHECK(inst[0].doc->index == 7);
  CHECK(inst[1].doc->index == 3);
  CHECK(inst[0].fewshot_indices == std::vector<int64_t>{38698, 27651, 2082, 1952, 6140});
  CHECK(inst[0].contexts[0] == "t38698 a\n\nt27651 a\n\nt2082 a\n\nt1952 a\n\nt6140 a\n\ne7");
  // limit keeps the first N after the shuffle; zero-shot draws nothing
  auto lim = build_instances(task_info("winogrande"), eval_docs, &pool, false, 0, {}, 3);
  REQUIRE(lim.size() == 3);
  CHECK(lim[2].doc->index == 2);
  CHECK(lim[0].contexts[0] == "e7");
}

TEST_CASE("eval few-shot: v0.4 keeps dataset order and uses Random(1234)", "[eval]") {
  auto eval_docs = synthetic(4, "e");
  auto pool = synthetic(9427, "t");  // BoolQ's train size
  TaskOptions v4;
  v4.version = HarnessVersion::v0_4;
  auto inst = build_instances(task_info("boolq"), eval_docs, &pool, false, 3, v4, -1);
  CHECK(inst[0].doc->index == 0);
  // CPython: r = Random(1234); [r.sample(range(9427), 4)[:3] for _ in range(4)] -- every
  // v0.4 release draws k+1 for boolq (fewshot_split == test_split == None).
  CHECK(inst[0].fewshot_indices == std::vector<int64_t>{7220, 1914, 122});
  CHECK(inst[1].fewshot_indices == std::vector<int64_t>{572, 1375, 1612});
  CHECK(inst[2].fewshot_indices == std::vector<int64_t>{3879, 285, 504});
  CHECK(inst[3].fewshot_indices == std::vector<int64_t>{5670, 7933, 7594});
  // The same for piqa, hellaswag, winogrande, wic and HANS: [r.sample(range(16113), 6)[:5] ...]
  auto piqa_pool = synthetic(16113, "t");
  for (const char* t : {"piqa", "hellaswag", "winogrande", "wic", "hans"}) {
    INFO(t);
    auto p = build_instances(task_info(t), eval_docs, &piqa_pool, false, 5, v4, 3);
    CHECK(p[0].fewshot_indices == std::vector<int64_t>{15834, 12749, 7220, 1914, 122});
    CHECK(p[1].fewshot_indices == std::vector<int64_t>{14925, 15442, 15388, 13221, 9539});
    CHECK(p[2].fewshot_indices == std::vector<int64_t>{11002, 11355, 1375, 1612, 12558});
  }
  // anli_r2 (test_split test_r2, fewshot from train_r2) draws k: sample(range(9427), 3) each.
  auto anli = build_instances(task_info("anli_r2"), eval_docs, &pool, false, 3, v4, -1);
  CHECK(anli[1].fewshot_indices == std::vector<int64_t>{1485, 572, 1375});
  CHECK(anli[3].fewshot_indices == std::vector<int64_t>{285, 504, 259});
  // A train row equal to the evaluated row is dropped in v0.4 (dict equality), not in v0.3:
  // sample(range(9427), 4) = [7220, 1914, 122, 1485] without 7220.
  auto same = synthetic(9427, "t");
  std::vector<Doc> one{same[7220]};
  auto dropped = build_instances(task_info("boolq"), one, &same, false, 3, v4, -1);
  CHECK(dropped[0].fewshot_indices == std::vector<int64_t>{1914, 122, 1485});
}

TEST_CASE("eval few-shot: v0.4 lambada examples join text and target with a double space", "[eval]") {
  std::vector<Doc> docs(3);
  for (int i = 0; i < 3; ++i) {
    docs[i].index = i;
    docs[i].row = {{"text", "w" + std::to_string(i)}};
    docs[i].text = "ctx" + std::to_string(i);
    docs[i].choices = {" w" + std::to_string(i)};
    docs[i].target = " w" + std::to_string(i);
  }
  TaskOptions v4;
  v4.version = HarnessVersion::v0_4;
  auto in4 = build_instances(task_info("lambada_openai"), docs, &docs, true, 1, v4, -1);
  auto in3 = build_instances(task_info("lambada_openai"), docs, &docs, true, 1, {}, -1);
  for (const auto& in : in4)
    if (!in.fewshot_indices.empty()) {
      const int64_t j = in.fewshot_indices[0];
      CHECK(in.contexts[0] == "ctx" + std::to_string(j) + "  w" + std::to_string(j) + "\n\n" + in.doc->text);
    }
  for (const auto& in : in3) {
    REQUIRE(in.fewshot_indices.size() == 1);
    const int64_t j = in.fewshot_indices[0];
    CHECK(in.contexts[0] == "ctx" + std::to_string(j) + " w" + std::to_string(j) + "\n\n" + in.doc->text);
  }
}

TEST_CASE("eval few-shot: a pool that is the eval split excludes the current doc", "[eval]") {
  auto docs = synthetic(3, "e");
  // k = 2 of 3 docs: v0.3 draws 3 (k+1) and drops the current doc -> always 2 others
  auto inst = build_instances(task_info("lambada_openai"), docs, &docs, true, 2, {}, -1);
  for (auto& in : inst) {
    CHECK(in.fewshot_indices.size() == 2);
    for (int64_t j : in.fewshot_indices) CHECK(j != in.doc->index);
  }
  CHECK_THROWS_WITH(build_instances(task_info("lambada_openai"), docs, &docs, true, 3, {}, -1),
                    Contains("pool has only 3"));
}

TEST_CASE("eval requests: harness tokenization and left truncation", "[eval]") {
  auto tok = mtnlg::test::gpt2_tokenizer();
  if (!tok) {
    WARN("skipped: GPT-2 vocabulary unavailable");
    return;
  }
  auto p3 = tokenize_pair(*tok, "Question: dresser\nAnswer:", " replace drawer", HarnessVersion::v0_3);
  auto p4 = tokenize_pair(*tok, "Question: dresser\nAnswer:", " replace drawer", HarnessVersion::v0_4);
  CHECK(p3.context == p4.context);
  CHECK(p3.continuation == p4.continuation);
  CHECK(p3.continuation == tok->encode(" replace drawer"));
  // empty context -> [EOT]
  auto e = tokenize_pair(*tok, "", " Hello", HarnessVersion::v0_3);
  CHECK(e.context == std::vector<int32_t>{50256});
  // v0.4 moves the context's trailing space into the continuation
  auto m4 = tokenize_pair(*tok, "Answer: ", "yes", HarnessVersion::v0_4);
  CHECK(m4.continuation == tok->encode(" yes"));
  auto m3 = tokenize_pair(*tok, "Answer: ", "yes", HarnessVersion::v0_3);
  CHECK(m3.continuation == tok->encode("yes"));

  TokenizedPair tp{{1, 2, 3, 4, 5, 6}, {7, 8}};
  Window w = make_window(tp, 4, "x");
  CHECK(w.input == std::vector<int32_t>{4, 5, 6, 7});  // last 5 tokens minus the final one
  CHECK(w.targets == std::vector<int32_t>{7, 8});
  CHECK(w.truncated == 3);
  Window full = make_window(tp, 100, "x");
  CHECK(full.input == std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7});
  CHECK(full.truncated == 0);
  CHECK_THROWS_WITH(make_window({{1}, {}}, 4, "f.jsonl:3"), Contains("f.jsonl:3: the continuation has no tokens"));
  CHECK_THROWS_WITH(make_window({{1}, {1, 2, 3, 4, 5}}, 4, "f"), Contains("more than the 4-token window"));
}

TEST_CASE("eval metrics: stderr formulas, argmax ties, acc_norm by code points", "[eval]") {
  std::vector<double> x = {1, 0, 1, 1};
  CHECK(mean(x) == Approx(0.75));
  // sqrt(p(1-p)/(n-1)) for 0/1 data
  CHECK(mean_stderr(x) == Approx(std::sqrt(0.75 * 0.25 / 3.0)));
  CHECK(std::isnan(mean_stderr({1.0})));
  CHECK(argmax({-1.0, -0.5, -0.5}) == 1);
  CHECK(argmax({-2.0, -2.0}) == 0);
  auto n = length_normalized({-4.0, -6.0}, {"ab", "caf\xc3\xa9 x"});  // 2 and 6 code points
  CHECK(n[0] == -2.0);
  CHECK(n[1] == -1.0);
  CHECK(perplexity({-1.0, -3.0}) == Approx(std::exp(2.0)));
  CHECK(utf8_slice("Le caf\xc3\xa9 au", 3, 7) == "caf\xc3\xa9");
}

TEST_CASE("eval metrics: perplexity bootstrap equals the harness's (CPython)", "[oracle]") {
  std::vector<double> lls = {-1.5, -0.25, -3.0, -2.125, -0.5, -4.75, -1.0};
  const double ours = bootstrap_perplexity_stderr(lls, 3000);
  const std::string py =
      "import random, math\n"
      "xs=[-1.5,-0.25,-3.0,-2.125,-0.5,-4.75,-1.0]\n"
      "res=[]\n"
      "for i in range(3):\n"
      "  rnd=random.Random(); rnd.seed(i)\n"
      "  for _ in range(1000):\n"
      "    s=rnd.choices(xs,k=len(xs)); res.append(math.exp(-sum(s)/len(s)))\n"
      "mu=sum(res)/len(res)\n"
      "print(repr(math.sqrt(sum((x-mu)**2 for x in res)/(len(res)-1))))\n";
  mtnlg::test::TempDir d("boot");
  mtnlg::test::write_file(d / "b.py", py);
  auto r = mtnlg::test::run_command(mtnlg::test::python() + " " + (d / "b.py").string());
  REQUIRE(r.exit_code == 0);
  CHECK(ours == Approx(std::stod(r.out)).epsilon(1e-12));
}
