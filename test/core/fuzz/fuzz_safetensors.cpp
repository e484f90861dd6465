// libFuzzer harness for the checkpoint reader's untrusted-input path: safetensors
// parsing (header length, JSON header, dtypes, shapes, offsets) must either return a
// File or throw InputError — never crash, hang or allocate beyond the input's size.
// Build and run: scripts/fuzz.sh [SECONDS]. The corpus in test/core/fuzz/corpus/ is replayed
// by the unit test test/core/test_safetensors.cpp on every test run.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "core/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = mtnlg::safetensors::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    for (auto& [name, t] : f.tensors) (void)t.nbytes();
  } catch (const mtnlg::InputError&) {}
  return 0;
}
