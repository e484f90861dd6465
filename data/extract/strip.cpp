// Removing script and style contents and comments before the HTML5 parse: see strip.hpp.
#include "data/extract/strip.hpp"

#include "data/extract/page.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

namespace mtnlg::extract {

namespace {

constexpr size_t npos = std::string_view::npos;

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }
bool name_end(char c) { return ws(c) || c == '/' || c == '>'; }
bool alnum(char c) { return alpha(c) || (c >= '0' && c <= '9'); }

constexpr uint64_t kAmps = 0x2626262626262626ULL;  // '&' in every byte
bool has_zero_byte(uint64_t x) { return ((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL) != 0; }

constexpr size_t kMinRun = 2;  // a piece of one byte is one character already

// Whether `s` at `i` holds `name` (lower case) in any case, followed by the end of a tag name.
bool name_at(std::string_view s, size_t i, std::string_view name) {
  if (i + name.size() >= s.size()) return false;  // a name that runs to the end ends no tag
  for (size_t k = 0; k < name.size(); ++k)
    if (lower(s[i + k]) != name[k]) return false;
  return name_end(s[i + name.size()]);
}

// An attribute of a start tag: s[begin, name_end) its name, s[begin, end) all of it.
struct AttributeSpan {
  size_t begin, name_end, end;
};

// Just past the '>' of a tag whose name ends before `i`, reading the attributes as the
// tokenizer does (a quoted value may hold '>'; after a quoted value the next attribute may
// start at once); s.size() when the tag is not closed (`closed` says which). `attrs`, when
// given, gets each attribute's span.
size_t tag_end(std::string_view s, size_t i, std::vector<AttributeSpan>* attrs = nullptr, bool* closed = nullptr) {
  const size_t n = s.size();
  if (closed) *closed = false;
  while (i < n) {
    if (s[i] == '>') {
      if (closed) *closed = true;
      return i + 1;
    }
    if (ws(s[i]) || s[i] == '/') {
      ++i;
      continue;
    }
    const size_t begin = i;
    ++i;  // an attribute name (its first character may be '=')
    while (i < n && !name_end(s[i]) && s[i] != '=') ++i;
    const size_t name_stop = i;
    while (i < n && ws(s[i])) ++i;
    if (i >= n || s[i] != '=') {
      if (attrs) attrs->push_back({begin, name_stop, name_stop});
      continue;
    }
    ++i;
    while (i < n && ws(s[i])) ++i;
    if (i < n && (s[i] == '"' || s[i] == '\'')) {
      const size_t q = s.find(s[i], i + 1);
      if (q == npos) return n;
      i = q + 1;
    } else {
      while (i < n && !ws(s[i]) && s[i] != '>') ++i;
    }
    if (attrs) attrs->push_back({begin, name_stop, i});
  }
  return n;
}

// Whether `s` (any case) is `lower_name` (lower case).
bool iequals(std::string_view s, std::string_view lower_name) {
  if (s.size() != lower_name.size()) return false;
  for (size_t k = 0; k < s.size(); ++k)
    if (lower(s[k]) != lower_name[k]) return false;
  return true;
}

// The attributes the block walk or the tree builder reads, by name: an index into this
// list for an attribute of that name (in any case), else -1.
constexpr std::string_view kReadAttributes[] = {"class",  "id",     "itemprop", "itemtype", "hidden", "aria-hidden",
                                                "role",   "type",   "color",    "face",     "size",   "encoding",
                                                "prompt", "action", "lang",     "style"};
// The first four: the walk asks only what their words mark (attribute_marks).
enum : int { kClass = 0, kId = 1, kMarked = 4 };
int read_attribute(std::string_view name) {
  for (size_t k = 0; k < std::size(kReadAttributes); ++k)
    if (iequals(name, kReadAttributes[k])) return static_cast<int>(k);
  return -1;
}

// Whether attribute `which` (not class or id) with this value, as written, on a start tag
// named `tag`, can change the tree or the blocks: the walk reads hidden (any value),
// aria-hidden="true" and the roles navigation, banner, contentinfo and dialog; the tree
// builder reads type=hidden on <input> (in a table, and for frameset-ok), color, face and
// size on <font> (leaving foreign content), encoding on <annotation-xml> and prompt and
// action on <isindex>. A value with a character reference may decode to anything: it stays.
bool attribute_read(int which, std::string_view value, std::string_view tag) {
  const std::string_view name = kReadAttributes[static_cast<size_t>(which)];
  if (name == "hidden" || value.find('&') != npos) return true;
  if (name == "aria-hidden") return value == "true";
  if (name == "role") return value == "navigation" || value == "banner" || value == "contentinfo" || value == "dialog";
  if (name == "type") return iequals(tag, "input") && iequals(value, "hidden");
  if (name == "color" || name == "face" || name == "size") return iequals(tag, "font");
  if (name == "encoding") return iequals(tag, "annotation-xml");
  if (name == "lang") return iequals(tag, "html");
  if (name == "style") return style_hides(value);
  return iequals(tag, "isindex");  // prompt, action
}

}  // namespace

bool style_hides(std::string_view style) {
  std::string v;  // lower case, without whitespace
  for (const char c : style)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f')
      v += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  auto declares = [&](std::string_view d) {
    for (size_t at = v.find(d); at != std::string::npos; at = v.find(d, at + 1))
      if ((at == 0 || v[at - 1] == ';' || v[at - 1] == '"' || v[at - 1] == '\'') &&
          (at + d.size() == v.size() || v[at + d.size()] == ';' || v[at + d.size()] == '!'))
        return true;
    return false;
  };
  return declares("display:none") || declares("visibility:hidden");
}

namespace {

// The value of an attribute as written (without its quotes); "" when it has none.
std::string_view attribute_value(std::string_view s, const AttributeSpan& a) {
  size_t i = a.name_end;
  while (i < a.end && ws(s[i])) ++i;
  if (i >= a.end || s[i] != '=') return {};
  ++i;
  while (i < a.end && ws(s[i])) ++i;
  if (i < a.end && (s[i] == '"' || s[i] == '\'')) return s.substr(i + 1, a.end - i - 2);
  return s.substr(i, a.end - i);
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

// Whether a numeric character reference at s[i] ("&#" then digits, or "&#x" then hex
// digits) names a private-use code point.
bool private_use_reference(std::string_view s, size_t i) {
  size_t k = i + 2;
  const bool hex = k < s.size() && (s[k] == 'x' || s[k] == 'X');
  k += hex;
  uint32_t v = 0;
  for (; k < s.size() && v <= 0x10FFFF; ++k) {
    const char c = lower(s[k]);
    const int d = (c >= '0' && c <= '9') ? c - '0' : (hex && c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) break;
    v = v * (hex ? 16 : 10) + static_cast<uint32_t>(d);
  }
  return v >= 0xE000 && v < 0xE000 + kPlaceholderBase;
}

// Whether the page's text can hold a private-use character U+E000..U+F8FF: as UTF-8 (EE xx
// xx, EF 80..A3 xx) or as a numeric character reference.
bool has_private_use(std::string_view s) {
  constexpr uint64_t kEF = 0xEFEFEFEFEFEFEFEFULL, kOnes = 0x0101010101010101ULL;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    // Eight bytes at a time while none is 0xEE, 0xEF or '&'.
    uint64_t x;
    while (i + 9 < s.size() &&
           (std::memcpy(&x, s.data() + i, 8), !has_zero_byte((x | kOnes) ^ kEF) && !has_zero_byte(x ^ kAmps)))
      i += 8;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0xEE || (c == 0xEF && static_cast<unsigned char>(s[i + 1]) < 0xA4)) return true;
    if (c == '&' && s[i + 1] == '#' && private_use_reference(s, i)) return true;
  }
  return false;
}

// The private-use character(s) that stand for text run `k` (strip.hpp).
void append_placeholder(std::string& out, size_t k) {
  auto put = [&](size_t v) {
    const auto cp = static_cast<unsigned>(0xE000 + v);
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  };
  if (k < kPlaceholderSingle) {
    put(k);
  } else {
    put(kPlaceholderSingle + (k - kPlaceholderSingle) / kPlaceholderBase);
    put((k - kPlaceholderSingle) % kPlaceholderBase);
  }
}

// Whether two tag names are the same (ASCII case-insensitively, as the tokenizer lowers them).
bool same_name(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (lower(a[k]) != lower(b[k])) return false;
  return true;
}

// The bytes of run k's placeholder (append_placeholder).
size_t placeholder_bytes(size_t k) { return k < kPlaceholderSingle ? 3 : 6; }

// What the pass needs to know of a tag name to take inline elements out of the parse.
enum class TagKind : uint8_t {
  other,
  a,
  inline_element,  // formatting or plain phrasing elements the walk does not read: <b>, <span>, ...
  table,
  cell,        // td, th, caption: the tree builder reads their content as in the body
  table_part,  // tr, tbody, thead, tfoot, col, colgroup: text there is moved out of the table
  pre,
  unsafe,  // svg, math (foreign content), template, object, applet, marquee (markers)
};

// A name of up to 8 bytes as one integer (its bytes in order, zeros after).
constexpr uint64_t pack(std::string_view name) {
  uint64_t v = 0;
  for (size_t k = 0; k < name.size(); ++k) v |= uint64_t{static_cast<unsigned char>(name[k])} << (8 * k);
  return v;
}

TagKind tag_kind(std::string_view name) {
  struct Entry {
    uint64_t name;
    uint8_t size;
    TagKind kind;
  };
  constexpr TagKind I = TagKind::inline_element;
  static constexpr std::pair<std::string_view, TagKind> kNames[] = {{"a", TagKind::a},
                                                                    {"b", I},
                                                                    {"i", I},
                                                                    {"q", I},
                                                                    {"s", I},
                                                                    {"u", I},
                                                                    {"em", I},
                                                                    {"tt", I},
                                                                    {"td", TagKind::cell},
                                                                    {"th", TagKind::cell},
                                                                    {"tr", TagKind::table_part},
                                                                    {"big", I},
                                                                    {"bdi", I},
                                                                    {"bdo", I},
                                                                    {"col", TagKind::table_part},
                                                                    {"dfn", I},
                                                                    {"kbd", I},
                                                                    {"pre", TagKind::pre},
                                                                    {"sub", I},
                                                                    {"sup", I},
                                                                    {"svg", TagKind::unsafe},
                                                                    {"var", I},
                                                                    {"abbr", I},
                                                                    {"cite", I},
                                                                    {"code", I},
                                                                    {"data", I},
                                                                    {"mark", I},
                                                                    {"math", TagKind::unsafe},
                                                                    {"samp", I},
                                                                    {"span", I},
                                                                    {"time", I},
                                                                    {"label", I},
                                                                    {"small", I},
                                                                    {"table", TagKind::table},
                                                                    {"tbody", TagKind::table_part},
                                                                    {"tfoot", TagKind::table_part},
                                                                    {"thead", TagKind::table_part},
                                                                    {"applet", TagKind::unsafe},
                                                                    {"object", TagKind::unsafe},
                                                                    {"strike", I},
                                                                    {"strong", I},
                                                                    {"acronym", I},
                                                                    {"caption", TagKind::cell},
                                                                    {"marquee", TagKind::unsafe},
                                                                    {"colgroup", TagKind::table_part},
                                                                    {"template", TagKind::unsafe}};
  // An open-addressing table of the names, 128 slots.
  static const std::array<Entry, 128> kTable = [] {
    std::array<Entry, 128> t{};
    for (const auto& [n, kind] : kNames) {
      size_t h = static_cast<size_t>((pack(n) * 0x9E3779B97F4A7C15ULL) >> 57);
      while (t[h].size != 0) h = (h + 1) & 127;
      t[h] = {pack(n), static_cast<uint8_t>(n.size()), kind};
    }
    return t;
  }();
  if (name.empty() || name.size() > 8) return TagKind::other;
  uint64_t v = 0;
  for (size_t k = 0; k < name.size(); ++k) v |= uint64_t{static_cast<unsigned char>(lower(name[k]))} << (8 * k);
  for (size_t h = static_cast<size_t>((v * 0x9E3779B97F4A7C15ULL) >> 57);; h = (h + 1) & 127) {
    if (kTable[h].size == 0) return TagKind::other;
    if (kTable[h].name == v) return kTable[h].kind;
  }
}

struct Stripper {
  Stripper(std::string_view s, std::string& out, std::vector<TextRun>* runs, bool drop_attributes)
      : s(s), out(out), runs(runs), drop_attributes(drop_attributes) {}

  std::string_view s;
  std::string& out;
  std::vector<TextRun>* runs;  // null: text is not replaced
  bool drop_attributes;
  size_t copied = 0;  // s[0, copied) is in `out` or was dropped
  bool in_select = false;
  std::vector<AttributeSpan> attrs;  // reused from tag to tag

  // Taking inline elements out (strip.hpp). What the tree builder may have open, as far
  // as the tags tell, erring on the side of leaving an element in: one entry per <table>
  // start tag, true while a cell or caption of it is open; <pre> start tags less end tags;
  // whether an <a> may be in the list of active formatting elements (one not taken out,
  // not yet followed by </a>), and whether a marker or scope boundary came after it (its
  // </a> may then leave it there: no <a> is taken out for the rest of the page).
  std::vector<bool> tables;
  int pre = 0;
  bool a_open = false, a_stuck = false, unsafe = false;
  // The inline elements whose start tag was written last, innermost last: where the tag
  // starts in `out`, where `out` ended after it, and the number of runs then.
  struct OpenInline {
    std::string_view name;
    size_t out_begin, out_end, runs;
    std::string_view text_only;  // text_only when its start tag came
  };
  std::vector<OpenInline> open_inline;
  // The name of the <li>, <dt>, <dd> or <p> whose start tag is the last tag so far with
  // only text after it (elements taken out count as text); empty when there is none.
  std::string_view text_only;
  // Whether the tree builder has left its initial insertion mode (a tag, a doctype or text
  // that is not whitespace came), and the whitespace-only text right before the tag now
  // read, when a tag came right before it: [ws_begin, ws_end).
  bool past_initial = false;
  size_t ws_begin = npos, ws_end = npos;

  // Whether an element that holds no text and only makes one of its own in the tree (a
  // <meta>, <link>, <base>, or an emptied <script> or <style>) can go with its tags: text
  // around it is then one text node where it was two, which changes nothing the walk reads
  // except inside <pre> (whitespace nodes there), in a table outside a cell (text moved
  // out of the table with the whitespace next to it) or before the initial insertion
  // mode is left (a <meta> first makes the page quirks mode).
  bool element_can_go(bool was_past_initial) const {
    return drop_attributes && was_past_initial && pre == 0 && !unsafe && !in_table_part();
  }

  // Whether whitespace-only text right before a start tag named `name` (without hidden or
  // aria-hidden: the walk leaves those early) can go: the tag opens a block the walk
  // flushes at, and the parser always inserts it (in the body, a cell, a caption, a table
  // by moving it out), so the whitespace would end the block before it, where trailing
  // whitespace is dropped, or sit in a table, head or select where the walk reads none.
  bool whitespace_can_go(std::string_view name) const {
    static constexpr std::string_view kBlocks[] = {
        "address",  "article",    "aside",   "blockquote", "center", "details", "dir",  "div",  "dl",
        "fieldset", "figcaption", "figure",  "footer",     "header", "hgroup",  "menu", "main", "nav",
        "ol",       "p",          "section", "summary",    "ul",     "h1",      "h2",   "h3",   "h4",
        "h5",       "h6",         "li",      "dd",         "dt",     "hr",      "br",   "table"};
    if (!drop_attributes || pre > 0 || unsafe) return false;
    for (const auto& a : attrs) {
      const int which = read_attribute(s.substr(a.begin, a.name_end - a.begin));
      if (which >= 0 && (kReadAttributes[static_cast<size_t>(which)] == "hidden" ||
                         kReadAttributes[static_cast<size_t>(which)] == "aria-hidden"))
        return false;
    }
    for (const auto b : kBlocks)
      if (same_name(name, b)) return true;
    return false;
  }

  bool in_table_part() const { return !tables.empty() && !tables.back(); }

  // A start tag of this kind (its attributes written when `bare` is false).
  void start_of(TagKind kind, std::string_view name, size_t out_begin, bool bare) {
    const bool boundary = kind == TagKind::table || kind == TagKind::cell || kind == TagKind::unsafe;
    if (boundary && a_open) a_stuck = true;
    if (boundary && pre > 0) unsafe = true;  // a </pre> may then leave the <pre> open
    switch (kind) {
      case TagKind::table: tables.push_back(false); break;
      case TagKind::cell:
        if (!tables.empty()) tables.back() = true;
        break;
      case TagKind::table_part:
        if (!tables.empty()) tables.back() = false;
        break;
      case TagKind::pre: ++pre; break;
      case TagKind::unsafe: unsafe = true; break;
      default: break;
    }
    const bool collapsible = (kind == TagKind::inline_element || (kind == TagKind::a && !a_open && !a_stuck)) && bare &&
                             runs && drop_attributes && !unsafe && pre == 0 && !in_table_part();
    if (kind == TagKind::a) a_open = true;
    if (collapsible)
      open_inline.push_back({name, out_begin, out.size(), runs->size(), text_only});
    else
      open_inline.clear();
    const bool list_or_p =
        same_name(name, "li") || same_name(name, "dt") || same_name(name, "dd") || same_name(name, "p");
    text_only = list_or_p ? name : std::string_view();
  }

  // The name of the tag that starts at s[at] ("" when none does) and whether it is an end tag.
  std::string_view tag_at(size_t at, bool& end_tag) const {
    end_tag = at + 1 < s.size() && s[at + 1] == '/';
    size_t b = at + 1 + end_tag;
    if (at >= s.size() || s[at] != '<' || b >= s.size() || !alpha(s[b])) return {};
    size_t e = b;
    while (e < s.size() && !name_end(s[e])) ++e;
    return e < s.size() ? s.substr(b, e - b) : std::string_view();
  }

  // Whether the end tag `name`, followed at once by the tag at `next`, does nothing that
  // the next tag does not do itself (the tree is the same without it): </td> and </th>
  // before a cell's start tag or </tr> (either closes the cell, in every insertion mode),
  // </tr> before <tr>; and, when the element's start tag is the last tag and only text
  // follows it (the element is the current node), </li> before <li>, </dt> and </dd>
  // before <dt> or <dd>, </p> before a start tag that closes a <p> in button scope.
  bool implied_end(std::string_view name, size_t next) const {
    bool next_end = false;
    const std::string_view y = tag_at(next, next_end);
    if (y.empty() || unsafe) return false;
    if (same_name(name, "td") || same_name(name, "th"))
      return next_end ? same_name(y, "tr") : same_name(y, "td") || same_name(y, "th");
    if (same_name(name, "tr")) return !next_end && same_name(y, "tr");
    if (next_end || text_only.empty() || !same_name(name, text_only)) return false;
    if (same_name(name, "li")) return same_name(y, "li");
    if (same_name(name, "dt") || same_name(name, "dd")) return same_name(y, "dt") || same_name(y, "dd");
    static constexpr std::string_view kClosesP[] = {
        "address",    "article", "aside",  "blockquote", "center", "details", "dir",  "div", "dl", "fieldset",
        "figcaption", "figure",  "footer", "header",     "hgroup", "menu",    "main", "nav", "ol", "p",
        "section",    "summary", "ul",     "h1",         "h2",     "h3",      "h4",   "h5",  "h6"};
    for (const auto c : kClosesP)
      if (same_name(y, c)) return true;
    return false;
  }


  // An end tag whose name is s[name_begin, name_end) and which starts at `lt` and ends
  // before `end`: takes the element out when it holds one text piece and nothing else.
  // True when it did (the end tag is dropped).
  bool end_of(size_t name_begin, size_t name_end, size_t lt, size_t end) {
    const std::string_view name = s.substr(name_begin, name_end - name_begin);
    const TagKind kind = tag_kind(name);
    switch (kind) {
      case TagKind::table:
        if (!tables.empty()) tables.pop_back();
        break;
      case TagKind::cell:
      case TagKind::table_part:
        if (!tables.empty()) tables.back() = false;
        break;
      case TagKind::pre: pre = std::max(0, pre - 1); break;
      case TagKind::a:
        if (!a_stuck) a_open = false;
        break;
      default: break;
    }
    if (!open_inline.empty() && (kind == TagKind::a || kind == TagKind::inline_element)) {
      const OpenInline e = open_inline.back();
      open_inline.pop_back();
      // Since the start tag: all of the page read, one run, and nothing but its placeholder written.
      const bool one_piece =
          copied == lt && runs->size() == e.runs + 1 && out.size() - e.out_end == placeholder_bytes(e.runs);
      if (one_piece && same_name(name, e.name)) {
        out.erase(e.out_begin, e.out_end - e.out_begin);
        if (kind == TagKind::a) runs->back().link = true;
        text_only = e.text_only;  // the element is text now
        drop(lt, end);
        return true;
      }
    }
    open_inline.clear();
    const bool implied = drop_attributes && implied_end(name, end);
    text_only = {};
    if (implied) drop(lt, end);
    return implied;
  }

  void drop(size_t from, size_t to) {
    out.append(s, copied, from - copied);
    copied = to;
  }

  // Text s[from, to) in the data state: its pieces of kMinRun bytes or more that hold no
  // character reference, NUL or leading/trailing whitespace become placeholders.
  void text(size_t from, size_t to) {
    for (size_t p = from; p < to;) {
      while (p < to && ws(s[p])) ++p;
      size_t q = p;
      uint64_t x;  // eight bytes at a time while none is '&' or NUL
      while (q + 8 <= to && (std::memcpy(&x, s.data() + q, 8), !has_zero_byte(x) && !has_zero_byte(x ^ kAmps))) q += 8;
      while (q < to && s[q] != '&' && s[q] != '\0') ++q;
      size_t e = q;  // the piece is s[p, e), trimmed
      while (e > p && ws(s[e - 1])) --e;
      if (e - p >= kMinRun && runs->size() < kPlaceholderRuns) {
        drop(p, e);
        append_placeholder(out, runs->size());
        runs->push_back({s.substr(p, e - p)});
      }
      // A reference's name or number and the NULs stay as they are.
      while (q < to && (s[q] == '&' || s[q] == '#' || s[q] == ';' || s[q] == '\0' || alnum(s[q]))) ++q;
      p = q;
    }
  }

  // Writes the start tag whose name is `name` (a view of `s`) and which ends before `end`
  // (`attrs` holds its attributes) with only what the walk and the tree builder read of
  // it: its name, the first occurrence of each attribute they read (the parser drops
  // repeats) where its value can matter (attribute_read), one space before each, and a
  // '/' that makes it self-closing. Of class and id the walk asks only whether a word
  // marks furniture: both go, and one id=nav (class=nav when the id stays) stands for
  // them when one does; a value with a character reference stays as it is written.
  bool canonical_start_tag(std::string_view name, size_t end) {
    const size_t name_end = static_cast<size_t>(name.data() - s.data()) + name.size();
    out.append(s, copied, name_end - copied);
    const size_t after_name = out.size();
    copied = end;
    uint32_t seen = 0;  // by index in kReadAttributes
    uint8_t marks = 0;
    bool raw[kMarked] = {false, false, false, false};
    for (const auto& a : attrs) {
      const int which = read_attribute(s.substr(a.begin, a.name_end - a.begin));
      if (which < 0 || (seen >> which & 1)) continue;
      seen |= uint32_t{1} << which;
      const std::string_view v = attribute_value(s, a);
      if (which < kMarked) {
        raw[which] = v.find('&') != npos;
        if (!raw[which]) {
          marks |= attribute_marks(v);
          continue;
        }
      } else if (!attribute_read(which, v, name)) {
        continue;
      }
      out += ' ';
      out.append(s, a.begin, a.end - a.begin);
    }
    if (marks) {  // one attribute with the same marks: "nav" furniture, "comments" a comment section, "paywall",
                  // "entry-content" a post's body
      std::string words;
      for (const auto& [mark, word] : {std::pair<uint8_t, std::string_view>{kMarkFurniture, "nav"},
                                       {kMarkComment, "comments"},
                                       {kMarkSoftFurniture, "paywall"},
                                       {kMarkPostBody, "entry-content"},
                                       {kMarkAuthor, "author"}})
        if (marks & mark) (words.empty() ? words : words += ' ') += word;
      out += raw[kId] ? " class=" : " id=";
      out += words.find(' ') == std::string::npos ? words : '"' + words + '"';
    }
    // Self-closing: a '/' right before the '>' that is in no value ("<a href=x/>" is not).
    const size_t last = attrs.empty() ? name_end : attrs.back().end;
    if (end - 2 >= last && s[end - 2] == '/') out += out.back() == '"' || out.back() == '\'' ? "/" : " /";
    out += '>';
    return out.size() == after_name + 1;  // bare: the name and '>' only
  }

  // A start tag whose name starts at `i`: where to read on from, after its contents when
  // they are text, foreign content or removed. npos: copy the rest as it is.
  // Drops the element whose start tag was just written at out[out_begin, ...) and whose
  // end tag starts at `stop` (a </script> or </style>): where to read on from.
  size_t drop_element(size_t out_begin, size_t stop) {
    bool closed = false;
    size_t e = stop + 2;
    while (e < s.size() && !name_end(s[e])) ++e;
    const size_t after = tag_end(s, e, nullptr, &closed);
    if (!closed) return stop;
    out.resize(out_begin);
    copied = after;
    return after;
  }

  size_t start_tag(size_t i) {
    size_t e = i;
    while (e < s.size() && !name_end(s[e])) ++e;
    const std::string_view name = s.substr(i, e - i);
    size_t end;
    bool bare = false, closed = false;
    const bool was_past_initial = past_initial;
    past_initial = true;
    if (drop_attributes) {
      attrs.clear();
      end = tag_end(s, e, &attrs, &closed);
      if (closed && ws_end == i - 1 && whitespace_can_go(name)) drop(ws_begin, ws_end);
    } else {
      end = tag_end(s, e);
    }
    const size_t out_begin = out.size() + (i - 1 - copied);  // where the tag's '<' will be in `out`
    // A tag the file ends inside is not emitted at all: leave it as it is.
    if (drop_attributes && closed) bare = canonical_start_tag(name, end);
    start_of(tag_kind(name), name, out_begin, bare);
    const bool can_go = closed && element_can_go(was_past_initial);
    switch (lower(s[i])) {  // the names below, by first letter
      case 's':
        if (name_at(s, i, "script")) {
          const size_t stop = script_end(s, end);
          drop(end, stop);
          return can_go && stop < s.size() ? drop_element(out_begin, stop) : stop;
        }
        if (name_at(s, i, "style")) {
          const size_t stop = find_end_tag(s, end, "style");
          if (in_select) return stop;
          drop(end, stop);
          return can_go && stop < s.size() ? drop_element(out_begin, stop) : stop;
        }
        if (name_at(s, i, "svg")) return foreign_end(s, end, "svg");
        if (name_at(s, i, "select")) in_select = true;
        return end;
      case 'm':
        if (name_at(s, i, "meta") && can_go) out.resize(out_begin);
        return name_at(s, i, "math") ? foreign_end(s, end, "math") : end;
      case 'l':
      case 'b':
        if ((name_at(s, i, "link") || name_at(s, i, "base")) && can_go) out.resize(out_begin);
        return end;
      case 't':
        if (name_at(s, i, "title")) {
          // Its text is RCDATA: no tags, references decoded; pieces of it can be placeholders.
          const size_t stop = find_end_tag(s, end, "title");
          if (runs) text(end, stop);
          return stop;
        }
        if (name_at(s, i, "textarea")) return find_end_tag(s, end, "textarea");
        return end;
      case 'x': return name_at(s, i, "xmp") ? find_end_tag(s, end, "xmp") : end;
      case 'i': return name_at(s, i, "iframe") ? find_end_tag(s, end, "iframe") : end;
      case 'n':
        for (const char* raw : {"noembed", "noframes"})
          if (name_at(s, i, raw)) return find_end_tag(s, end, raw);
        return end;
      case 'p': return name_at(s, i, "plaintext") ? npos : end;
      case 'f': return name_at(s, i, "frameset") ? npos : end;
      default: return end;
    }
  }

  size_t run() {
    const size_t n = s.size();
    size_t removed = 0, i = 0;
    bool after_tag = false;  // s[i] follows a tag
    for (;;) {
      const size_t lt = s.find('<', i);
      const size_t to = lt == npos ? n : lt;
      // Whitespace-only text between two tags (whitespace_can_go); text that is not
      // whitespace leaves the initial insertion mode.
      size_t k = i;
      while (k < to && ws(s[k])) ++k;
      ws_begin = ws_end = npos;
      if (k == to && after_tag && to > i) {
        ws_begin = i;
        ws_end = to;
      }
      if (k < to) past_initial = true;
      if (runs) text(i, to);
      if (lt == npos || lt + 1 >= n) break;
      i = lt;
      after_tag = false;
      const char c = s[i + 1];
      if (alpha(c)) {
        i = start_tag(i + 1);
        if (i == npos) break;
        after_tag = true;
      } else if (c == '/' && i + 2 < n && alpha(s[i + 2])) {
        past_initial = true;
        after_tag = true;
        if (name_at(s, i + 2, "select")) in_select = false;
        size_t e = i + 2;
        while (e < n && !name_end(s[e])) ++e;
        bool closed = false;
        const size_t end = tag_end(s, e, nullptr, &closed);
        // An end tag's attributes and '/' are ignored by the parser: they go.
        if (!(closed && end_of(i + 2, e, i, end)) && drop_attributes && closed && end - 1 > e) drop(e, end - 1);
        i = end;
      } else if (s.compare(i, 4, "<!--") == 0) {
        const size_t e = comment_end(s, i + 4);
        drop(i, e);
        i = e;
      } else if (c == '!' || c == '?' || c == '/') {  // doctype, bogus comment: up to '>'
        if (c == '!' && i + 9 <= n && same_name(s.substr(i + 2, 7), "doctype")) past_initial = true;
        const size_t gt = s.find('>', i + 2);
        i = gt == npos ? n : gt + 1;
      } else {
        ++i;  // a '<' that is text
      }
    }
    removed = copied - out.size();  // (placeholders are counted against the text they replace)
    out.append(s, copied, n - copied);
    return removed;
  }
};

}  // namespace

size_t unclosed_title_end(std::string_view html) {
  for (size_t p = html.find('<'); p != npos; p = html.find('<', p + 1)) {
    if (!name_at(html, p + 1, "title")) continue;
    const size_t gt = html.find('>', p);
    if (gt == npos || find_end_tag(html, gt + 1, "title") != html.size()) return npos;
    return html.find('<', gt + 1);
  }
  return npos;
}

size_t strip_raw_text(std::string_view html, std::string& out, std::vector<TextRun>* runs, bool drop_attributes) {
  out.clear();
  out.reserve(html.size());
  if (runs) {
    runs->clear();
    if (has_private_use(html)) runs = nullptr;  // a placeholder could not be told from the page's own text
  }
  return Stripper(html, out, runs, drop_attributes).run();
}

size_t placeholder_at(std::string_view s, size_t i, size_t* bytes) {
  auto pua = [&](size_t k) -> long {
    if (k + 3 > s.size()) return -1;
    const auto a = static_cast<unsigned char>(s[k]), b = static_cast<unsigned char>(s[k + 1]),
               c = static_cast<unsigned char>(s[k + 2]);
    if ((a & 0xF0) != 0xE0) return -1;
    const unsigned cp = ((a & 0x0Fu) << 12) | ((b & 0x3Fu) << 6) | (c & 0x3Fu);
    return cp >= 0xE000 && cp < 0xE000 + kPlaceholderBase ? static_cast<long>(cp - 0xE000) : -1;
  };
  const long hi = pua(i);
  if (hi < 0) return npos;
  if (static_cast<size_t>(hi) < kPlaceholderSingle) {
    if (bytes) *bytes = 3;
    return static_cast<size_t>(hi);
  }
  const long lo = pua(i + 3);
  if (lo < 0) return npos;
  if (bytes) *bytes = 6;
  return kPlaceholderSingle + (static_cast<size_t>(hi) - kPlaceholderSingle) * kPlaceholderBase +
         static_cast<size_t>(lo);
}

namespace {

// Whether the code point of the UTF-8 sequence s[i, i + len) is one the parser replaces
// by U+FFFD: C0 controls but tab, LF, FF, CR; DEL and C1; U+FDD0..U+FDEF; U+xFFFE, U+xFFFF.
bool replaced_by_parser(std::string_view s, size_t i, size_t len) {
  uint32_t cp = static_cast<unsigned char>(s[i]);
  if (len > 1) cp &= 0xFFu >> (len + 1);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
  return (cp >= 0x1 && cp <= 0x8) || cp == 0xB || (cp >= 0xE && cp <= 0x1F) || (cp >= 0x7F && cp <= 0x9F) ||
         (cp >= 0xFDD0 && cp <= 0xFDEF) || (cp & 0xFFFF) == 0xFFFE || (cp & 0xFFFF) == 0xFFFF;
}

size_t utf8_length(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

}  // namespace

namespace {

// The first index at or after `i` that does not start eight printable ASCII bytes
// (0x20..0x7E, tested eight at a time), where a code point the parser changes may begin.
size_t skip_printable_ascii(std::string_view run, size_t i) {
  uint64_t x;
  while (i + 8 <= run.size() &&
         (std::memcpy(&x, run.data() + i, 8),
          (((x - 0x2020202020202020ULL) | x | ((x ^ 0x7F7F7F7F7F7F7F7FULL) - 0x0101010101010101ULL)) &
           0x8080808080808080ULL) == 0))
    i += 8;
  return i;
}

// The only lead bytes that can start a code point the parser changes (controls, DEL,
// C1 controls after 0xC2, noncharacters and U+FFFD-adjacent forms after 0xEF, astral
// planes' noncharacters after 0xF0..0xF4).
bool may_start_changed(unsigned char c) {
  return c < 0x20 || c == 0x7F || c == 0xC2 || c == 0xEF || (c >= 0xF0 && c <= 0xF4);
}

// Where the first byte of `run` at or after `i` that may start a code point the parser
// changes is (append_as_parsed); run.size() if none.
size_t first_changed(std::string_view run, size_t i) {
  while (i < run.size()) {
    i = skip_printable_ascii(run, i);  // nothing changes there
    if (i >= run.size()) break;
    const auto c = static_cast<unsigned char>(run[i]);
    const bool maybe = may_start_changed(c);
    if (maybe && !(c < 0x20 && (c == '\t' || c == '\n' || c == '\f'))) return i;
    i += std::min(utf8_length(c), run.size() - i);
  }
  return run.size();
}

}  // namespace

std::string_view as_parsed(std::string_view run, std::string& scratch) {
  if (first_changed(run, 0) == run.size()) return run;
  scratch.clear();
  append_as_parsed(scratch, run);
  return scratch;
}

void append_as_parsed(std::string& out, std::string_view run) {
  size_t from = 0;  // run[from, i) not yet copied
  for (size_t i = 0; i < run.size();) {
    i = skip_printable_ascii(run, i);  // nothing changes there
    if (i >= run.size()) break;
    const auto c = static_cast<unsigned char>(run[i]);
    const size_t len = std::min(utf8_length(c), run.size() - i);
    // Only these lead bytes can start a code point that changes.
    const bool maybe = may_start_changed(c);
    if (!maybe || (c < 0x20 && (c == '\t' || c == '\n' || c == '\f'))) {
      i += len;
      continue;
    }
    out.append(run, from, i - from);
    if (c == '\r') {
      out += '\n';
      i += (i + 1 < run.size() && run[i + 1] == '\n') ? 2 : 1;
    } else {
      if (replaced_by_parser(run, i, len))
        out += "\xEF\xBF\xBD";
      else
        out.append(run, i, len);
      i += len;
    }
    from = i;
  }
  out.append(run, from, run.size() - from);
}

}  // namespace mtnlg::extract
