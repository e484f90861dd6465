// One web page to clean text: see page.hpp and docs/specs/justext.md.
#include "data/extract/page.hpp"

#include "data/extract/strip.hpp"

#include <cld2/public/compact_lang_det.h>
#include <gumbo.h>
#include <iconv.h>
#include <uchardet/uchardet.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace mtnlg::extract {

namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string lower_str(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = lower(c);
  return out;
}

// English function words: the stop words of the block classifier (written for mtnlg).
const std::unordered_set<std::string_view>& english_stopwords() {
  static const std::unordered_set<std::string_view> set = {
      "a",         "about",    "above",      "after",   "again",      "against", "all",     "almost",    "also",
      "although",  "always",   "am",         "among",   "an",         "and",     "another", "any",       "are",
      "around",    "as",       "at",         "be",      "because",    "been",    "before",  "being",     "below",
      "between",   "both",     "but",        "by",      "can",        "cannot",  "could",   "did",       "do",
      "does",      "doing",    "done",       "down",    "during",     "each",    "either",  "else",      "enough",
      "even",      "ever",     "every",      "few",     "for",        "from",    "further", "had",       "has",
      "have",      "having",   "he",         "her",     "here",       "hers",    "herself", "him",       "himself",
      "his",       "how",      "however",    "i",       "if",         "in",      "into",    "is",        "it",
      "its",       "itself",   "just",       "least",   "less",       "like",    "made",    "make",      "many",
      "may",       "me",       "might",      "more",    "most",       "much",    "must",    "my",        "myself",
      "neither",   "never",    "no",         "nor",     "not",        "now",     "of",      "off",       "often",
      "on",        "once",     "one",        "only",    "or",         "other",   "others",  "our",       "ours",
      "ourselves", "out",      "over",       "own",     "per",        "perhaps", "quite",   "rather",    "same",
      "she",       "should",   "since",      "so",      "some",       "still",   "such",    "than",      "that",
      "the",       "their",    "theirs",     "them",    "themselves", "then",    "there",   "therefore", "these",
      "they",      "this",     "those",      "though",  "through",    "thus",    "to",      "too",       "under",
      "until",     "up",       "upon",       "us",      "very",       "was",     "we",      "well",      "were",
      "what",      "when",     "where",      "whether", "which",      "while",   "who",     "whom",      "whose",
      "why",       "will",     "with",       "within",  "without",    "would",   "yet",     "you",       "your",
      "yours",     "yourself", "yourselves", "it's",    "don't",      "isn't",   "can't",   "won't",     "didn't",
      "doesn't",   "there's",  "that's",     "i'm",     "you're",     "we're",   "they're", "let",       "get",
      "got",       "two",      "first",      "new",     "way",        "use",     "used",    "any",       "because",
      "own"};
  return set;
}

// ASCII upper case to lower case in each byte of x; other bytes (UTF-8 too) unchanged.
uint64_t lower8(uint64_t x) {
  constexpr uint64_t kOnes = 0x0101010101010101ULL, kHigh = 0x8080808080808080ULL;
  const uint64_t seven = x & ~kHigh;
  const uint64_t ge_a = seven + kOnes * (0x80 - 'A'), gt_z = seven + kOnes * (0x80 - 'Z' - 1);
  const uint64_t upper = ge_a & ~gt_z & ~x & kHigh;
  return x | (upper >> 2);
}

// Word lookup (stop words, furniture words): each word (at most 15 bytes, lower case)
// zero-padded to 16 bytes and read as two 64-bit words, in an open-addressing table a
// quarter full. A lookup is a multiply, a shift and usually one compare (a list per
// (length, first letter) with memcmp on each entry cost ~100 instructions a word). The
// text holds no NUL (the parser drops them), so the padding cannot match a word's own
// bytes.
class WordTable {
 public:
  static constexpr size_t kMaxLen = 15;
  // A word as two 64-bit words: its bytes (lower case) in memory order, zeros after.
  struct Key {
    uint64_t lo = 0, hi = 0;
    bool empty() const { return lo == 0 && hi == 0; }
  };
  explicit WordTable(const std::unordered_set<std::string_view>& words) {
    for (auto w : words) {
      if (w.empty() || w.size() > kMaxLen) continue;
      const auto* p = reinterpret_cast<const unsigned char*>(w.data());
      const Key k = key(p, w.size(), p + w.size());
      size_t i = hash(k);
      while (!table_[i].empty()) i = (i + 1) & kMask;
      table_[i] = k;
    }
  }
  // The key of w[0, len) (1 <= len <= kMaxLen), lower-cased: 16 or 8 bytes read at once
  // when the text has them (`end` is its end), else byte by byte (a copy through a buffer
  // stalls the loads on the stores, and short blocks have most words near their end).
  static Key key(const unsigned char* w, size_t len, const unsigned char* end) {
    Key k;
    if (end - w >= 16) {
      std::memcpy(&k.lo, w, 8);
      std::memcpy(&k.hi, w + 8, 8);
    } else if (len <= 8 && end - w >= 8) {
      std::memcpy(&k.lo, w, 8);
    } else {
      for (size_t b = 0; b < len; ++b) (b < 8 ? k.lo : k.hi) |= uint64_t{w[b]} << (8 * (b % 8));
    }
    static_assert(std::endian::native == std::endian::little, "keys are bytes in memory order");
    if (len < 8) {
      k.lo &= (uint64_t{1} << (8 * len)) - 1;
      k.hi = 0;
    } else if (len < 16) {
      k.hi &= (uint64_t{1} << (8 * (len - 8))) - 1;
    }
    k.lo = lower8(k.lo);
    k.hi = lower8(k.hi);
    return k;
  }
  bool contains(const Key& k) const {
    for (size_t i = hash(k);; i = (i + 1) & kMask) {
      if (table_[i].empty()) return false;
      if (table_[i].lo == k.lo && table_[i].hi == k.hi) return true;
    }
  }

 private:
  static constexpr size_t kBits = 10, kMask = (size_t{1} << kBits) - 1;
  static size_t hash(const Key& k) {
    return static_cast<size_t>(((k.lo * 0x9E3779B97F4A7C15ULL) ^ (k.hi * 0xC2B2AE3D27D4EB4FULL)) >> (64 - kBits));
  }
  std::array<Key, size_t{1} << kBits> table_{};
};

const WordTable& english_stopword_table() {
  static const WordTable table(english_stopwords());
  return table;
}

// Class/id words that mark page furniture rather than content.
const WordTable& furniture_words() {
  static const WordTable table(std::unordered_set<std::string_view>{
      "cookie",    "cookies", "consent",  "gdpr",          "nav",         "navbar",     "navigation",
      "menu",      "footer",  "sidebar",  "breadcrumb",    "breadcrumbs", "share",      "sharing",
      "social",    "banner",  "advert",   "advertisement", "ads",         "promo",      "newsletter",
      "subscribe", "skip",    "toolbar",  "masthead",      "sitemap",     "pagination", "related",
      "signature", "donate",  "donation", "editsection",   "tooltip",     "disclosure", "disclaimer"});
  return table;
}

// Class/id words of boxes that hold the article's own text as often as furniture: a
// paywall or premium box around the rest of the article, an embed. Such a box is
// furniture only when it holds no prose (resolve_furniture).
const WordTable& soft_furniture_words() {
  static const WordTable table(std::unordered_set<std::string_view>{"paywall", "premium", "embed", "embedded",
                                                                    "metered", "regwall", "locked", "piano"});
  return table;
}

// Class/id words of an author's box: furniture when it holds prose (a bio), not when it is
// a byline alone (resolve_furniture).
const WordTable& author_words() {
  static const WordTable table(std::unordered_set<std::string_view>{"author", "authors", "autor", "autorin"});
  return table;
}

// Class/id/itemprop/itemtype words that mark user-generated sections: comments and reviews.
const WordTable& comment_words() {
  static const WordTable table(std::unordered_set<std::string_view>{
      "comment",    "comments",    "commentlist", "kommentar", "kommentare", "commentaire", "commentaires",
      "comentario", "comentarios", "commenti",    "commento",  "disqus",     "talkback",    "review",
      "reviews",    "bewertung",   "bewertungen", "opiniones", "recensioni", "usercomments"});
  return table;
}

bool alnum_byte(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// Whether the word w (lower case) holds `part` and is not `except` (nor holds it).
bool holds(std::string_view w, std::string_view part, std::string_view except) {
  return w.find(part) != std::string_view::npos && w.find(except) == std::string_view::npos;
}

}  // namespace

namespace {

// A class token naming the post's category or tag ("category-reviews", "tag-menu",
// "entry-category-camera_reviews"): the topic of the text, not the kind of box; its
// words mark nothing.
bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }
bool taxonomy_token(std::string_view rest) {
  const std::string tok = lower_str(rest.substr(0, std::min(rest.find_first_of(" \t\n\r\f"), size_t{64})));
  return tok.starts_with("tag-") || tok.starts_with("tag_") || tok.find("category-") != std::string::npos ||
         tok.find("category_") != std::string::npos;
}

// Whether the whitespace-separated token starting at `rest` names a post's body
// (kMarkPostBody), compared without case and without a copy.
bool post_body_token(std::string_view rest) {
  const size_t end = std::min(rest.find_first_of(" \t\n\r\f"), rest.size());
  if (end < 9 || end > 13) return false;
  const std::string_view tok = rest.substr(0, end);
  for (const std::string_view name :
       {"entry-content", "articlebody", "reviewbody", "post-body", "entry-body", "post-content", "article-body"}) {
    if (name.size() != tok.size()) continue;
    size_t k = 0;
    while (k < tok.size() && lower(tok[k]) == name[k]) ++k;
    if (k == tok.size()) return true;
  }
  return false;
}

}  // namespace

namespace {

// Whether the whitespace-separated value `v` holds the token `token` (lower case), in any case.
bool has_token(std::string_view v, std::string_view token) {
  for (size_t i = 0; i < v.size();) {
    while (i < v.size() && is_space(static_cast<unsigned char>(v[i]))) ++i;
    size_t j = i;
    while (j < v.size() && !is_space(static_cast<unsigned char>(v[j]))) ++j;
    if (j - i == token.size() && lower_str(v.substr(i, j - i)) == token) return true;
    i = j;
  }
  return false;
}

// The marks of the words of `v`; with `terms`, a token holding '-' marks nothing (a term
// of one of the post's taxonomies, see attribute_marks).
uint8_t word_marks(std::string_view v, bool terms) {
  const auto* t = reinterpret_cast<const unsigned char*>(v.data());
  const size_t n = v.size();
  const WordTable& furniture = furniture_words();
  const WordTable& comments = comment_words();
  const WordTable& soft = soft_furniture_words();
  const WordTable& author = author_words();
  uint8_t marks = 0;
  for (size_t i = 0; i < n;) {
    if (!alnum_byte(t[i])) {
      ++i;
      continue;
    }
    const bool token_start = i == 0 || is_space(t[i - 1]);
    if (token_start && post_body_token(v.substr(i))) {  // its words say nothing more ("reviewBody": no review section)
      marks |= kMarkPostBody;
      while (i < n && !is_space(t[i])) ++i;
      continue;
    }
    if (token_start &&
        (taxonomy_token(v.substr(i)) ||
         (terms && v.substr(i, v.find_first_of(" \t\n\r\f", i) - i).find('-') != std::string_view::npos))) {
      while (i < n && !is_space(t[i])) ++i;
      continue;
    }
    size_t j = i + 1;  // a word: ASCII letters and digits, lower-cased
    // A word ends where a lower-case letter meets an upper-case one too ("mainNav").
    while (j < n && alnum_byte(t[j]) && !(t[j] >= 'A' && t[j] <= 'Z' && t[j - 1] >= 'a' && t[j - 1] <= 'z')) ++j;
    if (j - i <= WordTable::kMaxLen) {
      const auto k = WordTable::key(t + i, j - i, t + n);
      if (furniture.contains(k)) marks |= kMarkFurniture;
      if (comments.contains(k)) marks |= kMarkComment;
      if (soft.contains(k)) marks |= kMarkSoftFurniture;
      if (author.contains(k)) marks |= kMarkAuthor;
    }
    if (!(marks & kMarkComment) && j - i >= 6) {  // "commentlist", "customerReviews"
      const std::string w = lower_str(v.substr(i, j - i));
      if (holds(w, "comment", "commentary") || (holds(w, "review", "preview") && w != "hreview")) marks |= kMarkComment;
    }
    i = j;
  }
  return marks;
}

}  // namespace

// WordPress's post element lists the post's terms of every taxonomy as class tokens beside
// hAtom's "hentry" ("category-news", "tag-cuba", "internet-estallido-comentarios"): there a
// hyphenated token is the post's topic, and no comment section.
uint8_t attribute_marks(std::string_view v) {
  const uint8_t marks = word_marks(v, false);
  if ((marks & kMarkComment) && has_token(v, "hentry")) return word_marks(v, true);
  return marks;
}

namespace {

bool is_skipped(GumboTag t) {
  switch (t) {
    case GUMBO_TAG_SCRIPT:
    case GUMBO_TAG_STYLE:
    case GUMBO_TAG_NOSCRIPT:
    case GUMBO_TAG_TEMPLATE:
    case GUMBO_TAG_HEAD:
    case GUMBO_TAG_SVG:
    case GUMBO_TAG_MATH:
    case GUMBO_TAG_IFRAME:
    case GUMBO_TAG_OBJECT:
    case GUMBO_TAG_EMBED:
    case GUMBO_TAG_SELECT:
    case GUMBO_TAG_OPTION:
    case GUMBO_TAG_BUTTON:
    case GUMBO_TAG_TEXTAREA:
    case GUMBO_TAG_INPUT:
    case GUMBO_TAG_CANVAS:
    case GUMBO_TAG_AUDIO:
    case GUMBO_TAG_VIDEO:
    case GUMBO_TAG_MAP:
    case GUMBO_TAG_APPLET: return true;
    default: return false;
  }
}

bool is_block(GumboTag t) {
  switch (t) {
    case GUMBO_TAG_ADDRESS:
    case GUMBO_TAG_ARTICLE:
    case GUMBO_TAG_ASIDE:
    case GUMBO_TAG_BLOCKQUOTE:
    case GUMBO_TAG_BODY:
    case GUMBO_TAG_CAPTION:
    case GUMBO_TAG_CENTER:
    case GUMBO_TAG_DD:
    case GUMBO_TAG_DETAILS:
    case GUMBO_TAG_DIR:
    case GUMBO_TAG_DIV:
    case GUMBO_TAG_DL:
    case GUMBO_TAG_DT:
    case GUMBO_TAG_FIELDSET:
    case GUMBO_TAG_FIGCAPTION:
    case GUMBO_TAG_FIGURE:
    case GUMBO_TAG_FOOTER:
    case GUMBO_TAG_FORM:
    case GUMBO_TAG_H1:
    case GUMBO_TAG_H2:
    case GUMBO_TAG_H3:
    case GUMBO_TAG_H4:
    case GUMBO_TAG_H5:
    case GUMBO_TAG_H6:
    case GUMBO_TAG_HEADER:
    case GUMBO_TAG_HR:
    case GUMBO_TAG_LI:
    case GUMBO_TAG_MAIN:
    case GUMBO_TAG_MENU:
    case GUMBO_TAG_NAV:
    case GUMBO_TAG_OL:
    case GUMBO_TAG_P:
    case GUMBO_TAG_PRE:
    case GUMBO_TAG_SECTION:
    case GUMBO_TAG_SUMMARY:
    case GUMBO_TAG_TABLE:
    case GUMBO_TAG_TBODY:
    case GUMBO_TAG_TD:
    case GUMBO_TAG_TFOOT:
    case GUMBO_TAG_TH:
    case GUMBO_TAG_THEAD:
    case GUMBO_TAG_TR:
    case GUMBO_TAG_UL:
    case GUMBO_TAG_BR:
    case GUMBO_TAG_HTML:
    case GUMBO_TAG_LEGEND:
    case GUMBO_TAG_OPTGROUP:
    case GUMBO_TAG_TITLE: return true;
    default: return false;
  }
}

bool is_heading(GumboTag t) {
  return t == GUMBO_TAG_H1 || t == GUMBO_TAG_H2 || t == GUMBO_TAG_H3 || t == GUMBO_TAG_H4 || t == GUMBO_TAG_H5 ||
         t == GUMBO_TAG_H6;
}

// Code points of UTF-8 text: its bytes less the continuation bytes (10xxxxxx), counted
// eight at a time.
int64_t code_points(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  int64_t continuation = 0;
  size_t i = 0;
  for (uint64_t x; i + 8 <= n; i += 8) {
    std::memcpy(&x, p + i, 8);
    continuation += std::popcount(x & ~(x << 1) & 0x8080808080808080ULL);
  }
  for (; i < n; ++i) continuation += (p[i] & 0xC0) == 0x80;
  return static_cast<int64_t>(n) - continuation;
}

// Where the first whitespace byte (kSpace) at or after `i` is; n if none; eight bytes at a
// time.
size_t next_space(const unsigned char* t, size_t i, size_t n);

constexpr std::array<bool, 256> kSpace = [] {
  std::array<bool, 256> t{};
  for (unsigned char c : {' ', '\t', '\n', '\r', '\f', '\v'}) t[c] = true;
  return t;
}();
bool space(char c) { return kSpace[static_cast<unsigned char>(c)]; }

// 0x80 in each byte of x that is whitespace (kSpace: 0x09..0x0D, 0x20), 0 elsewhere; exact
// (no carries between bytes).
uint64_t whitespace_mask(uint64_t x) {
  constexpr uint64_t k7F = 0x7F7F7F7F7F7F7F7FULL, k80 = 0x8080808080808080ULL;
  const uint64_t sp = x ^ 0x2020202020202020ULL;
  const uint64_t is_space = ~(((sp & k7F) + k7F) | sp | k7F);
  const uint64_t low = x & k7F;
  const uint64_t ge9 = low + 0x7777777777777777ULL, ge14 = low + 0x7272727272727272ULL;
  return (is_space | (ge9 & ~ge14 & ~x)) & k80;
}

size_t next_space(const unsigned char* t, size_t i, size_t n) {
  for (uint64_t x; i + 8 <= n; i += 8) {
    std::memcpy(&x, t + i, 8);
    if (const uint64_t m = whitespace_mask(x)) return i + static_cast<size_t>(std::countr_zero(m)) / 8;
  }
  for (; i < n; ++i)
    if (kSpace[t[i]]) return i;
  return n;
}

// Byte classes for counting words: whitespace (as kSpace), ASCII punctuation (std::ispunct's
// in the "C" locale), anything else (letters, digits, UTF-8 bytes).
constexpr uint8_t kOtherByte = 0, kSpaceByte = 1, kPunctByte = 2;
constexpr std::array<uint8_t, 256> kByteClass = [] {
  std::array<uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    if (kSpace[static_cast<size_t>(c)])
      t[static_cast<size_t>(c)] = kSpaceByte;
    else if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))
      t[static_cast<size_t>(c)] = kPunctByte;
  }
  return t;
}();

struct Walker {
  ParsedPage page;
  Block cur;
  int link = 0, pre = 0, heading = 0, h1 = 0, boiler = 0, article = 0;
  std::vector<int32_t> open;                        // the block-level elements open, innermost last
  const std::vector<TextRun>* runs = nullptr;       // the text runs behind placeholders
  bool names = false;                               // keep each element's name (ParsedPage::node_names)
  int noscript_depth = 0;                           // inside <noscript> elements
  std::vector<std::pair<size_t, size_t>> noscript;  // the blocks [from, to) of each outermost <noscript>
  std::string parsed;                               // a text run as parsed, when that differs from the run
  const WordTable& stop = english_stopword_table();

  // Words, stop words and code points of the current block: words are split at
  // whitespace, ASCII-lowered, with edge punctuation stripped (a leading apostrophe stays);
  // a word longer than any stop word is not looked up.
  void count_words() {
    const auto* t = reinterpret_cast<const unsigned char*>(cur.text.data());
    const size_t n = cur.text.size();
    int64_t words = 0, stopwords = 0;
    // The words are the non-empty gaps between whitespace bytes, found eight bytes at a time.
    size_t from = 0;  // where the current gap starts
    auto word = [&](size_t a, size_t b) {
      if (a >= b) return;
      ++words;
      while (a < b && kByteClass[t[a]] == kPunctByte && t[a] != '\'') ++a;
      while (b > a && kByteClass[t[b - 1]] == kPunctByte) --b;
      if (b > a && b - a <= WordTable::kMaxLen) stopwords += stop.contains(WordTable::key(t + a, b - a, t + n));
    };
    size_t i = 0;
    for (uint64_t x; i + 8 <= n; i += 8) {
      std::memcpy(&x, t + i, 8);
      for (uint64_t m = whitespace_mask(x); m != 0; m &= m - 1) {
        const size_t at = i + static_cast<size_t>(std::countr_zero(m)) / 8;
        word(from, at);
        from = at + 1;
      }
    }
    for (; i < n; ++i)
      if (kSpace[t[i]]) {
        word(from, i);
        from = i + 1;
      }
    word(from, n);
    cur.words = words;
    cur.stopwords = stopwords;
    cur.chars = code_points(cur.text);
    // CJK code points (lead bytes E3..ED: U+3000..U+D7FF) count three times in the length
    // tests: a character there carries about what a short word does elsewhere.
    int64_t cjk = 0;
    for (size_t k = 0; k < n; ++k) cjk += t[k] >= 0xE3 && t[k] <= 0xED;
    cur.length = cur.chars + 2 * cjk;
  }

  void flush() {
    // Trim the trailing space of collapsed text.
    while (!cur.text.empty() && cur.text.back() == ' ') cur.text.pop_back();
    if (!cur.text.empty()) {
      count_words();
      page.blocks.push_back(std::move(cur));
    }
    cur = Block{};
    cur.heading = heading > 0;
    cur.h1 = h1 > 0;
    cur.pre = pre > 0;
    cur.boilerplate_context = boiler > 0;
  }

  // A text node's text, each placeholder of strip_raw_text replaced by its text run as
  // the parser would have read it.
  void text(std::string_view s) {
    if (!runs || runs->empty()) {
      append_text(s);
      return;
    }
    size_t from = 0;  // s[from, i) not yet appended
    for (size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c != 0xEE && c != 0xEF) continue;
      size_t bytes = 0;
      const size_t k = placeholder_at(s, i, &bytes);
      if (k >= runs->size()) continue;
      append_text(s.substr(from, i - from));
      const TextRun& run = (*runs)[k];
      link += run.link;  // the text of an <a> the pass took out with it
      append_text(as_parsed(run.text, parsed));
      link -= run.link;
      i += bytes - 1;
      from = i + 1;
    }
    append_text(s.substr(from));
  }

  // Appends `s` to `out` with its placeholders replaced by their runs as parsed.
  void expand_into(std::string& out, std::string_view s) {
    size_t from = 0;  // s[from, i) not yet appended
    for (size_t i = 0; runs && i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c != 0xEE && c != 0xEF) continue;
      size_t bytes = 0;
      const size_t k = placeholder_at(s, i, &bytes);
      if (k >= runs->size()) continue;
      out.append(s, from, i - from);
      out += as_parsed((*runs)[k].text, parsed);
      i += bytes - 1;
      from = i + 1;
    }
    out.append(s, from, s.size() - from);
  }

  // Appends text to the current block, whitespace runs collapsed to one space (none at
  // the start) outside <pre>. Appending a text in pieces gives what appending it whole does.
  void append_text(std::string_view s) {
    if (cur.text.empty()) {
      cur.heading = heading > 0;
      cur.h1 = h1 > 0;
      cur.pre = pre > 0;
      cur.boilerplate_context = boiler > 0;
      cur.node = open.empty() ? -1 : open.back();
    }
    const size_t before = cur.text.size();
    if (pre > 0) {
      cur.text += s;
    } else {
      const auto* t = reinterpret_cast<const unsigned char*>(s.data());
      const size_t n = s.size();
      for (size_t p = 0; p < n;) {
        if (kSpace[t[p]]) {
          if (!cur.text.empty() && cur.text.back() != ' ') cur.text += ' ';
          ++p;
          continue;
        }
        // Words with single spaces between them go in at once.
        size_t e = next_space(t, p, n);
        while (e + 1 < n && t[e] == ' ' && !kSpace[t[e + 1]]) e = next_space(t, e + 1, n);
        cur.text.append(s, p, e - p);
        p = e;
      }
    }
    // Soft hyphens (U+00AD) mark where a word may break; they are not text ("Mit\u00ADtel\u00ADal\u00ADter").
    if (s.find("\xC2\xAD") != std::string_view::npos)
      for (size_t k = cur.text.find("\xC2\xAD", before); k != std::string::npos; k = cur.text.find("\xC2\xAD", k))
        cur.text.erase(k, 2);
    if (link > 0) cur.link_chars += code_points(std::string_view(cur.text).substr(before));
  }

  // The values of the attributes the walk reads (the first of each name, in any case, as
  // gumbo_get_attribute finds it), in one pass over the element's attributes.
  struct ReadAttributes {
    const char *hidden = nullptr, *aria_hidden = nullptr, *cls = nullptr, *id = nullptr, *role = nullptr,
               *itemprop = nullptr, *itemtype = nullptr, *lang = nullptr, *style = nullptr;
    explicit ReadAttributes(const GumboElement& e) {
      for (unsigned k = 0; k < e.attributes.length; ++k) {
        const auto* at = static_cast<const GumboAttribute*>(e.attributes.data[k]);
        const char*& slot = slot_of(at->name);
        if (&slot != &ignored && !slot) slot = at->value;
      }
    }

   private:
    const char* ignored = nullptr;
    static bool named(const char* name, std::string_view lower_name) {
      size_t k = 0;
      for (; k < lower_name.size(); ++k)
        if (name[k] == '\0' || lower(name[k]) != lower_name[k]) return false;
      return name[k] == '\0';
    }
    const char*& slot_of(const char* name) {
      switch (lower(name[0])) {
        case 'h': return named(name, "hidden") ? hidden : ignored;
        case 'a': return named(name, "aria-hidden") ? aria_hidden : ignored;
        case 'c': return named(name, "class") ? cls : ignored;
        case 'i':
          return named(name, "id")         ? id
                 : named(name, "itemprop") ? itemprop
                 : named(name, "itemtype") ? itemtype
                                           : ignored;
        case 'l': return named(name, "lang") ? lang : ignored;
        case 'r': return named(name, "role") ? role : ignored;
        case 's': return named(name, "style") ? style : ignored;
        default: return ignored;
      }
    }
  };

  // "div#id.class.class" (what --explain prints of an element).
  static std::string node_name(const GumboElement& e, const ReadAttributes& a) {
    std::string out = gumbo_normalized_tagname(e.tag);
    if (out.empty()) out = "element";
    if (a.id) (out += '#') += a.id;
    for (std::string_view c = a.cls ? a.cls : ""; !c.empty();) {
      const size_t sp = c.find_first_of(" \t\n\r\f");
      if (sp != 0) (out += '.') += c.substr(0, sp);
      c = sp == std::string_view::npos ? std::string_view() : c.substr(sp + 1);
    }
    return out;
  }

  // A node other than an element: text, whitespace, or the document (its children walked);
  // comments and the rest are not text.
  void walk_other(const GumboNode* n) {
    if (n->type == GUMBO_NODE_TEXT || n->type == GUMBO_NODE_CDATA) {
      text(n->v.text.text);
    } else if (n->type == GUMBO_NODE_WHITESPACE) {
      if (!cur.text.empty()) text(" ");
    } else if (n->type == GUMBO_NODE_DOCUMENT) {
      for (unsigned i = 0; i < n->v.document.children.length; ++i)
        walk(static_cast<const GumboNode*>(n->v.document.children.data[i]));
    }
  }

  // <head> (only its title is wanted) or the first <title>.
  void walk_head(const GumboElement& e) {
    for (unsigned i = 0; i < e.children.length; ++i) {
      const auto* c = static_cast<const GumboNode*>(e.children.data[i]);
      if (e.tag == GUMBO_TAG_TITLE && c->type == GUMBO_NODE_TEXT) expand_into(page.title, c->v.text.text);
      if (e.tag == GUMBO_TAG_HEAD && c->type == GUMBO_NODE_ELEMENT && c->v.element.tag == GUMBO_TAG_TITLE) walk(c);
    }
  }

  // Whether element t opens page furniture (navigation, footer, a banner, a dialog, a
  // figure's caption, or furniture words in its class or id outside the page's and the
  // content's own elements).
  bool furniture(GumboTag t, const ReadAttributes& a, uint8_t marks, bool page_or_content,
                 bool article_header = false) const {
    return t == GUMBO_TAG_NAV || t == GUMBO_TAG_FOOTER || t == GUMBO_TAG_ASIDE || t == GUMBO_TAG_FIGCAPTION ||
           (t == GUMBO_TAG_HEADER && article == 0 && !article_header) ||
           (!page_or_content && (marks & (kMarkFurniture | kMarkSoftFurniture))) ||
           (a.role && (std::strcmp(a.role, "navigation") == 0 || std::strcmp(a.role, "banner") == 0 ||
                       std::strcmp(a.role, "contentinfo") == 0 || std::strcmp(a.role, "dialog") == 0));
  }

  // Enters (d = +1) or leaves (d = -1) element t: the counts of the enclosing elements
  // that colour the text inside them.
  void nest(GumboTag t, bool ctx, bool art, int d) {
    link += d * (t == GUMBO_TAG_A);
    pre += d * (t == GUMBO_TAG_PRE);
    heading += d * is_heading(t);
    h1 += d * (t == GUMBO_TAG_H1);
    boiler += d * ctx;
    article += d * art;
  }

  // A browser running scripts reads a <noscript> as text up to the first </noscript>; a
  // parser that does not builds elements from it, and an unbalanced one
  // (`<noscript><div></noscript>` ... `<noscript></div></noscript>`) then holds the whole
  // page. Its blocks are read, and kept only when they hold more than half of the page's
  // text (drop_noscript).
  void walk_noscript(const GumboElement& e) {
    flush();
    const size_t from = page.blocks.size();
    ++noscript_depth;
    for (unsigned i = 0; i < e.children.length; ++i) walk(static_cast<const GumboNode*>(e.children.data[i]));
    flush();
    --noscript_depth;
    if (page.blocks.size() > from) noscript.emplace_back(from, page.blocks.size());
  }
  void drop_noscript() {
    int64_t all = 0, inside = 0;
    for (const auto& b : page.blocks) all += b.chars;
    for (const auto& [from, to] : noscript)
      for (size_t k = from; k < to; ++k) inside += page.blocks[k].chars;
    if (2 * inside > all) return;
    for (auto r = noscript.rbegin(); r != noscript.rend(); ++r)
      page.blocks.erase(page.blocks.begin() + static_cast<std::ptrdiff_t>(r->first),
                        page.blocks.begin() + static_cast<std::ptrdiff_t>(r->second));
  }

  // Whether the next element after n (its parent's child) is an <article>: a <header> right
  // before one is the article's (its title and byline), not the page's.
  static bool before_article(const GumboNode* n) {
    if (!n->parent || n->parent->type != GUMBO_NODE_ELEMENT) return false;
    const GumboVector& kids = n->parent->v.element.children;
    for (unsigned i = n->index_within_parent + 1; i < kids.length; ++i) {
      const auto* k = static_cast<const GumboNode*>(kids.data[i]);
      if (k->type == GUMBO_NODE_ELEMENT) return k->v.element.tag == GUMBO_TAG_ARTICLE;
    }
    return false;
  }

  void walk(const GumboNode* n) {
    if (n->type != GUMBO_NODE_ELEMENT && n->type != GUMBO_NODE_TEMPLATE) return walk_other(n);
    const GumboElement& e = n->v.element;
    const GumboTag t = e.tag;
    if ((t == GUMBO_TAG_TITLE && page.title.empty()) || t == GUMBO_TAG_HEAD) return walk_head(e);
    if (t == GUMBO_TAG_NOSCRIPT && noscript_depth == 0) return walk_noscript(e);
    if (is_skipped(t) && !(t == GUMBO_TAG_NOSCRIPT && noscript_depth > 0)) return;
    const ReadAttributes a(e);
    if (a.hidden) return;
    if (a.aria_hidden && std::strcmp(a.aria_hidden, "true") == 0) return;
    if (a.style && style_hides(a.style)) return;
    const bool block = is_block(t);
    // Class and id words describe the page on <html> and <body> ("navigation-with-keyboard",
    // "has-sidebar") and the content on <main> and <article>: furniture elsewhere only.
    const bool page_or_content =
        t == GUMBO_TAG_HTML || t == GUMBO_TAG_BODY || t == GUMBO_TAG_MAIN || t == GUMBO_TAG_ARTICLE;
    // The marks of class, id, itemprop and itemtype together (the pass before the parse
    // folds the four into one attribute with the same marks). A comment mark counts on
    // <article> (a comment is often one) but not on the page's <html>, <body> or <main>
    // ("comments-open").
    uint8_t marks = 0;
    for (const char* v : {a.cls, a.id, a.itemprop, a.itemtype})
      if (v) marks |= attribute_marks(v);
    if (t == GUMBO_TAG_HTML && a.lang && page.lang.empty()) page.lang = a.lang;
    const bool furn = furniture(t, a, marks, page_or_content, t == GUMBO_TAG_HEADER && before_article(n));
    const bool art = t == GUMBO_TAG_ARTICLE || t == GUMBO_TAG_MAIN;
    // Furniture inside a heading ("[edit]", an anchor or share link) is not its text.
    if (furn && heading > 0 && !block) return;
    if (block) flush();
    // Block-level elements that can hold text are the nodes of the content container. A
    // furniture node is marked, and whether its text is furniture is decided once its
    // prose is known (resolve_furniture); an inline one colours its text at once.
    const bool node = block && t != GUMBO_TAG_BR && t != GUMBO_TAG_HR;
    const bool ctx = furn && !node;
    if (node) {
      open.push_back(static_cast<int32_t>(page.parent.size()));
      page.parent.push_back(open.size() > 1 ? open[open.size() - 2] : -1);
      const bool page_element = t == GUMBO_TAG_HTML || t == GUMBO_TAG_BODY || t == GUMBO_TAG_MAIN;
      const bool soft =
          furn && (marks & kMarkSoftFurniture) && !furniture(t, a, marks & ~kMarkSoftFurniture, page_or_content);
      const bool words = furn && !furniture(t, a, 0, page_or_content);
      const bool author = (marks & kMarkAuthor) && !page_or_content;
      page.marks.push_back(static_cast<uint8_t>((page_element ? 0 : (marks & (kMarkComment | kMarkPostBody))) |
                                                (author ? kNodeAuthor : 0) | (t == GUMBO_TAG_TR ? kNodeRow : 0) |
                                                (furn ? kNodeFurniture : 0) | (soft ? kNodeSoft : 0) |
                                                (words ? kNodeWords : 0)));
      page.tags.push_back(static_cast<uint8_t>(std::min<int>(t, UINT8_MAX)));
      if (names) page.node_names.push_back(node_name(e, a));
    }
    nest(t, ctx, art, +1);
    if (block) {
      cur.heading = heading > 0;
      cur.h1 = h1 > 0;
      cur.pre = pre > 0;
      cur.boilerplate_context = boiler > 0;
    }
    for (unsigned i = 0; i < e.children.length; ++i) walk(static_cast<const GumboNode*>(e.children.data[i]));
    nest(t, ctx, art, -1);
    if (block) flush();
    if (node) open.pop_back();
    if (!block && t != GUMBO_TAG_A && !cur.text.empty() && cur.text.back() != ' ') {
      // Inline elements keep words apart only where the source had spaces; nothing to add.
    }
  }
};

// Nearest class among {good, bad} before (dir -1) or after (dir +1) index i, skipping
// short blocks and, when `skip_neargood`, near-good ones; the page edges count as bad.
BlockClass neighbour(const std::vector<Block>& b, size_t i, int dir, bool skip_neargood, bool final_classes) {
  for (int64_t k = static_cast<int64_t>(i) + dir; k >= 0 && k < static_cast<int64_t>(b.size()); k += dir) {
    const BlockClass c = final_classes ? b[static_cast<size_t>(k)].final_class : b[static_cast<size_t>(k)].initial;
    if (c == BlockClass::good || c == BlockClass::bad) return c;
    if (c == BlockClass::neargood && !skip_neargood) return c;
  }
  return BlockClass::bad;
}

// Gumbo allocates every node, string and vector on its own and frees them one by one
// (malloc and free were ~6% of the run). A page of up to kArenaMaxInput bytes is
// parsed into this bump arena instead: frees are no-ops and the whole tree goes at once.
// Gumbo allocates about 10x the input over a parse, so the arena stays under ~10 MiB;
// larger pages use malloc, and at most kKeptChunks chunks are kept between pages.
class ParseArena {
 public:
  static constexpr size_t kArenaMaxInput = size_t{1} << 20;
  static constexpr size_t kChunk = size_t{256} << 10;
  static constexpr size_t kKeptChunks = 16;  // 4 MiB kept for the next page
  void* allocate(size_t n) {
    n = (n + 15) & ~size_t{15};
    if (static_cast<size_t>(end_ - ptr_) < n) next_chunk(n);
    void* p = ptr_;
    ptr_ += n;
    return p;
  }
  // Drops everything allocated since the last reset; keeps up to kKeptChunks chunks.
  void reset() {
    std::erase_if(chunks_, [](const Chunk& c) { return c.size != kChunk; });
    if (chunks_.size() > kKeptChunks) chunks_.resize(kKeptChunks);
    cur_ = 0;
    ptr_ = end_ = nullptr;
    if (!chunks_.empty()) use(0);
  }
  static void* gumbo_alloc(void* self, size_t n) { return static_cast<ParseArena*>(self)->allocate(n); }
  static void gumbo_free(void*, void*) {}

 private:
  struct Chunk {
    std::unique_ptr<char[]> data;
    size_t size;
  };
  // Makes chunk k the one allocated from.
  void use(size_t k) {
    cur_ = k;
    ptr_ = chunks_[k].data.get();
    end_ = ptr_ + chunks_[k].size;
  }
  // The next chunk with room for n bytes (the current one is full), a new one if none.
  void next_chunk(size_t n) {
    size_t k = ptr_ == nullptr ? 0 : cur_ + 1;
    while (k < chunks_.size() && chunks_[k].size < n) ++k;
    if (k >= chunks_.size()) {
      const size_t size = std::max(n, kChunk);
      chunks_.push_back({std::make_unique_for_overwrite<char[]>(size), size});
      k = chunks_.size() - 1;
    }
    use(k);
  }
  std::vector<Chunk> chunks_;
  size_t cur_ = 0;
  char* ptr_ = nullptr;  // the free part of chunk cur_: [ptr_, end_)
  char* end_ = nullptr;
};

// The text of a furniture element (kNodeFurniture) is page furniture, but a class word
// may only flag a box, never the article: an element holding most of the page's prose
// (a wrapper named "content-with-sidebar", "has-section-nav", "article paywall") is not
// furniture, neither is a soft one (kNodeSoft: a paywall or embed box) holding two
// prose blocks or more, nor one flagged by its class or id words alone (kNodeWords: a
// section named "TestReport__Section--Ads") holding kWordBoxProse prose blocks or more.
// Prose: blocks of at least kProseChars code points with at most a fifth of link text,
// weighed by their length.
constexpr int64_t kProseChars = 70;
constexpr int32_t kWordBoxProse = 4;
constexpr int32_t kBioProse = 2;  // an author's box of more prose blocks is a post

// An article's sections are alike: a box flagged by its class or id words alone
// (kNodeWords) that holds prose is the article's when a sibling of the same tag and marks
// holds kWordBoxProse prose blocks and is not furniture (the sections of a test report
// all named "TestReport__Section--Ads", the longest of them cleared by its prose).
void article_sections(const ParsedPage& page, const std::vector<int32_t>& prose_blocks, std::vector<char>& furniture) {
  std::vector<size_t> cleared;
  for (size_t e = 0; e < furniture.size(); ++e)
    if ((page.marks[e] & kNodeWords) && !furniture[e] && prose_blocks[e] >= kWordBoxProse && page.parent[e] >= 0)
      cleared.push_back(e);
  if (cleared.empty()) return;
  for (size_t e = 0; e < furniture.size(); ++e) {
    if (!furniture[e] || !(page.marks[e] & kNodeWords) || prose_blocks[e] == 0) continue;
    for (const size_t c : cleared)
      if (page.parent[c] == page.parent[e] && page.marks[c] == page.marks[e] && page.tags[c] == page.tags[e]) {
        furniture[e] = 0;
        break;
      }
  }
}
void resolve_furniture(ParsedPage& page) {
  const size_t n = page.parent.size();
  std::vector<int64_t> prose(n, 0);
  std::vector<int32_t> prose_blocks(n, 0);
  int64_t total = 0;
  for (const auto& b : page.blocks) {
    if (b.chars < kProseChars || 5 * b.link_chars > b.chars) continue;
    total += b.length;
    for (int32_t e = b.node; e >= 0; e = page.parent[static_cast<size_t>(e)]) {
      prose[static_cast<size_t>(e)] += b.length;
      ++prose_blocks[static_cast<size_t>(e)];
    }
  }
  // An element around a post's body (kMarkPostBody) is the post, whatever its class says
  // ("entry-author-jane_doe": the author's term, not a box).
  std::vector<char> holds_body(n, 0);
  for (size_t e = n; e-- > 0;)
    if (page.marks[e] & kMarkPostBody) holds_body[e] = 1;
  for (size_t e = n; e-- > 0;)
    if (holds_body[e] && page.parent[e] >= 0) holds_body[static_cast<size_t>(page.parent[e])] = 1;
  std::vector<char> furniture(n, 0);
  for (size_t e = 0; e < n; ++e) {
    const uint8_t m = page.marks[e];
    const bool most = 2 * prose[e] > total && total > 0;
    furniture[e] =
        ((m & kNodeFurniture) && !most && !((m & kNodeSoft) && prose_blocks[e] >= 2) &&
         !((m & kNodeWords) && prose_blocks[e] >= kWordBoxProse)) ||
        ((m & kNodeAuthor) && !most && prose_blocks[e] >= 1 && prose_blocks[e] <= kBioProse && !holds_body[e]);
  }
  article_sections(page, prose_blocks, furniture);
  for (auto& b : page.blocks)
    for (int32_t e = b.node; e >= 0 && !b.boilerplate_context; e = page.parent[static_cast<size_t>(e)])
      b.boilerplate_context = furniture[static_cast<size_t>(e)];
}

ParsedPage parse_gumbo_blocks(std::string_view html, const std::vector<TextRun>* runs, bool names) {
  GumboOptions opt = kGumboDefaultOptions;
  opt.max_errors = 0;  // parse errors are not collected (HTML5 recovers from all of them)
  thread_local ParseArena arena;
  const bool in_arena = html.size() <= ParseArena::kArenaMaxInput;
  if (in_arena) {
    arena.reset();
    opt.allocator = &ParseArena::gumbo_alloc;
    opt.deallocator = &ParseArena::gumbo_free;
    opt.userdata = &arena;
  }
  struct Release {  // the tree goes when the blocks are out, or on an exception
    GumboOptions& opt;
    GumboOutput* out;
    bool in_arena;
    ~Release() {
      if (in_arena)
        arena.reset();
      else
        gumbo_destroy_output(&opt, out);
    }
  } release{opt, gumbo_parse_with_options(&opt, html.data(), html.size()), in_arena};
  Walker w;
  w.runs = runs;
  w.names = names;
  w.walk(release.out->document);
  w.flush();
  w.drop_noscript();
  resolve_furniture(w.page);
  return std::move(w.page);
}

}  // namespace

ParsedPage parse_html_blocks(std::string_view html, bool strip, bool names) {
  thread_local std::string stripped;  // reused: their capacity is kept for the next page
  thread_local std::vector<TextRun> runs;
  std::string repaired;  // a <title> whose end tag was lost ends before the next tag
  if (const size_t cut = unclosed_title_end(html); cut != std::string_view::npos) {
    repaired.reserve(html.size() + 8);
    repaired.append(html.substr(0, cut)).append("</title>").append(html.substr(cut));
    html = repaired;
  }
  if (strip) strip_raw_text(html, stripped, &runs, true);
  ParsedPage page = parse_gumbo_blocks(strip ? std::string_view(stripped) : html, strip ? &runs : nullptr, names);
  if (stripped.capacity() > (size_t{4} << 20)) {  // memory stays bounded
    std::string().swap(stripped);
    std::vector<TextRun>().swap(runs);
  }
  return page;
}

namespace {

double link_density(const Block& b) {
  return b.chars > 0 ? static_cast<double>(b.link_chars) / static_cast<double>(b.chars) : 0.0;
}

// The most link text a block may have: a heading's may be larger (an "[edit]" or anchor
// link beside its words).
double link_limit(const Block& b, const BlockParams& p) {
  return b.heading ? std::max(p.max_link_density, p.max_heading_link_density) : p.max_link_density;
}

// Left out by the page's structure: a comment or review section (unless kept), a teaser
// card of a listing, text repeated on other pages of the site (when that applies: the
// `repeated` argument).
bool structural_bad(const Block& b, const BlockParams& p, bool repeated) {
  return (b.comment && !p.keep_comments) || b.listing ||
         (repeated && b.repeated && !b.heading && b.chars >= p.repeat_min_chars);
}

// Whether s starts with `prefix` (lower case), ASCII case aside.
bool starts_without_case(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (lower(s[i]) != prefix[i]) return false;
  return true;
}

// A short line that labels a picture or an ad rather than saying anything: a photo
// credit ("Foto: dpa", "Photograph by ...", "Bild: ...", "Jane Doe, photo: ...") or an ad
// label alone ("Advertisement", "Anzeige", "Werbung").
bool label_line(const Block& b, const BlockParams& p) {
  if (b.length >= p.length_low) return false;
  for (const std::string_view w :
       {"foto:",     "fotos:",       "bild:",      "bilder:",       "photo:",       "photos:",
        "image:",    "credit:",      "credits:",   "photograph by", "photo by",     "photo credit",
        "(foto:",    "(photo:",      "fotó:",      "crédito:",      "foto/",        "bild/",
        "titelbild", "beitragsbild", "bildquelle", "bildnachweis",  "fotonachweis", "titelfoto"})
    if (starts_without_case(b.text, w)) return true;
  // A name and its picture's credit: "Roman Prymula, photo: ČTK".
  const std::string_view text = b.text;
  for (size_t comma = text.find(", "); comma != std::string_view::npos; comma = text.find(", ", comma + 1))
    for (const std::string_view w : {"photo:", "foto:", "photo by", "foto von"})
      if (starts_without_case(text.substr(comma + 2), w)) return true;
  std::string_view whole = b.text;
  while (!whole.empty() && (whole.back() == ' ' || whole.back() == '\n')) whole.remove_suffix(1);
  while (!whole.empty() && whole.front() == ' ') whole.remove_prefix(1);
  if (whole.size() > 16) return false;  // longer than any ad label
  const std::string lw = lower_str(whole);
  return lw == "advertisement" || lw == "anzeige" || lw == "werbung" || lw == "publicidad" || lw == "publicité" ||
         lw == "pubblicità" || lw == "ad" || lw == "sponsored";
}

// A copyright line: a block with a © sign in its first kCopyrightLead bytes ("© 2012
// Example Inc. All rights reserved", "Copyright © ..."); one further on credits a picture
// at the end of a paragraph ("... a pencil drawing. Artwork and photos © DiegoKoi"), and the
// paragraph stays prose.
constexpr size_t kCopyrightLead = 80;
bool copyright_line(const Block& b) {
  const size_t at = b.text.find("\xC2\xA9");
  return at != std::string::npos && at < kCopyrightLead;
}

// Bad whatever its place: page furniture by context, left out by structure, mostly link
// text, a copyright line, a short block with link text (a byline, a "read more") or a
// label line.
bool hard_bad(const Block& b, const BlockParams& p, bool repeated) {
  return b.boilerplate_context || structural_bad(b, p, repeated) || link_density(b) > link_limit(b, p) ||
         copyright_line(b) || (b.length < p.length_low && b.link_chars > 0) || label_line(b, p);
}

// Per element: its first block, how many blocks it holds and their characters outside
// links. An element is a teaser card when it holds 2..5 blocks, the first of them a
// headline (mostly link text, at most 200 characters) and at most 400 characters outside
// links in all; when at least three children of one element are cards and they are at
// least half of its children holding text, the element is a listing and the cards' blocks
// are marked (docs/specs/justext.md, "Listing pages").
std::vector<int32_t> mark_listing_cards(ParsedPage& page) {
  auto& blocks = page.blocks;
  const size_t n = page.parent.size();
  std::vector<int32_t> first(n, -1), count(n, 0);
  std::vector<int64_t> plain(n, 0);
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].listing = false;
    for (int32_t e = blocks[i].node; e >= 0; e = page.parent[static_cast<size_t>(e)]) {
      const auto k = static_cast<size_t>(e);
      if (first[k] < 0) first[k] = static_cast<int32_t>(i);
      ++count[k];
      plain[k] += blocks[i].chars - blocks[i].link_chars;
    }
  }
  std::vector<int32_t> cards(n, 0), children(n, 0);
  std::vector<char> card(n, 0);
  for (size_t e = 0; e < n; ++e) {
    if (count[e] == 0) continue;
    const int32_t up = page.parent[e];
    if (up >= 0) ++children[static_cast<size_t>(up)];
    const Block& head = blocks[static_cast<size_t>(first[e])];
    card[e] = count[e] >= 2 && count[e] <= 5 && plain[e] <= 400 && head.chars <= 200 && link_density(head) >= 0.8;
    if (card[e] && up >= 0) ++cards[static_cast<size_t>(up)];
  }
  std::vector<int32_t> listings;
  for (auto& b : blocks)
    for (int32_t e = b.node; e >= 0; e = page.parent[static_cast<size_t>(e)]) {
      const int32_t up = page.parent[static_cast<size_t>(e)];
      if (card[static_cast<size_t>(e)] && up >= 0 && cards[static_cast<size_t>(up)] >= 3 &&
          2 * cards[static_cast<size_t>(up)] >= children[static_cast<size_t>(up)]) {
        b.listing = true;
        if (listings.empty() || listings.back() != up) listings.push_back(up);
        break;
      }
    }
  return listings;
}

bool inside(const ParsedPage& page, int32_t node, int32_t container);
std::vector<int32_t> subtree_blocks(const ParsedPage& page);

// Whether the marked elements holding text (`items`: each block's innermost, or the
// nearest marked one around it holding two blocks or more) are one item: each inside the
// one before it (a review and its parts), not several side by side (the comments of a
// thread, the reviews of a product).
bool single_item(const ParsedPage& page, std::vector<int32_t> items) {
  if (items.empty()) return false;
  const std::vector<int32_t> texts = subtree_blocks(page);
  for (auto& e : items)  // a marked element of one line is part of an item ("review__title")
    for (int32_t up = e; texts[static_cast<size_t>(e)] < 2 && up >= 0; up = page.parent[static_cast<size_t>(up)])
      if (page.marks[static_cast<size_t>(up)] & kMarkComment) e = up;
  std::sort(items.begin(), items.end());  // parents before children
  items.erase(std::unique(items.begin(), items.end()), items.end());
  for (size_t k = 1; k < items.size(); ++k)
    if (!inside(page, items[k], items[k - 1])) return false;
  return true;
}

// The post's body by its marks (kMarkPostBody): the one element so named (the outermost
// where they nest) that holds text and is outside comment sections; when there is none
// outside, the one inside (a review's body, `itemprop=reviewBody`, under an element
// named `mainReview`: the review is the article). -1 when there is none, or several (a
// blog's front page, a listing of excerpts, the reviews of a product).
int32_t marked_post_body(const ParsedPage& page) {
  const auto& parent = page.parent;
  if (std::none_of(page.marks.begin(), page.marks.end(), [](uint8_t m) { return m & kMarkPostBody; })) return -1;
  const std::vector<int32_t> texts = subtree_blocks(page);
  int32_t found[2] = {-1, -1};  // outside comment sections, inside one
  int32_t count[2] = {0, 0};
  for (size_t e = 0; e < parent.size(); ++e) {
    if (!(page.marks[e] & kMarkPostBody) || texts[e] == 0) continue;
    bool nested = false, in_comments = page.marks[e] & kMarkComment;
    for (int32_t a = parent[e]; a >= 0 && !nested; a = parent[static_cast<size_t>(a)]) {
      nested = page.marks[static_cast<size_t>(a)] & kMarkPostBody;
      in_comments = in_comments || (page.marks[static_cast<size_t>(a)] & kMarkComment);
    }
    if (nested) continue;
    found[in_comments] = static_cast<int32_t>(e);
    ++count[in_comments];
  }
  if (count[0] > 0) return count[0] == 1 ? found[0] : -1;
  return count[1] == 1 ? found[1] : -1;
}

// Comment and review sections: a block is in one when an element around it carries a
// comment mark and does not hold an <h1> or the post's body (an element holding the
// page's title or its one articleBody or reviewBody is the article, whatever its class
// says: a review site's review). Nor is it when the page has
// no <h1> and its sections are one item holding more of the page's text than the rest of
// the page outside furniture: a page of one review or one review post (a review typed as
// such by schema.org or data-vocabulary.org) is that review (with an <h1> outside the
// section, the page is a product's or a post's, and its one section of reviews theirs).
void mark_comments(ParsedPage& page) {
  const size_t n = page.parent.size();
  std::vector<char> has_h1(n, 0);
  for (const auto& b : page.blocks)
    if (b.h1)
      for (int32_t e = b.node; e >= 0 && !has_h1[static_cast<size_t>(e)]; e = page.parent[static_cast<size_t>(e)])
        has_h1[static_cast<size_t>(e)] = 1;
  for (int32_t e = marked_post_body(page); e >= 0; e = page.parent[static_cast<size_t>(e)])
    has_h1[static_cast<size_t>(e)] = 1;
  std::vector<int32_t> items;  // the innermost marked element of each block in a section
  int64_t in_sections = 0, outside = 0;
  for (auto& b : page.blocks) {
    b.comment = false;
    int32_t e = b.node;
    for (; e >= 0 && !b.comment; e = b.comment ? e : page.parent[static_cast<size_t>(e)])
      b.comment = (page.marks[static_cast<size_t>(e)] & kMarkComment) && !has_h1[static_cast<size_t>(e)];
    if (b.comment) items.push_back(e);
    if (!b.boilerplate_context) (b.comment ? in_sections : outside) += b.chars;
  }
  const bool titled = std::any_of(page.blocks.begin(), page.blocks.end(), [](const Block& b) { return b.h1; });
  if (!titled && single_item(page, items) && in_sections > outside)
    for (auto& b : page.blocks) b.comment = false;
}

bool inside(const ParsedPage& page, int32_t node, int32_t container) {
  for (int32_t n = node; n >= container; n = page.parent[static_cast<size_t>(n)])
    if (n == container) return true;
  return false;
}

int32_t widen_container(const ParsedPage& page, int32_t c);

// How many blocks each element's subtree holds (a child comes after its parent in
// document order, so one pass from the end adds each element's count to its parent's).
std::vector<int32_t> subtree_blocks(const ParsedPage& page) {
  const auto& parent = page.parent;
  std::vector<int32_t> texts(parent.size(), 0);
  for (const auto& b : page.blocks)
    if (b.node >= 0) ++texts[static_cast<size_t>(b.node)];
  for (size_t n = parent.size(); n > 0; --n)
    if (parent[n - 1] >= 0) texts[static_cast<size_t>(parent[n - 1])] += texts[n - 1];
  return texts;
}

// The deepest element holding most of the prose and the anchor (docs/specs/justext.md,
// "The content container"); widen_container widens it.
int32_t content_container(const ParsedPage& page) {
  const auto& blocks = page.blocks;
  const auto& parent = page.parent;
  std::vector<int64_t> good_chars(parent.size(), 0);
  std::vector<int32_t> good_blocks(parent.size(), 0);
  int64_t total = 0;
  int32_t blocks_good = 0, last_good = -1;
  for (const auto& b : blocks) {
    // Prose: good or near-good on its own, whatever its neighbours made of it.
    // Comments kept on request are not the article: they do not place its container.
    if ((b.initial != BlockClass::good && b.initial != BlockClass::neargood) || b.node < 0 || b.comment) continue;
    total += b.length;  // CJK text weighs as in the length tests
    ++blocks_good;
    last_good = b.node;
    for (int32_t n = b.node; n >= 0; n = parent[static_cast<size_t>(n)]) {
      good_chars[static_cast<size_t>(n)] += b.length;
      ++good_blocks[static_cast<size_t>(n)];
    }
  }
  if (blocks_good == 0) return -1;
  // The anchor: the first good block after the page's first <h1> (not furniture) that is
  // prose on its own (good or near-good before its neighbours were looked at); the
  // container holds it. The article starts under its title; a page of posts (a question
  // and its answers, a forum thread) whose one long post holds most of the text keeps its
  // other posts.
  int32_t anchor = -1;
  bool after_h1 = false;
  for (const auto& b : blocks) {
    after_h1 = after_h1 || (b.h1 && !b.boilerplate_context);
    if (after_h1 && !b.heading && b.final_class == BlockClass::good && b.node >= 0 &&
        (b.initial == BlockClass::good || b.initial == BlockClass::neargood)) {
      anchor = b.node;
      break;
    }
  }
  int32_t c = -1;
  if (blocks_good == 1) {
    c = parent[static_cast<size_t>(last_good)] >= 0 ? parent[static_cast<size_t>(last_good)] : last_good;
  } else {
    // The nodes holding more than half form a chain from the top: the deepest is the one
    // with the largest index (a child comes after its parent in document order).
    for (size_t n = 0; n < parent.size(); ++n)
      if (2 * good_chars[n] > total && good_blocks[n] >= 2 &&
          (anchor < 0 || inside(page, anchor, static_cast<int32_t>(n))))
        c = static_cast<int32_t>(n);
  }
  return c;
}

// The element around the container c, at most kFlatLevels up, whose own paragraphs (prose
// blocks, not headings, comments or furniture, whose element is its child) are at least
// as many as the container's prose blocks, and two at least: the container is then a box
// inside an article of paragraphs side by side (a recipe's card amid a post's paragraphs,
// a table inside a story); c when there is none.
constexpr int kFlatLevels = 3;
int32_t amid_paragraphs(const ParsedPage& page, int32_t c) {
  const auto& parent = page.parent;
  std::vector<int32_t> own(parent.size(), 0);
  for (const auto& b : page.blocks)
    if ((b.initial == BlockClass::good || b.initial == BlockClass::neargood) && b.node >= 0 && !b.comment &&
        !b.heading && !b.boilerplate_context) {
      const int32_t up = parent[static_cast<size_t>(b.node)];
      ++own[static_cast<size_t>(up >= 0 ? up : b.node)];
    }
  int32_t in_c = 0;  // the container's prose blocks
  for (const auto& b : page.blocks)
    if ((b.initial == BlockClass::good || b.initial == BlockClass::neargood) && b.node >= 0 && !b.comment &&
        !b.heading && !b.boilerplate_context && b.node >= c && inside(page, b.node, c))
      ++in_c;
  int32_t a = parent[static_cast<size_t>(c)];
  for (int level = 0; level < kFlatLevels && a >= 0; ++level, a = parent[static_cast<size_t>(a)])
    if (own[static_cast<size_t>(a)] >= std::max(2, in_c)) return a;
  return c;
}

// The container c widened over siblings that go on with the article: holding a block good
// on its own and another prose block (not a heading). A box of one paragraph (an about-us
// box, a pitch, a consent text) does not widen it. First, a box amid the article's
// paragraphs widens to the element holding them (amid_paragraphs).
int32_t widen_container(const ParsedPage& page, int32_t c) {
  const auto& blocks = page.blocks;
  const auto& parent = page.parent;
  c = amid_paragraphs(page, c);
  std::vector<int32_t> prose(parent.size(), 0);
  std::vector<char> solo_good(parent.size(), 0);  // the element holds an initially good block and more prose
  for (const auto& b : blocks)
    if ((b.initial == BlockClass::good || b.initial == BlockClass::neargood) && !b.heading && b.node >= 0 && !b.comment)
      for (int32_t n = b.node; n >= 0; n = parent[static_cast<size_t>(n)]) ++prose[static_cast<size_t>(n)];
  for (const auto& b : blocks)
    if (b.initial == BlockClass::good && b.node >= 0 && !b.comment)
      for (int32_t n = b.node; n >= 0 && !solo_good[static_cast<size_t>(n)]; n = parent[static_cast<size_t>(n)])
        solo_good[static_cast<size_t>(n)] = prose[static_cast<size_t>(n)] >= 2;
  // A wrapper whose only child with text is the container (a grid's row around its column)
  // is passed through: the siblings that go on with the article may be the wrapper's.
  const std::vector<int32_t> texts = subtree_blocks(page);
  for (;;) {
    const int32_t up = parent[static_cast<size_t>(c)];
    if (up < 0) break;
    bool sibling = false, other_text = false;
    for (size_t n = static_cast<size_t>(up) + 1; n < parent.size() && !sibling; ++n)
      if (parent[n] == up && n != static_cast<size_t>(c)) {
        sibling = solo_good[n];
        other_text = other_text || texts[n] > 0;
      }
    if (!sibling && (other_text || texts[static_cast<size_t>(up)] > texts[static_cast<size_t>(c)])) break;
    c = up;
  }
  return c;
}

// Whether text repeated on other pages of the site is to be taken as boilerplate: as long
// as some text that is not short (length_low), furniture or a comment is not repeated (a
// page fetched twice, or one whose article is on two pages, keeps its article).
bool site_repeats_are_boilerplate(const std::vector<Block>& blocks, const BlockParams& p) {
  bool repeated = false;
  for (const auto& b : blocks)
    if (b.repeated) repeated = true;
  if (repeated) {
    // Of the blocks that are not short, furniture or comments: how many, how many repeated.
    int64_t prose = 0, shared = 0;
    for (const auto& b : blocks)
      if (!b.boilerplate_context && !(b.comment && !p.keep_comments) && b.length >= p.length_low) {
        ++prose;
        shared += b.repeated;
      }
    // A near copy of another page (a mirror, a print version: six or more of its blocks and
    // three quarters of them on the other page) is the dedup stage's, not boilerplate: a
    // site's boxes of prose are a few paragraphs.
    repeated = shared < prose && !(shared >= 6 && 4 * shared >= 3 * prose);
  }
  return repeated;
}

// A paragraph over the link-density limit but with at most kLinkedProse of link text,
// of prose length and (with a stop-word list) at least stopwords_low of stop words: a
// paragraph of the text with a few inline links more often than a box of links, so it is
// near-good, and its neighbours decide (a link box between link boxes stays out).
constexpr double kLinkedProse = 0.5;
bool linked_prose(const Block& b, const BlockParams& p, bool use_stopwords, bool repeated, double ld, double sd) {
  return !b.boilerplate_context && !b.heading && !structural_bad(b, p, repeated) && ld > link_limit(b, p) &&
         ld <= kLinkedProse && b.length >= p.length_low && (!use_stopwords || sd >= p.stopwords_low) &&
         !copyright_line(b);
}

// 1. Each block on its own.
void classify_each(std::vector<Block>& blocks, const BlockParams& p, bool use_stopwords, bool repeated) {
  for (auto& b : blocks) {
    const double ld = link_density(b);
    const double sd = b.words > 0 ? static_cast<double>(b.stopwords) / static_cast<double>(b.words) : 0.0;
    BlockClass c;
    if (linked_prose(b, p, use_stopwords, repeated, ld, sd)) {
      b.initial = BlockClass::neargood;
      b.rule = "alone: prose with a few inline links (its neighbours decide)";
      continue;
    }
    if (b.boilerplate_context || structural_bad(b, p, repeated) || ld > link_limit(b, p) || copyright_line(b) ||
        label_line(b, p)) {
      c = BlockClass::bad;
      b.rule = b.boilerplate_context             ? "furniture: inside a furniture element"
               : (b.comment && !p.keep_comments) ? "structure: comment or review section"
               : b.listing                       ? "structure: teaser card of a listing"
               : structural_bad(b, p, repeated)  ? "structure: repeated on another page of the site"
               : ld > link_limit(b, p)           ? "alone: link density over the limit"
               : label_line(b, p)                ? "alone: a photo credit or an ad label"
                                                 : "alone: copyright line";
    } else if (b.pre && b.length > p.length_high) {
      c = BlockClass::good;  // code, a man page, a message: <pre> text is written, not generated furniture
      b.rule = "alone: <pre> text";
    } else if (b.length < p.length_low) {
      c = b.link_chars > 0 ? BlockClass::bad : BlockClass::shortb;
      b.rule = b.link_chars > 0 ? "alone: short with link text" : "alone: short";
    } else if (!use_stopwords) {
      c = b.length > p.length_high ? BlockClass::good : BlockClass::neargood;
      b.rule = "alone: length (no stop-word list)";
    } else if (sd >= p.stopwords_high) {
      c = b.length > p.length_high ? BlockClass::good : BlockClass::neargood;
      b.rule = "alone: length and stop words";
    } else if (sd >= p.stopwords_low) {
      c = BlockClass::neargood;
      b.rule = "alone: stop words between the limits";
    } else {
      c = BlockClass::bad;
      b.rule = "alone: few stop words";
    }
    b.initial = c;
  }
}

// 2. Short headings followed closely by good text become near-good.
void headings_before_good(std::vector<Block>& blocks, const BlockParams& p) {
  auto good_follows = [&](size_t i) {
    int64_t dist = 0;
    for (size_t k = i + 1; k < blocks.size() && dist <= p.max_heading_distance; ++k) {
      if (blocks[k].initial == BlockClass::good) return true;
      dist += blocks[k].chars;
    }
    return false;
  };
  for (size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i].heading && blocks[i].initial == BlockClass::shortb && good_follows(i)) {
      blocks[i].initial = BlockClass::neargood;
      blocks[i].rule = "heading close before good text";
    }
}

// 3. Short blocks take their class from their neighbours.
void short_by_neighbours(std::vector<Block>& blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& b = blocks[i];
    b.final_class = b.initial;
    if (b.initial != BlockClass::shortb) continue;
    const BlockClass prev = neighbour(blocks, i, -1, true, false), next = neighbour(blocks, i, +1, true, false);
    b.rule = "short: by its neighbours";
    if (prev == BlockClass::good && next == BlockClass::good) {
      b.final_class = BlockClass::good;
    } else if (prev == BlockClass::bad && next == BlockClass::bad) {
      b.final_class = BlockClass::bad;
    } else {
      // Mixed: the side that is bad decides, unless a near-good block stands closer on it.
      const int dir = prev == BlockClass::bad ? -1 : +1;
      b.final_class =
          neighbour(blocks, i, dir, false, false) == BlockClass::neargood ? BlockClass::good : BlockClass::bad;
    }
  }
}

// 4. Near-good blocks are good unless bad text surrounds them on both sides, or stand
// next to a sibling paragraph (4b).
void neargood_in_context(ParsedPage& page) {
  auto& blocks = page.blocks;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& b = blocks[i];
    if (b.initial != BlockClass::neargood) continue;
    const BlockClass prev = neighbour(blocks, i, -1, true, true), next = neighbour(blocks, i, +1, true, true);
    b.final_class = (prev == BlockClass::bad && next == BlockClass::bad) ? BlockClass::bad : BlockClass::good;
    b.rule = b.final_class == BlockClass::bad ? "near-good: bad text on both sides" : "near-good: good text beside it";
  }
  // 4b. Paragraphs come in groups, boxes of boilerplate alone: a near-good block next to
  // another near-good or good block of the same parent element is good.
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& b = blocks[i];
    if (b.initial != BlockClass::neargood || b.final_class == BlockClass::good || b.node < 0) continue;
    const int32_t up = page.parent[static_cast<size_t>(b.node)];
    auto sibling = [&](size_t k) {
      const Block& o = blocks[k];
      return o.node >= 0 && o.node != b.node && page.parent[static_cast<size_t>(o.node)] == up &&
             (o.initial == BlockClass::neargood || o.initial == BlockClass::good);
    };
    if ((i > 0 && sibling(i - 1)) || (i + 1 < blocks.size() && sibling(i + 1))) {
      b.final_class = BlockClass::good;
      b.rule = "near-good: a sibling paragraph";
    }
  }
}

// 4b'. The page's lead and 4c. a listing's intro.
void lead_and_listing_intro(ParsedPage& page, const BlockParams& p, const std::vector<int32_t>& listings) {
  auto& blocks = page.blocks;
  // 4b'. The lead: the first near-good block within max_heading_distance after the page's
  // first <h1> (not furniture) is good, as a heading before good text is.
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!blocks[i].h1 || blocks[i].boilerplate_context) continue;
    int64_t dist = 0;
    for (size_t k = i + 1; k < blocks.size() && dist <= p.max_heading_distance; ++k) {
      if (blocks[k].heading) break;
      if (blocks[k].initial == BlockClass::neargood || blocks[k].initial == BlockClass::good) {
        blocks[k].final_class = BlockClass::good;
        blocks[k].rule = "the lead under the <h1>";
        break;
      }
      dist += blocks[k].chars;
    }
    break;
  }
  // 4c. A listing's intro: the near-good and good text of the element around the listing,
  // before the listing (docs/specs/justext.md, "Listing pages").
  for (const int32_t l : listings) {
    const int32_t around = page.parent[static_cast<size_t>(l)];
    if (around < 0) continue;
    for (auto& b : blocks) {
      if (b.listing) break;  // the first card: the intro is before it
      if (b.node >= 0 && b.initial == BlockClass::neargood && inside(page, b.node, around) &&
          !inside(page, b.node, l)) {
        b.final_class = BlockClass::good;
        b.rule = "a listing's intro";
      }
    }
  }
}

// 5. A heading (not page furniture) just before good text is kept with it.
void keep_headings(std::vector<Block>& blocks, const BlockParams& p, bool repeated) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& b = blocks[i];
    if (!b.heading || b.final_class != BlockClass::bad || hard_bad(b, p, repeated)) continue;
    int64_t dist = 0;
    for (size_t k = i + 1; k < blocks.size() && dist <= p.max_heading_distance; ++k) {
      if (blocks[k].final_class == BlockClass::good) {
        b.final_class = BlockClass::good;
        b.rule = "heading before good text";
        break;
      }
      dist += blocks[k].chars;
    }
  }
}

// 5b. No good text at all: the article written in short lines.
void short_line_article(ParsedPage& page, const BlockParams& p, bool repeated) {
  auto& blocks = page.blocks;
  // An element whose own lines (text split by <br>, or its child
  // blocks) hold at least 400 characters in three or more blocks that are bad only for
  // their length or stop words is the article: a message or a poem written in short lines.
  if (std::none_of(blocks.begin(), blocks.end(), [](const Block& b) { return b.final_class == BlockClass::good; })) {
    const size_t n = page.parent.size();
    std::vector<int64_t> soft(n, 0);
    std::vector<int32_t> count(n, 0);
    for (const auto& b : blocks) {
      if (b.heading || b.node < 0 || hard_bad(b, p, repeated)) continue;
      for (int32_t e : {b.node, page.parent[static_cast<size_t>(b.node)]})
        if (e >= 0) {
          soft[static_cast<size_t>(e)] += b.length;
          ++count[static_cast<size_t>(e)];
        }
    }
    int32_t best = -1;
    for (size_t e = 0; e < n; ++e)
      if (count[e] >= 3 && soft[e] >= 2 * p.length_high && (best < 0 || soft[e] > soft[static_cast<size_t>(best)]))
        best = static_cast<int32_t>(e);
    if (best >= 0) {
      for (auto& b : blocks)
        if (b.node >= 0 && !b.heading && !hard_bad(b, p, repeated) && inside(page, b.node, best)) {
          b.final_class = BlockClass::good;
          b.rule = "an article in short lines";
        }
      keep_headings(blocks, p, repeated);
    }
  }
}

// A short line with link text between two lines of the same list (the same parent
// element; neither all link text, both shorter than length_high, the first not a
// heading): an ingredient or a deal with a link in a list of them, not a byline or a
// "read more" (those sit between a title or a paragraph and the text). Inside the
// container such a line does not break a run of lines (container_runs).
bool link_line_in_list(const ParsedPage& page, size_t i, const BlockParams& p, bool repeated) {
  const auto& blocks = page.blocks;
  const Block& b = blocks[i];
  if (i == 0 || i + 1 >= blocks.size() || b.length >= p.length_low || b.link_chars == 0 || b.boilerplate_context ||
      structural_bad(b, p, repeated) || copyright_line(b) || label_line(b, p))
    return false;
  auto parent = [&](size_t k) { return blocks[k].node >= 0 ? page.parent[static_cast<size_t>(blocks[k].node)] : -2; };
  auto item = [&](size_t k) {
    return parent(k) == parent(i) && blocks[k].link_chars < blocks[k].chars && blocks[k].length < p.length_high;
  };
  return item(i - 1) && item(i + 1) && !blocks[i - 1].heading;
}

// A heading, or a short line ending in ':' or '?', right before a block of links (link
// density over the limit), furniture or a teaser card: the title of that box.
bool box_title(const ParsedPage& page, size_t k, const BlockParams& p) {
  const auto& blocks = page.blocks;
  if (k + 1 >= blocks.size()) return false;
  const Block& b = blocks[k];
  const Block& next = blocks[k + 1];
  std::string_view t = b.text;
  while (!t.empty() && (t.back() == ' ' || t.back() == '\n')) t.remove_suffix(1);
  const bool label = b.heading || (b.length < p.length_low && !t.empty() && (t.back() == ':' || t.back() == '?'));
  return label && (next.boilerplate_context || next.listing || link_density(next) > link_limit(next, p));
}

// Whether blocks a and b are each a <p> of their own, children of one element: a line and a
// paragraph of one text, not a date line or a signature in a box of its own.
bool sibling_paragraph(const ParsedPage& page, size_t a, size_t b) {
  const int32_t x = page.blocks[a].node, y = page.blocks[b].node;
  return x >= 0 && y >= 0 && x != y && page.tags[static_cast<size_t>(x)] == GUMBO_TAG_P &&
         page.tags[static_cast<size_t>(y)] == GUMBO_TAG_P &&
         page.parent[static_cast<size_t>(x)] == page.parent[static_cast<size_t>(y)];
}

// 6, inside the content container (its blocks [first, last]): prose is the article's, and
// runs of blocks bad only for their length or stop words between good ones are good.
void container_runs(ParsedPage& page, const BlockParams& p, bool repeated, size_t first, size_t last, int32_t body) {
  auto& blocks = page.blocks;
  auto run_stop = [&](size_t k) {
    return hard_bad(blocks[k], p, repeated) && !link_line_in_list(page, k, p, repeated);
  };
  // Prose inside the container is the article's, whatever its neighbours: a near-good
  // block there is good (a one-paragraph answer or post between user cards).
  for (size_t i = first; i <= last && first < blocks.size(); ++i)
    if (blocks[i].initial == BlockClass::neargood) {
      blocks[i].final_class = BlockClass::good;
      blocks[i].rule = "container: prose inside the content container";
    }
  for (size_t i = first; i <= last && first < blocks.size();) {
    if (blocks[i].final_class == BlockClass::good || run_stop(i)) {
      ++i;
      continue;
    }
    size_t j = i;  // the run [i, j)
    while (j <= last && blocks[j].final_class != BlockClass::good && !run_stop(j)) ++j;
    // A good block in another cell of the same table row does not count: a column of short
    // lines beside a column of text is a sidebar (a forum post's user card, a layout's menu).
    auto same_column = [&](size_t a, size_t b) {
      int32_t x = blocks[a].node, y = blocks[b].node;
      while (x != y && x >= 0 && y >= 0) (x > y ? x : y) = page.parent[static_cast<size_t>(x > y ? x : y)];
      return !(x >= 0 && x == y && (page.marks[static_cast<size_t>(x)] & kNodeRow));
    };
    const bool before = i > first && blocks[i - 1].final_class == BlockClass::good;
    const bool after = j <= last && blocks[j].final_class == BlockClass::good;
    // A single line with good text on one side only (a post's date line, a signature) is
    // the post's furniture more often than its text; a run of lines is a list or a table.
    // Inside the post's body (post_body) a single line is the post's own text ("P.S. ...").
    const bool in_body = body >= 0 && blocks[i].node >= body && inside(page, blocks[i].node, body);
    const bool single = j == i + 1 && !blocks[i].heading && blocks[i].initial == BlockClass::shortb && !in_body &&
                        !(!before && after && sibling_paragraph(page, i, j));
    auto keep = [&](Block& b) {
      b.final_class = BlockClass::good;
      b.rule = "container: a run of lines next to its text";
    };
    // The run's last line, when it is a heading or a label ("Mehr zum Thema", "Weitere
    // Informationen:", "Schon gelesen?") right before a box of links, furniture or teaser
    // cards, is that box's title: it stays out unless good text follows the run.
    const size_t end = !after && j <= last && box_title(page, j - 1, p) ? j - 1 : j;
    if (before && (!single || after))
      for (size_t k = i; k < end && same_column(i - 1, k); ++k) keep(blocks[k]);
    if (after && (!single || before))
      for (size_t k = j; k > i && same_column(j, k - 1); --k) keep(blocks[k - 1]);
    i = j;
  }
}

// An article split into sibling chunks (its lead in a box of its own, the rest of its
// body after an ad or a newsletter box): prose blocks (good or near-good on their own,
// not headings, comments, cards or furniture) right before or after the container's
// blocks [first, last], with at most max_heading_distance characters of other lines
// between chunks, are the article's; after the container, two such blocks or more. Stops
// at the first prose of any other kind.
std::vector<char> sibling_chunks(const std::vector<Block>& blocks, const BlockParams& p, size_t first, size_t last) {
  std::vector<char> joined(blocks.size(), 0);
  const auto n = static_cast<int64_t>(blocks.size());
  for (const int dir : {-1, +1}) {
    int64_t gap = 0;
    std::vector<size_t> got;
    for (int64_t k = dir < 0 ? static_cast<int64_t>(first) - 1 : static_cast<int64_t>(last) + 1; k >= 0 && k < n;
         k += dir) {
      const Block& o = blocks[static_cast<size_t>(k)];
      const bool prose_alone = o.initial == BlockClass::good || o.initial == BlockClass::neargood;
      if (prose_alone && !o.heading && !o.comment && !o.listing && !o.boilerplate_context) {
        got.push_back(static_cast<size_t>(k));
        gap = 0;
        continue;
      }
      gap += o.chars;
      if (prose_alone || gap > p.max_heading_distance) break;
    }
    if (dir > 0 && got.size() < 2) continue;  // one paragraph after the article: a pitch, a consent text
    for (const size_t k : got) joined[k] = 1;
  }
  return joined;
}

// 8. The article's title even when it is all link text (a post's title linking to its
// own address): the nearest heading before the first kept block of the container
// [first, last], with at most max_heading_distance characters of other lines between,
// that is not furniture, a comment, a card or repeated.
void linked_title(ParsedPage& page, const BlockParams& p, bool repeated, size_t first, size_t last) {
  auto& blocks = page.blocks;
  size_t k = first;
  while (k <= last && k < blocks.size() && blocks[k].final_class != BlockClass::good) ++k;
  if (k > last || k >= blocks.size()) return;
  int64_t dist = 0;
  for (size_t i = k; i-- > 0 && dist <= p.max_heading_distance;) {
    Block& h = blocks[i];
    if (!h.heading) {
      dist += h.chars;
      continue;
    }
    if (h.final_class != BlockClass::good && !h.boilerplate_context && !structural_bad(h, p, repeated) &&
        h.length < p.length_high) {
      h.final_class = BlockClass::good;
      h.rule = "the title of the container's text";
    }
    return;
  }
}

// The whole text of a heading that titles a box of related content rather than a part of
// the article (lower case for ASCII letters, without a trailing colon or dots): "Mehr zum
// Thema", "Zum Weiterlesen", "Related articles", "Zobacz także", ... in the languages of
// the pages measured (docs/specs/justext.md, "Related-content boxes").
bool related_title(const Block& b) {
  static const std::unordered_set<std::string_view> titles = {"mehr zum thema",
                                                              "zum weiterlesen",
                                                              "weiterlesen",
                                                              "lesen sie auch",
                                                              "lies auch",
                                                              "auch interessant",
                                                              "das könnte sie auch interessieren",
                                                              "das könnte dich auch interessieren",
                                                              "weitere artikel",
                                                              "verwandte artikel",
                                                              "neueste artikel",
                                                              "passend zum thema",
                                                              "related",
                                                              "related articles",
                                                              "related posts",
                                                              "related stories",
                                                              "related content",
                                                              "related news",
                                                              "more on this topic",
                                                              "more stories",
                                                              "read next",
                                                              "you may also like",
                                                              "you might also like",
                                                              "recommended for you",
                                                              "latest articles",
                                                              "latest news",
                                                              "more from this author",
                                                              "noticias relacionadas",
                                                              "te puede interesar",
                                                              "también te puede interesar",
                                                              "lee también",
                                                              "artículos relacionados",
                                                              "más noticias",
                                                              "à lire aussi",
                                                              "À lire aussi",
                                                              "lire aussi",
                                                              "sur le même sujet",
                                                              "articles similaires",
                                                              "leggi anche",
                                                              "articoli correlati",
                                                              "zobacz także",
                                                              "zobacz też",
                                                              "czytaj także",
                                                              "czytaj też",
                                                              "leia também",
                                                              "veja também",
                                                              "notícias relacionadas"};
  if (!b.heading || b.text.size() > 64) return false;
  std::string t = lower_str(b.text);
  while (!t.empty() && (t.back() == ':' || t.back() == '.' || t.back() == ' ')) t.pop_back();
  return titles.contains(t);
}

// The element a heading titles: its nearest ancestor holding more blocks than the heading.
int32_t titled_box(const ParsedPage& page, const std::vector<int32_t>& texts, int32_t heading) {
  int32_t e = page.parent[static_cast<size_t>(heading)];
  while (e >= 0 && texts[static_cast<size_t>(e)] <= 1) e = page.parent[static_cast<size_t>(e)];
  return e;
}

int depth(const ParsedPage& page, int32_t node) {
  int d = 0;
  for (int32_t e = node; e >= 0; e = page.parent[static_cast<size_t>(e)]) ++d;
  return d;
}

// 9. A heading titling related content ("Mehr zum Thema", "Related articles") and what
// follows it in the box it titles are not the article: teaser titles and their blurbs,
// often prose enough to pass for it. The box ends at the next heading as shallow as the
// title (the next section) and at a line of the box's own that is not mostly link text
// (the article going on after a list of links in it). Nothing is dropped when that would
// be half of the kept text or more.
void related_boxes(ParsedPage& page) {
  auto& blocks = page.blocks;
  std::vector<int32_t> texts;
  int64_t kept = 0;
  for (const auto& b : blocks)
    if (b.final_class == BlockClass::good) kept += b.chars;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].node < 0 || !related_title(blocks[i])) continue;
    if (texts.empty()) texts = subtree_blocks(page);
    const int32_t box = titled_box(page, texts, blocks[i].node);
    if (box < 0) continue;
    const int d = depth(page, blocks[i].node);
    size_t end = i + 1;
    int64_t dropped = blocks[i].final_class == BlockClass::good ? blocks[i].chars : 0;
    for (; end < blocks.size() && blocks[end].node >= 0 && inside(page, blocks[end].node, box); ++end) {
      const Block& b = blocks[end];
      if (b.heading && depth(page, b.node) <= d) break;
      if (page.parent[static_cast<size_t>(b.node)] == box && !b.heading && 2 * b.link_chars < b.chars) break;
      if (blocks[end].final_class == BlockClass::good) dropped += blocks[end].chars;
    }
    if (2 * dropped >= kept) continue;
    for (size_t k = i; k < end; ++k) {
      if (blocks[k].final_class != BlockClass::good) continue;
      blocks[k].final_class = BlockClass::bad;
      blocks[k].rule = "related: inside a box titled as related content";
      kept -= blocks[k].chars;
    }
    i = end - 1;
  }
}

// 7. Outside the container (its blocks [first, last]).
void outside_container(ParsedPage& page, const BlockParams& p, size_t first, size_t last) {
  auto& blocks = page.blocks;
  // Outside it only the article's sibling chunks (sibling_chunks) and headings that lead
  // into kept text stay (inside it too, a heading right before a furniture box or a teaser
  // card must: "Related news", "Read more"): a box of prose beside the article (an
  // about-us box, a newsletter or donation pitch, a consent text without a telling class)
  // is not the article however wordy it is. Comments kept on request are the exception:
  // their prose is kept wherever the section is.
  const std::vector<char> joined = sibling_chunks(blocks, p, first, last);
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& b = blocks[i];
    if (joined[i] && b.final_class == BlockClass::good) continue;
    if (p.keep_comments && b.comment) {
      if (b.initial == BlockClass::good || b.initial == BlockClass::neargood) {
        b.final_class = BlockClass::good;
        b.rule = "a comment, kept on request";
      }
      continue;
    }
    if ((i < first || i > last) && b.final_class == BlockClass::good && !b.heading) {
      b.final_class = BlockClass::bad;
      b.rule = "outside the content container";
    }
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& b = blocks[i];
    if (!b.heading || b.final_class != BlockClass::good) continue;
    if (i >= first && i <= last &&
        !(i + 1 < blocks.size() && (blocks[i + 1].boilerplate_context || blocks[i + 1].listing)))
      continue;
    bool leads = false;
    int64_t dist = 0;
    for (size_t k = i + 1; k < blocks.size() && dist <= p.max_heading_distance && !leads; ++k) {
      leads = blocks[k].final_class == BlockClass::good && !blocks[k].heading;
      dist += blocks[k].heading ? 0 : blocks[k].chars;
    }
    if (!leads) {
      b.final_class = BlockClass::bad;
      b.rule = "a heading leading into no kept text";
    }
  }
}

// A post of a title and a line or two (a video, a photo): the page's first <h1> outside
// furniture and comments, and the lines not bad in themselves (hard_bad) in the nearest
// element around it that holds any.
void title_and_its_lines(ParsedPage& page, const BlockParams& p, bool repeated) {
  auto& blocks = page.blocks;
  const auto h1 = std::find_if(blocks.begin(), blocks.end(), [](const Block& b) {
    return b.h1 && b.node >= 0 && !b.boilerplate_context && !b.comment;
  });
  if (h1 == blocks.end()) return;
  auto lines_in = [&](int32_t e) {
    int32_t count = 0;
    for (const auto& b : blocks)
      count += b.node >= 0 && !b.heading && !b.comment && !hard_bad(b, p, repeated) && inside(page, b.node, e);
    return count;
  };
  int32_t e = h1->node;
  while (e >= 0 && lines_in(e) == 0) e = page.parent[static_cast<size_t>(e)];
  if (e < 0) return;
  for (auto& b : blocks)
    if (b.node >= 0 && !b.comment && !hard_bad(b, p, repeated) && inside(page, b.node, e) &&
        (!b.heading || &b == &*h1)) {
      b.final_class = BlockClass::good;
      b.rule = "nothing kept: the title and the lines around it";
    }
}

// When no rule kept anything (an article of table rows, of lines in nested boxes, under
// class words that flag each of its sections), the page's text is where most of its
// readable lines are: the deepest element holding more than half of the length of the
// blocks not bad in themselves (hard_bad), when that is at least length_high, keeps
// those blocks, and the headings before them; else the page's title and its lines.
void nothing_kept(ParsedPage& page, const BlockParams& p, bool repeated) {
  auto& blocks = page.blocks;
  if (std::any_of(blocks.begin(), blocks.end(), [](const Block& b) { return b.final_class == BlockClass::good; }))
    return;
  const size_t n = page.parent.size();
  std::vector<int64_t> soft(n, 0);
  int64_t total = 0;
  for (const auto& b : blocks) {
    if (b.heading || b.node < 0 || hard_bad(b, p, repeated)) continue;
    total += b.length;
    for (int32_t e = b.node; e >= 0; e = page.parent[static_cast<size_t>(e)]) soft[static_cast<size_t>(e)] += b.length;
  }
  int32_t best = -1;  // those holding more than half form a chain from the top: the deepest has the largest index
  for (size_t e = 0; e < n; ++e)
    if (2 * soft[e] > total && soft[e] >= p.length_high) best = static_cast<int32_t>(e);
  if (best < 0) {
    title_and_its_lines(page, p, repeated);
    return;
  }
  for (auto& b : blocks)
    if (b.node >= 0 && !b.heading && !hard_bad(b, p, repeated) && inside(page, b.node, best)) {
      b.final_class = BlockClass::good;
      b.rule = "nothing kept: the element with most of the readable lines";
    }
  keep_headings(blocks, p, repeated);
}

// The post's body (marked_post_body), unless its text is all bad in itself (hard_bad).
int32_t post_body(const ParsedPage& page, const BlockParams& p, bool repeated) {
  const int32_t found = marked_post_body(page);
  if (found < 0) return -1;
  const bool soft = std::any_of(page.blocks.begin(), page.blocks.end(), [&](const Block& b) {
    return b.node >= found && inside(page, b.node, found) && !hard_bad(b, p, repeated);
  });
  return soft ? found : -1;
}

// A post's body without good text holds a short post (a line under a photo, an
// invitation with an address): its blocks not bad in themselves (hard_bad) are good.
// With good text the container's rules decide (a page builder's boxes inside the body).
void keep_post_body(ParsedPage& page, const BlockParams& p, bool repeated, int32_t body) {
  auto in_body = [&](const Block& b) { return b.node >= body && inside(page, b.node, body); };
  if (std::any_of(page.blocks.begin(), page.blocks.end(),
                  [&](const Block& b) { return b.final_class == BlockClass::good && in_body(b); }))
    return;
  for (auto& b : page.blocks)
    if (in_body(b) && !hard_bad(b, p, repeated)) {
      b.final_class = BlockClass::good;
      b.rule = "a short post: the post's body (entry-content, articleBody)";
    }
}

}  // namespace


void classify_blocks(ParsedPage& page, const BlockParams& p, bool use_stopwords) {
  auto& blocks = page.blocks;
  mark_comments(page);
  const std::vector<int32_t> listings = mark_listing_cards(page);
  const bool repeated = site_repeats_are_boilerplate(blocks, p);
  classify_each(blocks, p, use_stopwords, repeated);
  headings_before_good(blocks, p);
  short_by_neighbours(blocks);
  neargood_in_context(page);
  lead_and_listing_intro(page, p, listings);
  keep_headings(blocks, p, repeated);
  short_line_article(page, p, repeated);
  nothing_kept(page, p, repeated);
  // 6. The content container: inside it, a run of blocks bad only for their length or
  // their stop words (a key-value run, table cells, list items, code, short lines)
  // that has a good block of the container on either side is good. jusText's context
  // step for short blocks, with the container's edges instead of the page's and the
  // blocks of low stop-word density taken as short ones.
  int32_t c = content_container(page);
  if (c >= 0) c = widen_container(page, c);
  // A page with one post's body marked as such (entry-content, articleBody): that element
  // is the container, wherever most of the prose is (a short post beside a wordy sidebar).
  const int32_t body = post_body(page, p, repeated);
  if (body >= 0) {
    keep_post_body(page, p, repeated, body);
    c = widen_container(page, body);
  }
  if (c < 0) return;
  size_t first = blocks.size(), last = 0;  // the container's blocks: contiguous in document order
  for (size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i].node >= c && inside(page, blocks[i].node, c)) {
      first = std::min(first, i);
      last = i;
    }
  container_runs(page, p, repeated, first, last, body);
  outside_container(page, p, first, last);
  linked_title(page, p, repeated, first, last);
  related_boxes(page);
}

const char* block_class_name(BlockClass c) {
  switch (c) {
    case BlockClass::bad: return "bad";
    case BlockClass::shortb: return "short";
    case BlockClass::neargood: return "near-good";
    case BlockClass::good: return "good";
  }
  return "?";
}

std::string main_text(const std::vector<Block>& blocks) {
  std::string out;
  for (const auto& b : blocks) {
    if (b.final_class != BlockClass::good) continue;
    if (!out.empty()) out += '\n';
    out += b.text;
  }
  return out;
}

std::string extract_main_text(std::string_view html, const BlockParams& p) {
  auto page = parse_html_blocks(html);
  classify_blocks(page, p, true);
  return main_text(page.blocks);
}

std::string language_sample(const std::vector<Block>& blocks, size_t max_bytes) {
  size_t total = 0;
  for (const auto& b : blocks) total += b.text.size() + 1;
  std::vector<std::pair<size_t, size_t>> pick;  // (block, bytes of it in the sample)
  if (total <= max_bytes) {
    for (size_t i = 0; i < blocks.size(); ++i) pick.emplace_back(i, blocks[i].text.size());
  } else {
    std::vector<size_t> by_size(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) by_size[i] = i;
    std::stable_sort(by_size.begin(), by_size.end(),
                     [&](size_t a, size_t b) { return blocks[a].text.size() > blocks[b].text.size(); });
    size_t taken = 0;
    for (size_t i : by_size) {
      if (taken >= max_bytes) break;
      pick.emplace_back(i, std::min(blocks[i].text.size(), max_bytes - taken));
      taken += blocks[i].text.size() + 1;
    }
    std::sort(pick.begin(), pick.end());
  }
  std::string out;
  for (auto [i, n] : pick) {
    const std::string& t = blocks[i].text;
    if (n < t.size()) {  // the block that fills the sample: cut at a space, else a character
      const size_t sp = t.rfind(' ', n);
      n = (sp != std::string::npos && sp > 0) ? sp : n;
      while (n > 0 && (static_cast<unsigned char>(t[n]) & 0xC0) == 0x80) --n;
    }
    out.append(t, 0, n);
    out += '\n';
  }
  return out;
}

std::string language_sample(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  std::vector<Block> lines;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = std::min(text.find('\n', at), text.size());
    lines.emplace_back().text.assign(text, at, nl - at);
    at = nl + 1;
  }
  return language_sample(lines, max_bytes);
}

Language identify_language(std::string_view text) {
  CLD2::Language lang3[3];
  int percent3[3];
  int text_bytes = 0;
  bool reliable = false;
  const auto top = CLD2::DetectLanguageSummary(text.data(), static_cast<int>(std::min<size_t>(text.size(), 1 << 30)),
                                               true, lang3, percent3, &text_bytes, &reliable);
  Language l;
  l.code = CLD2::LanguageCode(top);
  l.score = top == CLD2::UNKNOWN_LANGUAGE ? 0.0 : percent3[0] / 100.0;
  l.reliable = reliable;
  return l;
}

namespace {

template <class Text>
Language sampled_language(const Text& text) {
  const std::string first = language_sample(text, kLanguageFirstSampleBytes);
  const Language l = identify_language(first);
  if (l.reliable && l.score >= kLanguageFirstSampleScore) return l;
  std::string full = language_sample(text, kLanguageSampleBytes);
  return full.size() > first.size() ? identify_language(full) : l;
}

}  // namespace

Language page_language(const std::vector<Block>& blocks) { return sampled_language(blocks); }
Language page_language(const std::string& text) { return sampled_language(text); }

std::string declared_language(std::string_view v) {
  while (!v.empty() && space(v.front())) v.remove_prefix(1);
  while (!v.empty() && space(v.back())) v.remove_suffix(1);
  if (v.find(',') != std::string_view::npos) return "";  // several: no prior
  size_t n = 0;
  while (n < v.size() && ((v[n] >= 'a' && v[n] <= 'z') || (v[n] >= 'A' && v[n] <= 'Z'))) ++n;
  if (n < 2 || n > 3 || (n < v.size() && v[n] != '-' && v[n] != '_')) return "";
  return lower_str(v.substr(0, n));
}

namespace {

// CLD2's three languages of a sample: codes and percentages.
struct Top3 {
  std::string code[3];
  int percent[3] = {0, 0, 0};
  bool reliable = false;
};
Top3 top3_language(std::string_view text) {
  CLD2::Language lang3[3];
  int percent3[3];
  int text_bytes = 0;
  Top3 t;
  CLD2::DetectLanguageSummary(text.data(), static_cast<int>(std::min<size_t>(text.size(), 1 << 30)), true, lang3,
                              percent3, &text_bytes, &t.reliable);
  for (int k = 0; k < 3; ++k) {
    t.code[k] = lang3[k] == CLD2::UNKNOWN_LANGUAGE ? "un" : CLD2::LanguageCode(lang3[k]);
    t.percent[k] = lang3[k] == CLD2::UNKNOWN_LANGUAGE ? 0 : percent3[k];
  }
  return t;
}

// The primary subtag of a CLD2 code ("zh-Hant" -> "zh"; CLD2's "iw" is "he").
std::string primary(const std::string& code) {
  std::string p = code.substr(0, code.find('-'));
  return p == "iw" ? "he" : p;
}

}  // namespace

TextLanguage main_text_language(const std::vector<Block>& blocks, const std::string& declared, int64_t min_chars) {
  std::vector<Block> kept;
  int64_t chars = 0;
  for (const auto& b : blocks)
    if (b.final_class == BlockClass::good) {
      kept.emplace_back().text = b.text;
      chars += b.chars;
    }
  TextLanguage out;
  if (chars < min_chars) {
    out.lang.code = "un";
    out.unclassifiable = true;
    return out;
  }
  // As page_language: the 1 KiB sample, then the 2 KiB one unless that was sure.
  const std::string first = language_sample(kept, kLanguageFirstSampleBytes);
  Top3 t = top3_language(first);
  if (!(t.reliable && t.percent[0] >= 100 * kLanguageFirstSampleScore)) {
    const std::string full = language_sample(kept, kLanguageSampleBytes);
    if (full.size() > first.size()) t = top3_language(full);
  }
  out.lang = {t.code[0], t.percent[0] / 100.0, t.reliable};
  const bool unsure = !t.reliable || t.percent[0] < 70;
  if (!declared.empty() && primary(t.code[0]) != declared && unsure)
    for (int k = 1; k < 3; ++k)
      if (primary(t.code[k]) == declared && t.percent[k] >= 20) {
        out.lang = {t.code[k], t.percent[k] / 100.0, false};
        return out;
      }
  if (!t.reliable && t.percent[0] < 50 && (declared.empty() || primary(out.lang.code) != declared))
    out.unclassifiable = true;
  if (out.lang.code == "un") out.unclassifiable = true;
  return out;
}

// --- charsets ----------------------------------------------------------------------------

std::string normalize_charset(std::string_view label) {
  std::string l = lower_str(label);
  while (!l.empty() && (l.front() == '"' || l.front() == '\'' || space(l.front()))) l.erase(0, 1);
  while (!l.empty() && (l.back() == '"' || l.back() == '\'' || l.back() == ';' || space(l.back()))) l.pop_back();
  if (l.empty()) return "";
  static const std::unordered_map<std::string, std::string> alias = {{"utf-8", "UTF-8"},
                                                                     {"utf8", "UTF-8"},
                                                                     {"unicode-1-1-utf-8", "UTF-8"},
                                                                     {"iso-8859-1", "WINDOWS-1252"},
                                                                     {"iso8859-1", "WINDOWS-1252"},
                                                                     {"latin1", "WINDOWS-1252"},
                                                                     {"l1", "WINDOWS-1252"},
                                                                     {"us-ascii", "WINDOWS-1252"},
                                                                     {"ascii", "WINDOWS-1252"},
                                                                     {"windows-1252", "WINDOWS-1252"},
                                                                     {"cp1252", "WINDOWS-1252"},
                                                                     {"x-cp1252", "WINDOWS-1252"},
                                                                     {"iso_8859-1", "WINDOWS-1252"},
                                                                     {"cp819", "WINDOWS-1252"},
                                                                     {"ibm819", "WINDOWS-1252"},
                                                                     {"shift_jis", "CP932"},
                                                                     {"shift-jis", "CP932"},
                                                                     {"sjis", "CP932"},
                                                                     {"x-sjis", "CP932"},
                                                                     {"ms_kanji", "CP932"},
                                                                     {"windows-31j", "CP932"},
                                                                     {"csshiftjis", "CP932"},
                                                                     {"gb2312", "GB18030"},
                                                                     {"gbk", "GB18030"},
                                                                     {"x-gbk", "GB18030"},
                                                                     {"gb18030", "GB18030"},
                                                                     {"euc-kr", "CP949"},
                                                                     {"ks_c_5601-1987", "CP949"},
                                                                     {"iso-8859-9", "WINDOWS-1254"},
                                                                     {"latin5", "WINDOWS-1254"},
                                                                     {"tis-620", "WINDOWS-874"},
                                                                     {"iso-8859-11", "WINDOWS-874"},
                                                                     {"utf-16", "UTF-16LE"},
                                                                     {"utf-16le", "UTF-16LE"},
                                                                     {"utf-16be", "UTF-16BE"},
                                                                     {"euc-jp", "EUC-JP"},
                                                                     {"iso-2022-jp", "ISO-2022-JP"},
                                                                     {"big5", "BIG5-HKSCS"},
                                                                     {"koi8-r", "KOI8-R"},
                                                                     {"koi8-u", "KOI8-U"}};
  if (auto it = alias.find(l); it != alias.end()) return it->second;
  // A label with '_' for '-' (Java's "ISO8859_1") is the label with '-'.
  std::string dashed = l;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  if (auto it = alias.find(dashed); it != alias.end()) return it->second;
  std::string up = l;
  for (auto& c : up) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return up;
}

std::string meta_charset(std::string_view body) {
  const std::string head = lower_str(body.substr(0, 4096));
  size_t at = 0;
  while ((at = head.find("<meta", at)) != std::string::npos) {
    const size_t end = head.find('>', at);
    const std::string_view tag =
        std::string_view(head).substr(at, end == std::string::npos ? std::string::npos : end - at);
    at += 5;
    size_t cs = tag.find("charset");
    if (cs == std::string_view::npos) continue;
    cs += 7;
    while (cs < tag.size() && space(tag[cs])) ++cs;
    if (cs >= tag.size() || tag[cs] != '=') continue;
    ++cs;
    while (cs < tag.size() && (space(tag[cs]) || tag[cs] == '"' || tag[cs] == '\'')) ++cs;
    size_t e = cs;
    while (e < tag.size() && !space(tag[e]) && tag[e] != '"' && tag[e] != '\'' && tag[e] != ';' && tag[e] != '/') ++e;
    if (e > cs) return std::string(body.substr(at - 5 + (cs), e - cs));
  }
  return "";
}

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // Eight ASCII bytes at a time.
    uint64_t word;
    if (i + 8 <= n && (std::memcpy(&word, p + i, 8), (word & 0x8080808080808080ULL) == 0)) {
      i += 8;
      continue;
    }
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else
      return false;
    if (i + static_cast<size_t>(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + static_cast<size_t>(k)] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + static_cast<size_t>(k)] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

struct Utf8Converter::Impl {
  std::unordered_map<std::string, iconv_t> cds;
  uchardet_t ud = nullptr;
  ~Impl() {
    for (auto& [k, cd] : cds) iconv_close(cd);
    if (ud) uchardet_delete(ud);
  }
};

Utf8Converter::Utf8Converter() : impl_(std::make_unique<Impl>()) {}
Utf8Converter::~Utf8Converter() = default;

std::string Utf8Converter::detect(std::string_view body) {
  if (!impl_->ud) impl_->ud = uchardet_new();
  uchardet_reset(impl_->ud);
  uchardet_handle_data(impl_->ud, body.data(), std::min<size_t>(body.size(), 1 << 16));
  uchardet_data_end(impl_->ud);
  const char* cs = uchardet_get_charset(impl_->ud);
  return normalize_charset(cs ? cs : "");
}

std::string Utf8Converter::convert(std::string_view in, const std::string& cs, int64_t* replaced) {
  if (cs == "UTF-8") {
    if (valid_utf8(in)) return std::string(in);
  }
  auto it = impl_->cds.find(cs);
  if (it == impl_->cds.end()) {
    iconv_t cd = iconv_open("UTF-8", cs.c_str());
    if (cd == reinterpret_cast<iconv_t>(-1)) throw WarcError("encoding", fmt::format("unknown encoding '{}'", cs));
    it = impl_->cds.emplace(cs, cd).first;
  }
  iconv_t cd = it->second;
  iconv(cd, nullptr, nullptr, nullptr, nullptr);
  std::string out;
  out.resize(in.size() * 2 + 16);
  char* src = const_cast<char*>(in.data());
  size_t src_left = in.size();
  size_t used = 0;
  while (src_left > 0) {
    char* dst = out.data() + used;
    size_t dst_left = out.size() - used;
    const size_t r = iconv(cd, &src, &src_left, &dst, &dst_left);
    used = out.size() - dst_left;
    if (r != static_cast<size_t>(-1)) break;
    if (errno == E2BIG) {
      out.resize(out.size() * 2);
    } else {  // EILSEQ or EINVAL: one byte becomes U+FFFD
      if (out.size() - used < 3) out.resize(out.size() * 2);
      std::memcpy(out.data() + used, "\xEF\xBF\xBD", 3);
      used += 3;
      ++src;
      --src_left;
      if (replaced) ++*replaced;
      iconv(cd, nullptr, nullptr, nullptr, nullptr);
    }
  }
  out.resize(used);
  return out;
}

// --- HTTP --------------------------------------------------------------------------------

namespace {

std::string inflate_body(const std::string& in, bool raw_deflate_ok, const std::string& where) {
  z_stream zs{};
  // 15 + 32: zlib or gzip header, detected.
  if (inflateInit2(&zs, 15 + 32) != Z_OK) throw_runtime("zlib initialisation failed");
  std::string out;
  char buf[1 << 15];
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  int ret = Z_OK;
  do {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    ret = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - zs.avail_out);
    if (out.size() > (size_t{1} << 28)) break;  // 256 MiB: a decompression bomb is not a page
  } while (ret == Z_OK && (zs.avail_in > 0 || zs.avail_out == 0));
  inflateEnd(&zs);
  if (ret == Z_DATA_ERROR && raw_deflate_ok) {
    z_stream r{};
    inflateInit2(&r, -15);
    out.clear();
    r.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    r.avail_in = static_cast<uInt>(in.size());
    do {
      r.next_out = reinterpret_cast<Bytef*>(buf);
      r.avail_out = sizeof(buf);
      ret = inflate(&r, Z_NO_FLUSH);
      out.append(buf, sizeof(buf) - r.avail_out);
    } while (ret == Z_OK && (r.avail_in > 0 || r.avail_out == 0));
    inflateEnd(&r);
  }
  if (ret != Z_STREAM_END && ret != Z_OK && ret != Z_BUF_ERROR)
    throw WarcError("http", fmt::format("{}: HTTP body: Content-Encoding does not decode ({})", where,
                                        zs.msg ? zs.msg : "corrupt"));
  return out;
}

}  // namespace

namespace {

// A chunked transfer-encoded body's data; a body cut short keeps what came.
std::string dechunk(const std::string& body) {
  std::string out;
  size_t p = 0;
  for (;;) {
    const size_t nl = body.find('\n', p);
    if (nl == std::string::npos) break;
    const size_t size = std::strtoull(body.c_str() + p, nullptr, 16);
    p = nl + 1;
    if (size == 0) break;
    out.append(body, p, std::min(size, body.size() - std::min(p, body.size())));
    p += size;
    if (p < body.size() && body[p] == '\r') ++p;
    if (p < body.size() && body[p] == '\n') ++p;
    if (p >= body.size()) break;
  }
  return out;
}

}  // namespace

HttpResponse parse_http_response(std::string_view block, const std::string& where) {
  HttpResponse r;
  size_t pos = 0;
  auto line = [&](std::string_view& out) {
    if (pos >= block.size()) return false;
    size_t nl = block.find('\n', pos);
    if (nl == std::string_view::npos) nl = block.size();
    out = block.substr(pos, nl - pos);
    if (!out.empty() && out.back() == '\r') out.remove_suffix(1);
    pos = nl + 1;
    return true;
  };
  std::string_view l;
  if (!line(l) || l.rfind("HTTP/", 0) != 0)
    throw WarcError("http", fmt::format("{}: HTTP status line: expected 'HTTP/1.x NNN', found '{}'", where,
                                        std::string(l.substr(0, 40))));
  const size_t sp = l.find(' ');
  if (sp == std::string_view::npos || sp + 4 > l.size() + 0 || l.size() < sp + 4)
    throw WarcError("http",
                    fmt::format("{}: HTTP status line: no status code in '{}'", where, std::string(l.substr(0, 40))));
  for (int k = 1; k <= 3; ++k) {
    const char c = l[sp + static_cast<size_t>(k)];
    if (c < '0' || c > '9')
      throw WarcError("http",
                      fmt::format("{}: HTTP status line: no status code in '{}'", where, std::string(l.substr(0, 40))));
    r.status = r.status * 10 + (c - '0');
  }
  std::string content_type, content_encoding, transfer_encoding;
  bool ended = false;
  while (line(l)) {
    if (l.empty()) {
      ended = true;
      break;
    }
    const size_t colon = l.find(':');
    if (colon == std::string_view::npos) continue;  // tolerated: servers send odd lines
    const std::string name = lower_str(l.substr(0, colon));
    std::string_view v = l.substr(colon + 1);
    while (!v.empty() && space(v.front())) v.remove_prefix(1);
    while (!v.empty() && space(v.back())) v.remove_suffix(1);
    if (name == "content-type")
      content_type = std::string(v);
    else if (name == "content-encoding")
      content_encoding = lower_str(v);
    else if (name == "transfer-encoding")
      transfer_encoding = lower_str(v);
    else if (name == "content-language")
      r.content_language = std::string(v);
  }
  if (!ended && pos < block.size())
    throw WarcError("http", fmt::format("{}: HTTP headers: no blank line before the body", where));
  // Media type and charset parameter.
  {
    const std::string ct = lower_str(content_type);
    const size_t semi = ct.find(';');
    std::string mt = ct.substr(0, semi);
    while (!mt.empty() && space(mt.back())) mt.pop_back();
    r.content_type = mt;
    const size_t cs = ct.find("charset=");
    if (cs != std::string::npos) {
      size_t e = ct.find(';', cs);
      r.charset = content_type.substr(cs + 8, e == std::string::npos ? std::string::npos : e - cs - 8);
    }
  }
  std::string body(pos < block.size() ? block.substr(pos) : std::string_view());
  if (transfer_encoding.find("chunked") != std::string::npos) body = dechunk(body);
  if (content_encoding == "gzip" || content_encoding == "x-gzip" || content_encoding == "deflate")
    body = inflate_body(body, content_encoding == "deflate", where);
  else if (!content_encoding.empty() && content_encoding != "identity")
    throw WarcError("http", fmt::format("{}: HTTP Content-Encoding '{}' is not supported (gzip, deflate)", where,
                                        content_encoding));
  r.body = std::move(body);
  return r;
}

}  // namespace mtnlg::extract
