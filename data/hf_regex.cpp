// PCRE2 behind the tokenizer.json patterns (data/hf_regex.hpp).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/hf_regex.hpp"

#include <pcre2.h>

#include <cctype>

#include "core/error.hpp"

namespace mtnlg::data {

namespace {

// Unicode White_Space, Oniguruma's \s.
constexpr const char* kSpaceClass =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
// Oniguruma's Unicode \w.
constexpr const char* kWordClass = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";

// One matcher per thread: match data with room for the whole match, and a JIT stack
// larger than the default for long runs of one class.
struct ThreadMatch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  ThreadMatch() {
    md = pcre2_match_data_create(1, nullptr);
    mc = pcre2_match_context_create(nullptr);
    js = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (mc && js) pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~ThreadMatch() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    pcre2_jit_stack_free(js);
  }
};

ThreadMatch& thread_match() {
  thread_local ThreadMatch tm;
  return tm;
}

}  // namespace

std::string oniguruma_to_pcre2(const std::string& p, const std::string& where) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's' || e == 'w') {
        const char* cls = e == 's' ? kSpaceClass : kWordClass;
        if (in_class) {
          out += cls;
        } else {
          out += '[';
          out += cls;
          out += ']';
        }
      } else if (e == 'S' || e == 'W') {
        if (in_class) throw_input("{}: \\{} inside a bracketed class is not supported (pattern '{}')", where, e, p);
        out += "[^";
        out += e == 'S' ? kSpaceClass : kWordClass;
        out += ']';
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
      continue;
    }
    if (in_class && c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
        const size_t close = p.find(":]", i + 2);
        if (close == std::string::npos) throw_input("{}: unterminated POSIX class in pattern '{}'", where, p);
        out.append(p, i, close + 2 - i);
        i = close + 1;
        continue;
      }
      throw_input("{}: nested bracketed classes (Oniguruma set operations) are not supported (pattern '{}')", where, p);
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

HfRegex::HfRegex(const std::string& pattern, const std::string& where) : pcre_(oniguruma_to_pcre2(pattern, where)) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre_.data()), pcre_.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw_input("{}: pattern '{}' does not compile at offset {}: {}", where, pattern, off,
                reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without a JIT, pcre2_match interprets
  code_ = code;
}

std::unique_ptr<HfRegex> HfRegex::literal(const std::string& lit, const std::string& where) {
  std::string pat;
  for (char c : lit) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) pat += '\\';
    pat += c;
  }
  return std::make_unique<HfRegex>(pat, where);
}

HfRegex::~HfRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool HfRegex::next(std::string_view s, size_t from, size_t& start, size_t& end) const {
  ThreadMatch& tm = thread_match();
  // The subject is valid UTF-8 (the tokenizer repairs its input first).
  const int rc = pcre2_match(static_cast<const pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(),
                             from, PCRE2_NO_UTF_CHECK, tm.md, tm.mc);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    throw RuntimeError(fmt::format("tokenizer regex '{}' failed on a {}-byte text: {}", pcre_, s.size(),
                                   reinterpret_cast<const char*>(msg)));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tm.md);
  start = ov[0];
  end = ov[1];
  return true;
}

}  // namespace mtnlg::data
