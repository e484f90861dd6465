// Python's case mappings and character classes beyond ASCII, generated from Python
// itself by scripts/gen-py-case-tables.py into py_case_tables.cpp. Used by
// py_capitalize / py_strip (tasks.hpp), which must match Python's str.capitalize() and
// str.strip() on non-ASCII text (HellaSwag, WinoGrande).
#pragma once
#include <cstdint>

namespace mtnlg::data::eval::pycase {

struct CaseMapping {
  uint32_t cp;
  const char* utf8;  // the mapping (one or more code points), UTF-8
};
struct Range {
  uint32_t lo, hi;  // inclusive
};

extern const char kUnicodeVersion[];
extern const CaseMapping kLower[];  // sorted by cp: chr(cp).lower() where it differs
extern const int64_t kLower_size;
extern const CaseMapping kTitle[];  // chr(cp).title() where it differs
extern const int64_t kTitle_size;
extern const Range kCaseIgnorable[];  // sorted ranges
extern const int64_t kCaseIgnorable_size;
extern const Range kCased[];
extern const int64_t kCased_size;
extern const Range kSpace[];  // str.isspace()
extern const int64_t kSpace_size;

}  // namespace mtnlg::data::eval::pycase
