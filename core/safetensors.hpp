// safetensors files: 8-byte little-endian header length, a JSON header mapping tensor
// names to {dtype, shape, data_offsets} (plus "__metadata__": string -> string), then
// the raw little-endian data. The format Hugging Face uses; readers in any language
// need only a JSON parser. mtnlg's checkpoints and oracle dumps use it.
//
// Reading is defensive: the header length, every offset and shape are checked against
// the file size before anything is allocated, so a truncated, corrupted or foreign file
// gives an InputError naming the file and tensor, never a crash or a huge allocation.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mtnlg::safetensors {

struct Entry {
  std::string name;
  Tensor tensor;  // CPU
};

// Writes atomically (temporary name, fsync, rename). Tensors are written in the given order.
void write(const std::string& path, const std::vector<Entry>& tensors,
           const std::map<std::string, std::string>& metadata = {});

struct File {
  std::map<std::string, std::string> metadata;
  std::vector<std::string> names;  // in file order
  std::map<std::string, Tensor> tensors;
};
// Reads the whole file. `max_bytes` bounds the file size accepted (0 = no bound).
File read(const std::string& path);
// Parses from memory (the fuzz harness uses this); `what` names the source in errors.
File parse(const std::string& bytes, const std::string& what);

std::string dtype_name(DType t);  // "F32", "F64", "BF16", "F16", "I32"

}  // namespace mtnlg::safetensors
