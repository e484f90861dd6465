// A tokenizer read from a Hugging Face tokenizer.json, giving the ids that Hugging Face's
// tokenizers library gives (docs/specs/hf-tokenizer.md lists the components supported and
// how each is run). encode() is Tokenizer::encode of that library with
// add_special_tokens as given:
//   1. the text's bytes as UTF-8, each maximal ill-formed subsequence replaced by U+FFFD
//      (what a UTF-8 decoder following the Unicode/WHATWG practice does before a string
//      reaches the library: its input is always valid Unicode)
//   2. added tokens not marked `normalized` are cut out of the raw text
//   3. each remaining piece is normalized, and `normalized` added tokens cut out of it
//   4. the pre-tokenizers split each piece further
//   5. the BPE model turns each piece into ids (a per-thread cache remembers pieces)
//   6. with add_special_tokens, the post-processor's template adds BOS/EOS ids
// A component or option the file uses that is not supported is an InputError naming it
// and its JSON path when the file is loaded, never a silent difference.
// The object is immutable after loading and safe to share between threads.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mtnlg::data {

class HfTokenizer {
 public:
  // Throws InputError naming the file (and JSON path) when it is missing, malformed or
  // uses an unsupported component.
  static std::shared_ptr<const HfTokenizer> from_file(const std::string& path);
  ~HfTokenizer();

  // Ids 0 .. vocab_size()-1: the model's vocabulary and the added tokens (Megatron's
  // HuggingFaceTokenizer counts the same: len(tokenizer)).
  int64_t vocab_size() const;

  void encode(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens = true) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // The library's decode: tokens through the file's decoder (none: joined by spaces).
  // Throws InputError on an id that is not in the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // An id by its token as written in the file (added token content or vocab key).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token of an id as written in the file; InputError for an unknown id.
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  const std::string& path() const;

  struct Impl;

 private:
  HfTokenizer();
  std::unique_ptr<Impl> impl_;
};

// `s` with each maximal ill-formed UTF-8 subsequence replaced by U+FFFD (EF BF BD).
std::string utf8_lossy(std::string_view s);
// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, at most U+10FFFF).
bool utf8_valid(std::string_view s);

// The end-of-document token of a tokenizer.json: `eos_token` of the tokenizer_config.json
// beside it (how transformers, and so Megatron's HuggingFaceTokenizer, find it); nullopt
// when there is no such file or field. InputError when the file is malformed.
std::optional<std::string> hf_config_eos_token(const std::string& tokenizer_json);

}  // namespace mtnlg::data
