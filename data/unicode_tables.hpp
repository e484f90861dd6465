// Unicode letter (\p{L}) and number (\p{N}) classes as sorted range tables, generated
// by scripts/gen-unicode-tables.py into unicode_tables.cpp. Used by the GPT-2
// pre-tokenizer for code points >= 128 (ASCII goes through a 128-entry table).
#pragma once
#include <cstdint>

namespace mtnlg::data::unicode {

struct CodepointRange {
  uint32_t lo, hi;  // inclusive
};

extern const char kUnicodeVersion[];
extern const CodepointRange kLetterRanges[];
extern const int64_t kLetterRanges_size;
extern const CodepointRange kNumberRanges[];
extern const int64_t kNumberRanges_size;

bool in_ranges(const CodepointRange* r, int64_t n, uint32_t cp);
inline bool is_letter(uint32_t cp) { return in_ranges(kLetterRanges, kLetterRanges_size, cp); }
inline bool is_number(uint32_t cp) { return in_ranges(kNumberRanges, kNumberRanges_size, cp); }
// JavaScript's \s with the u flag (js-tiktoken is the oracle): WhiteSpace + LineTerminator,
// i.e. \t \n \v \f \r, space, U+00A0, U+1680, U+2000-200A, U+2028, U+2029, U+202F,
// U+205F, U+3000, U+FEFF. (Rust's \s, used by tiktoken, has U+0085 instead of U+FEFF.)
inline bool is_space(uint32_t cp) {
  if (cp < 128) return cp == ' ' || (cp >= 9 && cp <= 13);
  return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

}  // namespace mtnlg::data::unicode
