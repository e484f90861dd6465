// The regular expressions of a tokenizer.json (Split pre-tokenizer, Replace normalizer and
// decoder), run by PCRE2 with its JIT.
//
// Hugging Face's tokenizers compiles these patterns with Oniguruma. PCRE2 (UTF + UCP mode)
// reads the same syntax for everything these files use: Unicode properties (\p{L},
// \p{N}), scoped flags ((?i:...)), possessive quantifiers and lookahead; its JIT makes it
// the fastest engine packaged for Debian. Where the two differ, the pattern is rewritten
// before PCRE2 sees it, so that it means what Oniguruma means:
//   \s, \S  Oniguruma: Unicode White_Space (which includes U+0085); PCRE2 UCP: Z plus
//           \t\n\v\f\r (no U+0085) -> an explicit White_Space class
//   \w, \W  Oniguruma: Letter | Mark | Decimal_Number | Connector_Punctuation; PCRE2 UCP:
//           L, N and '_' -> an explicit class
// \S or \W inside a bracketed class has no PCRE2 spelling and is refused (InputError).
// Both engines' Unicode tables are from Unicode 14/15; characters assigned since differ.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace mtnlg::data {

class HfRegex {
 public:
  // `where` names the pattern in errors ("tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex").
  // Throws InputError when the pattern does not compile.
  HfRegex(const std::string& oniguruma_pattern, const std::string& where);
  // A pattern matching `literal` exactly (the String form of a pattern).
  static std::unique_ptr<HfRegex> literal(const std::string& literal, const std::string& where);
  ~HfRegex();
  HfRegex(const HfRegex&) = delete;
  HfRegex& operator=(const HfRegex&) = delete;

  // Calls f(start, end) for each leftmost non-overlapping match in `s` (valid UTF-8), in
  // order, as Oniguruma's search loop does: after an empty match the search resumes one
  // character further.
  template <typename F>
  void for_each_match(std::string_view s, F&& f) const {
    size_t pos = 0, start = 0, end = 0;
    while (pos <= s.size() && next(s, pos, start, end)) {
      f(start, end);
      if (end > start) {
        pos = end;
      } else {
        if (end >= s.size()) break;
        pos = end + 1;
        while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
  }
  // The first match at or after byte `from`: true and its bounds, or false.
  bool next(std::string_view s, size_t from, size_t& start, size_t& end) const;

  // The pattern as given to PCRE2 (after the rewrites above).
  const std::string& pcre2_pattern() const { return pcre_; }

 private:
  std::string pcre_;
  void* code_ = nullptr;  // pcre2_code_8
};

// The rewrite described above (exposed for tests). Throws InputError naming `where`.
std::string oniguruma_to_pcre2(const std::string& pattern, const std::string& where);

}  // namespace mtnlg::data
