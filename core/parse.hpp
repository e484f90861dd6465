// Text to values with the spellings recipes, --set values and environment switches share
// (core knows nothing of what the values configure: the recipe lives in config/).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace mtnlg {

// "270B", "12e9", "1.5M", 2048 -> integer counts. Throws InputError(what) when the
// text is not a whole non-negative number.
int64_t parse_count(const std::string& text, const std::string& what);
// The one boolean spelling of recipes, --set values and environment switches: true/yes/on
// and false/no/off in lower, Capitalised or UPPER case; nullopt for anything else.
std::optional<bool> parse_bool(const std::string& text);

}  // namespace mtnlg
