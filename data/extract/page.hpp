// One web page to clean text (docs/CURATION.md, "Text extraction"): the HTTP response
// in a WARC record's block -> body (chunked and gzip/deflate content encodings undone)
// -> charset (BOM, HTTP header, <meta>, valid UTF-8, else libuchardet) -> UTF-8 (iconv,
// invalid bytes become U+FFFD) -> HTML5 tree (libgumbo) -> text blocks -> jusText-style
// block classifier -> main text, and its language (CLD2).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/extract/warc.hpp"

namespace mtnlg::extract {

// The block classifier's thresholds (jusText's defaults; docs/specs/justext.md).
struct BlockParams {
  int64_t length_low = 70;                // characters: shorter blocks are "short"
  int64_t length_high = 200;              // characters: longer, wordy blocks are "good"
  double stopwords_low = 0.30;            // stop-word density of a "near-good" block
  double stopwords_high = 0.32;           // ... of a "good" one
  double max_link_density = 0.2;          // more link text than this: "bad"
  int64_t max_heading_distance = 200;     // characters from a heading to good text
  double max_heading_link_density = 0.5;  // a heading with an "[edit]" link is still a heading
  // Structure (docs/specs/justext.md, "Structure"): text repeated on another page of the
  // same site at least this long (code points) is boilerplate; comment and review
  // sections are left out unless `keep_comments`.
  int64_t repeat_min_chars = 70;
  bool keep_comments = false;
};

enum class BlockClass { bad, shortb, neargood, good };

struct Block {
  std::string text;        // whitespace collapsed (kept inside <pre>)
  int64_t chars = 0;       // code points
  int64_t length = 0;      // code points, those of CJK scripts (U+3000..U+D7FF) counted three times: the length tests
  int64_t link_chars = 0;  // code points inside <a>
  int64_t words = 0, stopwords = 0;
  bool heading = false;              // <h1>..<h6>
  bool h1 = false;                   // <h1>
  bool pre = false;                  // inside <pre>
  bool repeated = false;             // set by the caller: the text is on another page of the same site
  bool comment = false;              // classify_blocks: inside a comment or review section
  bool listing = false;              // classify_blocks: inside a teaser card of a listing
  bool boilerplate_context = false;  // inside nav/footer/aside, a page header, or a class/id such as "cookie", "menu"
  int32_t node = -1;                 // the innermost block-level element holding the text (ParsedPage::parent)
  BlockClass initial = BlockClass::bad, final_class = BlockClass::bad;
  const char* rule = "";  // classify_blocks: the rule that decided final_class (`data extract --explain`)
};

// What the words of a class, id, itemprop or itemtype value mark (a word: a run of ASCII
// letters and digits, split where a lower-case letter meets an upper-case one, compared
// lower-cased and whole: "content-with-sidebar-wrp" holds "sidebar", "mainNav" "nav",
// "penci_sidebar" "sidebar", "sidebarless" nothing): page furniture (cookie, consent, nav,
// menu, footer, sidebar, breadcrumb, share, banner, signature, ...), boxes that are
// furniture only when they hold no prose (paywall, premium, embed, ...), and
// user-generated sections (comment, comments, kommentare, commentaires, comentarios,
// disqus, review, reviews, bewertungen, a word holding "comment" or "review" but not
// "commentary", "preview" or the hReview microformat's "hreview" (a review post is the
// article); schema.org's Comment, UserComments and Review types;
// docs/specs/justext.md, "Structure").
// kMarkPostBody: a whole class, id or itemprop token naming the body of a post or article
// ("entry-content" of the hAtom microformat, schema.org's "articleBody" and "reviewBody",
// Blogger's "post-body", TypePad's "entry-body", "post-content", "article-body"; case
// aside); the words of such a token mark nothing else ("reviewBody" is no review section).
// kMarkAuthor: an author's box (author, authors, autor, autorin), furniture when it holds
// prose (a bio beside the article), not when it is a byline alone.
constexpr uint8_t kMarkFurniture = 1, kMarkComment = 2, kMarkSoftFurniture = 4, kMarkPostBody = 8, kMarkAuthor = 16;
// ParsedPage::marks: the element is a table row; it is furniture by its tag, role or
// class words (kNodeSoft: by soft words only; kNodeWords: by class or id words, not by
// its tag or role). A furniture element's text is the page's
// furniture (Block::boilerplate_context) unless the element holds most of the page's
// prose, or it is soft and holds prose (docs/specs/justext.md, "Structure").
// kNodeAuthor (kMarkFurniture's bit, which the elements' marks do not keep): kMarkAuthor
// outside the page's and the content's own elements.
constexpr uint8_t kNodeRow = 0x80, kNodeFurniture = 0x40, kNodeSoft = 0x20, kNodeWords = 0x10, kNodeAuthor = 0x01;
uint8_t attribute_marks(std::string_view value);
inline bool furniture_attribute(std::string_view class_or_id) { return attribute_marks(class_or_id) & kMarkFurniture; }

// The blocks of an HTML document (UTF-8), in document order, its block-level elements
// (each one's parent, in document order; the blocks' `node`s index it) and its <title>.
struct ParsedPage {
  std::vector<Block> blocks;
  std::vector<int32_t> parent;  // -1: the outermost element
  std::vector<uint8_t>
      marks;  // per element: kMarkComment, kMarkPostBody (its class, id, itemprop or itemtype), kNode* bits
  std::vector<uint8_t> tags;  // per element: its GumboTag (at most 255)
  std::string title;
  std::string lang;                     // <html lang>, as written
  std::vector<std::string> node_names;  // per element, with `names`: "div#id.class.class" (--explain)
};
// `strip`: the contents of <script>, <style> and comments are removed first, the text
// runs stand in as placeholders during the parse, and tags whose absence leaves the blocks
// the same go (strip.hpp); the blocks are the same, and the parser is spared most of the
// bytes and tags of a page.
// `names`: the elements' names, ids and classes kept in node_names (the page is then
// parsed without the pass before the parse, which drops them).
ParsedPage parse_html_blocks(std::string_view html_utf8, bool strip = true, bool names = false);
// The name of block classes as `--explain` prints them: "bad", "short", "near-good", "good".
const char* block_class_name(BlockClass c);

// Classifies the blocks in place; `use_stopwords` false for a language without a
// stop-word list (only length, link density and context count then). The page's
// structure first (comment and review sections, teaser cards of listings, text the
// caller marked `repeated`: docs/specs/justext.md, "Structure"), then jusText's steps
// (each block alone, then its neighbours; <pre> text good), groups of paragraphs, the
// lead under the <h1>, a listing's intro, then the content container: the deepest
// element holding most of the prose and the first prose after the <h1> (widened over
// siblings that go on with the article); inside it near-good prose and runs of short or
// low-stop-word blocks next to its good text are good, outside it only headings leading
// into kept text stay (docs/specs/justext.md, "The content container").
void classify_blocks(ParsedPage& page, const BlockParams& p, bool use_stopwords);

// The kept (good) blocks joined by '\n'.
std::string main_text(const std::vector<Block>& blocks);

// Convenience for tests and benchmarks: parse, classify (English stop words), join.
std::string extract_main_text(std::string_view html_utf8, const BlockParams& p = {});

// The text CLD2 sees for a page: every block's text joined by '\n' when that is at most
// `max_bytes`; else the longest blocks, in document order, up to about `max_bytes` (the
// last one cut at a space). CLD2's time grows with the text; a few KB of the page's
// longest (main-text) blocks decide the language as well as the whole page does.
std::string language_sample(const std::vector<Block>& blocks, size_t max_bytes);
// The same for plain text (a WET conversion record): its lines as the blocks.
std::string language_sample(const std::string& text, size_t max_bytes);

// Language of UTF-8 text by CLD2: ISO code ("en", "de", "ja", "un" when unknown) and
// the share of the text bytes in it (0..1).
struct Language {
  std::string code;
  double score = 0;
  bool reliable = false;
};
Language identify_language(std::string_view utf8_text);

// The language of a page (its blocks) or of a WET record (its text): CLD2 on the 1 KiB
// language_sample first; that answer stands when CLD2 calls it reliable and puts at least
// 95% of the sample in that language; otherwise CLD2 on the 2 KiB sample decides (the
// score is then that sample's share). CLD2's time grows with its input (~290
// instructions a byte); docs/specs/justext.md "Language" has the measurements behind
// the sizes.
constexpr size_t kLanguageFirstSampleBytes = 1024, kLanguageSampleBytes = 2048;
constexpr double kLanguageFirstSampleScore = 0.95;
Language page_language(const std::vector<Block>& blocks);
Language page_language(const std::string& text);

// The language of a page's MAIN text (its good blocks), with the page's declared language
// (`declared`: Content-Language or <html lang>, declared_language's form) as the prior:
// CLD2 on the main text's sample (as page_language); the declared language wins over
// CLD2's first answer when it is among CLD2's three with at least 20% of the text and
// CLD2 is unsure (not reliable, or under 70% for its first). `unclassifiable` when the
// main text has fewer than `min_chars` code points, when CLD2 knows no language, or when
// it is not reliable, under 50% for its first and the declaration does not back it (docs/specs/justext.md, "Language").
struct TextLanguage {
  Language lang;
  bool unclassifiable = false;
};
TextLanguage main_text_language(const std::vector<Block>& blocks, const std::string& declared, int64_t min_chars);
// The primary subtag of a Content-Language or lang value, lower case ("zh-CN" -> "zh");
// "" when there is none or several languages are listed.
std::string declared_language(std::string_view value);

// Charsets. `normalize_charset` maps an HTTP/HTML label to the name iconv uses, following
// the web's aliases (iso-8859-1 and us-ascii mean windows-1252, shift_jis means
// Windows-31J, ...); "" for an empty label.
std::string normalize_charset(std::string_view label);
// The charset declared by a <meta> tag in the first 4 KiB of `body`, or "".
std::string meta_charset(std::string_view body);
bool valid_utf8(std::string_view s);

// Converts `in` (charset `cs`, normalized) to UTF-8; invalid sequences become U+FFFD
// (counted). Throws WarcError("encoding") when iconv does not know the charset. Keeps
// one iconv descriptor per charset.
class Utf8Converter {
 public:
  Utf8Converter();
  ~Utf8Converter();
  Utf8Converter(const Utf8Converter&) = delete;
  Utf8Converter& operator=(const Utf8Converter&) = delete;
  std::string convert(std::string_view in, const std::string& cs, int64_t* replaced);
  // Charset found by libuchardet, normalized ("" when it has no guess).
  std::string detect(std::string_view body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The parts of an HTTP response (the block of a WARC `response` record).
struct HttpResponse {
  int status = 0;
  std::string content_type;      // media type, lower case, without parameters
  std::string charset;           // the Content-Type charset parameter, as written
  std::string content_language;  // the Content-Language header, as written
  std::string body;              // chunked transfer coding and gzip/deflate content coding undone
};
// Throws WarcError("http") naming the part at fault; `where` prefixes the message
// ("FILE: record N at byte B").
HttpResponse parse_http_response(std::string_view block, const std::string& where);

}  // namespace mtnlg::extract
