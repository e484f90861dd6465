// Megatron MMap indexed dataset reader/writer (see indexed_dataset.hpp for the layout).
#include "data/indexed_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "core/error.hpp"

namespace mtnlg::data {

int64_t dtype_size(DType d) {
  switch (d) {
    case DType::u8:
    case DType::i8: return 1;
    case DType::i16:
    case DType::u16: return 2;
    case DType::i32:
    case DType::f32: return 4;
    case DType::i64:
    case DType::f64: return 8;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::u8: return "uint8";
    case DType::i8: return "int8";
    case DType::i16: return "int16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::f64: return "float64";
    case DType::f32: return "float32";
    case DType::u16: return "uint16";
  }
  return "?";
}

bool dtype_valid(uint8_t code) { return code >= 1 && code <= 8; }

DType dtype_for_vocab(int64_t vocab_size) { return vocab_size < 65500 ? DType::u16 : DType::i32; }

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

bool indexed_dataset_exists(const std::string& prefix) {
  std::error_code ec;
  return std::filesystem::is_regular_file(idx_path(prefix), ec) &&
         std::filesystem::is_regular_file(bin_path(prefix), ec);
}

// ---------------------------------------------------------------------------------
MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_input("{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_input("{}: not a regular file", path);
  }
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw_runtime("{}: mmap failed ({})", path, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

MappedFile::MappedFile(MappedFile&& o) noexcept : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

// ---------------------------------------------------------------------------------
IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string ip = idx_path(prefix), bp = bin_path(prefix);
  {
    std::error_code ec;
    if (!std::filesystem::exists(ip, ec))
      throw_input("{}: index file not found (data prefix '{}' needs {} and {})", ip, prefix, ip, bp);
    if (!std::filesystem::exists(bp, ec))
      throw_input("{}: data file not found (data prefix '{}' needs {} and {})", bp, prefix, ip, bp);
  }
  idx_ = MappedFile(ip);
  const uint8_t* h = idx_.data();
  const int64_t isz = idx_.size();
  if (isz < 9 || std::memcmp(h, kIndexMagic, 9) != 0) {
    if (isz >= 6 && std::memcmp(h, "TNTIDX", 6) == 0)
      throw_input("{}: legacy 'TNTIDX' cached index format is not supported (re-run preprocess to get MMIDIDX)", ip);
    throw_input("{}: not a Megatron index: magic bytes are not 'MMIDIDX\\0\\0'", ip);
  }
  if (isz < kIndexHeaderBytes)
    throw_input("{}: truncated: {} bytes, the header alone needs {}", ip, isz, kIndexHeaderBytes);
  const uint64_t version = load<uint64_t>(h + 9);
  if (version != 1) throw_input("{}: index version {} is not supported (expected 1)", ip, version);
  const uint8_t code = h[17];
  if (!dtype_valid(code)) throw_input("{}: dtype code {} is not valid (expected 1..8)", ip, code);
  dtype_ = static_cast<DType>(code);
  if (dtype_ == DType::f32 || dtype_ == DType::f64)
    throw_input("{}: dtype {} cannot hold token ids (expected an integer dtype)", ip, dtype_name(dtype_));
  const uint64_t n = load<uint64_t>(h + 18), d = load<uint64_t>(h + 26);
  // Sizes far beyond the file length would overflow the arithmetic below: bound first.
  if (n > static_cast<uint64_t>(isz) || d > static_cast<uint64_t>(isz) || d < 1)
    throw_input("{}: header counts ({} sequences, {} document indices) do not fit a {}-byte index", ip, n, d, isz);
  n_ = static_cast<int64_t>(n);
  d_ = static_cast<int64_t>(d);
  const int64_t need = kIndexHeaderBytes + 12 * n_ + 8 * d_;
  if (isz != need && isz != need + n_) {
    if (isz < need)
      throw_input(
          "{}: truncated: header says {} sequences and {} document indices ({} bytes) but the file has {} bytes", ip,
          n_, d_, need, isz);
    throw_input("{}: {} bytes, expected {} for {} sequences and {} document indices (trailing bytes)", ip, isz, need,
                n_, d_);
  }
  lengths_ = h + kIndexHeaderBytes;
  pointers_ = lengths_ + 4 * n_;
  doc_idx_ = pointers_ + 8 * n_;

  const int64_t item = dtype_size(dtype_);
  int64_t expect_ptr = 0;
  for (int64_t i = 0; i < n_; ++i) {
    const int32_t len = sequence_length(i);
    if (len < 0) throw_input("{}: sequence {} has negative length {}", ip, i, len);
    if (sequence_pointer(i) != expect_ptr)
      throw_input("{}: sequence {} points at byte {} but the lengths before it put it at {}", ip, i,
                  sequence_pointer(i), expect_ptr);
    expect_ptr += static_cast<int64_t>(len) * item;
  }
  num_tokens_ = expect_ptr / item;
  if (document_index(0) != 0) throw_input("{}: document_indices[0] is {} (expected 0)", ip, document_index(0));
  for (int64_t i = 1; i < d_; ++i) {
    if (document_index(i) < document_index(i - 1))
      throw_input("{}: document_indices[{}] = {} is below the previous entry {}", ip, i, document_index(i),
                  document_index(i - 1));
  }
  if (document_index(d_ - 1) != n_)
    throw_input("{}: last document index is {} but there are {} sequences", ip, document_index(d_ - 1), n_);

  bin_ = MappedFile(bp);
  if (bin_.size() != expect_ptr)
    throw_input("{}: {} bytes but {} says {} tokens of {} ({} bytes){}", bp, bin_.size(), ip, num_tokens_,
                dtype_name(dtype_), expect_ptr,
                bin_.size() < expect_ptr ? " (truncated)" : " (the pair does not belong together)");
}

std::vector<int32_t> IndexedDataset::sequence_lengths() const {
  std::vector<int32_t> v(static_cast<size_t>(n_));
  if (n_ > 0) std::memcpy(v.data(), lengths_, 4 * static_cast<size_t>(n_));
  return v;
}

std::vector<int64_t> IndexedDataset::document_indices() const {
  std::vector<int64_t> v(static_cast<size_t>(d_));
  std::memcpy(v.data(), doc_idx_, 8 * static_cast<size_t>(d_));
  return v;
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t count, int32_t* out) const {
  MTNLG_CHECK(i >= 0 && i < n_, "sequence {} of {}", i, n_);
  const int64_t len = sequence_length(i);
  MTNLG_CHECK(offset >= 0 && count >= 0 && offset + count <= len, "tokens [{}, {}) of a {}-token sequence", offset,
              offset + count, len);
  const uint8_t* p = sequence_bytes(i);
  switch (dtype_) {
    case DType::u16:
      for (int64_t k = 0; k < count; ++k) out[k] = load<uint16_t>(p + 2 * (offset + k));
      break;
    case DType::i32: std::memcpy(out, p + 4 * offset, 4 * static_cast<size_t>(count)); break;
    case DType::u8:
      for (int64_t k = 0; k < count; ++k) out[k] = p[offset + k];
      break;
    case DType::i8:
      for (int64_t k = 0; k < count; ++k) out[k] = static_cast<int8_t>(p[offset + k]);
      break;
    case DType::i16:
      for (int64_t k = 0; k < count; ++k) out[k] = load<int16_t>(p + 2 * (offset + k));
      break;
    case DType::i64:
      for (int64_t k = 0; k < count; ++k) out[k] = static_cast<int32_t>(load<int64_t>(p + 8 * (offset + k)));
      break;
    default: MTNLG_CHECK(false, "float dtype {}", dtype_name(dtype_));
  }
}

std::vector<int32_t> IndexedDataset::get(int64_t i) const {
  std::vector<int32_t> v(static_cast<size_t>(sequence_length(i)));
  read(i, 0, static_cast<int64_t>(v.size()), v.data());
  return v;
}

std::string IndexedDataset::fingerprint() const {
  auto one = [](const std::string& p) {
    struct stat st {};
    ::stat(p.c_str(), &st);
    return fmt::format("{}:{}.{}", static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                       static_cast<int64_t>(st.st_mtim.tv_nsec));
  };
  return one(idx_.path()) + "|" + one(bin_.path());
}

// ---------------------------------------------------------------------------------
IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, DType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  try {
    bin_ = std::make_unique<AtomicFile>(bin_path(prefix_));
  } catch (const RuntimeError& e) {
    throw InputError(e.what());  // an output prefix that cannot be written: the user's input
  }
}

// The AtomicFile members remove their temporary files unless committed.
IndexedDatasetWriter::~IndexedDatasetWriter() = default;

void IndexedDatasetWriter::write_tokens(std::span<const int32_t> ids) {
  const int64_t item = dtype_size(dtype_);
  buf_.resize(ids.size() * static_cast<size_t>(item));
  uint8_t* p = buf_.data();
  const int64_t max_id = dtype_ == DType::u16 ? 65535 : dtype_ == DType::u8 ? 255 : INT32_MAX;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t v = ids[k];
    if (v < 0 || v > max_id) throw_input("{}: token id {} does not fit dtype {}", prefix_, v, dtype_name(dtype_));
    if (item == 2) {
      const uint16_t u = static_cast<uint16_t>(v);
      std::memcpy(p + 2 * k, &u, 2);
    } else if (item == 4) {
      std::memcpy(p + 4 * k, &v, 4);
    } else if (item == 1) {
      p[k] = static_cast<uint8_t>(v);
    } else {
      const int64_t w = v;
      std::memcpy(p + 8 * k, &w, 8);
    }
  }
  bin_->write(buf_.data(), buf_.size());
  tokens_ += static_cast<int64_t>(ids.size());
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> ids, std::span<const int64_t> sequence_lengths) {
  MTNLG_CHECK(!closed_, "add_document after finalize");
  int64_t total = 0;
  for (int64_t l : sequence_lengths) {
    MTNLG_CHECK(l >= 0 && l <= INT32_MAX, "sequence length {}", l);
    total += l;
    lengths_.push_back(static_cast<int32_t>(l));
  }
  MTNLG_CHECK(total == static_cast<int64_t>(ids.size()), "lengths sum {} != {} ids", total, ids.size());
  write_tokens(ids);
  doc_idx_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> ids) {
  const int64_t len = static_cast<int64_t>(ids.size());
  if (len == 0)
    add_document(ids, std::span<const int64_t>{});
  else
    add_document(ids, std::span<const int64_t>(&len, 1));
}

namespace {
void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
}  // namespace

void IndexedDatasetWriter::close_files() {
  MTNLG_CHECK(!closed_, "close_files twice");
  closed_ = true;
  bin_->sync();

  const uint64_t n = lengths_.size(), d = doc_idx_.size(), version = 1;
  std::vector<uint8_t> idx;
  idx.reserve(kIndexHeaderBytes + 12 * n + 8 * d);
  put_bytes(idx, kIndexMagic, 9);
  put_bytes(idx, &version, 8);
  const uint8_t code = static_cast<uint8_t>(dtype_);
  put_bytes(idx, &code, 1);
  put_bytes(idx, &n, 8);
  put_bytes(idx, &d, 8);
  put_bytes(idx, lengths_.data(), 4 * n);
  int64_t ptr = 0;
  const int64_t item = dtype_size(dtype_);
  for (int32_t l : lengths_) {
    put_bytes(idx, &ptr, 8);
    ptr += static_cast<int64_t>(l) * item;
  }
  put_bytes(idx, doc_idx_.data(), 8 * d);
  idx_ = std::make_unique<AtomicFile>(idx_path(prefix_));
  idx_->write(idx.data(), idx.size());
  idx_->sync();
}

void IndexedDatasetWriter::commit() {
  MTNLG_CHECK(closed_ && !done_, "commit before close_files or twice");
  // .bin first: a reader that finds the new .idx then also finds its .bin.
  bin_->commit();
  idx_->commit();
  done_ = true;
}

}  // namespace mtnlg::data
