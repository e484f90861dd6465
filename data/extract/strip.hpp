// A pass over the HTML before the HTML5 parse that removes what can hold no text of the
// page: the contents of <script> and <style> elements and comments. Common Crawl pages are
// often mostly inline scripts, JSON and CSS, and the parser otherwise tokenizes every byte
// of them one character at a time. The result parses to the same tree, less those texts
// and comment nodes (docs/specs/justext.md, "Before the parse").
#pragma once
#include <string>
#include <string_view>

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
size_t strip_raw_text(std::string_view html, std::string& out);

}  // namespace mtnlg::extract
