// Megatron's MMap indexed dataset (`PREFIX.bin` + `PREFIX.idx`, version 1), the file
// format of every tokenized corpus mtnlg reads (megatron.md section 2):
//   .bin  token ids of all sequences concatenated, little-endian, header dtype, no header
//   .idx  "MMIDIDX\0\0" | u64 version=1 | u8 dtype | u64 N | u64 D | i32 lengths[N] |
//         i64 byte pointers[N] | i64 document_indices[D]   (packed, unaligned)
// The reader maps both files and copies nothing; because the .idx arrays start at byte
// 34 they are unaligned, so elements are read through memcpy accessors, never through
// typed pointers. Opening validates everything a later read relies on (magic, version,
// dtype, sizes, pointer/length consistency, document boundaries, .bin length), so a
// truncated or foreign file is an InputError naming the file and the mismatch.
// The writer produces byte-identical files to Megatron's and never leaves a
// half-written pair: it writes temporary names and renames both at finalize().
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"

namespace mtnlg::data {

// Megatron's dtype codes.
enum class DType : uint8_t { u8 = 1, i8 = 2, i16 = 3, i32 = 4, i64 = 5, f64 = 6, f32 = 7, u16 = 8 };

int64_t dtype_size(DType d);
const char* dtype_name(DType d);
bool dtype_valid(uint8_t code);
// Megatron's choice: uint16 when vocab_size < 65500, else int32.
DType dtype_for_vocab(int64_t vocab_size);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr int64_t kIndexHeaderBytes = 34;

std::string idx_path(const std::string& prefix);  // PREFIX.idx
std::string bin_path(const std::string& prefix);  // PREFIX.bin
// True when both PREFIX.idx and PREFIX.bin exist.
bool indexed_dataset_exists(const std::string& prefix);

// A read-only memory map of a whole file (empty files map to nothing).
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws InputError if it cannot be opened
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin; throws InputError on anything inconsistent.
  explicit IndexedDataset(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  int64_t num_sequences() const { return n_; }
  // Documents = document_indices entries - 1 (empty documents count).
  int64_t num_documents() const { return d_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

  int32_t sequence_length(int64_t i) const { return load<int32_t>(lengths_ + 4 * i); }
  int64_t sequence_pointer(int64_t i) const { return load<int64_t>(pointers_ + 8 * i); }
  int64_t document_index(int64_t i) const { return load<int64_t>(doc_idx_ + 8 * i); }
  // All sequence lengths copied out (aligned), for index building.
  std::vector<int32_t> sequence_lengths() const;
  std::vector<int64_t> document_indices() const;

  // Raw little-endian tokens of sequence i (sequence_length(i) elements of dtype()).
  const uint8_t* sequence_bytes(int64_t i) const { return bin_.data() + sequence_pointer(i); }
  // Tokens [offset, offset+count) of sequence i, widened to int32. Bounds are checked.
  void read(int64_t i, int64_t offset, int64_t count, int32_t* out) const;
  std::vector<int32_t> get(int64_t i) const;

  // File identity for cache keys: sizes and modification times of both files.
  std::string fingerprint() const;

 private:
  template <typename T>
  static T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  }
  std::string prefix_;
  MappedFile idx_, bin_;
  DType dtype_ = DType::u16;
  int64_t n_ = 0, d_ = 0, num_tokens_ = 0;
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* doc_idx_ = nullptr;
};

// Appends documents and writes PREFIX.bin/.idx through core's AtomicFile. Until
// finalize() succeeds only their temporary files (PREFIX.bin.tmp.<pid>.<n>, ...) exist;
// the destructor removes them.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, DType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One document made of sequences: `ids` is their concatenation, `sequence_lengths`
  // their lengths (sum == ids.size()). No sequences = an empty document, which repeats
  // the previous boundary in document_indices (Megatron's add_document).
  void add_document(std::span<const int32_t> ids, std::span<const int64_t> sequence_lengths);
  // A document that is one sequence (or none when ids is empty).
  void add_document(std::span<const int32_t> ids);
  // Flushes, fsyncs, writes the index and renames both files into place (.bin first).
  void finalize() {
    close_files();
    commit();
  }
  // The two halves of finalize(), so that a caller writing several datasets can finish
  // all temporary files before renaming any (all or nothing).
  void close_files();
  void commit();

  int64_t num_documents() const { return static_cast<int64_t>(doc_idx_.size()) - 1; }
  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_tokens() const { return tokens_; }

 private:
  void write_tokens(std::span<const int32_t> ids);
  std::string prefix_;
  DType dtype_;
  std::unique_ptr<AtomicFile> bin_, idx_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<uint8_t> buf_;
  int64_t tokens_ = 0;
  bool closed_ = false, done_ = false;
};

}  // namespace mtnlg::data
