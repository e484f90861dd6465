// Merging Megatron indexed datasets (see merge.hpp).
#include "data/merge.hpp"

#include "core/atomic_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.hpp"
#include "core/progress.hpp"
#include "data/indexed_dataset.hpp"

namespace mtnlg::data {

namespace fs = std::filesystem;

std::vector<std::string> expand_merge_inputs(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const auto& a : args) {
    std::error_code ec;
    if (!fs::is_directory(a, ec)) {
      out.push_back(a);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(a, ec))
      if (e.is_regular_file() && e.path().extension() == ".idx")
        found.push_back((e.path().parent_path() / e.path().stem()).string());
    if (found.empty()) throw_input("{}: directory has no .idx files to merge", a);
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

namespace {

// Buffered little-endian writes of fixed-size values.
class ValueWriter {
 public:
  explicit ValueWriter(AtomicFile& f) : f_(f) { buf_.reserve(kCap); }
  ~ValueWriter() = default;
  template <typename T>
  void put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    buf_.insert(buf_.end(), b, b + sizeof(T));
    if (buf_.size() >= kCap) flush();
  }
  void flush() {
    f_.write(buf_.data(), buf_.size());
    buf_.clear();
  }

 private:
  static constexpr size_t kCap = 1 << 20;
  AtomicFile& f_;
  std::vector<uint8_t> buf_;
};

}  // namespace

MergeResult merge_indexed_datasets(const std::vector<std::string>& inputs, const std::string& output_prefix,
                                   bool progress) {
  if (inputs.empty()) throw_input("data merge: no input prefixes given");
  if (output_prefix.empty()) throw_input("--output-prefix: must not be empty");
  {
    const auto parent = fs::path(output_prefix).parent_path();
    std::error_code ec;
    if (!parent.empty() && !fs::is_directory(parent, ec))
      throw_input("--output-prefix {}: directory {} does not exist", output_prefix, parent.string());
  }
  std::error_code ec;
  const fs::path out_idx = fs::weakly_canonical(idx_path(output_prefix), ec);
  std::vector<std::unique_ptr<IndexedDataset>> ds;
  MergeResult res;
  res.inputs = static_cast<int64_t>(inputs.size());
  for (const auto& p : inputs) {
    if (fs::weakly_canonical(idx_path(p), ec) == out_idx)
      throw_input("{}: the output prefix is also an input (write the merge to a new prefix)", p);
    ds.push_back(std::make_unique<IndexedDataset>(p));
    const auto& d = *ds.back();
    if (d.dtype() != ds.front()->dtype())
      throw_input("{}: dtype {} differs from {} ({}); a merged dataset has one dtype", p, dtype_name(d.dtype()),
                  dtype_name(ds.front()->dtype()), ds.front()->prefix());
    const int64_t plain = kIndexHeaderBytes + 12 * d.num_sequences() + 8 * (d.num_documents() + 1);
    if (d.num_sequences() > 0 && static_cast<int64_t>(fs::file_size(idx_path(p), ec)) != plain)
      throw_input("{}: multimodal index (per-sequence mode bytes) cannot be merged", idx_path(p));
    res.sequences += d.num_sequences();
    res.documents += d.num_documents();
    res.tokens += d.num_tokens();
  }
  const DType dtype = ds.front()->dtype();
  const int64_t item = dtype_size(dtype);
  res.dtype = dtype_name(dtype);

  Progress bar("merge " + std::to_string(inputs.size()) + " prefixes", res.tokens, "tokens", progress);
  AtomicFile bin(bin_path(output_prefix)), idx(idx_path(output_prefix));
  // .bin: the inputs' token bytes back to back, copied in 8 MiB slices.
  constexpr int64_t kSlice = 8 << 20;
  for (const auto& d : ds) {
    const int64_t bytes = d->num_tokens() * item;
    const uint8_t* src = d->num_sequences() > 0 ? d->sequence_bytes(0) : nullptr;
    for (int64_t off = 0; off < bytes; off += kSlice) {
      const int64_t n = std::min(kSlice, bytes - off);
      bin.write(src + off, static_cast<size_t>(n));
      bar.add(n / item);
    }
  }
  // .idx: header, lengths, pointers recomputed from the lengths, shifted document indices.
  {
    ValueWriter w(idx);
    for (char c : kIndexMagic) w.put(c);
    w.put<uint64_t>(1);
    w.put<uint8_t>(static_cast<uint8_t>(dtype));
    w.put<uint64_t>(static_cast<uint64_t>(res.sequences));
    w.put<uint64_t>(static_cast<uint64_t>(res.documents + 1));
    for (const auto& d : ds)
      for (int64_t i = 0; i < d->num_sequences(); ++i) w.put<int32_t>(d->sequence_length(i));
    int64_t ptr = 0;
    for (const auto& d : ds)
      for (int64_t i = 0; i < d->num_sequences(); ++i) {
        w.put<int64_t>(ptr);
        ptr += static_cast<int64_t>(d->sequence_length(i)) * item;
      }
    w.put<int64_t>(0);
    int64_t base = 0;
    for (const auto& d : ds) {
      for (int64_t i = 1; i <= d->num_documents(); ++i) w.put<int64_t>(base + d->document_index(i));
      base += d->num_sequences();
    }
    w.flush();
  }
  bin.sync();  // both files complete before either is renamed into place
  idx.sync();
  bar.finish();
  // .bin first: a reader that finds the new .idx also finds its .bin.
  bin.commit();
  idx.commit();
  return res;
}

}  // namespace mtnlg::data
