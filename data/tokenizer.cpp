// GPT-2 byte-level BPE (see tokenizer.hpp for the algorithm and the compatibility
// contract with tiktoken / js-tiktoken).
#include "data/tokenizer.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "core/error.hpp"
#include "data/unicode_tables.hpp"

namespace mtnlg::data {

namespace unicode {
bool in_ranges(const CodepointRange* r, int64_t n, uint32_t cp) {
  int64_t lo = 0, hi = n - 1;
  while (lo <= hi) {
    const int64_t mid = (lo + hi) / 2;
    if (cp < r[mid].lo)
      hi = mid - 1;
    else if (cp > r[mid].hi)
      lo = mid + 1;
    else
      return true;
  }
  return false;
}
}  // namespace unicode

const char* unicode_tables_version() { return unicode::kUnicodeVersion; }

namespace {

// ----- character classes -------------------------------------------------------------
enum Cls : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

uint8_t classify_slow(uint32_t cp) {
  if (unicode::is_space(cp)) return kSpace;
  if (unicode::is_letter(cp)) return kLetter;
  if (unicode::is_number(cp)) return kNumber;
  return kOther;
}

// Class of every BMP code point (64 KiB), built once; astral planes use the range tables.
const uint8_t* bmp_classes() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(65536);
    for (uint32_t cp = 0; cp < 65536; ++cp) t[cp] = classify_slow(cp);
    return t;
  }();
  return table.data();
}

struct Ch {
  uint32_t len;
  uint8_t cls;
};

// Decodes one UTF-8 character at p (< end). Invalid or truncated sequences, overlong
// forms and encoded surrogates are one byte of class kOther.
inline Ch decode_char(const uint8_t* p, const uint8_t* end, const uint8_t* bmp) {
  const uint8_t b = p[0];
  if (b < 0x80) return {1, bmp[b]};
  const int64_t left = end - p;
  if (b >= 0xC2 && b <= 0xDF) {
    if (left >= 2 && (p[1] & 0xC0) == 0x80) return {2, bmp[((b & 0x1Fu) << 6) | (p[1] & 0x3Fu)]};
  } else if ((b & 0xF0) == 0xE0) {
    if (left >= 3 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80) {
      const uint32_t cp = ((b & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
      if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) return {3, bmp[cp]};
    }
  } else if (b >= 0xF0 && b <= 0xF4) {
    if (left >= 4 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80) {
      const uint32_t cp = ((b & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
      if (cp >= 0x10000 && cp <= 0x10FFFF) return {4, classify_slow(cp)};
    }
  }
  return {1, kOther};
}

// The GPT-2 pattern, alternative by alternative (leftmost alternative that matches wins,
// each quantifier greedy):
//   's|'t|'re|'ve|'m|'ll|'d  ->  contraction check at an apostrophe
//   ' ?X+' for X in L, N, other  ->  an optional single ' ' then a run of one class
//   '\s+(?!\S)'  ->  a whitespace run, minus its last char when a non-space follows
//   '\s+'  ->  what is left: a single whitespace char before a non-space
template <typename F>
void pretokenize_impl(std::string_view text, F&& emit) {
  const uint8_t* bmp = bmp_classes();
  const auto* base = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t* end = base + text.size();
  const uint8_t* p = base;
  while (p < end) {
    if (*p == '\'' && end - p >= 2) {
      const uint8_t a = p[1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(reinterpret_cast<const char*>(p), 2);
        p += 2;
        continue;
      }
      if (end - p >= 3) {
        const uint8_t b = p[2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          emit(reinterpret_cast<const char*>(p), 3);
          p += 3;
          continue;
        }
      }
    }
    const uint8_t* start = p;
    Ch c = decode_char(p, end, bmp);
    const uint8_t* q = p;  // first char of the class run
    if (*p == ' ' && p + 1 < end) {
      const Ch d = decode_char(p + 1, end, bmp);
      if (d.cls != kSpace) {
        q = p + 1;
        c = d;
      }
    }
    if (c.cls != kSpace) {
      const uint8_t cls = c.cls;
      const uint8_t* k = q + c.len;
      if (cls == kLetter) {
        // ASCII letters are the common case: skip them without a decode.
        while (k < end) {
          const uint8_t b = *k;
          if (b < 0x80) {
            if (bmp[b] != kLetter) break;
            ++k;
            continue;
          }
          const Ch e = decode_char(k, end, bmp);
          if (e.cls != kLetter) break;
          k += e.len;
        }
      } else {
        while (k < end) {
          const Ch e = decode_char(k, end, bmp);
          if (e.cls != cls) break;
          k += e.len;
        }
      }
      emit(reinterpret_cast<const char*>(start), k - start);
      p = k;
      continue;
    }
    // Whitespace run starting at p.
    const uint8_t* last = p;
    const uint8_t* k = p + c.len;
    while (k < end) {
      const Ch e = decode_char(k, end, bmp);
      if (e.cls != kSpace) break;
      last = k;
      k += e.len;
    }
    const uint8_t* stop = (k == end || last == p) ? k : last;
    emit(reinterpret_cast<const char*>(p), stop - p);
    p = stop;
  }
}

inline uint64_t hash_bytes(const uint8_t* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 29;
  return h;
}

// GPT-2's reversible byte <-> printable-unicode map (bytes_to_unicode in OpenAI's encoder):
// printable Latin-1 bytes map to themselves, the other 68 to U+0100 + n in byte order.
std::vector<int> unicode_to_byte_table() {
  std::vector<int> u2b(512, -1);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    if (printable[b])
      u2b[b] = b;
    else
      u2b[256 + n++] = b;
  }
  return u2b;
}

// UTF-8 key of vocab.json -> raw bytes; false if a char is outside the byte alphabet.
bool vocab_key_to_bytes(const std::string& key, const std::vector<int>& u2b, std::string& out) {
  out.clear();
  const auto* p = reinterpret_cast<const uint8_t*>(key.data());
  const uint8_t* end = p + key.size();
  while (p < end) {
    uint32_t cp;
    if (p[0] < 0x80) {
      cp = *p++;
    } else if ((p[0] & 0xE0) == 0xC0 && end - p >= 2) {
      cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
      p += 2;
    } else {
      return false;
    }
    if (cp >= u2b.size() || u2b[cp] < 0) return false;
    out.push_back(static_cast<char>(u2b[cp]));
  }
  return true;
}

}  // namespace

// ----- tables -------------------------------------------------------------------------
// (left id, right id) -> id of the concatenation; open addressing, linear probing.
struct Tokenizer::PairTable {
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<uint64_t> keys;
  std::vector<int32_t> vals;
  uint64_t mask = 0;
  int shift = 0;
  explicit PairTable(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    keys.assign(cap, kEmpty);
    vals.assign(cap, -1);
    mask = cap - 1;
    shift = 64 - __builtin_ctzll(cap);
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift); }
  void insert(int32_t a, int32_t b, int32_t v) {
    const uint64_t k = key(a, b);
    size_t i = slot(k);
    while (keys[i] != kEmpty && keys[i] != k) i = (i + 1) & mask;
    keys[i] = k;
    vals[i] = v;
  }
  // The merged id, or INT32_MAX when the pair does not merge.
  int32_t get(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    size_t i = slot(k);
    while (true) {
      const uint64_t s = keys[i];
      if (s == k) return vals[i];
      if (s == kEmpty) return INT32_MAX;
      i = (i + 1) & mask;
    }
  }
};

// bytes -> id, keys point into id_to_bytes_ (never resized after loading).
struct Tokenizer::BytesMap {
  struct Slot {
    uint64_t h = 0;
    const std::string* s = nullptr;
    int32_t id = -1;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;
  explicit BytesMap(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    slots.resize(cap);
    mask = cap - 1;
  }
  void insert(const std::string* s, int32_t id) {
    const uint64_t h = hash_bytes(reinterpret_cast<const uint8_t*>(s->data()), s->size());
    size_t i = h & mask;
    while (slots[i].s && !(slots[i].h == h && *slots[i].s == *s)) i = (i + 1) & mask;
    slots[i] = Slot{h, s, id};
  }
  int32_t find(const char* p, size_t n) const {
    const uint64_t h = hash_bytes(reinterpret_cast<const uint8_t*>(p), n);
    size_t i = h & mask;
    while (slots[i].s) {
      if (slots[i].h == h && slots[i].s->size() == n && std::memcmp(slots[i].s->data(), p, n) == 0) return slots[i].id;
      i = (i + 1) & mask;
    }
    return -1;
  }
};

namespace {

// Per-thread piece -> ids cache: open addressing over arenas, no allocation per entry.
// Cleared as a whole when half full (simple, and text statistics refill it fast).
struct PieceCache {
  static constexpr size_t kSlots = 1 << 17;
  static constexpr size_t kMaxKeyBytes = 256;
  struct Slot {
    uint64_t h;
    uint32_t koff, klen, voff, vlen;
  };
  uint64_t owner = 0;
  std::vector<Slot> slots;
  std::string keys;
  std::vector<int32_t> vals;
  size_t used = 0;

  void reset(uint64_t who) {
    owner = who;
    if (slots.empty()) slots.resize(kSlots);
    std::fill(slots.begin(), slots.end(), Slot{0, 0, 0, 0, 0});
    keys.clear();
    vals.clear();
    used = 0;
  }
  const Slot* find(uint64_t h, const char* p, size_t n) const {
    size_t i = h & (kSlots - 1);
    while (slots[i].klen != 0) {
      const Slot& s = slots[i];
      if (s.h == h && s.klen == n && std::memcmp(keys.data() + s.koff, p, n) == 0) return &s;
      i = (i + 1) & (kSlots - 1);
    }
    return nullptr;
  }
  void insert(uint64_t h, const char* p, size_t n, const int32_t* ids, size_t m) {
    if (used * 2 >= kSlots || keys.size() > (64u << 20)) reset(owner);
    size_t i = h & (kSlots - 1);
    while (slots[i].klen != 0) i = (i + 1) & (kSlots - 1);
    slots[i] = Slot{h, static_cast<uint32_t>(keys.size()), static_cast<uint32_t>(n), static_cast<uint32_t>(vals.size()),
                    static_cast<uint32_t>(m)};
    keys.append(p, n);
    vals.insert(vals.end(), ids, ids + m);
    ++used;
  }
};

thread_local PieceCache tl_cache;
std::atomic<uint64_t> g_serial{1};

std::string read_whole(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw_input("{}: cannot open {} (run scripts/fetch-gpt2-vocab.sh to get GPT-2's files)", path, what);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::from_files(const std::string& vocab_json, const std::string& merges_txt) {
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->serial_ = g_serial.fetch_add(1);
  const std::vector<int> u2b = unicode_to_byte_table();
  std::vector<bool> special;
  t->read_vocab(vocab_json, u2b, special);
  t->index_vocab(vocab_json, special);
  t->build_pairs(special);
  t->check_merges(merges_txt, vocab_json, u2b);
  return t;
}

// vocab.json: token -> id, every id 0..n-1 once, <|endoftext|> among them.
void Tokenizer::read_vocab(const std::string& vocab_json, const std::vector<int>& u2b, std::vector<bool>& special) {
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_whole(vocab_json, "vocab file"));
  } catch (const nlohmann::json::exception& e) {
    throw_input("{}: not valid JSON ({})", vocab_json, e.what());
  }
  if (!vocab.is_object() || vocab.empty())
    throw_input("{}: expected a JSON object mapping tokens to ids (GPT-2 vocab.json / encoder.json)", vocab_json);
  const size_t nv = vocab.size();
  id_to_bytes_.assign(nv, std::string());
  std::vector<bool> seen(nv, false);
  special.assign(nv, false);
  std::string bytes;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) throw_input("{}: token '{}' has a non-integer id", vocab_json, it.key());
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(nv) || seen[static_cast<size_t>(id)])
      throw_input("{}: token '{}' has id {} (ids must be 0..{} without repeats)", vocab_json, it.key(), id, nv - 1);
    seen[static_cast<size_t>(id)] = true;
    if (it.key() == eod_text_) {
      eod_ = static_cast<int32_t>(id);
      special[static_cast<size_t>(id)] = true;
      id_to_bytes_[static_cast<size_t>(id)] = it.key();
      continue;
    }
    if (!vocab_key_to_bytes(it.key(), u2b, bytes))
      throw_input("{}: token '{}' uses characters outside GPT-2's byte alphabet", vocab_json, it.key());
    id_to_bytes_[static_cast<size_t>(id)] = bytes;
  }
  if (eod_ < 0) throw_input("{}: no '<|endoftext|>' token (not a GPT-2 vocabulary)", vocab_json);
}

// Bytes -> id for every ordinary token; each of the 256 bytes must be a token.
void Tokenizer::index_vocab(const std::string& vocab_json, const std::vector<bool>& special) {
  const size_t nv = id_to_bytes_.size();
  bytes_to_id_ = std::make_unique<BytesMap>(nv);
  for (int b = 0; b < 256; ++b) byte_id_[b] = -1;
  for (size_t id = 0; id < nv; ++id) {
    if (special[id]) continue;
    const std::string& s = id_to_bytes_[id];
    bytes_to_id_->insert(&s, static_cast<int32_t>(id));
    if (s.size() == 1) byte_id_[static_cast<uint8_t>(s[0])] = static_cast<int32_t>(id);
  }
  for (int b = 0; b < 256; ++b)
    if (byte_id_[b] < 0) throw_input("{}: byte 0x{:02X} has no token (not a byte-level BPE vocabulary)", vocab_json, b);
}

// Every split of every token whose halves are tokens is a mergeable pair (tiktoken's
// rule); its rank is the merged token's id.
void Tokenizer::build_pairs(const std::vector<bool>& special) {
  const size_t nv = id_to_bytes_.size();
  size_t npairs = 0;
  for (size_t id = 0; id < nv; ++id) npairs += special[id] ? 0 : id_to_bytes_[id].size();
  pairs_ = std::make_unique<PairTable>(npairs);
  for (size_t id = 0; id < nv; ++id) {
    if (special[id]) continue;
    const std::string& s = id_to_bytes_[id];
    for (size_t k = 1; k < s.size(); ++k) {
      const int32_t a = bytes_to_id_->find(s.data(), k);
      const int32_t b = a < 0 ? -1 : bytes_to_id_->find(s.data() + k, s.size() - k);
      if (a >= 0 && b >= 0) pairs_->insert(a, b, static_cast<int32_t>(id));
    }
  }
}

// merges.txt must agree with the vocabulary: each line "A B" with A, B and AB tokens.
void Tokenizer::check_merges(const std::string& merges_txt, const std::string& vocab_json,
                             const std::vector<int>& u2b) const {
  const std::string merges = read_whole(merges_txt, "merges file");
  std::istringstream ms(merges);
  std::string line, ab, a, b;
  int64_t lineno = 0, nmerges = 0;
  while (std::getline(ms, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      throw_input("{}:{}: expected two tokens separated by one space, got '{}'", merges_txt, lineno, line);
    if (!vocab_key_to_bytes(line.substr(0, sp), u2b, a) || !vocab_key_to_bytes(line.substr(sp + 1), u2b, b))
      throw_input("{}:{}: '{}' uses characters outside GPT-2's byte alphabet", merges_txt, lineno, line);
    const int32_t ia = bytes_to_id_->find(a.data(), a.size());
    const int32_t ib = bytes_to_id_->find(b.data(), b.size());
    ab = a + b;
    const int32_t iab = bytes_to_id_->find(ab.data(), ab.size());
    if (ia < 0 || ib < 0 || iab < 0)
      throw_input("{}:{}: merge '{}' refers to a token missing from {}", merges_txt, lineno, line, vocab_json);
    ++nmerges;
  }
  if (nmerges == 0) throw_input("{}: no merges found", merges_txt);
}

std::optional<int32_t> Tokenizer::token_id(std::string_view bytes) const {
  if (bytes == eod_text_) return eod_;
  const int32_t id = bytes_to_id_->find(bytes.data(), bytes.size());
  if (id < 0) return std::nullopt;
  return id;
}

void Tokenizer::bpe(const uint8_t* p, int64_t n, std::vector<int32_t>& out) const {
  const PairTable& pt = *pairs_;
  if (n <= 128) {
    // Small piece: arrays of current tokens and of the rank of each adjacent pair;
    // merge the lowest rank (leftmost on ties) until nothing merges.
    int32_t tok[128], rk[128];
    int64_t m = n;
    for (int64_t i = 0; i < m; ++i) tok[i] = byte_id_[p[i]];
    for (int64_t i = 0; i + 1 < m; ++i) rk[i] = pt.get(tok[i], tok[i + 1]);
    while (m > 1) {
      int32_t best = INT32_MAX;
      int64_t bi = -1;
      for (int64_t i = 0; i + 1 < m; ++i)
        if (rk[i] < best) {
          best = rk[i];
          bi = i;
        }
      if (bi < 0) break;
      tok[bi] = best;
      std::memmove(tok + bi + 1, tok + bi + 2, sizeof(int32_t) * static_cast<size_t>(m - bi - 2));
      if (bi + 2 < m) std::memmove(rk + bi + 1, rk + bi + 2, sizeof(int32_t) * static_cast<size_t>(m - bi - 3));
      --m;
      if (bi > 0) rk[bi - 1] = pt.get(tok[bi - 1], tok[bi]);
      if (bi + 1 < m) rk[bi] = pt.get(tok[bi], tok[bi + 1]);
    }
    out.insert(out.end(), tok, tok + m);
    return;
  }
  // Long piece (e.g. a long whitespace run): linked list + min-heap of (rank, position)
  // with lazy invalidation; picks the same merge as the scan above, in O(n log n).
  std::vector<int32_t> tok(static_cast<size_t>(n)), nxt(static_cast<size_t>(n)), prv(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    tok[i] = byte_id_[p[i]];
    nxt[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prv[i] = static_cast<int32_t>(i - 1);
  }
  using Entry = std::pair<int32_t, int32_t>;  // (rank, left position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (int64_t i = 0; i + 1 < n; ++i) {
    const int32_t r = pt.get(tok[i], tok[i + 1]);
    if (r != INT32_MAX) heap.emplace(r, static_cast<int32_t>(i));
  }
  std::vector<bool> alive(static_cast<size_t>(n), true);
  while (!heap.empty()) {
    const auto [r, i] = heap.top();
    heap.pop();
    if (!alive[i] || nxt[i] < 0 || pt.get(tok[i], tok[nxt[i]]) != r) continue;
    const int32_t j = nxt[i];
    tok[i] = r;
    alive[j] = false;
    nxt[i] = nxt[j];
    if (nxt[j] >= 0) prv[nxt[j]] = i;
    if (prv[i] >= 0) {
      const int32_t rl = pt.get(tok[prv[i]], tok[i]);
      if (rl != INT32_MAX) heap.emplace(rl, prv[i]);
    }
    if (nxt[i] >= 0) {
      const int32_t rr = pt.get(tok[i], tok[nxt[i]]);
      if (rr != INT32_MAX) heap.emplace(rr, i);
    }
  }
  for (int32_t i = 0; i >= 0; i = nxt[i]) out.push_back(tok[i]);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(byte_id_[p[0]]);
    return;
  }
  PieceCache& cache = tl_cache;
  if (cache.owner != serial_) cache.reset(serial_);
  const bool cacheable = n <= PieceCache::kMaxKeyBytes;
  uint64_t h = 0;
  if (cacheable) {
    h = hash_bytes(p, n);
    if (const auto* s = cache.find(h, piece.data(), n)) {
      out.insert(out.end(), cache.vals.data() + s->voff, cache.vals.data() + s->voff + s->vlen);
      return;
    }
  }
  const size_t before = out.size();
  const int32_t whole = bytes_to_id_->find(piece.data(), n);
  if (whole >= 0)
    out.push_back(whole);
  else
    bpe(p, static_cast<int64_t>(n), out);
  if (cacheable) cache.insert(h, piece.data(), n, out.data() + before, out.size() - before);
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  pretokenize_impl(text,
                   [&](const char* p, int64_t n) { encode_piece(std::string_view(p, static_cast<size_t>(n)), out); });
}

void Tokenizer::encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
  if (!allow_special) {
    encode_ordinary(text, out);
    return;
  }
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(eod_text_, pos);
    if (hit == std::string_view::npos) {
      encode_ordinary(text.substr(pos), out);
      return;
    }
    encode_ordinary(text.substr(pos, hit - pos), out);
    out.push_back(eod_);
    pos = hit + eod_text_.size();
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode(text, out, allow_special);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) throw_input("token id {} is outside the vocabulary [0, {})", id, vocab_size());
    s += id_to_bytes_[static_cast<size_t>(id)];
  }
  return s;
}

void gpt2_pretokenize(std::string_view text, const std::function<void(std::string_view)>& f) {
  pretokenize_impl(text, [&](const char* p, int64_t n) { f(std::string_view(p, static_cast<size_t>(n))); });
}

std::vector<std::string> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string> v;
  gpt2_pretokenize(text, [&](std::string_view s) { v.emplace_back(s); });
  return v;
}

}  // namespace mtnlg::data
