// Text to values with the spellings recipes, --set values and environment switches share.
#include "core/parse.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.hpp"

namespace mtnlg {

int64_t parse_count(const std::string& text_in, const std::string& what) {
  std::string t = text_in;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.erase(t.begin());
  double mult = 1.0;
  if (!t.empty()) {
    switch (t.back()) {
      case 'K':
      case 'k': mult = 1e3; break;
      case 'M':
      case 'm': mult = 1e6; break;
      case 'B':
      case 'b':
      case 'G':
      case 'g': mult = 1e9; break;
      case 'T':
      case 't': mult = 1e12; break;
      default: break;
    }
    if (mult != 1.0) t.pop_back();
  }
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  if (t.empty()) throw_input("{}: expected a count such as 2048, 12e9 or \"270B\", got \"{}\"", what, text_in);
  // Integers are parsed exactly; anything with '.', 'e' goes through double.
  int64_t iv = 0;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), iv);
  if (ec == std::errc() && p == t.data() + t.size() && mult == 1.0) {
    if (iv < 0) throw_input("{}: expected a non-negative count, got {}", what, text_in);
    return iv;
  }
  char* end = nullptr;
  double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(d))
    throw_input("{}: expected a count such as 2048, 12e9 or \"270B\", got \"{}\"", what, text_in);
  d *= mult;
  if (d < 0) throw_input("{}: expected a non-negative count, got {}", what, text_in);
  if (d > 9.2e18) throw_input("{}: count {} is too large", what, text_in);
  double r = std::round(d);
  if (std::fabs(d - r) > 1e-6 * std::max(1.0, std::fabs(d)))
    throw_input("{}: expected a whole number, got {}", what, text_in);
  return static_cast<int64_t>(r);
}

std::optional<bool> parse_bool(const std::string& s) {
  for (const char* t : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"})
    if (s == t) return true;
  for (const char* f : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"})
    if (s == f) return false;
  return std::nullopt;
}

}  // namespace mtnlg
