#include "core/safetensors.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.hpp"

namespace mtnlg::safetensors {

std::string dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
  }
  return "?";
}

namespace {
bool dtype_from(const std::string& s, DType& t) {
  if (s == "F32")
    t = DType::f32;
  else if (s == "F64")
    t = DType::f64;
  else if (s == "BF16")
    t = DType::bf16;
  else if (s == "F16")
    t = DType::f16;
  else if (s == "I32")
    t = DType::i32;
  else
    return false;
  return true;
}
}  // namespace

void write(const std::string& path, const std::vector<Entry>& tensors,
           const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h;
  if (!metadata.empty()) {
    nlohmann::ordered_json m;
    for (auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  int64_t off = 0;
  for (auto& e : tensors) {
    MTNLG_CHECK(e.tensor.device() == Device::cpu, "safetensors::write needs CPU tensors ({})", e.name);
    h[e.name] = {{"dtype", dtype_name(e.tensor.dtype())},
                 {"shape", e.tensor.shape()},
                 {"data_offsets", {off, off + e.tensor.nbytes()}}};
    off += e.tensor.nbytes();
  }
  std::string header = h.dump();
  while (header.size() % 8 != 0) header.push_back(' ');  // align data to 8 bytes
  std::filesystem::path final_path(path);
  if (final_path.has_parent_path()) std::filesystem::create_directories(final_path.parent_path());
  write_file_atomic(path, [&](AtomicFile& f) {
    uint64_t n = header.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    f.write(len, 8);
    f.write(header);
    for (auto& e : tensors) f.write(e.tensor.raw(), static_cast<size_t>(e.tensor.nbytes()));
  });
}

File parse(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 8) throw_input("{}: not a safetensors file (only {} bytes)", what, bytes.size());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8 || n > (100u << 20))
    throw_input("{}: header length {} does not fit the file ({} bytes): truncated or not a safetensors file", what, n,
                bytes.size());
  nlohmann::ordered_json h;  // ordered: names come back in file order
  try {
    h = nlohmann::ordered_json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const nlohmann::json::exception& e) {
    throw_input("{}: header is not valid JSON: {}", what, e.what());
  }
  if (!h.is_object()) throw_input("{}: header is not a JSON object", what);
  const uint64_t data_start = 8 + n, data_len = bytes.size() - data_start;
  File f;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) throw_input("{}: __metadata__ is not an object", what);
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw_input("{}: __metadata__.{} is not a string", what, m.key());
        f.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") ||
        !e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2)
      throw_input("{}: tensor '{}': entry needs dtype, shape and data_offsets [begin, end]", what, name);
    DType dt;
    if (!dtype_from(e["dtype"].get<std::string>(), dt))
      throw_input("{}: tensor '{}': unsupported dtype {}", what, name, e["dtype"].dump());
    Shape shape;
    uint64_t numel = 1;
    for (auto& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40))
        throw_input("{}: tensor '{}': bad dimension {}", what, name, d.dump());
      uint64_t dv = d.get<uint64_t>();
      if (dv != 0 && numel > (1ull << 62) / dv) throw_input("{}: tensor '{}': shape too large", what, name);
      numel *= dv;
      shape.push_back(static_cast<int64_t>(dv));
    }
    auto& o = e["data_offsets"];
    if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      throw_input("{}: tensor '{}': data_offsets must be non-negative integers", what, name);
    uint64_t b = o[0].get<uint64_t>(), en = o[1].get<uint64_t>();
    uint64_t need = numel * static_cast<uint64_t>(dtype_size(dt));
    if (b > en || en > data_len || en - b != need)
      throw_input(
          "{}: tensor '{}': data_offsets [{}, {}] do not match its shape ({} bytes) or the file ({} data bytes)", what,
          name, b, en, need, data_len);
    Tensor t = Tensor::empty(shape, dt);
    if (need) std::memcpy(t.raw(), bytes.data() + data_start + b, need);
    f.names.push_back(name);
    f.tensors[name] = t;
  }
  return f;
}

File read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw_input("{}: cannot open ({})", path, std::filesystem::exists(path) ? "permission denied" : "no such file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

}  // namespace mtnlg::safetensors
