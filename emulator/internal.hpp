// What the runtime (runtime.cpp) and the SIMT executor (simt.cpp) share inside the
// emulated CUDA backend.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <string>

#include "emulator/cuda_emu.hpp"

namespace mtnlg::emu {

// printf-style formatting into a std::string (usable without fmt in any unit).
inline std::string fmt_str(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt_str(const char* f, ...) {
  va_list a;
  va_start(a, f);
  char buf[2048];
  std::vsnprintf(buf, sizeof buf, f, a);
  va_end(a);
  return buf;
}

// Runs a launch's grid to completion (blocks on the pool, threads as fibers).
void run_grid(const LaunchSpec& spec, const std::function<void()>& body);

// For the fault handler: guard pages of fiber stacks and of shared memory, and the
// kernel (and block) each OS thread is running.
void register_stack_guard(void* p, size_t bytes);
void register_smem_guard(void* p, size_t bytes);
void set_running_kernel(const char* name);
void set_thread_kernel(const char* name, const uint3* block);

}  // namespace mtnlg::emu
