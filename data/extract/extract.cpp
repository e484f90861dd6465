// `mtnlg data extract`, one input file at a time: see extract.hpp.
#include "data/extract/extract.hpp"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/atomic_file.hpp"

namespace mtnlg::extract {

namespace {

constexpr const char* kCounterNames[kCounters] = {"records",
                                                  "response_records",
                                                  "conversion_records",
                                                  "other_records",
                                                  "http_not_200",
                                                  "not_html",
                                                  "pages",
                                                  "no_main_text",
                                                  "language_dropped",
                                                  "language_unclassifiable",
                                                  "documents",
                                                  "characters",
                                                  "bytes_replaced",
                                                  "charset_from_bom",
                                                  "charset_from_http",
                                                  "charset_from_meta",
                                                  "charset_utf8_valid",
                                                  "charset_detected",
                                                  "charset_default",
                                                  "bad_truncated",
                                                  "bad_gzip",
                                                  "bad_header",
                                                  "bad_oversize",
                                                  "bad_encoding",
                                                  "bad_http"};

int bad_counter(const std::string& cause) {
  if (cause == "truncated") return kBadTruncated;
  if (cause == "gzip") return kBadGzip;
  if (cause == "oversize") return kBadOversize;
  if (cause == "encoding") return kBadEncoding;
  if (cause == "http") return kBadHttp;
  return kBadHeader;
}

// JSONL shard writer: plain, or one zstd frame written as it goes.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, bool zstd) : file_(path), zstd_(zstd) {
    if (zstd_) {
      cctx_ = ZSTD_createCCtx();
      ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, 3);
      ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1);
      out_.resize(ZSTD_CStreamOutSize());
    }
  }
  ~ShardWriter() {
    if (cctx_) ZSTD_freeCCtx(cctx_);
  }
  void line(const std::string& s) {
    pending_ += s;
    pending_ += '\n';
    if (pending_.size() >= (1 << 20)) flush(false);
  }
  void commit() {
    flush(true);
    file_.commit();
  }

 private:
  void flush(bool end) {
    if (!zstd_) {
      file_.write(pending_);
      pending_.clear();
      return;
    }
    ZSTD_inBuffer in{pending_.data(), pending_.size(), 0};
    for (;;) {
      ZSTD_outBuffer ob{out_.data(), out_.size(), 0};
      const size_t left = ZSTD_compressStream2(cctx_, &ob, &in, end ? ZSTD_e_end : ZSTD_e_continue);
      if (ZSTD_isError(left)) throw_runtime("zstd: {}", ZSTD_getErrorName(left));
      file_.write(out_.data(), ob.pos);
      if (end ? left == 0 : in.pos == in.size) break;
    }
    pending_.clear();
  }
  AtomicFile file_;
  bool zstd_;
  ZSTD_CCtx* cctx_ = nullptr;
  std::string pending_, out_;
};

bool is_html_type(const std::string& mt) {
  return mt == "text/html" || mt == "application/xhtml+xml" || mt == "application/xml+xhtml";
}

bool looks_like_html(std::string_view body) {
  std::string head(body.substr(0, 512));
  for (auto& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return head.find("<html") != std::string::npos || head.find("<!doctype html") != std::string::npos ||
         head.find("<body") != std::string::npos || head.find("<p>") != std::string::npos;
}

bool has_zero_byte(uint64_t x) { return ((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL) != 0; }

// Whether one of the eight bytes in `x` is under 0x20, '"' or '\\'.
bool needs_escape(uint64_t x) {
  const bool control = ((x - 0x2020202020202020ULL) & ~x & 0x8080808080808080ULL) != 0;
  return control || has_zero_byte(x ^ 0x2222222222222222ULL) || has_zero_byte(x ^ 0x5C5C5C5C5C5C5C5CULL);
}

// Appends `s` as a JSON string exactly as nlohmann's dump writes valid UTF-8 (ensure_ascii
// off: '"', '\\' and control characters escaped, \u00xx in lower case, the rest as is).
void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  size_t run = 0;  // start of the bytes not yet copied
  for (size_t i = 0; i < s.size(); ++i) {
    // Eight bytes at a time while none is a control character, '"' or '\\'.
    uint64_t x;
    while (i + 8 <= s.size() && (std::memcpy(&x, s.data() + i, 8), !needs_escape(x))) i += 8;
    if (i >= s.size()) break;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s, run, i - run);
    run = i + 1;
    out += '\\';
    switch (c) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '\b': out += 'b'; break;
      case '\f': out += 'f'; break;
      case '\n': out += 'n'; break;
      case '\r': out += 'r'; break;
      case '\t': out += 't'; break;
      default:
        out += "u00";
        out += kHex[c >> 4];
        out += kHex[c & 15];
        break;
    }
  }
  out.append(s, run, s.size() - run);
  out += '"';
}

// One output line, byte for byte what nlohmann::ordered_json::dump writes for these keys
// (built by hand: the JSON library was ~4% of the run); strings that are not valid UTF-8
// (a URL, say) go through nlohmann, which replaces the bad bytes.
std::string document_line(const std::string& text, std::string_view url, std::string_view id, std::string_view date,
                          const Language& lang) {
  if (!valid_utf8(text) || !valid_utf8(url) || !valid_utf8(id) || !valid_utf8(date) || !valid_utf8(lang.code)) {
    nlohmann::ordered_json j;
    j["text"] = text;
    j["url"] = std::string(url);
    j["warc_record_id"] = std::string(id);
    j["date"] = std::string(date);
    j["language"] = lang.code;
    j["language_score"] = lang.score;
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string out;
  out.reserve(text.size() + url.size() + 160);
  const std::pair<const char*, std::string_view> fields[] = {{"{\"text\":", text},
                                                             {",\"url\":", url},
                                                             {",\"warc_record_id\":", id},
                                                             {",\"date\":", date},
                                                             {",\"language\":", lang.code}};
  for (const auto& [key, value] : fields) {
    out += key;
    append_json_string(out, value);
  }
  std::string score = fmt::format("{}", lang.score);  // shortest round-trip digits, as nlohmann
  if (score.find_first_of(".eE") == std::string::npos && std::isfinite(lang.score)) score += ".0";
  out += ",\"language_score\":";
  out += std::isfinite(lang.score) ? score : "null";
  out += '}';
  return out;
}

}  // namespace

const char* counter_name(int c) { return kCounterNames[c]; }

std::vector<std::string> shard_paths(const ExtractOptions& opt) {
  std::vector<std::string> out;
  std::map<std::string, std::string> seen;
  for (const auto& in : opt.inputs) {
    const std::string stem = warc_stem(in);
    if (auto it = seen.find(stem); it != seen.end())
      throw_input("--input: '{}' and '{}' would both write the shard '{}' (one stem per input)", it->second, in, stem);
    seen[stem] = in;
    out.push_back(
        (std::filesystem::path(opt.output_dir) / (stem + (opt.compress == "zstd" ? ".jsonl.zst" : ".jsonl"))).string());
  }
  return out;
}

void check_extract_options(const ExtractOptions& opt) {
  if (opt.inputs.empty()) throw_input("data extract: --input: no input files");
  if (opt.compress != "none" && opt.compress != "zstd")
    throw_input("--compress: '{}' is not none or zstd", opt.compress);
  if (opt.languages.empty()) throw_input("--languages: empty (give ISO codes such as en,de or 'all')");
  if (opt.max_record_bytes < 1024) throw_input("--max-record-bytes: {} is under 1024", opt.max_record_bytes);
  if (opt.min_language_chars < 0) throw_input("--min-language-chars: {} is negative", opt.min_language_chars);
  if (opt.blocks.repeat_min_chars < 1) throw_input("--repeat-min-chars: {} is under 1", opt.blocks.repeat_min_chars);
  std::set<std::string> dup;
  for (const auto& in : opt.inputs) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(in, ec)) throw_input("--input: {}: no such file", in);
    const auto canon = std::filesystem::weakly_canonical(in, ec).string();
    if (!dup.insert(canon).second) throw_input("--input: {} is given twice", in);
  }
  shard_paths(opt);
}

std::vector<int64_t> assign_inputs(const std::vector<std::string>& inputs, int64_t W, int64_t r) {
  std::vector<std::pair<int64_t, int64_t>> by_size;  // (-size, index)
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::error_code ec;
    const auto s = static_cast<int64_t>(std::filesystem::file_size(inputs[i], ec));
    by_size.emplace_back(ec ? 0 : -s, static_cast<int64_t>(i));
  }
  std::sort(by_size.begin(), by_size.end());
  std::vector<int64_t> load(static_cast<size_t>(W), 0), mine;
  for (const auto& [neg, i] : by_size) {
    const auto q = static_cast<int64_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[static_cast<size_t>(q)] += -neg + 1;
    if (q == r) mine.push_back(i);
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

namespace {

// The charset of an HTML body, in order of authority: a byte-order mark (removed from
// `body`), the HTTP header, <meta>, valid UTF-8, libuchardet's guess, windows-1252;
// counted by where it came from.
std::string body_charset(std::string_view& body, const std::string& http_charset, Utf8Converter& conv, Counts& c) {
  if (body.substr(0, 3) == "\xEF\xBB\xBF") {
    body.remove_prefix(3);
    ++c[kCsBom];
    return "UTF-8";
  }
  if (body.substr(0, 2) == "\xFF\xFE" || body.substr(0, 2) == "\xFE\xFF") {
    const std::string cs = body[0] == '\xFF' ? "UTF-16LE" : "UTF-16BE";
    body.remove_prefix(2);
    ++c[kCsBom];
    return cs;
  }
  if (!http_charset.empty()) {
    ++c[kCsHttp];
    return normalize_charset(http_charset);
  }
  if (const std::string m = meta_charset(body); !m.empty()) {
    ++c[kCsMeta];
    return normalize_charset(m);
  }
  if (valid_utf8(body)) {
    ++c[kCsUtf8];
    return "UTF-8";
  }
  if (std::string cs = conv.detect(body); !cs.empty()) {
    ++c[kCsDetected];
    return cs;
  }
  ++c[kCsDefault];
  return "WINDOWS-1252";
}

// --languages and --min-language-score: whether a page's language is kept (a dropped
// one is counted, and tallied by language for the report).
struct LanguageFilter {
  explicit LanguageFilter(const ExtractOptions& opt)
      : all(std::find(opt.languages.begin(), opt.languages.end(), "all") != opt.languages.end()),
        keep(opt.languages.begin(), opt.languages.end()),
        min_score(opt.min_language_score) {}
  bool kept(const Language& lang, Counts& c, std::map<std::string, int64_t>& dropped) const {
    if (all || (keep.count(lang.code) && !(lang.score < min_score))) return true;
    ++c[kLanguageDropped];
    ++dropped[lang.code];
    return false;
  }
  bool all;
  std::set<std::string> keep;
  double min_score;
};

// The host of a URL, lower case ("" when it has none).
std::string url_host(std::string_view url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string_view::npos) return "";
  url.remove_prefix(scheme + 3);
  url = url.substr(0, url.find_first_of("/?#"));
  if (const size_t at = url.rfind('@'); at != std::string_view::npos) url.remove_prefix(at + 1);
  std::string h(url.substr(0, url.find(':')));
  for (auto& ch : h) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return h;
}

uint64_t fnv1a(std::string_view s, uint64_t h = 0xCBF29CE484222325ULL) {
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001B3ULL;
  return h;
}

// A record on its way out: a WET record's document, or a page parsed and waiting for
// the window (the pages of a site seen together) before it is classified.
struct Pending {
  std::string url, id, date;
  bool page = false;  // an HTML page (else `text` and `lang` are the document)
  ParsedPage parsed;
  std::string declared;  // Content-Language, else <html lang> (declared_language)
  std::string text;
  Language lang;
};

// One record to its pending document: the parsed page of a 200 HTML response, or a WET
// conversion record's text with its language; counted in `c` on the way.
struct RecordExtractor {
  RecordExtractor(const ExtractOptions& opt, Counts& c, std::map<std::string, int64_t>& dropped_languages)
      : opt(opt), c(c), dropped_languages(dropped_languages), languages(opt) {}

  const ExtractOptions& opt;
  Counts& c;
  std::map<std::string, int64_t>& dropped_languages;
  Utf8Converter conv;
  LanguageFilter languages;

  // False when the record gives nothing (another type, not a 200 HTML page, a WET record
  // in a language not kept). Throws WarcError.
  bool record(const WarcRecord& rec, const std::string& where, Pending& out) {
    const std::string_view type = rec.type();
    out.url = std::string(rec.header("WARC-Target-URI"));
    out.id = std::string(rec.header("WARC-Record-ID"));
    out.date = std::string(rec.header("WARC-Date"));
    if (type == "response") return response(rec, where, out);
    if (type == "conversion") {
      ++c[kConversion];
      ++c[kPages];
      out.text = conv.convert(rec.block, "UTF-8", &c[kReplacedBytes]);
      out.lang = page_language(out.text);
      return languages.kept(out.lang, c, dropped_languages);
    }
    ++c[kOtherType];
    return false;
  }

  bool response(const WarcRecord& rec, const std::string& where, Pending& out) {
    ++c[kResponse];
    const HttpResponse http = parse_http_response(rec.block, where);
    if (http.status != 200) {
      ++c[kNotOk];
      return false;
    }
    if (!(is_html_type(http.content_type) || (http.content_type.empty() && looks_like_html(http.body)))) {
      ++c[kNotHtml];
      return false;
    }
    ++c[kPages];
    std::string_view body = http.body;
    const std::string cs = body_charset(body, http.charset, conv, c);
    std::string html;
    try {
      html = conv.convert(body, cs, &c[kReplacedBytes]);
    } catch (const WarcError& e) {
      throw WarcError(e.cause(), fmt::format("{}: charset: {}", where, e.what()));
    }
    out.page = true;
    out.parsed = parse_html_blocks(html);
    out.declared = declared_language(http.content_language);
    if (out.declared.empty()) out.declared = declared_language(out.parsed.lang);
    return true;
  }

  // A page of the window to its document: classified with English stop words when it
  // looks English (its declared language, else English stop words are at least 15% of
  // the words of its blocks: a test that costs nothing, where CLD2 on the page would cost
  // as much as CLD2 on the main text), then the language of its main text decides (once
  // more classified when that turns out to be the other side of English); false when it
  // has no main text or its language is not kept.
  bool finish(Pending& pg) {
    ParsedPage& page = pg.parsed;
    bool english = pg.declared == "en";
    if (pg.declared.empty()) {
      int64_t words = 0, stopwords = 0;
      for (const auto& b : page.blocks)
        if (!b.boilerplate_context) {
          words += b.words;
          stopwords += b.stopwords;
        }
      english = stopwords * 100 >= words * 15 && words > 0;
    }
    classify_blocks(page, opt.blocks, english);
    TextLanguage tl = main_text_language(page.blocks, pg.declared, opt.min_language_chars);
    // Classified the other way when the main text's language is the other side of English,
    // or when English stop words left too little text to tell (an undeclared page in
    // another language).
    if ((!tl.unclassifiable && (tl.lang.code == "en") != english) || (tl.unclassifiable && english)) {
      classify_blocks(page, opt.blocks, !english);
      TextLanguage other = main_text_language(page.blocks, pg.declared, opt.min_language_chars);
      if (tl.unclassifiable && (other.unclassifiable || other.lang.code == "en"))
        classify_blocks(page, opt.blocks, english);  // nothing better: the first reading stands
      else
        tl = other;
    }
    pg.text = main_text(page.blocks);
    pg.lang = tl.lang;
    if (pg.text.empty()) return true;  // counted as no main text by the caller
    if (!languages.all && tl.unclassifiable) {
      ++c[kLanguageUnclassifiable];
      return false;
    }
    return languages.kept(pg.lang, c, dropped_languages);
  }
};

// Text repeated across the pages of one site (host) in one input: block texts of at
// least repeat_min_chars code points (headings aside), hashed with their host. The
// pages of a window are counted together; what earlier windows held is remembered (up to
// kMaxRemembered keys), so a page is compared with every earlier page of its site and
// with the window's later ones. A URL seen before adds nothing (a page fetched twice is
// not boilerplate of itself); a URL without a host (file://) belongs to no site.
class SiteRepetition {
 public:
  explicit SiteRepetition(int64_t min_chars) : min_chars_(min_chars) {}
  void mark(std::vector<Pending>& window) {
    std::unordered_map<uint64_t, int32_t> count;  // key -> pages of the window
    std::vector<std::vector<uint64_t>> keys(window.size());
    std::vector<char> counted(window.size(), 0);
    std::vector<char> site(window.size(), 0);  // a page with a host (a file:// URL has none: no site)
    for (size_t i = 0; i < window.size(); ++i) {
      if (!window[i].page) continue;
      const std::string h = url_host(window[i].url);
      site[i] = !h.empty();
      if (!site[i]) continue;
      const uint64_t host = fnv1a(h);
      for (const auto& b : window[i].parsed.blocks)
        if (!b.heading && b.chars >= min_chars_) keys[i].push_back(fnv1a(b.text, host));
      std::sort(keys[i].begin(), keys[i].end());
      keys[i].erase(std::unique(keys[i].begin(), keys[i].end()), keys[i].end());
      const uint64_t url = fnv1a(window[i].url);
      counted[i] = !urls_.count(url);
      if (counted[i] && urls_.size() < kMaxRemembered) urls_.insert(url);
      if (counted[i])
        for (uint64_t k : keys[i]) ++count[k];
    }
    for (size_t i = 0; i < window.size(); ++i) {
      if (!site[i]) continue;
      const uint64_t host = fnv1a(url_host(window[i].url));
      for (auto& b : window[i].parsed.blocks) {
        if (b.heading || b.chars < min_chars_) continue;
        const uint64_t k = fnv1a(b.text, host);
        const auto it = count.find(k);
        const int32_t others = (it == count.end() ? 0 : it->second) - counted[i] + (seen_.count(k) ? 1 : 0);
        b.repeated = others >= 1;
      }
    }
    for (const auto& [k, n] : count)
      if (seen_.size() < kMaxRemembered) seen_.insert(k);
  }

 private:
  static constexpr size_t kMaxRemembered = size_t{1} << 19;
  int64_t min_chars_;
  std::unordered_set<uint64_t> seen_, urls_;
};

}  // namespace

Counts extract_file(const std::string& input, const std::string& output, const ExtractOptions& opt,
                    std::map<std::string, int64_t>& dropped_languages, const FileProgress& progress) {
  Counts c{};
  WarcReader reader(input, opt.max_record_bytes);
  ShardWriter out(output, opt.compress == "zstd");
  RecordExtractor records(opt, c, dropped_languages);
  SiteRepetition repetition(opt.blocks.repeat_min_chars);
  std::vector<Pending> window;
  size_t window_bytes = 0;
  auto flush_window = [&] {
    repetition.mark(window);
    for (auto& pg : window) {
      if (pg.page && !records.finish(pg)) continue;
      if (static_cast<int64_t>(pg.text.size()) < opt.min_chars) {
        ++c[kNoText];
        continue;
      }
      out.line(document_line(pg.text, pg.url, pg.id, pg.date, pg.lang));
      ++c[kKept];
      c[kCharsOut] += static_cast<int64_t>(pg.text.size());
      if (progress.documents) ++*progress.documents;
    }
    window.clear();
    window_bytes = 0;
  };
  WarcRecord rec;
  int64_t reported_bytes = 0;
  auto report_bytes = [&] {
    if (!progress.bytes) return;
    const int64_t b = reader.bytes_read();
    *progress.bytes += b - reported_bytes;
    reported_bytes = b;
  };
  auto bad = [&](const WarcError& e) {
    ++c[static_cast<size_t>(bad_counter(e.cause()))];
    if (!opt.skip_bad_records) throw;
  };
  for (;;) {
    try {
      if (!reader.next(rec)) break;
    } catch (const WarcError& e) {
      ++c[kRecords];
      bad(e);
      if (!reader.resync()) break;
      continue;
    }
    ++c[kRecords];
    report_bytes();
    const std::string where = fmt::format("{}: record {} at byte {}", input, rec.ordinal, rec.offset);
    Pending pg;
    try {
      if (!records.record(rec, where, pg)) continue;
    } catch (const WarcError& e) {
      bad(e);
      continue;
    }
    for (const auto& b : pg.parsed.blocks) window_bytes += b.text.size() + sizeof(Block);
    window_bytes += pg.text.size();
    window.push_back(std::move(pg));
    if (window.size() >= kWindowPages || window_bytes >= kWindowBytes) flush_window();
  }
  flush_window();
  report_bytes();
  if (progress.bytes) *progress.bytes += reader.file_bytes() - reported_bytes;  // the rest (e.g. after the last record)
  out.commit();
  return c;
}

nlohmann::ordered_json extract_report(const ExtractOptions& opt, const std::vector<Counts>& per_file,
                                      const std::map<std::string, int64_t>& dropped_languages, double seconds) {
  nlohmann::ordered_json rep;
  rep["command"] = "data extract";
  nlohmann::ordered_json o;
  o["languages"] = opt.languages;
  o["min_language_score"] = opt.min_language_score;
  o["min_chars"] = opt.min_chars;
  o["compress"] = opt.compress;
  o["max_record_bytes"] = opt.max_record_bytes;
  o["skip_bad_records"] = opt.skip_bad_records;
  o["length_low"] = opt.blocks.length_low;
  o["length_high"] = opt.blocks.length_high;
  o["stopwords_low"] = opt.blocks.stopwords_low;
  o["stopwords_high"] = opt.blocks.stopwords_high;
  o["max_link_density"] = opt.blocks.max_link_density;
  o["max_heading_distance"] = opt.blocks.max_heading_distance;
  o["repeat_min_chars"] = opt.blocks.repeat_min_chars;
  o["keep_comments"] = opt.blocks.keep_comments;
  o["min_language_chars"] = opt.min_language_chars;
  rep["options"] = o;
  Counts total{};
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  const auto shards = shard_paths(opt);
  for (size_t i = 0; i < per_file.size(); ++i) {
    nlohmann::ordered_json f;
    f["input"] = opt.inputs[i];
    f["output"] = std::filesystem::path(shards[i]).filename().string();
    for (int k = 0; k < kCounters; ++k) {
      f[kCounterNames[k]] = per_file[i][static_cast<size_t>(k)];
      total[static_cast<size_t>(k)] += per_file[i][static_cast<size_t>(k)];
    }
    files.push_back(f);
  }
  nlohmann::ordered_json t;
  for (int k = 0; k < kCounters; ++k) t[kCounterNames[k]] = total[static_cast<size_t>(k)];
  int64_t bad = 0;
  for (int k = kBadTruncated; k <= kBadHttp; ++k) bad += total[static_cast<size_t>(k)];
  t["bad_records"] = bad;
  rep["totals"] = t;
  nlohmann::ordered_json dl = nlohmann::ordered_json::object();
  for (const auto& [k, v] : dropped_languages) dl[k] = v;
  rep["dropped_languages"] = dl;
  rep["files"] = files;
  rep["seconds"] = seconds;
  return rep;
}

}  // namespace mtnlg::extract

namespace mtnlg::extract {

namespace {

// The HTML of `source` for --explain: an HTML file, or a WARC file's response record
// (FILE#N: the record numbered N in the file; FILE#URL: the first with that target URI;
// FILE alone: its first response record). `url` gets the record's target URI.
std::string explain_source_html(const std::string& source, const ExtractOptions& opt, std::string& url) {
  const size_t hash = source.find('#');
  const std::string path = source.substr(0, hash);
  const std::string sel = hash == std::string::npos ? "" : source.substr(hash + 1);
  const bool warc = path.ends_with(".warc") || path.ends_with(".warc.gz");
  if (!std::filesystem::is_regular_file(path)) throw InputError(fmt::format("--explain: {}: no such file", path));
  if (!warc && !sel.empty()) throw InputError(fmt::format("--explain: {}: '#' selects a record of a WARC file", path));
  Utf8Converter conv;
  Counts c{};
  int64_t replaced = 0;
  if (!warc) {
    std::ifstream f(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::string_view body = bytes;
    url = path;
    return conv.convert(body, body_charset(body, "", conv, c), &replaced);
  }
  const bool by_number = !sel.empty() && sel.find_first_not_of("0123456789") == std::string::npos;
  WarcReader reader(path, opt.max_record_bytes);
  WarcRecord rec;
  while (reader.next(rec)) {
    if (rec.type() != "response") continue;
    url = std::string(rec.header("WARC-Target-URI"));
    if (by_number ? std::to_string(rec.ordinal) != sel : (!sel.empty() && url != sel)) continue;
    const HttpResponse http = parse_http_response(rec.block, fmt::format("{}: record {}", path, rec.ordinal));
    std::string_view body = http.body;
    return conv.convert(body, body_charset(body, http.charset, conv, c), &replaced);
  }
  throw InputError(fmt::format("--explain: {}: no response record {}", path, sel.empty() ? "in the file" : sel));
}

// The elements from the page's top down to `node`: "body > div#main.content > p" (the
// last `keep` of them, "... > " before when there are more).
std::string element_chain(const ParsedPage& page, int32_t node, size_t keep) {
  std::vector<int32_t> up;
  for (int32_t e = node; e >= 0; e = page.parent[static_cast<size_t>(e)]) up.push_back(e);
  std::string out = up.size() > keep ? "... > " : "";
  for (size_t k = std::min(up.size(), keep); k-- > 0;) {
    out += page.node_names[static_cast<size_t>(up[k])];
    if (k > 0) out += " > ";
  }
  return out;
}

}  // namespace

std::string explain_page(const std::string& source, const ExtractOptions& opt) {
  std::string url;
  const std::string html = explain_source_html(source, opt, url);
  ParsedPage page = parse_html_blocks(html, false, true);
  // English stop words as `data extract` decides before the language of the main text:
  // the page's declaration, else their share of the words outside furniture.
  const std::string declared = declared_language(page.lang);
  int64_t words = 0, stopwords = 0;
  for (const auto& b : page.blocks)
    if (!b.boilerplate_context) {
      words += b.words;
      stopwords += b.stopwords;
    }
  const bool english = declared.empty() ? stopwords * 100 >= words * 15 && words > 0 : declared == "en";
  classify_blocks(page, opt.blocks, english);
  int64_t kept = 0;
  for (const auto& b : page.blocks) kept += b.final_class == BlockClass::good;
  std::string out = fmt::format("page {}: {} blocks, {} kept; stop words: {}\n", url, page.blocks.size(), kept,
                                english ? "English" : "none (length and context only)");
  for (const auto& b : page.blocks) {
    size_t cut = std::min<size_t>(b.text.size(), 100);  // at a character's first byte
    while (cut < b.text.size() && (static_cast<unsigned char>(b.text[cut]) & 0xC0) == 0x80) --cut;
    const std::string text = cut < b.text.size() ? b.text.substr(0, cut) + "..." : b.text;
    out += fmt::format("{:<4} {:>9} -> {:<9} {} | {} | {}\n", b.final_class == BlockClass::good ? "KEEP" : "drop",
                       block_class_name(b.initial), block_class_name(b.final_class), b.rule,
                       b.node >= 0 ? element_chain(page, b.node, 4) : "(no element)", text);
  }
  return out;
}

}  // namespace mtnlg::extract
