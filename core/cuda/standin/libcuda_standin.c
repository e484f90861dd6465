/* A stand-in for the CUDA driver (libcuda.so.1) on a machine without one, for cuDNN's
 * offline planning only (core/cuda/cudnn_device.hpp, load_plan_driver): cuDNN >= 9.8
 * finalizes execution plans for a device described by a device-property descriptor, and
 * its runtime-compiled engines open libcuda.so.1 and load the kernels they compiled while
 * planning. Here every call of the driver API that planning makes answers CUDA_SUCCESS
 * with a plausible output (one device, a current context, a loaded library and kernel),
 * and cuGetExportTable answers CUDA_ERROR_NOT_FOUND (NVRTC then goes without its cache).
 * Nothing is run: an execution through this library would do nothing, and mtnlg loads it
 * only into processes that plan and never launch (`mtnlg plan`, the plan-table test).
 * Built as libmtnlg_cuda_standin.so with the soname libcuda.so.1, so that cuDNN's
 * dlopen("libcuda.so.1") finds it once it is loaded. */
#include <stddef.h>
#include <stdint.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_FOUND 500

static char g_handle[64]; /* what every opaque output points at */

int cuInit(unsigned flags) {
  (void)flags;
  return CUDA_SUCCESS;
}
int cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}
int cuDeviceGet(int* d, int ordinal) {
  (void)ordinal;
  *d = 0;
  return CUDA_SUCCESS;
}
int cuDeviceGetCount(int* n) {
  *n = 1;
  return CUDA_SUCCESS;
}
int cuCtxGetCurrent(void** c) {
  *c = g_handle;
  return CUDA_SUCCESS;
}
int cuCtxPushCurrent(void* c) {
  (void)c;
  return CUDA_SUCCESS;
}
int cuCtxPopCurrent(void** c) {
  if (c) *c = g_handle;
  return CUDA_SUCCESS;
}
int cuCtxGetLimit(size_t* v, int limit) {
  (void)limit;
  *v = 0;
  return CUDA_SUCCESS;
}
int cuStreamGetCtx(void* s, void** c) {
  (void)s;
  *c = g_handle;
  return CUDA_SUCCESS;
}
int cuGetErrorName(int e, const char** s) {
  (void)e;
  *s = "CUDA_ERROR (driver stand-in)";
  return CUDA_SUCCESS;
}
int cuGetErrorString(int e, const char** s) {
  (void)e;
  *s = "the CUDA driver stand-in of offline planning";
  return CUDA_SUCCESS;
}
int cuGetExportTable(const void** table, const void* id) {
  (void)id;
  *table = NULL;
  return CUDA_ERROR_NOT_FOUND;
}
int cuLibraryLoadData(void** lib, const void* code, void* jo, void* jv, unsigned nj, void* lo, void* lv, unsigned nl) {
  (void)code, (void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
  *lib = g_handle;
  return CUDA_SUCCESS;
}
int cuLibraryLoadFromFile(void** lib, const char* f, void* jo, void* jv, unsigned nj, void* lo, void* lv, unsigned nl) {
  (void)f, (void)jo, (void)jv, (void)nj, (void)lo, (void)lv, (void)nl;
  *lib = g_handle;
  return CUDA_SUCCESS;
}
int cuLibraryUnload(void* lib) {
  (void)lib;
  return CUDA_SUCCESS;
}
int cuLibraryGetKernel(void** k, void* lib, const char* name) {
  (void)lib, (void)name;
  *k = g_handle;
  return CUDA_SUCCESS;
}
int cuKernelGetAttribute(int* v, int attr, void* k, int dev) {
  (void)attr, (void)k, (void)dev;
  *v = 0;
  return CUDA_SUCCESS;
}
int cuKernelSetAttribute(int attr, int v, void* k, int dev) {
  (void)attr, (void)v, (void)k, (void)dev;
  return CUDA_SUCCESS;
}
int cuOccupancyMaxPotentialClusterSize(int* n, void* f, const void* cfg) {
  (void)f, (void)cfg;
  *n = 1;
  return CUDA_SUCCESS;
}
int cuLinkCreate(unsigned n, void* o, void** v, void** state) {
  (void)n, (void)o, (void)v;
  *state = g_handle;
  return CUDA_SUCCESS;
}
int cuLinkAddData(void) { return CUDA_SUCCESS; }
int cuLinkComplete(void* state, void** cubin, size_t* size) {
  (void)state;
  *cubin = g_handle;
  *size = sizeof g_handle;
  return CUDA_SUCCESS;
}
int cuLinkDestroy(void* state) {
  (void)state;
  return CUDA_SUCCESS;
}
/* Launches are never made by a planning process; they would do nothing. */
int cuLaunchKernel(void) { return CUDA_SUCCESS; }
int cuLaunchKernelEx(void) { return CUDA_SUCCESS; }
int cuLaunchCooperativeKernel(void) { return CUDA_SUCCESS; }
