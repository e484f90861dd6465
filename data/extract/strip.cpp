// Removing script and style contents and comments before the HTML5 parse: see strip.hpp.
#include "data/extract/strip.hpp"

#include <cstring>

namespace mtnlg::extract {

namespace {

constexpr size_t npos = std::string_view::npos;

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }
bool name_end(char c) { return ws(c) || c == '/' || c == '>'; }

// Whether `s` at `i` holds `name` (lower case) in any case, followed by the end of a tag name.
bool name_at(std::string_view s, size_t i, std::string_view name) {
  if (i + name.size() >= s.size()) return false;  // a name that runs to the end ends no tag
  for (size_t k = 0; k < name.size(); ++k)
    if (lower(s[i + k]) != name[k]) return false;
  return name_end(s[i + name.size()]);
}

// Just past the '>' of a tag whose name ends before `i`, reading the attributes as the
// tokenizer does (a quoted value may hold '>'); s.size() when the tag is not closed.
size_t tag_end(std::string_view s, size_t i) {
  const size_t n = s.size();
  while (i < n) {
    if (s[i] == '>') return i + 1;
    if (ws(s[i]) || s[i] == '/') {
      ++i;
      continue;
    }
    ++i;  // an attribute name (its first character may be '=')
    while (i < n && !name_end(s[i]) && s[i] != '=') ++i;
    while (i < n && ws(s[i])) ++i;
    if (i >= n || s[i] != '=') continue;
    ++i;
    while (i < n && ws(s[i])) ++i;
    if (i < n && (s[i] == '"' || s[i] == '\'')) {
      const size_t q = s.find(s[i], i + 1);
      if (q == npos) return n;
      i = q + 1;
    } else {
      while (i < n && !ws(s[i]) && s[i] != '>') ++i;
    }
  }
  return n;
}

// Where "</name" (then whitespace, '/' or '>') starts at or after `i`; s.size() if nowhere.
size_t find_end_tag(std::string_view s, size_t i, std::string_view name) {
  for (size_t p = s.find("</", i); p != npos; p = s.find("</", p + 1))
    if (name_at(s, p + 2, name)) return p;
  return s.size();
}

// Where script data starting at `i` ends: the "</script" that ends it outside the escaped
// states ("<!--" escapes; in it a "<script" escapes twice, until "</script"; "-->" ends
// both), as the HTML5 tokenizer reads it; s.size() if it runs to the end.
size_t script_end(std::string_view s, size_t i) {
  enum { kData, kEscaped, kDoubleEscaped } state = kData;
  for (const size_t n = s.size(); i < n; ++i) {
    const char c = s[i];
    if (c == '>' && state != kData && i >= 2 && s[i - 1] == '-' && s[i - 2] == '-') {
      state = kData;
    } else if (c == '<' && state == kData && s.compare(i, 4, "<!--") == 0) {
      state = kEscaped;
      i += 3;  // "<!-->" ends at once: the '>' sees the two dashes before it
    } else if (c == '<' && i + 1 < n && s[i + 1] == '/' && name_at(s, i + 2, "script")) {
      if (state != kDoubleEscaped) return i;
      state = kEscaped;
    } else if (c == '<' && state == kEscaped && name_at(s, i + 1, "script")) {
      state = kDoubleEscaped;
    }
  }
  return s.size();
}

// Just past a comment whose "<!--" ends before `i` ("<!-->", "<!--->", "-->", "--!>").
size_t comment_end(std::string_view s, size_t i) {
  if (s.compare(i, 1, ">") == 0) return i + 1;
  if (s.compare(i, 2, "->") == 0) return i + 2;
  for (size_t p = s.find("--", i); p != npos; p = s.find("--", p + 1)) {
    if (s.compare(p + 2, 1, ">") == 0) return p + 3;
    if (s.compare(p + 2, 2, "!>") == 0) return p + 4;
  }
  return s.size();
}

// Just past the end tag of a foreign (<svg>, <math>) element whose start tag ends before
// `i`, counting the same elements nested in it; s.size() when it is not closed.
size_t foreign_end(std::string_view s, size_t i, std::string_view name) {
  int depth = 1;
  for (size_t p = s.find('<', i); p != npos; p = s.find('<', p + 1)) {
    if (name_at(s, p + 1, name)) {
      ++depth;
    } else if (s.compare(p, 2, "</") == 0 && name_at(s, p + 2, name) && --depth == 0) {
      return tag_end(s, p + 2 + name.size());
    }
  }
  return s.size();
}

struct Stripper {
  std::string_view s;
  std::string& out;
  size_t copied = 0;  // s[0, copied) is in `out` or was dropped
  bool in_select = false;

  void drop(size_t from, size_t to) {
    out.append(s, copied, from - copied);
    copied = to;
  }

  // A start tag whose name starts at `i`: where to read on from, after its contents when
  // they are text, foreign content or removed. npos: copy the rest as it is.
  size_t start_tag(size_t i) {
    size_t e = i;
    while (e < s.size() && !name_end(s[e])) ++e;
    const size_t end = tag_end(s, e);
    if (name_at(s, i, "script")) {
      const size_t stop = script_end(s, end);
      drop(end, stop);
      return stop;
    }
    if (name_at(s, i, "style")) {
      const size_t stop = find_end_tag(s, end, "style");
      if (!in_select) drop(end, stop);
      return stop;
    }
    for (const char* raw : {"title", "textarea", "xmp", "iframe", "noembed", "noframes"})
      if (name_at(s, i, raw)) return find_end_tag(s, end, raw);
    for (const char* foreign : {"svg", "math"})
      if (name_at(s, i, foreign)) return foreign_end(s, end, foreign);
    if (name_at(s, i, "select")) in_select = true;
    if (name_at(s, i, "plaintext") || name_at(s, i, "frameset")) return npos;
    return end;
  }

  size_t run() {
    const size_t n = s.size();
    size_t removed = 0;
    for (size_t i = s.find('<'); i != npos && i + 1 < n; i = s.find('<', i)) {
      const char c = s[i + 1];
      if (alpha(c)) {
        i = start_tag(i + 1);
        if (i == npos) break;
      } else if (c == '/' && i + 2 < n && alpha(s[i + 2])) {
        if (name_at(s, i + 2, "select")) in_select = false;
        i = tag_end(s, i + 2);
      } else if (s.compare(i, 4, "<!--") == 0) {
        const size_t e = comment_end(s, i + 4);
        drop(i, e);
        i = e;
      } else if (c == '!' || c == '?' || c == '/') {  // doctype, bogus comment: up to '>'
        const size_t gt = s.find('>', i + 2);
        i = gt == npos ? n : gt + 1;
      } else {
        ++i;  // a '<' that is text
      }
    }
    removed = copied - out.size();
    out.append(s, copied, n - copied);
    return removed;
  }
};

}  // namespace

size_t strip_raw_text(std::string_view html, std::string& out) {
  out.clear();
  out.reserve(html.size());
  return Stripper{html, out}.run();
}

}  // namespace mtnlg::extract
