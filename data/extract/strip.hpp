// A pass over the HTML before the HTML5 parse that removes what can hold no text of the
// page: the contents of <script> and <style> elements and comments. Common Crawl pages are
// often mostly inline scripts, JSON and CSS, and the parser otherwise tokenizes every byte
// of them one character at a time. With its options it also takes the text, the
// attributes nothing reads and the tags whose absence changes no block out of the parse;
// the walk then finds the same blocks (docs/specs/justext.md, "Before the parse").
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace mtnlg::extract {

// Appends `html` to `out` (cleared first) with the contents of <script> and <style> and
// every comment removed. It reads the markup as the HTML5 tokenizer does where that
// matters: tag names case-insensitively; attribute values in quotes may hold '>'; the
// text of <title>, <textarea>, <xmp>, <iframe>, <noembed>, <noframes> and everything after
// <plaintext> is copied as it is (a "<script>" there is text); script data ends at the
// first "</script" followed by whitespace, '/' or '>' outside the escaped states that
// "<!--" and a nested "<script" open; <svg> and <math> (foreign content, where <style/> can
// close itself) are copied as they are up to their end tag; inside <select> (where the
// parser ignores a <style> tag) and after <frameset> nothing is removed. Returns the number
// of bytes removed.
//
// With `runs`, the text in the data state (and a <title>'s) is also taken out of the
// parse: each piece of text of 2 bytes or more (without leading or trailing whitespace,
// character references or NULs, which the parser would change) is replaced by one
// private-use character that numbers it (two from the 6,337th piece on), and `runs` gets
// the piece. The parser then builds the same tree (a placeholder is text, and not
// whitespace, as the piece is) in a fraction of the time: it reads one character where the
// piece had many. The walker puts the pieces back (placeholder_at). A page that holds
// private-use characters itself (or numeric references to them) is left without
// placeholders.
//
// With `drop_attributes`, each start tag is written with only what the block walk or the
// tree builder reads of it: hidden, aria-hidden="true", the walk's roles, type=hidden on
// <input>, color/face/size on <font>, encoding on <annotation-xml>, prompt and action on
// <isindex> (the first of each name: the parser ignores repeats; a value with a character
// reference stays as written), lang on <html>, one space before each; class, id, itemprop
// and itemtype, of which the walk only asks what their words mark (attribute_marks),
// become one id standing for their marks together (id=nav furniture, id=comments a
// comment section, id="nav comments" both; class= when the id stays) or go when they mark
// nothing. End tags lose what the parser
// ignores in them. A tag the input ends inside is left as it is.
//
// With both, tags whose absence leaves the blocks the same go too (docs/specs/justext.md,
// "Before the parse"): an inline element holding nothing but one piece of text (<a>,
// <span>, <b>, <code>, ... without attributes left, as in "<a href=x>Home</a>") becomes its
// piece's placeholder (a run marked `link` for an <a>); end tags the next tag implies
// (</td><td>, </li><li> after text only, </p><div> after text only, ...); whitespace-only
// text before a block's start tag; <meta>, <link>, <base> and emptied <script> and <style>.
// The pass keeps track of what would make that change the blocks and leaves them where it
// could: inside <pre> (the walk reads whitespace there as the parser splits it), directly
// in a table outside a cell (text is moved out of the table where an element is not), an
// <a> while another <a> may still be open (a new <a> closes it), before the tree builder
// leaves its initial mode, after foreign content, <template>, <object>, <applet> or
// <marquee>.
struct TextRun {
  std::string_view text;  // a view of the page
  bool link = false;      // the text of an <a> taken out of the parse
};
size_t strip_raw_text(std::string_view html, std::string& out, std::vector<TextRun>* runs = nullptr,
                      bool drop_attributes = false);

// Where a page's first <title> would end if its end tag was lost: the first '<' after its
// start tag, when no "</title" follows anywhere (the title's text, RCDATA, would otherwise
// run to the end of the page and the body would be empty: pages whose bytes were damaged
// after the title, which libxml2's HTML parser recovers from); npos otherwise.
size_t unclosed_title_end(std::string_view html);

// Whether an inline style hides its element: it declares display:none or
// visibility:hidden (any case and spacing, !important or not). The walk leaves such an
// element out, as it does one with `hidden`; the pass keeps such a style (and no other).
bool style_hides(std::string_view style);

// The placeholders: U+E000 + k for piece k < kPlaceholderSingle, else the two characters
// U+E000 + kPlaceholderSingle + (k - kPlaceholderSingle) / 6400 and U+E000 + (k -
// kPlaceholderSingle) % 6400; all in U+E000..U+F8FF (three bytes of UTF-8 each).
constexpr size_t kPlaceholderBase = 6400;    // U+E000..U+F8FF
constexpr size_t kPlaceholderSingle = 6336;  // pieces with a one-character placeholder
constexpr size_t kPlaceholderRuns =          // pieces a page can have; the text after them stays
    kPlaceholderSingle + (kPlaceholderBase - kPlaceholderSingle) * kPlaceholderBase;
// The number of the piece whose placeholder starts at s[i], its length in bytes in
// `bytes`; npos when none starts there.
size_t placeholder_at(std::string_view s, size_t i, size_t* bytes = nullptr);

// Appends a run's text as the parser would have given it: CR LF and CR as LF, and the code
// points it replaces by U+FFFD (controls, noncharacters) replaced. `run` is valid UTF-8.
void append_as_parsed(std::string& out, std::string_view run);
// The run as the parser would have given it: `run` itself when nothing changes, else
// `scratch` holding it.
std::string_view as_parsed(std::string_view run, std::string& scratch);

}  // namespace mtnlg::extract
