// tokenizer.json (data/hf_tokenizer.hpp; the format subset in docs/specs/hf-tokenizer.md).
#include "data/hf_tokenizer.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "core/error.hpp"
#include "data/hf_regex.hpp"

namespace mtnlg::data {

using json = nlohmann::json;

// ---------------------------------------------------------------- UTF-8

namespace {

// Length of the well-formed UTF-8 character at s[i] (Unicode Table 3-7), or 0 when the
// bytes there are ill-formed; `bad` then gets the length of the maximal subpart to
// replace by one U+FFFD (at least 1).
inline size_t utf8_char_len(std::string_view s, size_t i, size_t& bad) {
  const auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b = u(i);
  const size_t left = s.size() - i;
  bad = 1;
  if (b < 0x80) return 1;
  unsigned char lo = 0x80, hi = 0xBF;
  size_t n = 0;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (k >= left) return 0;  // truncated: the subpart so far is one replacement
    const unsigned char c = u(i + k);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
    bad = k + 1;
  }
  return n;
}

inline int32_t decode_cp(const char* p, size_t len) {
  utf8proc_int32_t cp = 0;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(p), static_cast<utf8proc_ssize_t>(len), &cp);
  return cp;
}

inline size_t char_len_at(std::string_view s, size_t i) {
  const unsigned char b = static_cast<unsigned char>(s[i]);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

// Unicode White_Space (Rust's char::is_whitespace, the regex crate's \s).
inline bool is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// The regex crate's Unicode \w: Alphabetic, Mark, Decimal_Number, Connector_Punctuation,
// Join_Control. Alphabetic beyond L and Nl is Other_Alphabetic: marks (covered by M) and
// the circled/squared letters below.
inline bool is_word_char(int32_t c) {
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC: return true;
    default: break;
  }
  return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
         (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
}

// Rust's char::is_numeric: Nd, Nl, No.
inline bool is_numeric_char(int32_t c) {
  const auto k = utf8proc_category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

// GPT-2's byte <-> printable character table (the ByteLevel alphabet): printable Latin-1
// bytes stand for themselves, the other 68 bytes for U+0100.. in byte order.
struct ByteAlphabet {
  std::array<int32_t, 256> byte_to_cp{};
  std::array<int16_t, 324> cp_to_byte{};
  ByteAlphabet() {
    cp_to_byte.fill(-1);
    int32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[static_cast<size_t>(b)] = printable ? b : 256 + n++;
      cp_to_byte[static_cast<size_t>(byte_to_cp[static_cast<size_t>(b)])] = static_cast<int16_t>(b);
    }
  }
  // The raw bytes of a token written in the alphabet; false when a char is not in it.
  bool to_bytes(std::string_view tok, std::string& out) const {
    out.clear();
    for (size_t i = 0; i < tok.size();) {
      const size_t n = char_len_at(tok, i);
      const int32_t cp = decode_cp(tok.data() + i, n);
      if (cp < 0 || cp >= static_cast<int32_t>(cp_to_byte.size()) || cp_to_byte[static_cast<size_t>(cp)] < 0)
        return false;
      out.push_back(static_cast<char>(cp_to_byte[static_cast<size_t>(cp)]));
      i += n;
    }
    return true;
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using StrMap = std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>>;

std::atomic<uint64_t> g_serial{1};

}  // namespace

bool utf8_valid(std::string_view s) {
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    // ASCII runs, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const size_t n = utf8_char_len(s, i, bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0, bad = 0;
  while (i < s.size()) {
    const size_t n = utf8_char_len(s, i, bad);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

// ---------------------------------------------------------------- the loaded file

namespace {

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct AddedToken {
  int32_t id = 0;
  std::string content;
  std::string match;  // what is searched for: content, normalized when `normalized`
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Leftmost-longest search over a set of strings (the added tokens of one kind).
struct AddedMatcher {
  std::array<std::vector<const AddedToken*>, 256> by_first;  // longest first
  bool empty = true;
  void build(const std::vector<const AddedToken*>& toks) {
    for (const AddedToken* t : toks) {
      if (t->match.empty()) continue;
      by_first[static_cast<unsigned char>(t->match[0])].push_back(t);
      empty = false;
    }
    for (auto& v : by_first)
      std::stable_sort(v.begin(), v.end(),
                       [](const AddedToken* a, const AddedToken* b) { return a->match.size() > b->match.size(); });
  }
  const AddedToken* find(std::string_view s, size_t from, size_t& at) const {
    for (size_t i = from; i < s.size(); ++i) {
      const auto& c = by_first[static_cast<unsigned char>(s[i])];
      for (const AddedToken* t : c)
        if (s.compare(i, t->match.size(), t->match) == 0) {
          at = i;
          return t;
        }
    }
    return nullptr;
  }
};

struct NormStep {
  enum Kind { nfc, nfd, nfkc, nfkd, replace, prepend } kind = nfc;
  std::unique_ptr<HfRegex> re;
  std::string content;
};

struct PreStep {
  enum Kind { split, byte_level, digits, metaspace } kind = split;
  std::unique_ptr<HfRegex> re;
  Behavior behavior = Behavior::isolated;
  bool invert = false;
  bool add_prefix_space = false, use_regex = true;
  bool individual_digits = false;
  std::string replacement;
  int prepend_scheme = 0;  // 0 always, 1 first, 2 never
  bool split_on_replacement = true;
};

struct DecStep {
  enum Kind { byte_level, replace, byte_fallback, fuse, strip, metaspace } kind = byte_level;
  std::unique_ptr<HfRegex> re;
  std::string content;
  int32_t strip_char = 0;
  size_t start = 0, stop = 0;
  std::string replacement;
  bool prepend = true;
};

struct TemplateItem {
  bool sequence = false;  // $A
  std::vector<int32_t> ids;
};

struct Piece {
  std::string_view s;
  bool first = false;  // starts at offset 0 of the original text
};

// A piece of the text after the added-token split: text, or one added token.
struct Seg {
  std::string_view s;
  const AddedToken* tok = nullptr;
  bool first = false;
};

struct MergeVal {
  int32_t rank, id;
};

// (left id, right id) -> merge, open addressing with linear probing; last insert wins.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, MergeVal{0, 0});
    mask_ = cap - 1;
  }
  void put(int32_t a, int32_t b, MergeVal v) {
    const uint64_t k = key(a, b);
    size_t i = slot(k);
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
    keys_[i] = k;
    vals_[i] = v;
  }
  const MergeVal* get(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<MergeVal> vals_;
  size_t mask_ = 0;
};

// One symbol of a word being merged by BPE: its id and its live neighbours (a list).
struct BpeSym {
  int32_t id;
  int32_t prev, next;
  bool alive;
};

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  uint64_t serial = 0;
  // Model (BPE).
  bool byte_level = false;  // the pre-tokenizer ends with ByteLevel: vocab keys are raw bytes
  StrMap vocab;             // raw bytes (byte-level) or text -> id
  StrMap file_vocab;        // as written in the file (merges, token_to_id)
  MergeTable merges;
  std::array<int32_t, 256> byte_id{};  // byte-level: the id of each single byte (-1: none)
  bool byte_fallback = false, ignore_merges = false, fuse_unk = false;
  int32_t unk = -1;
  std::array<int32_t, 256> fallback_id{};  // <0xXX>
  bool fallback_complete = false;
  // Tokens.
  std::vector<std::string> id_token;  // as written in the file
  std::vector<uint8_t> id_special;
  std::vector<uint8_t> id_known;  // ids neither in the vocab nor added are holes
  std::deque<AddedToken> added;
  std::unordered_map<int32_t, const AddedToken*> added_by_id;
  AddedMatcher raw_matcher, norm_matcher;
  // Pipeline.
  std::vector<NormStep> norm;
  std::vector<PreStep> pre;
  std::vector<TemplateItem> single;  // empty: no template
  bool has_decoder = false;
  std::vector<DecStep> dec;

  std::string normalize(std::string_view s) const;
  void split_added(const AddedMatcher& m, const Seg& in, std::vector<Seg>& out) const;
  void pretokenize(const Seg& seg, std::deque<std::string>& arena, std::vector<Piece>& out) const;
  void model(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_symbols(std::string_view w, std::vector<BpeSym>& sy) const;
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const;
};

namespace {

// ---------------------------------------------------------------- loading helpers

struct Loader {
  const std::string& file;
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw_input("{}: {}: {}", file, where, what);
  }
  [[noreturn]] void unsupported(const std::string& where, const std::string& component,
                                const std::string& supported) const {
    throw_input("{}: {}: unsupported {} (supported: {})", file, where, component, supported);
  }
  const json& member(const json& j, const std::string& where, const char* key) const {
    if (!j.is_object() || !j.contains(key)) fail(where, fmt::format("missing field '{}'", key));
    return j.at(key);
  }
  std::string str(const json& j, const std::string& where, const char* key) const {
    const json& v = member(j, where, key);
    if (!v.is_string()) fail(where + "." + key, "expected a string");
    return v.get<std::string>();
  }
  bool flag(const json& j, const std::string& where, const char* key, bool dflt) const {
    if (!j.contains(key) || j.at(key).is_null()) return dflt;
    if (!j.at(key).is_boolean()) fail(where + "." + key, "expected true or false");
    return j.at(key).get<bool>();
  }
  std::string type(const json& j, const std::string& where) const {
    if (!j.is_object()) fail(where, "expected an object");
    return str(j, where, "type");
  }
  // The pattern of Split/Replace: {"String": s} or {"Regex": r}.
  std::unique_ptr<HfRegex> pattern(const json& j, const std::string& where) const {
    const json& p = member(j, where, "pattern");
    if (p.is_object() && p.contains("String") && p.at("String").is_string()) {
      const std::string s = p.at("String").get<std::string>();
      if (s.empty()) fail(where + ".pattern.String", "an empty pattern is not supported");
      return HfRegex::literal(s, file + ": " + where + ".pattern.String");
    }
    if (p.is_object() && p.contains("Regex") && p.at("Regex").is_string())
      return std::make_unique<HfRegex>(p.at("Regex").get<std::string>(), file + ": " + where + ".pattern.Regex");
    fail(where + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  int32_t single_char(const json& j, const std::string& where, const char* key) const {
    const std::string s = str(j, where, key);
    size_t bad = 0;
    if (s.empty() || utf8_char_len(s, 0, bad) != s.size()) fail(where + "." + key, "expected one character");
    return decode_cp(s.data(), s.size());
  }
};

Behavior parse_behavior(const Loader& L, const json& j, const std::string& where) {
  const std::string b = L.str(j, where, "behavior");
  if (b == "Removed") return Behavior::removed;
  if (b == "Isolated") return Behavior::isolated;
  if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (b == "MergedWithNext") return Behavior::merged_with_next;
  if (b == "Contiguous") return Behavior::contiguous;
  L.unsupported(where + ".behavior", "split behavior '" + b + "'",
                "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

void load_normalizer(const Loader& L, const json& j, const std::string& where, std::vector<NormStep>& out) {
  if (j.is_null()) return;
  const std::string t = L.type(j, where);
  NormStep s;
  if (t == "Sequence") {
    const json& list = L.member(j, where, "normalizers");
    if (!list.is_array()) L.fail(where + ".normalizers", "expected a list");
    for (size_t i = 0; i < list.size(); ++i)
      load_normalizer(L, list[i], fmt::format("{}.normalizers[{}]", where, i), out);
    return;
  } else if (t == "NFC") {
    s.kind = NormStep::nfc;
  } else if (t == "NFD") {
    s.kind = NormStep::nfd;
  } else if (t == "NFKC") {
    s.kind = NormStep::nfkc;
  } else if (t == "NFKD") {
    s.kind = NormStep::nfkd;
  } else if (t == "Replace") {
    s.kind = NormStep::replace;
    s.re = L.pattern(j, where);
    s.content = L.str(j, where, "content");
  } else if (t == "Prepend") {
    s.kind = NormStep::prepend;
    s.content = L.str(j, where, "prepend");
  } else {
    L.unsupported(where + ".type", "normalizer '" + t + "'", "NFC, NFD, NFKC, NFKD, Replace, Prepend, Sequence, null");
  }
  out.push_back(std::move(s));
}

void load_pre(const Loader& L, const json& j, const std::string& where, std::vector<PreStep>& out) {
  if (j.is_null()) return;
  const std::string t = L.type(j, where);
  PreStep s;
  if (t == "Sequence") {
    const json& list = L.member(j, where, "pretokenizers");
    if (!list.is_array()) L.fail(where + ".pretokenizers", "expected a list");
    for (size_t i = 0; i < list.size(); ++i) load_pre(L, list[i], fmt::format("{}.pretokenizers[{}]", where, i), out);
    return;
  } else if (t == "Split") {
    s.kind = PreStep::split;
    s.re = L.pattern(j, where);
    s.behavior = parse_behavior(L, j, where);
    s.invert = L.flag(j, where, "invert", false);
  } else if (t == "ByteLevel") {
    s.kind = PreStep::byte_level;
    s.add_prefix_space = L.flag(j, where, "add_prefix_space", true);
    s.use_regex = L.flag(j, where, "use_regex", true);
    if (s.use_regex)
      s.re = std::make_unique<HfRegex>(
          "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", "ByteLevel's pattern");
  } else if (t == "Digits") {
    s.kind = PreStep::digits;
    s.individual_digits = L.flag(j, where, "individual_digits", false);
  } else if (t == "Metaspace") {
    s.kind = PreStep::metaspace;
    L.single_char(j, where, "replacement");
    s.replacement = L.str(j, where, "replacement");
    if (j.contains("prepend_scheme") && !j.at("prepend_scheme").is_null()) {
      const std::string ps = L.str(j, where, "prepend_scheme");
      if (ps == "always")
        s.prepend_scheme = 0;
      else if (ps == "first")
        s.prepend_scheme = 1;
      else if (ps == "never")
        s.prepend_scheme = 2;
      else
        L.unsupported(where + ".prepend_scheme", "prepend_scheme '" + ps + "'", "always, first, never");
    } else {
      s.prepend_scheme = L.flag(j, where, "add_prefix_space", true) ? 0 : 2;
    }
    s.split_on_replacement = L.flag(j, where, "split", true);
  } else {
    L.unsupported(where + ".type", "pre-tokenizer '" + t + "'", "Split, ByteLevel, Digits, Metaspace, Sequence, null");
  }
  out.push_back(std::move(s));
}

void load_decoder(const Loader& L, const json& j, const std::string& where, std::vector<DecStep>& out) {
  const std::string t = L.type(j, where);
  DecStep s;
  if (t == "Sequence") {
    const json& list = L.member(j, where, "decoders");
    if (!list.is_array()) L.fail(where + ".decoders", "expected a list");
    for (size_t i = 0; i < list.size(); ++i) load_decoder(L, list[i], fmt::format("{}.decoders[{}]", where, i), out);
    return;
  } else if (t == "ByteLevel") {
    s.kind = DecStep::byte_level;
  } else if (t == "Replace") {
    s.kind = DecStep::replace;
    s.re = L.pattern(j, where);
    s.content = L.str(j, where, "content");
  } else if (t == "ByteFallback") {
    s.kind = DecStep::byte_fallback;
  } else if (t == "Fuse") {
    s.kind = DecStep::fuse;
  } else if (t == "Strip") {
    s.kind = DecStep::strip;
    s.strip_char = L.single_char(j, where, "content");
    const json& a = L.member(j, where, "start");
    const json& b = L.member(j, where, "stop");
    if (!a.is_number_unsigned() || !b.is_number_unsigned()) L.fail(where, "start and stop must be counts");
    s.start = a.get<size_t>();
    s.stop = b.get<size_t>();
  } else if (t == "Metaspace") {
    s.kind = DecStep::metaspace;
    L.single_char(j, where, "replacement");
    s.replacement = L.str(j, where, "replacement");
    if (j.contains("prepend_scheme") && !j.at("prepend_scheme").is_null())
      s.prepend = L.str(j, where, "prepend_scheme") != "never";
    else
      s.prepend = L.flag(j, where, "add_prefix_space", true);
  } else {
    L.unsupported(where + ".type", "decoder '" + t + "'",
                  "ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence, null");
  }
  out.push_back(std::move(s));
}

}  // namespace

// ---------------------------------------------------------------- HfTokenizer

HfTokenizer::HfTokenizer() : impl_(std::make_unique<Impl>()) {}
HfTokenizer::~HfTokenizer() = default;

namespace {

using Impl = HfTokenizer::Impl;

json read_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input("{}: cannot open the tokenizer file", path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw_input("{}: not valid JSON ({})", path, e.what());
  }
}

// The model's options (BPE only, without dropout or subword affixes) and its vocabulary:
// as written, and as the raw bytes a byte-level pre-tokenizer produces. Returns the
// largest id.
int32_t load_bpe_vocab(const Loader& L, const json& model, Impl& m) {
  const std::string mtype = model.is_object() && model.contains("type") ? L.str(model, "model", "type") : "BPE";
  if (mtype != "BPE") L.unsupported("model.type", "model '" + mtype + "'", "BPE");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() > 0)
    L.unsupported("model.dropout", "BPE dropout (random merges)", "null");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && !model[k].is_null() && !(model[k].is_string() && model[k].get<std::string>().empty()))
      L.unsupported(std::string("model.") + k, std::string(k), "null or \"\"");
  m.byte_fallback = L.flag(model, "model", "byte_fallback", false);
  m.ignore_merges = L.flag(model, "model", "ignore_merges", false);
  m.fuse_unk = L.flag(model, "model", "fuse_unk", false);
  const json& vocab = L.member(model, "model", "vocab");
  if (!vocab.is_object()) L.fail("model.vocab", "expected an object of token: id");
  int32_t max_id = -1;
  std::string raw;
  const ByteAlphabet& abc = alphabet();
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      L.fail("model.vocab[\"" + it.key() + "\"]", "expected a non-negative id");
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    max_id = std::max(max_id, id);
    m.file_vocab[it.key()] = id;
    if (!m.byte_level) {
      m.vocab[it.key()] = id;
    } else if (abc.to_bytes(it.key(), raw)) {
      m.vocab[raw] = id;
    }  // else: a token outside the alphabet, never produced by byte-level pieces
  }
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    const std::string u = L.str(model, "model", "unk_token");
    auto f = m.file_vocab.find(u);
    if (f == m.file_vocab.end()) L.fail("model.unk_token", "'" + u + "' is not in model.vocab");
    m.unk = f->second;
  }
  m.fallback_complete = true;
  for (int b = 0; b < 256; ++b) {
    auto f = m.file_vocab.find(fmt::format("<0x{:02X}>", b));
    m.fallback_id[static_cast<size_t>(b)] = f == m.file_vocab.end() ? -1 : f->second;
  }
  return max_id;
}

// The model's merges (by their rank) and the ids of single bytes.
void load_bpe_merges(const Loader& L, const json& model, Impl& m) {
  const json& merges = L.member(model, "model", "merges");
  if (!merges.is_array()) L.fail("model.merges", "expected a list");
  m.merges.reserve(merges.size());
  for (int b = 0; b < 256; ++b) {
    auto f = m.vocab.find(std::string(1, static_cast<char>(b)));
    m.byte_id[static_cast<size_t>(b)] = f == m.vocab.end() ? -1 : f->second;
  }
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    const std::string where = fmt::format("model.merges[{}]", i);
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        L.fail(where, "expected two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      L.fail(where, "expected \"a b\" or [\"a\", \"b\"]");
    }
    auto fa = m.file_vocab.find(a), fb = m.file_vocab.find(b), fab = m.file_vocab.find(a + b);
    if (fa == m.file_vocab.end() || fb == m.file_vocab.end() || fab == m.file_vocab.end())
      L.fail(where, fmt::format("'{}', '{}' or '{}{}' is not in model.vocab", a, b, a, b));
    m.merges.put(fa->second, fb->second, MergeVal{static_cast<int32_t>(i), fab->second});
  }
}

// Added tokens. Their ids are the library's, not the file's "id" (which it only checks
// with a warning): a token already added keeps its id (the later entry's flags win), a
// token of the model's vocabulary gets that id, any other the next id after the model's
// vocabulary size and the added ids so far. Raises `max_id` to the largest.
void load_added_tokens(const Loader& L, const json& j, Impl& m, int32_t& max_id) {
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    const json& list = j["added_tokens"];
    if (!list.is_array()) L.fail("added_tokens", "expected a list");
    std::unordered_map<std::string, AddedToken*> by_content;
    const auto model_size = static_cast<int64_t>(m.file_vocab.size());
    int64_t max_added = -1;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string where = fmt::format("added_tokens[{}]", i);
      const json& a = list[i];
      AddedToken t;
      const json& id = L.member(a, where, "id");
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        L.fail(where + ".id", "expected a non-negative id");
      t.content = L.str(a, where, "content");
      t.special = L.flag(a, where, "special", false);
      t.single_word = L.flag(a, where, "single_word", false);
      t.lstrip = L.flag(a, where, "lstrip", false);
      t.rstrip = L.flag(a, where, "rstrip", false);
      t.normalized = L.flag(a, where, "normalized", !t.special);
      if (t.content.empty()) continue;  // the library ignores empty tokens
      if (!utf8_valid(t.content)) L.fail(where + ".content", "not valid UTF-8");
      if (auto f = by_content.find(t.content); f != by_content.end()) {
        t.id = f->second->id;
        *f->second = std::move(t);
        continue;
      }
      if (auto f = m.file_vocab.find(t.content); f != m.file_vocab.end()) {
        t.id = f->second;
      } else {
        const int64_t next =
            max_added < 0 ? model_size : (max_added >= model_size || model_size == 0 ? max_added + 1 : model_size);
        if (next > INT32_MAX) L.fail(where, "too many ids");
        t.id = static_cast<int32_t>(next);
      }
      max_added = std::max<int64_t>(max_added, t.id);
      max_id = std::max(max_id, t.id);
      m.added.push_back(std::move(t));
      by_content[m.added.back().content] = &m.added.back();
    }
  }
}

// Every id's token (a hole where neither the vocabulary nor an added token has it) and
// the matchers of the added tokens, raw and normalized.
void index_tokens(Impl& m, int32_t max_id) {
  m.id_token.assign(static_cast<size_t>(max_id + 1), std::string());
  m.id_special.assign(static_cast<size_t>(max_id + 1), 0);
  std::vector<uint8_t>& known = m.id_known;
  known.assign(static_cast<size_t>(max_id + 1), 0);
  for (auto it = m.file_vocab.begin(); it != m.file_vocab.end(); ++it) {
    m.id_token[static_cast<size_t>(it->second)] = it->first;
    known[static_cast<size_t>(it->second)] = 1;
  }
  std::vector<const AddedToken*> raw_toks, norm_toks;
  for (AddedToken& t : m.added) {
    t.match = t.normalized ? m.normalize(t.content) : t.content;
    m.id_token[static_cast<size_t>(t.id)] = t.content;
    m.id_special[static_cast<size_t>(t.id)] = t.special ? 1 : 0;
    known[static_cast<size_t>(t.id)] = 1;
    m.added_by_id[t.id] = &t;
    (t.normalized ? norm_toks : raw_toks).push_back(&t);
  }
  m.raw_matcher.build(raw_toks);
  m.norm_matcher.build(norm_toks);
}

// The post-processor: a template of special tokens around the one sequence, at most.
void load_post_processor(const Loader& L, const json& p, const std::string& where, Impl& m, int32_t max_id) {
  if (p.is_null()) return;
  const std::string t = L.type(p, where);
  if (t == "Sequence") {
    const json& list = L.member(p, where, "processors");
    if (!list.is_array()) L.fail(where + ".processors", "expected a list");
    for (size_t i = 0; i < list.size(); ++i)
      load_post_processor(L, list[i], fmt::format("{}.processors[{}]", where, i), m, max_id);
  } else if (t == "ByteLevel") {
    // Only offsets change: no ids.
  } else if (t == "TemplateProcessing") {
    if (!m.single.empty()) L.unsupported(where, "a second TemplateProcessing", "one");
    const json& single = L.member(p, where, "single");
    const json& specials = L.member(p, where, "special_tokens");
    if (!single.is_array()) L.fail(where + ".single", "expected a list");
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string w = fmt::format("{}.single[{}]", where, i);
      const json& item = single[i];
      TemplateItem ti;
      if (item.is_object() && item.contains("Sequence")) {
        if (L.str(item["Sequence"], w + ".Sequence", "id") != "A")
          L.unsupported(w + ".Sequence.id", "sequence other than A", "A");
        ti.sequence = true;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name = L.str(item["SpecialToken"], w + ".SpecialToken", "id");
        if (!specials.is_object() || !specials.contains(name))
          L.fail(w, "special token '" + name + "' is not in special_tokens");
        const json& ids = L.member(specials[name], where + ".special_tokens." + name, "ids");
        if (!ids.is_array()) L.fail(where + ".special_tokens." + name + ".ids", "expected a list of ids");
        for (const auto& x : ids) {
          if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > max_id)
            L.fail(where + ".special_tokens." + name + ".ids", "id outside the vocabulary");
          ti.ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
        }
      } else {
        L.fail(w, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
      m.single.push_back(std::move(ti));
    }
  } else {
    L.unsupported(where + ".type", "post-processor '" + t + "'", "TemplateProcessing, ByteLevel, Sequence, null");
  }
}

}  // namespace

std::shared_ptr<const HfTokenizer> HfTokenizer::from_file(const std::string& path) {
  const json j = read_tokenizer_json(path);
  Loader L{path};
  if (!j.is_object()) L.fail("(top level)", "expected a JSON object");
  auto tok = std::shared_ptr<HfTokenizer>(new HfTokenizer());
  Impl& m = *tok->impl_;
  m.path = path;
  m.serial = g_serial.fetch_add(1);

  if (j.contains("truncation") && !j["truncation"].is_null())
    L.unsupported("truncation", "truncation (ids would be cut to a length)", "null");
  if (j.contains("padding") && !j["padding"].is_null()) L.unsupported("padding", "padding", "null");

  // Pipeline first: the model's vocab depends on whether the pre-tokenizer is byte-level.
  load_normalizer(L, j.value("normalizer", json()), "normalizer", m.norm);
  load_pre(L, j.value("pre_tokenizer", json()), "pre_tokenizer", m.pre);
  for (size_t i = 0; i < m.pre.size(); ++i)
    if (m.pre[i].kind == PreStep::byte_level) {
      if (i + 1 != m.pre.size())
        L.unsupported("pre_tokenizer", "pre-tokenizer after ByteLevel (it must come last)",
                      "ByteLevel as the last step");
      m.byte_level = true;
    }

  // Model.
  const json& model = L.member(j, "(top level)", "model");
  int32_t max_id = load_bpe_vocab(L, model, m);
  load_bpe_merges(L, model, m);
  load_added_tokens(L, j, m, max_id);
  index_tokens(m, max_id);
  load_post_processor(L, j.value("post_processor", json()), "post_processor", m, max_id);

  // Decoder.
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    m.has_decoder = true;
    load_decoder(L, j["decoder"], "decoder", m.dec);
  }
  return tok;
}

int64_t HfTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_token.size()); }
const std::string& HfTokenizer::path() const { return impl_->path; }

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& t : impl_->added)
    if (t.content == token) return t.id;
  auto f = impl_->file_vocab.find(token);
  if (f == impl_->file_vocab.end()) return std::nullopt;
  return f->second;
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->id_known[static_cast<size_t>(id)])
    throw_input("token id {} is outside the vocabulary of {} ({} ids)", id, impl_->path, vocab_size());
  return impl_->id_token[static_cast<size_t>(id)];
}

bool HfTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_special[static_cast<size_t>(id)] != 0;
}

// ---------------------------------------------------------------- encoding

std::string HfTokenizer::Impl::normalize(std::string_view in) const {
  std::string s(in);
  for (const NormStep& st : norm) {
    switch (st.kind) {
      case NormStep::nfc:
      case NormStep::nfd:
      case NormStep::nfkc:
      case NormStep::nfkd: {
        // Below U+0300 every character is its own NFC and NFD; ASCII is its own NFKC/NFKD.
        const unsigned char limit = (st.kind == NormStep::nfc || st.kind == NormStep::nfd) ? 0xCC : 0x80;
        bool fast = true;
        for (char c : s)
          if (static_cast<unsigned char>(c) >= limit) {
            fast = false;
            break;
          }
        if (fast) break;
        int opt = UTF8PROC_STABLE;
        if (st.kind == NormStep::nfc || st.kind == NormStep::nfkc)
          opt |= UTF8PROC_COMPOSE;
        else
          opt |= UTF8PROC_DECOMPOSE;
        if (st.kind == NormStep::nfkc || st.kind == NormStep::nfkd) opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t* outp = nullptr;
        const auto n =
            utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                         &outp, static_cast<utf8proc_option_t>(opt));
        if (n < 0) throw RuntimeError(fmt::format("{}: normalization failed: {}", path, utf8proc_errmsg(n)));
        s.assign(reinterpret_cast<const char*>(outp), static_cast<size_t>(n));
        std::free(outp);
        break;
      }
      case NormStep::replace: {
        std::string r;
        size_t prev = 0;
        bool any = false;
        st.re->for_each_match(s, [&](size_t a, size_t b) {
          any = true;
          r.append(s, prev, a - prev);
          r += st.content;
          prev = b;
        });
        if (any) {
          r.append(s, prev, std::string::npos);
          s = std::move(r);
        }
        break;
      }
      case NormStep::prepend:
        if (!s.empty()) s.insert(0, st.content);
        break;
    }
  }
  return s;
}

void HfTokenizer::Impl::split_added(const AddedMatcher& mt, const Seg& in, std::vector<Seg>& out) const {
  const std::string_view s = in.s;
  if (mt.empty) {
    if (!s.empty()) out.push_back(in);
    return;
  }
  size_t start_offset = 0, pos = 0, at = 0;
  auto push_text = [&](size_t a, size_t b) {
    if (b > a) out.push_back({s.substr(a, b - a), nullptr, in.first && a == 0});
  };
  while (const AddedToken* t = mt.find(s, pos, at)) {
    size_t start = at, stop = at + t->match.size();
    pos = stop;
    if (start < start_offset) continue;  // inside whitespace an rstrip took
    if (t->single_word) {
      bool start_space = true, stop_space = true;
      if (start > 0) {
        size_t k = start - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        start_space = !is_word_char(decode_cp(s.data() + k, start - k));
      }
      if (stop < s.size()) stop_space = !is_word_char(decode_cp(s.data() + stop, char_len_at(s, stop)));
      if (!start_space || !stop_space) continue;
    }
    if (t->lstrip) {
      size_t k = start;
      while (k > 0) {
        size_t c = k - 1;
        while (c > 0 && (static_cast<unsigned char>(s[c]) & 0xC0) == 0x80) --c;
        if (!is_white_space(decode_cp(s.data() + c, k - c))) break;
        k = c;
      }
      start = std::max(k, start_offset);
    }
    if (t->rstrip) {
      while (stop < s.size()) {
        const size_t n = char_len_at(s, stop);
        if (!is_white_space(decode_cp(s.data() + stop, n))) break;
        stop += n;
      }
    }
    push_text(start_offset, start);
    out.push_back({s.substr(start, stop - start), t, false});
    start_offset = stop;
  }
  push_text(start_offset, s.size());
}

namespace {

// Splits `p` by the matches (start, end) in order, with the library's behaviours; empty
// pieces are dropped.
void split_by(const Piece& p, const std::vector<std::pair<size_t, size_t>>& matches, Behavior bh, bool invert,
              std::vector<Piece>& out) {
  // (start, end, is_match) covering p.s
  struct R {
    size_t a, b;
    bool m;
  };
  thread_local std::vector<R> rs;
  rs.clear();
  size_t prev = 0;
  for (auto [a, b] : matches) {
    if (a > prev) rs.push_back({prev, a, invert});
    rs.push_back({a, b, !invert});
    prev = b;
  }
  if (prev < p.s.size()) rs.push_back({prev, p.s.size(), invert});
  thread_local std::vector<R> sp;  // m = remove
  sp.clear();
  switch (bh) {
    case Behavior::isolated:
      for (auto& r : rs) sp.push_back({r.a, r.b, false});
      break;
    case Behavior::removed: sp = rs; break;
    case Behavior::contiguous: {
      bool prev_match = false;
      for (auto& r : rs) {
        if (r.m == prev_match && !sp.empty())
          sp.back().b = r.b;
        else
          sp.push_back({r.a, r.b, false});
        prev_match = r.m;
      }
      break;
    }
    case Behavior::merged_with_previous: {
      bool prev_match = false;
      for (auto& r : rs) {
        if (r.m && !prev_match && !sp.empty())
          sp.back().b = r.b;
        else
          sp.push_back({r.a, r.b, false});
        prev_match = r.m;
      }
      break;
    }
    case Behavior::merged_with_next: {
      bool prev_match = false;
      for (size_t k = rs.size(); k-- > 0;) {
        const R& r = rs[k];
        if (r.m && !prev_match && !sp.empty())
          sp.back().a = r.a;
        else
          sp.push_back({r.a, r.b, false});
        prev_match = r.m;
      }
      std::reverse(sp.begin(), sp.end());
      break;
    }
  }
  for (auto& r : sp)
    if (!r.m && r.b > r.a) out.push_back({p.s.substr(r.a, r.b - r.a), p.first && r.a == 0});
}

}  // namespace

void HfTokenizer::Impl::pretokenize(const Seg& seg, std::deque<std::string>& arena, std::vector<Piece>& out) const {
  thread_local std::vector<Piece> cur, next;
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  cur.clear();
  cur.push_back({seg.s, seg.first});
  for (const PreStep& st : pre) {
    next.clear();
    for (const Piece& p0 : cur) {
      Piece p = p0;
      matches.clear();
      switch (st.kind) {
        case PreStep::split:
          st.re->for_each_match(p.s, [&](size_t a, size_t b) { matches.emplace_back(a, b); });
          split_by(p, matches, st.behavior, st.invert, next);
          break;
        case PreStep::digits: {
          for (size_t i = 0; i < p.s.size();) {
            const size_t n = char_len_at(p.s, i);
            if (is_numeric_char(decode_cp(p.s.data() + i, n))) matches.emplace_back(i, i + n);
            i += n;
          }
          split_by(p, matches, st.individual_digits ? Behavior::isolated : Behavior::contiguous, false, next);
          break;
        }
        case PreStep::metaspace: {
          std::string& s = arena.emplace_back();
          for (char c : p.s) {
            if (c == ' ')
              s += st.replacement;
            else
              s += c;
          }
          const bool starts = s.compare(0, st.replacement.size(), st.replacement) == 0;
          if (!starts && (st.prepend_scheme == 0 || (st.prepend_scheme == 1 && p.first))) s.insert(0, st.replacement);
          p.s = s;
          if (st.split_on_replacement) {
            for (size_t i = s.find(st.replacement); i != std::string::npos;
                 i = s.find(st.replacement, i + st.replacement.size()))
              matches.emplace_back(i, i + st.replacement.size());
            split_by(p, matches, Behavior::merged_with_next, false, next);
          } else if (!p.s.empty()) {
            next.push_back(p);
          }
          break;
        }
        case PreStep::byte_level: {
          if (st.add_prefix_space && (p.s.empty() || p.s[0] != ' ')) {
            std::string& s = arena.emplace_back();
            s.reserve(p.s.size() + 1);
            s += ' ';
            s += p.s;
            p.s = s;
          }
          if (st.use_regex) {
            st.re->for_each_match(p.s, [&](size_t a, size_t b) { matches.emplace_back(a, b); });
            split_by(p, matches, Behavior::isolated, false, next);
          } else if (!p.s.empty()) {
            next.push_back(p);
          }
          break;
        }
      }
    }
    std::swap(cur, next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

namespace {

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x243F6A8885A308D3ull ^ (s.size() * 0x9E3779B97F4A7C15ull);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  return h * 0xBF58476D1CE4E5B9ull;
}

// Per-thread cache of piece -> ids, for one tokenizer at a time: open addressing over
// two arenas (piece bytes, ids); emptied when half full.
class PieceCache {
 public:
  static constexpr size_t kMaxPiece = 128;
  const int32_t* find(std::string_view p, uint64_t h, uint32_t& n) const {
    for (size_t i = h & kMask;; i = (i + 1) & kMask) {
      const Entry& e = table_[i];
      if (e.len == 0) return nullptr;
      if (e.hash == h && e.len == p.size() && std::memcmp(keys_.data() + e.key, p.data(), p.size()) == 0) {
        n = e.n;
        return ids_.data() + e.ids;
      }
    }
  }
  void put(std::string_view p, uint64_t h, const int32_t* ids, size_t n) {
    if (used_ * 2 >= kSize || n > 0xFFFF) {
      if (n > 0xFFFF) return;
      clear();
    }
    size_t i = h & kMask;
    while (table_[i].len != 0) i = (i + 1) & kMask;
    table_[i] = Entry{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                      static_cast<uint16_t>(p.size()), static_cast<uint16_t>(n)};
    keys_.append(p);
    ids_.insert(ids_.end(), ids, ids + n);
    ++used_;
  }
  void reset_for(uint64_t serial) {
    if (serial != serial_) {
      clear();
      serial_ = serial;
    }
  }

 private:
  static constexpr size_t kSize = size_t{1} << 18, kMask = kSize - 1;
  struct Entry {
    uint64_t hash = 0;
    uint32_t key = 0, ids = 0;
    uint16_t len = 0, n = 0;  // len 0: empty slot (empty pieces are never cached)
  };
  void clear() {
    std::fill(table_.begin(), table_.end(), Entry{});
    keys_.clear();
    ids_.clear();
    used_ = 0;
  }
  std::vector<Entry> table_ = std::vector<Entry>(kSize);
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t used_ = 0;
  uint64_t serial_ = 0;
};

}  // namespace

void HfTokenizer::Impl::model(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() <= PieceCache::kMaxPiece) {
    thread_local PieceCache cache;
    cache.reset_for(serial);
    const uint64_t h = hash_bytes(piece);
    uint32_t n = 0;
    if (const int32_t* ids = cache.find(piece, h, n)) {
      out.insert(out.end(), ids, ids + n);
      return;
    }
    const size_t before = out.size();
    bpe(piece, out);
    cache.put(piece, h, out.data() + before, out.size() - before);
    return;
  }
  bpe(piece, out);
}

// The word as symbols: one per byte (byte-level) or per character, unknown ones by byte
// fallback or the unk token, as the library does; linked in order.
void HfTokenizer::Impl::bpe_symbols(std::string_view w, std::vector<BpeSym>& sy) const {
  sy.clear();
  int32_t pending_unk = -1;
  auto add = [&](int32_t id) { sy.push_back({id, 0, 0, true}); };
  for (size_t i = 0; i < w.size();) {
    const size_t n = byte_level ? 1 : char_len_at(w, i);
    int32_t id = -1;
    if (byte_level) {
      id = byte_id[static_cast<unsigned char>(w[i])];
    } else {
      auto f = vocab.find(w.substr(i, n));
      if (f != vocab.end()) id = f->second;
    }
    if (id >= 0) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(id);
    } else {
      bool done = false;
      if (byte_fallback) {
        bool all = true;
        for (size_t k = 0; k < n; ++k) all = all && fallback_id[static_cast<unsigned char>(w[i + k])] >= 0;
        if (all) {
          for (size_t k = 0; k < n; ++k) add(fallback_id[static_cast<unsigned char>(w[i + k])]);
          done = true;
        }
      }
      if (!done && unk >= 0) {
        if (pending_unk >= 0 && !fuse_unk) add(pending_unk);
        pending_unk = unk;
      }
    }
    i += n;
  }
  if (pending_unk >= 0) add(pending_unk);
  const int32_t n = static_cast<int32_t>(sy.size());
  for (int32_t k = 0; k < n; ++k) {
    sy[static_cast<size_t>(k)].prev = k - 1;
    sy[static_cast<size_t>(k)].next = k + 1 < n ? k + 1 : -1;
  }
}

namespace {

// Few symbols: scan for the lowest-ranked adjacent pair (leftmost on ties) each round.
void bpe_merge_by_scan(const MergeTable& merges, std::vector<BpeSym>& sy) {
  const int32_t n = static_cast<int32_t>(sy.size());
  while (true) {
    int32_t best = -1;
    MergeVal bv{INT32_MAX, -1};
    for (int32_t k = 0; k >= 0 && k < n; k = sy[static_cast<size_t>(k)].next) {
      const int32_t nx = sy[static_cast<size_t>(k)].next;
      if (nx < 0) break;
      const MergeVal* mv = merges.get(sy[static_cast<size_t>(k)].id, sy[static_cast<size_t>(nx)].id);
      if (mv && mv->rank < bv.rank) {
        bv = *mv;
        best = k;
      }
    }
    if (best < 0) break;
    BpeSym& a = sy[static_cast<size_t>(best)];
    BpeSym& b = sy[static_cast<size_t>(a.next)];
    a.id = bv.id;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) sy[static_cast<size_t>(b.next)].prev = best;
  }
}

// The library's queue: (rank, position) ascending; stale entries are skipped.
void bpe_merge_by_queue(const MergeTable& merges, std::vector<BpeSym>& sy) {
  struct Cand {
    int32_t rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = static_cast<int32_t>(sy.size());
  auto lookup = [&](int32_t a, int32_t b) -> const MergeVal* { return merges.get(a, b); };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
  for (int32_t k = 0; k + 1 < n; ++k)
    if (const MergeVal* mv = lookup(sy[static_cast<size_t>(k)].id, sy[static_cast<size_t>(k + 1)].id))
      q.push({mv->rank, k, mv->id});
  while (!q.empty()) {
    const Cand top = q.top();
    q.pop();
    BpeSym& a = sy[static_cast<size_t>(top.pos)];
    if (!a.alive || a.next < 0) continue;
    BpeSym& b = sy[static_cast<size_t>(a.next)];
    const MergeVal* mv = lookup(a.id, b.id);
    if (!mv || mv->id != top.id) continue;
    a.id = top.id;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) sy[static_cast<size_t>(b.next)].prev = top.pos;
    if (a.prev >= 0)
      if (const MergeVal* pv = lookup(sy[static_cast<size_t>(a.prev)].id, a.id)) q.push({pv->rank, a.prev, pv->id});
    if (a.next >= 0)
      if (const MergeVal* nv = lookup(a.id, sy[static_cast<size_t>(a.next)].id)) q.push({nv->rank, top.pos, nv->id});
  }
}

}  // namespace

void HfTokenizer::Impl::bpe(std::string_view w, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    auto f = vocab.find(w);
    if (f != vocab.end()) {
      out.push_back(f->second);
      return;
    }
  }
  thread_local std::vector<BpeSym> sy;
  bpe_symbols(w, sy);
  if (sy.size() <= 24)
    bpe_merge_by_scan(merges, sy);
  else
    bpe_merge_by_queue(merges, sy);
  for (const BpeSym& s : sy)
    if (s.alive) out.push_back(s.id);
}

void HfTokenizer::encode(std::string_view text_in, std::vector<int32_t>& out, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string repaired;
  std::string_view text = text_in;
  if (!utf8_valid(text)) {
    repaired = utf8_lossy(text);
    text = repaired;
  }
  std::deque<std::string> arena;
  thread_local std::vector<Seg> segs1, segs2;
  thread_local std::vector<Piece> pieces;
  segs1.clear();
  segs2.clear();
  m.split_added(m.raw_matcher, {text, nullptr, true}, segs1);
  for (const Seg& s : segs1) {
    if (s.tok || m.norm.empty()) {
      segs2.push_back(s);
      continue;
    }
    std::string& ns = arena.emplace_back(m.normalize(s.s));
    m.split_added(m.norm_matcher, {ns, nullptr, s.first}, segs2);
  }
  if (m.norm.empty() && !m.norm_matcher.empty) {
    // No normalizer: the normalized tokens are searched in the same text, second.
    segs1.swap(segs2);
    segs2.clear();
    for (const Seg& s : segs1) {
      if (s.tok)
        segs2.push_back(s);
      else
        m.split_added(m.norm_matcher, s, segs2);
    }
  }
  const bool tmpl = add_special_tokens && !m.single.empty();
  size_t at_seq = 0;
  if (tmpl) {
    size_t k = 0;
    for (; k < m.single.size() && !m.single[k].sequence; ++k)
      out.insert(out.end(), m.single[k].ids.begin(), m.single[k].ids.end());
    at_seq = k;
  }
  for (const Seg& s : segs2) {
    if (s.tok) {
      out.push_back(s.tok->id);
      continue;
    }
    pieces.clear();
    m.pretokenize(s, arena, pieces);
    for (const Piece& p : pieces) m.model(p.s, out);
  }
  if (tmpl)
    for (size_t k = at_seq + 1; k < m.single.size(); ++k) {
      if (m.single[k].sequence) continue;  // one $A: the template is read once
      out.insert(out.end(), m.single[k].ids.begin(), m.single[k].ids.end());
    }
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  encode(text, out, add_special_tokens);
  return out;
}

// ---------------------------------------------------------------- decoding

namespace {

// The decoder's steps (decode_chain), each from the token strings `toks` to the next
// list, `nt`.

void decode_byte_level(const std::vector<std::string>& toks, std::vector<std::string>& nt) {
  const ByteAlphabet& abc = alphabet();
  std::string bytes, b;
  for (const auto& t : toks) {
    if (abc.to_bytes(t, b))
      bytes += b;
    else
      bytes += t;
  }
  nt.push_back(utf8_lossy(bytes));
}

void decode_replace(const DecStep& st, const std::vector<std::string>& toks, std::vector<std::string>& nt) {
  for (const auto& t : toks) {
    std::string r;
    size_t prev = 0;
    st.re->for_each_match(t, [&](size_t a, size_t b) {
      r.append(t, prev, a - prev);
      r += st.content;
      prev = b;
    });
    r.append(t, prev, std::string::npos);
    nt.push_back(std::move(r));
  }
}

void decode_byte_fallback(const std::vector<std::string>& toks, std::vector<std::string>& nt) {
  std::string pend;
  auto flush = [&] {
    if (pend.empty()) return;
    if (utf8_valid(pend))
      nt.push_back(pend);
    else
      for (size_t k = 0; k < pend.size(); ++k) nt.push_back("\xEF\xBF\xBD");
    pend.clear();
  };
  for (const auto& t : toks) {
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
      pend.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
    } else {
      flush();
      nt.push_back(t);
    }
  }
  flush();
}

void decode_fuse(const std::vector<std::string>& toks, std::vector<std::string>& nt) {
  std::string all;
  for (const auto& t : toks) all += t;
  nt.push_back(std::move(all));
}

void decode_strip(const DecStep& st, const std::vector<std::string>& toks, std::vector<std::string>& nt) {
  for (const auto& t : toks) {
    std::vector<std::pair<size_t, int32_t>> cs;  // (byte offset, cp)
    for (size_t i = 0; i < t.size();) {
      const size_t n = char_len_at(t, i);
      cs.emplace_back(i, decode_cp(t.data() + i, n));
      i += n;
    }
    size_t a = 0, b = cs.size();
    for (size_t k = 0; k < st.start && k < cs.size() && cs[k].second == st.strip_char; ++k) a = k + 1;
    for (size_t k = 0; k < st.stop && k < cs.size() && cs[cs.size() - 1 - k].second == st.strip_char; ++k)
      b = cs.size() - 1 - k;
    if (b < a) b = a;
    const size_t from = a < cs.size() ? cs[a].first : t.size();
    const size_t to = b < cs.size() ? cs[b].first : t.size();
    nt.push_back(t.substr(from, to - from));
  }
}

void decode_metaspace(const DecStep& st, const std::vector<std::string>& toks, std::vector<std::string>& nt) {
  for (size_t i = 0; i < toks.size(); ++i) {
    std::string r;
    const std::string& t = toks[i];
    for (size_t k = 0; k < t.size();) {
      if (t.compare(k, st.replacement.size(), st.replacement) == 0) {
        if (!(i == 0 && st.prepend)) r += ' ';
        k += st.replacement.size();
      } else {
        r += t[k++];
      }
    }
    nt.push_back(std::move(r));
  }
}

}  // namespace

std::vector<std::string> HfTokenizer::Impl::decode_chain(std::vector<std::string> toks) const {
  for (const DecStep& st : dec) {
    std::vector<std::string> nt;
    switch (st.kind) {
      case DecStep::byte_level: decode_byte_level(toks, nt); break;
      case DecStep::replace: decode_replace(st, toks, nt); break;
      case DecStep::byte_fallback: decode_byte_fallback(toks, nt); break;
      case DecStep::fuse: decode_fuse(toks, nt); break;
      case DecStep::strip: decode_strip(st, toks, nt); break;
      case DecStep::metaspace: decode_metaspace(st, toks, nt); break;
    }
    toks = std::move(nt);
  }
  return toks;
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !impl_->id_known[static_cast<size_t>(id)])
      throw_input("token id {} is outside the vocabulary of {} ({} ids)", id, impl_->path, vocab_size());
    if (skip_special_tokens && impl_->id_special[static_cast<size_t>(id)]) continue;
    toks.push_back(impl_->id_token[static_cast<size_t>(id)]);
  }
  std::string out;
  if (!impl_->has_decoder) {
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  for (const auto& t : impl_->decode_chain(std::move(toks))) out += t;
  return out;
}

std::optional<std::string> hf_config_eos_token(const std::string& tokenizer_json) {
  const auto cfg = std::filesystem::path(tokenizer_json).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(cfg, ec)) return std::nullopt;
  std::ifstream in(cfg);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw_input("{}: not valid JSON ({})", cfg.string(), e.what());
  }
  if (!j.is_object() || !j.contains("eos_token") || j["eos_token"].is_null()) return std::nullopt;
  const json& e = j["eos_token"];
  if (e.is_string()) return e.get<std::string>();
  if (e.is_object() && e.contains("content") && e["content"].is_string()) return e["content"].get<std::string>();
  throw_input("{}: eos_token: expected a string or an object with \"content\"", cfg.string());
}

}  // namespace mtnlg::data
