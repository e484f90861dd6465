// The tokenizer eval and generate use, whichever files it comes from: GPT-2's
// vocab.json + merges.txt (data/tokenizer.hpp) or a Hugging Face tokenizer.json
// (data/hf_tokenizer.hpp). Thread-safe like both.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/hf_tokenizer.hpp"
#include "data/tokenizer.hpp"

namespace mtnlg::data {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  virtual int64_t vocab_size() const = 0;
  // The end-of-document token (GPT-2: <|endoftext|>).
  virtual int32_t eod() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of the ids (GPT-2: raw bytes; tokenizer.json: the file's decoder).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
};

// GPT-2's files; special tokens in the text are text (Megatron's and the harness's way).
class Gpt2TextTokenizer final : public TextTokenizer {
 public:
  explicit Gpt2TextTokenizer(std::shared_ptr<const Tokenizer> t) : t_(std::move(t)) {}
  int64_t vocab_size() const override { return t_->vocab_size(); }
  int32_t eod() const override { return t_->eod(); }
  std::vector<int32_t> encode(std::string_view text) const override { return t_->encode(text); }
  std::string decode(std::span<const int32_t> ids) const override { return t_->decode(ids); }

 private:
  std::shared_ptr<const Tokenizer> t_;
};

// A tokenizer.json. `add_special_tokens`: apply the post-processor's template (BOS) to
// each encode (generate's prompt: yes, as transformers does; the harness's contexts and
// continuations: no, as lm-evaluation-harness encodes them).
class HfTextTokenizer final : public TextTokenizer {
 public:
  HfTextTokenizer(std::shared_ptr<const HfTokenizer> t, int32_t eod, bool add_special_tokens)
      : t_(std::move(t)), eod_(eod), special_(add_special_tokens) {}
  int64_t vocab_size() const override { return t_->vocab_size(); }
  int32_t eod() const override { return eod_; }
  std::vector<int32_t> encode(std::string_view text) const override { return t_->encode(text, special_); }
  std::string decode(std::span<const int32_t> ids) const override { return t_->decode(ids); }

 private:
  std::shared_ptr<const HfTokenizer> t_;
  int32_t eod_;
  bool special_;
};

// The end-of-document id of a tokenizer.json: `eod_token` when given, else eos_token of
// the tokenizer_config.json beside it; InputError naming the file when neither gives a
// token of it.
int32_t hf_eod_id(const HfTokenizer& t, const std::string& eod_token);

}  // namespace mtnlg::data
