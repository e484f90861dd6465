#include "core/tensor.hpp"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace mtnlg {

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
  }
  return 0;
}

std::string to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
  }
  return "?";
}

std::string to_string(Device d) {
  switch (d) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
    case Device::test: return "test";
  }
  return "?";
}

namespace {
std::atomic<int64_t> g_device_to_host{0}, g_host_to_device{0};
}
int64_t device_to_host_copies() { return g_device_to_host.load(std::memory_order_relaxed); }
int64_t host_to_device_copies() { return g_host_to_device.load(std::memory_order_relaxed); }

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) {
    if (d < 0) throw_runtime("negative dimension in shape {}", shape_str(s));
    n *= d;
  }
  return n;
}

DeviceAllocatorHooks& cuda_allocator_hooks() {
  static DeviceAllocatorHooks h;
  return h;
}

Storage::Storage(int64_t bytes, Device dev, bool pinned) : bytes_(bytes), dev_(dev) {
  int64_t n = std::max<int64_t>(bytes, 1);
  if (pinned && dev == Device::cpu && cuda_allocator_hooks().host_alloc) {
    ptr_ = cuda_allocator_hooks().host_alloc(n);
    pinned_ = true;
  } else if (dev != Device::cuda) {  // cpu, and the test device's host memory
    int64_t rounded = (n + 63) / 64 * 64;
    ptr_ = std::aligned_alloc(64, static_cast<size_t>(rounded));
    if (!ptr_) throw std::bad_alloc();
  } else {
    auto& h = cuda_allocator_hooks();
    if (!h.alloc)
      throw_runtime("a CUDA tensor was requested but this mtnlg has no CUDA backend (built with MTNLG_CUDA=OFF?)");
    ptr_ = h.alloc(n);
  }
  role_ = mem::on_alloc(bytes_);
}

Storage::~Storage() {
  mem::on_free(bytes_, role_);
  if (pinned_)
    cuda_allocator_hooks().host_free(ptr_, std::max<int64_t>(bytes_, 1));
  else if (dev_ != Device::cuda)
    std::free(ptr_);
  else if (cuda_allocator_hooks().free)
    cuda_allocator_hooks().free(ptr_);
}

void configure_host_allocator() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 256 << 20);
#endif
}

Tensor Tensor::empty(const Shape& shape, DType dt, Device dev) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dt;
  t.storage_ = std::make_shared<Storage>(t.numel_ * dtype_size(dt), dev);
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dt) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dt;
  t.storage_ = std::make_shared<Storage>(t.numel_ * dtype_size(dt), Device::cpu, /*pinned=*/true);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dt, Device dev) {
  Tensor t = empty(shape, dt, dev);
  if (dev != Device::cuda)
    std::memset(t.raw(), 0, static_cast<size_t>(t.nbytes()));
  else
    throw_runtime("Tensor::zeros on CUDA must go through ops::fill");
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  if (shape_numel(shape) != numel_) throw_runtime("view: cannot view {} elements as {}", numel_, shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::rows(int64_t start, int64_t n) const {
  MTNLG_CHECK(ndim() >= 1 && start >= 0 && start + n <= shape_[0], "rows({}, {}) of {}", start, n, shape_str(shape_));
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  Tensor t = *this;
  t.shape_[0] = n;
  t.offset_ += start * row;
  t.numel_ = n * row;
  return t;
}

void Tensor::host_access_error() const {
  throw_runtime(
      "host code read the elements of a {} tensor {} {} in device memory; copy it with .to(Device::cpu) or "
      "pass raw() to a device API",
      to_string(device()), to_string(dtype_), shape_str(shape_));
}

Tensor Tensor::to(Device dev) const {
  Tensor t = empty(shape_, dtype_, dev);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  MTNLG_CHECK(src.numel_ == numel_ && src.dtype_ == dtype_, "copy_from: {} {} into {} {}", to_string(src.dtype_),
              shape_str(src.shape_), to_string(dtype_), shape_str(shape_));
  if (numel_ == 0 || src.raw() == raw()) return;
  const Device from = src.device(), dev = device();
  if (from != Device::cpu && dev == Device::cpu) g_device_to_host.fetch_add(1, std::memory_order_relaxed);
  if (from == Device::cpu && dev != Device::cpu) g_host_to_device.fetch_add(1, std::memory_order_relaxed);
  if (from != Device::cuda && dev != Device::cuda) {  // host memory on both sides
    std::memmove(raw(), src.raw(), static_cast<size_t>(nbytes()));
    return;
  }
  if (from == Device::test || dev == Device::test)
    throw_runtime("copy of a {} tensor {} between the test device and CUDA: only the host talks to both",
                  to_string(dtype_), shape_str(shape_));
  auto& h = cuda_allocator_hooks();
  if (!h.copy) throw_runtime("a CUDA copy was requested but this mtnlg has no CUDA backend");
  const CopyKind kind = from == Device::cpu  ? CopyKind::host_to_device
                        : dev == Device::cpu ? CopyKind::device_to_host
                                             : CopyKind::device_to_device;
  h.copy(raw(), src.raw(), nbytes(), kind);
}

Tensor Tensor::flat(int64_t start, int64_t n) const {
  MTNLG_CHECK(start >= 0 && start + n <= numel_, "flat({}, {}) of {} elements", start, n, numel_);
  Tensor t = *this;
  t.shape_ = {n};
  t.offset_ += start;
  t.numel_ = n;
  return t;
}

}  // namespace mtnlg
